"""The head freezes its heap (``gc.freeze``) once nodes have joined and their agents registered, and only then."""

from __future__ import annotations

import gc
import importlib.util
import sys
from pathlib import Path

import pytest

from orchestrator.control.service import HeadService
from orchestrator.control.store import MemoryStore
from orchestrator.core.config import RuntimeSettings

_PATH = Path(__file__).resolve().parents[2] / "bench" / "scale.py"
_spec = importlib.util.spec_from_file_location("scale_bench_heap", _PATH)
assert _spec is not None and _spec.loader is not None
scale = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = scale
_spec.loader.exec_module(scale)


def test_freezes_after_the_agents_register_and_again_when_the_cluster_grows(monkeypatch: pytest.MonkeyPatch) -> None:
    frozen: list[int] = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(1))  # count, without freezing the test process
    settings = RuntimeSettings(heartbeat_interval_s=1.0, agent_ttl_s=10.0, reconcile_interval_s=0.25)
    config = scale.cluster(4)
    port = scale.BenchPort(config, settings)
    everyone, port.alive = port.alive, port.alive[:3]
    clock = scale.SimClock()
    head = HeadService(settings, config, MemoryStore(), scale.NoJobs(), port, clock=clock, status_poll_s=0.0)

    def register_new() -> None:
        for name, core in port.agents.items():
            if head.ctl.nodes.get(name) is None:
                head.register_agent(**core.registration())

    head.cycle()  # asks for three agents: nothing joined yet
    assert not frozen
    register_new()
    head.cycle()
    assert len(frozen) == 1, "frozen once every agent asked for registered"
    clock.now += 1
    head.cycle()
    assert len(frozen) == 1, "not again while no node joins"
    port.alive = everyone
    head._nodes_read_at = float("-inf")  # noqa: SLF001 - read the Ray node table now, not a second later
    head.cycle()  # asks for the fourth agent
    register_new()
    head.cycle()
    assert len(frozen) == 2
