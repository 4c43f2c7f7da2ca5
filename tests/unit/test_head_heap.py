"""The head freezes its heap (``gc.freeze``) once nodes have joined and their agents registered, and only then."""

from __future__ import annotations

import gc

import pytest

from orchestrator.control.service import HeadService
from orchestrator.control.store import MemoryStore
from orchestrator.core.config import RuntimeSettings

from scalebench import scale


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


def test_decide_freezes_what_came_since_every_interval_and_collects_fully_rarely() -> None:
    from orchestrator.control.heap import HeapAction, HeapState, decide

    state = HeapState()
    action, _, state = decide(state, nodes=0, starts_pending=False, now=0.0, freeze_every_s=10, full_every_s=100)
    assert action is HeapAction.NONE, "nothing to freeze before a node joined"
    action, _, state = decide(state, nodes=3, starts_pending=True, now=1.0, freeze_every_s=10, full_every_s=100)
    assert action is HeapAction.NONE, "agents asked for have not registered, and more joined since the last cycle"
    action, _, state = decide(state, nodes=3, starts_pending=True, now=2.0, freeze_every_s=10, full_every_s=100)
    assert action is HeapAction.FREEZE_NODES, "none more registered for a cycle: settled"
    seen = []
    for t in range(3, 120):
        action, why, state = decide(state, nodes=3, starts_pending=False, now=float(t), freeze_every_s=10,
                                    full_every_s=100)
        assert why
        if action is not HeapAction.NONE:
            seen.append((t, action))
    assert seen == [(12, HeapAction.FREEZE_RECENT), (22, HeapAction.FREEZE_RECENT), (32, HeapAction.FREEZE_RECENT),
                    (42, HeapAction.FREEZE_RECENT), (52, HeapAction.FREEZE_RECENT), (62, HeapAction.FREEZE_RECENT),
                    (72, HeapAction.FREEZE_RECENT), (82, HeapAction.FREEZE_RECENT), (92, HeapAction.FREEZE_RECENT),
                    (102, HeapAction.FULL_COLLECT), (112, HeapAction.FREEZE_RECENT)]
    action, _, state = decide(state, nodes=4, starts_pending=False, now=113.0, freeze_every_s=10, full_every_s=100)
    assert action is HeapAction.FREEZE_NODES, "a node joined: freeze what it brought"


def test_the_head_freezes_recent_objects_on_its_own_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.control import heap

    calls: list[str] = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append("collect") or 0)
    settings = RuntimeSettings(heartbeat_interval_s=1.0, agent_ttl_s=10.0, reconcile_interval_s=0.25)
    config = scale.cluster(2)
    clock = scale.SimClock()
    head, port, _ = scale.bring_up(config, settings, clock)
    assert calls == ["collect", "freeze"]
    clock.now += heap.FREEZE_EVERY_S
    head.cycle()
    assert calls == ["collect", "freeze"] * 2, "what came since the last freeze is collected and frozen"
    clock.now += heap.FULL_EVERY_S
    head.cycle()
    assert calls == ["collect", "freeze"] * 2 + ["unfreeze", "collect", "freeze"]
