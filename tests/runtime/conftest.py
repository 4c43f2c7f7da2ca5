"""Helpers for the runtime's unit tests: a clock, the demo cluster, fake agents. No Ray."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.core.config import DEMO_CONFIG, ClusterConfig, RuntimeSettings, load_config
from orchestrator.control.controller import HeadController
from orchestrator.control.store import MemoryStore


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


class FakeAgent:
    """Plays one node's agent against a controller: registers, heartbeats, reports what it holds."""

    def __init__(self, ctl: HeadController, cluster: ClusterConfig, name: str, incarnation: str = "inc-1") -> None:
        self.ctl, self.name, self.incarnation = ctl, name, incarnation
        node = cluster.node(name)
        assert node is not None
        self.inventory = node.inventory()
        self.ray_node_id = f"ray-{name}"
        self.last_reply: dict[str, Any] = {}

    def register(self) -> dict[str, Any]:
        return self.ctl.register_agent(self.name, self.ray_node_id, self.incarnation, self.inventory.model_dump(mode="json"))

    def beat(self, **kw: Any) -> dict[str, Any]:
        allocated = sorted(self.last_reply.get("assignments", {}))
        self.last_reply = self.ctl.heartbeat(self.name, self.incarnation, allocated, **kw)
        return self.last_reply


@pytest.fixture
def demo() -> ClusterConfig:
    return load_config(DEMO_CONFIG)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def settings() -> RuntimeSettings:
    return RuntimeSettings(heartbeat_interval_s=1.0, agent_ttl_s=5.0, grant_ttl_s=60.0)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def ctl(settings: RuntimeSettings, store: MemoryStore, clock: FakeClock) -> HeadController:
    return HeadController(settings, store, clock=clock)


@pytest.fixture
def agents(ctl: HeadController, demo: ClusterConfig) -> dict[str, FakeAgent]:
    out = {n.name: FakeAgent(ctl, demo, n.name) for n in demo.nodes}
    for a in out.values():
        a.register()
    return out
