"""The lease state machine: only table edges, an append-only history, a reason on each."""

from __future__ import annotations

import itertools

import pytest

from orchestrator.core.errors import IllegalTransitionError
from orchestrator.core.lease import HOLDING_STATES, LEASE_TRANSITIONS, Lease, LeaseState
from orchestrator.core.request import GpuRequest


def test_every_edge_has_a_comment_and_terminals_are_final() -> None:
    for src, dsts in LEASE_TRANSITIONS.table.items():
        for dst, comment in dsts.items():
            assert len(comment) > 10, f"{src}->{dst} needs a comment"
    for t in LEASE_TRANSITIONS.terminal:
        assert LEASE_TRANSITIONS.allowed(t) == ()


def test_only_table_edges_are_allowed() -> None:
    base = Lease.new("l1", GpuRequest.whole(1), now=0.0)
    for src, dst in itertools.product(LeaseState, LeaseState):
        lease = Lease(base.lease_id, base.request, state=src, history=base.history)
        if dst in LEASE_TRANSITIONS.table[src]:
            out = lease.transition(dst, now=1.0, reason="test")
            assert out.state is dst and out.history[-1].reason == "test"
            assert lease.state is src  # immutable
        else:
            with pytest.raises(IllegalTransitionError):
                lease.transition(dst, now=1.0, reason="test")


def test_lifecycle_history() -> None:
    lease = Lease.new("l1", GpuRequest.whole(1), now=0.0, owner="job-1")
    lease = lease.transition(LeaseState.GRANTED, now=1.0, reason="placed", fencing_token=7)
    assert lease.holding and lease.fencing_token == 7
    lease = lease.transition(LeaseState.ACTIVE, now=2.0, reason="actor started")
    lease = lease.transition(LeaseState.CHECKPOINTING, now=3.0, reason="victim of job-2")
    lease = lease.transition(LeaseState.PREEMPTED, now=4.0, reason="checkpoint acknowledged")
    assert [t.state for t in lease.history] == [LeaseState.PENDING, LeaseState.GRANTED, LeaseState.ACTIVE,
                                                LeaseState.CHECKPOINTING, LeaseState.PREEMPTED]
    assert lease.terminal and not lease.holding
    assert lease.entered(LeaseState.ACTIVE) == 2.0
    assert lease.to_dict()["history"][-1]["reason"] == "checkpoint acknowledged"
    assert HOLDING_STATES == {LeaseState.GRANTED, LeaseState.ACTIVE, LeaseState.CHECKPOINTING}
