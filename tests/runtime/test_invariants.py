"""The chaos bench's invariant checker (orchestrator/control/invariants.py), no Ray.

The clean cases come from a real controller and real agent cores (conftest): what they show must pass.
Each broken case changes one thing in such a view and must be caught, so the checker can fail.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from orchestrator.control.controller import HeadController
from orchestrator.control.invariants import History, LeaseSeen, Observation, disagreements, double_grants, observation
from orchestrator.core.lease import TOKEN_RANDOM_BITS, key_digest

from tests.runtime.conftest import FakeClock, SimAgent

KEY = "inv-key"


def _grant(ctl: HeadController, agents: dict[str, SimAgent], lease_id: str, gpu: str, **kw: Any) -> dict[str, Any]:
    ctl.request_lease({"lease_id": lease_id, "request": gpu, "requester_digest": key_digest(KEY), **kw})
    ctl.reconcile()
    for a in agents.values():
        a.beat()
    return ctl.get_lease(lease_id, KEY)


def _obs(ctl: HeadController, agents: dict[str, SimAgent], at: float = 0.0) -> Observation:
    return observation(ctl.status(), {n: a.core.allocated for n, a in agents.items()}, at=at)


def _mixed(ctl: HeadController, agents: dict[str, SimAgent]) -> list[dict[str, Any]]:
    return [_grant(ctl, agents, f"l{i}", gpu) for i, gpu in enumerate(
        ("1", "2", "mig:1g.10gb", "mig:3g.40gb", "mps:40%,10GiB", "mps:60%,10GiB", "timeslice:0.5", "timeslice:0.5"))]


def test_a_real_controller_and_its_agents_break_no_invariant(ctl: HeadController, agents: dict[str, SimAgent]) -> None:
    leases = _mixed(ctl, agents)
    assert all(le["state"] == "granted" for le in leases)
    obs = _obs(ctl, agents)
    assert double_grants(obs) == [] and disagreements(obs) == []
    h = History()
    assert h.observe(obs) == []
    ctl.release("l0", leases[0]["fencing_token"])
    h.released("l0")
    for a in agents.values():
        a.beat()
    assert h.observe(_obs(ctl, agents, 1.0)) == [] and disagreements(_obs(ctl, agents)) == []
    assert h.leases_lost == 0


def _with(obs: Observation, lease_id: str, **alloc: Any) -> Observation:
    """``obs`` plus a copy of ``lease_id`` (as ``dup``) whose allocation has ``alloc`` replaced."""
    le = next(le for le in obs.leases if le.lease_id == lease_id)
    dup = replace(le, lease_id="dup", allocation={**(le.allocation or {}), **alloc})
    return replace(obs, leases=(*obs.leases, dup))


def test_every_kind_of_double_grant_is_caught(ctl: HeadController, agents: dict[str, SimAgent]) -> None:
    _mixed(ctl, agents)
    obs = _obs(ctl, agents)
    by_id = {le.lease_id: le for le in obs.leases}
    mps, ts, mig3 = by_id["l4"].allocation, by_id["l6"].allocation, by_id["l3"].allocation
    assert mps and ts and mig3
    cases = {
        "whole twice": _with(obs, "l0"),
        "MPS above 100%": _with(obs, "l4", sm_percent=10),  # 40 + 60 + 10 on one card
        "time-slices above capacity": _with(obs, "l6", milli=500, mig_uuid=None),  # 0.5 + 0.5 + 0.5
        "MIG overlap": _with(obs, "l3", mig_profile="1g.10gb", mig_start=(mig3["mig_start"] or 0) + 1, mig_uuid=None),
        "one MIG instance twice": _with(obs, "l2"),
        "modes mixed": _with(obs, "l4", kind="timeslice", sm_percent=None, milli=100),
    }
    for what, broken in cases.items():
        found = double_grants(broken)
        assert found and found[0].kind == "double_grant", what
    # a revoking (ended, fenced) lease still occupies its card; an ended one does not
    ended = _with(obs, "l0")
    fenced = replace(ended, leases=tuple(replace(le, state="preempted", revoking=le.lease_id == "dup")
                                         if le.lease_id == "dup" else le for le in ended.leases))
    assert double_grants(fenced)
    freed = replace(ended, leases=tuple(replace(le, state="preempted") if le.lease_id == "dup" else le
                                        for le in ended.leases))
    assert double_grants(freed) == []


def test_an_agent_holding_more_or_less_than_the_ledger_is_a_disagreement(ctl: HeadController,
                                                                        agents: dict[str, SimAgent]) -> None:
    le = _grant(ctl, agents, "a", "1")
    node = le["allocation"]["node"]
    other = next(n for n in agents if n != node)
    obs = _obs(ctl, agents)
    held = dict(obs.agents)
    assert [v.lease_id for v in disagreements(replace(obs, agents={**held, node: frozenset()}))] == ["a"]
    extra = disagreements(replace(obs, agents={**held, other: frozenset({"a"})}))
    assert [(v.node, v.lease_id) for v in extra] == [(other, "a")] and node in extra[0].detail
    # an agent that did not answer, or a node not registered, is not judged
    assert disagreements(replace(obs, agents={**held, node: None})) == []
    assert disagreements(replace(obs, agents={**held, node: frozenset()}, registered=frozenset())) == []


def _seen(lid: str, state: str, token: int | None = None, reason: str = "r", node: str = "n1") -> LeaseSeen:
    alloc = {"node": node, "kind": "whole", "gpu_indices": [0], "milli": 1000}
    return LeaseSeen(lid, state, reason, alloc if state != "pending" else None, token)


def _at(t: float, counter: int, *leases: LeaseSeen) -> Observation:
    return Observation(t, counter, leases)


def T(counter: int) -> int:
    """A token made at ``counter`` (its counter in the high bits, as ``make_token`` does, with fixed low bits)."""
    return (counter << TOKEN_RANDOM_BITS) | 0x5EED


def test_fencing_must_grow_and_never_repeat() -> None:
    h = History()
    assert h.observe(_at(0, 5, _seen("a", "pending"))) == []
    assert h.observe(_at(1, 6, _seen("a", "granted", T(6)))) == []
    assert "went down: 6 -> 4" in h.observe(_at(2, 4, _seen("a", "active", T(6))))[0].detail
    h = History()
    h.observe(_at(0, 5, _seen("a", "pending")))
    assert "pending while the counter was 5" in h.observe(_at(1, 6, _seen("a", "granted", T(5))))[0].detail
    h = History()
    h.observe(_at(0, 7, _seen("a", "granted", T(6))))
    assert f"changed {T(6)} -> {T(7)}" in h.observe(_at(1, 7, _seen("a", "active", T(7))))[0].detail
    h = History()
    assert "both a and b" in h.observe(_at(0, 7, _seen("a", "granted", T(6)), _seen("b", "granted", T(6))))[0].detail
    assert "above the counter" in History().observe(_at(0, 5, _seen("a", "granted", T(6))))[0].detail


def test_a_lease_lost_is_one_that_vanished_regressed_or_ended_without_cause() -> None:
    def lost(*later: Observation, own: bool = False, gone: tuple[str, ...] = (), fault: float | None = None) -> int:
        h = History(fault_window_s=5.0)
        if own:
            h.requested("a")
        h.observe(_at(10, 1, _seen("a", "active", 1)))
        if fault is not None:
            h.fault("n1", fault)
        for obs in later:
            h.observe(obs, gone)
        return h.leases_lost

    assert lost(_at(11, 1), gone=("a",)) == 1  # gone from the ledger while holding
    assert lost(_at(11, 1), _at(12, 1), gone=("a",)) == 1  # once, however often it is seen gone
    assert lost(_at(11, 1)) == 0  # merely absent from a partial view: not proof
    assert lost(_at(11, 1, _seen("a", "pending"))) == 1
    assert lost(_at(11, 1, _seen("a", "lost", 1, reason=""))) == 1
    assert lost(_at(11, 1, _seen("a", "released", 1)), own=True) == 1  # released, not by us
    assert lost(_at(11, 1, _seen("a", "lost", 1, reason="node n1 lost"))) == 1  # no fault on n1
    assert lost(_at(11, 1, _seen("a", "lost", 1, reason="node n1 lost")), fault=10.5) == 0
    assert lost(_at(30, 1, _seen("a", "lost", 1, reason="node n1 lost")), fault=2.0) == 1  # long before the grant
    assert lost(_at(11, 1, _seen("a", "lost", 1)), _at(12, 1, _seen("a", "active", 1)), fault=10.5) == 1  # revived
    h = History()
    h.requested("a")
    h.observe(_at(10, 1, _seen("a", "active", 1)))
    h.released("a")
    assert h.observe(_at(11, 1, _seen("a", "released", 1))) == [] and h.leases_lost == 0
    h.fault("n1", 11.5)
    h.observe(_at(12, 2, _seen("b", "granted", 2)))
    h.observe(_at(13, 2, _seen("b", "lost", 2, reason="node n1 lost")))
    assert (h.leases_lost, h.ended_by_faults) == (0, 1)


def test_a_lease_moved_while_holding_is_lost(clock: FakeClock) -> None:
    h = History()
    h.observe(_at(0, 1, _seen("a", "active", 1)))
    moved = replace(_seen("a", "active", 1), allocation={"node": "n2", "kind": "whole", "gpu_indices": [0], "milli": 1000})
    assert h.observe(_at(1, 1, moved))[0].kind == "lease_lost" and h.leases_lost == 1
