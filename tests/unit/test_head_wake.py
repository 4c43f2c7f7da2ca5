"""The head wakes a node's agent through a handle it looks up once per agent incarnation (``HeadActor._agent``):
a lookup is a blocking GCS call on the head's loop, and every grant gives its node's agent work. No Ray: the
lookup is stood in for."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.rayport import ray_api
from orchestrator.rayport.head import HeadActor


class _Agent:
    def __init__(self) -> None:
        self.woken = 0
        self.wake = SimpleNamespace(remote=self._wake)

    def _wake(self) -> None:
        self.woken += 1


def _head(records: dict[str, Any], work: list[dict[str, set[tuple[str, str]]]]) -> HeadActor:
    head = HeadActor.__new__(HeadActor)  # no __init__: no Ray, only what _wake_agents reads
    head._told, head._agents = set(), {}
    head.service = SimpleNamespace(agent_work=lambda: work[0], settings=SimpleNamespace(namespace="ns"),
                                   ctl=SimpleNamespace(nodes=SimpleNamespace(records=records)))
    return head


def test_an_agents_handle_is_looked_up_once_per_incarnation(monkeypatch: pytest.MonkeyPatch) -> None:
    lookups: list[str] = []
    agents: dict[str, _Agent] = {}

    def get_actor(name: str, namespace: str) -> _Agent:
        assert namespace == "ns"
        lookups.append(name)
        if name == "missing":
            raise ValueError("no such actor")
        return agents.setdefault(name, _Agent())

    monkeypatch.setattr(ray_api, "get_actor", get_actor)
    monkeypatch.setattr(ray_api, "agent_name", lambda node: node)
    records = {"n0": SimpleNamespace(incarnation="i1")}
    work = [{"n0": {("l1", "hold")}}]
    head = _head(records, work)
    head._wake_agents()
    work[0] = {"n0": {("l1", "hold"), ("l2", "hold")}}
    head._wake_agents()
    assert lookups == ["n0"] and agents["n0"].woken == 2, "a second grant on the node looked the agent up again"
    records["n0"] = SimpleNamespace(incarnation="i2")  # the agent was replaced: its handle is looked up again
    work[0] = {"n0": {("l3", "hold")}}
    head._wake_agents()
    assert lookups == ["n0", "n0"] and agents["n0"].woken == 3
    work[0] = {"missing": {("l4", "hold")}}  # no such agent (yet): nothing kept, asked again next time
    head._wake_agents()
    work[0] = {"missing": {("l4", "hold"), ("l5", "hold")}}
    head._wake_agents()
    assert lookups.count("missing") == 2 and "missing" not in head._agents
