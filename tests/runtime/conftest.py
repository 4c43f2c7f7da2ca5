"""Helpers for the runtime's unit tests: a clock, the demo cluster, real agent cores on simulated GPUs. No Ray."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.control.agent import AgentCore
from orchestrator.control.controller import HeadController
from orchestrator.control.discovery.simulated import SimulatedBackend
from orchestrator.control.store import MemoryStore
from orchestrator.core.config import DEMO_CONFIG, ClusterConfig, RuntimeSettings, load_config


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


class SimAgent:
    """One node's real agent logic (:class:`AgentCore` over the simulated backend) talking to a controller.

    ``beat(**overrides)`` sends the core's heartbeat with fields replaced (a test makes an agent report a
    refusal with ``rejected=...``) and applies the reply's assignments, as the agent actor's loop does."""

    def __init__(self, ctl: HeadController, cluster: ClusterConfig, name: str, incarnation: str = "inc-1") -> None:
        self.ctl, self.name = ctl, name
        node = cluster.node(name)
        assert node is not None
        self.core = AgentCore(name, f"ray-{name}", SimulatedBackend(node), RuntimeSettings())
        self.core.incarnation = incarnation
        self.incarnation = incarnation
        self.inventory = self.core.inventory
        self.ray_node_id = self.core.ray_node_id
        self.last_reply: dict[str, Any] = {}

    def register(self) -> dict[str, Any]:
        reply = self.ctl.register_agent(**self.core.registration())
        self.core.apply_assignments(reply["assignments"], reply.get("revocations"))
        return reply

    def beat(self, **overrides: Any) -> dict[str, Any]:
        self.last_reply = self.ctl.heartbeat(**{**self.core.heartbeat_payload(), **overrides})
        if self.last_reply.get("ok"):
            self.core.apply_assignments(self.last_reply.get("assignments", {}), self.last_reply.get("revocations"))
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
def agents(ctl: HeadController, demo: ClusterConfig) -> dict[str, SimAgent]:
    out = {n.name: SimAgent(ctl, demo, n.name) for n in demo.nodes}
    for a in out.values():
        a.register()
    return out
