"""The ledger's watchers see every change, and the metrics' live lease counts kept by watching it (and the
ledger's own queue usage) equal a count from scratch after every change."""

from __future__ import annotations

import random

from orchestrator.control.metrics import LeaseCounts, count_live
from orchestrator.core.config import RuntimeSettings
from orchestrator.core.lease import LeaseState, key_digest
from orchestrator.scheduling.preemption import queue_usage

from scalebench import scale


def _same(kept: LeaseCounts, fresh: LeaseCounts) -> None:
    assert kept.by_state == fresh.by_state
    assert kept.queued == fresh.queued
    assert kept.active == fresh.active


def test_kept_counts_equal_a_fresh_count_through_grants_activations_releases_expiries_and_prunes() -> None:
    rng = random.Random(3)
    settings = RuntimeSettings(heartbeat_interval_s=1.0, agent_ttl_s=10.0, reconcile_interval_s=0.25,
                               grant_ttl_s=5.0, ended_retention_s=60.0)
    config = scale.cluster(4)  # the fourth node has MIG cards
    clock = scale.SimClock()
    head, port, _ = scale.bring_up(config, settings, clock)
    digest = key_digest(scale.KEY)
    mirror: dict[str, object] = {}

    def follow(old: object, new: object) -> None:  # a watcher that keeps a copy of the entries
        if new is None:
            del mirror[old.lease_id]  # type: ignore[attr-defined]
        else:
            mirror[new.lease_id] = new  # type: ignore[attr-defined]

    head.ctl.ledger.watch(follow)
    kinds, weights = zip(*scale.MIX)
    tokens: dict[str, int] = {}
    seen: set[LeaseState] = set()
    pruned = ledger_size = 0
    usage_seen = False
    for step in range(400):
        if step < 200 and rng.random() < 0.6:
            lid = f"l{step:04d}"
            head.request_lease({"lease_id": lid, "request": rng.choices(kinds, weights)[0], "owner": "t",
                                "requester_digest": digest})
        for core in port.agents.values():
            reply = head.heartbeat(**core.heartbeat_payload())
            core.apply_assignments(reply.get("assignments", {}), reply.get("revocations"))
        for e in head.ctl.ledger.in_state(LeaseState.GRANTED):
            if not e.lease_id.endswith("7") and rng.random() < 0.5:  # the rest activate later, or expire
                head.activate(e.lease_id, e.lease.fencing_token, holder=f"h-{e.lease_id}")
                tokens[e.lease_id] = e.lease.fencing_token
        for lid in list(tokens):
            if rng.random() < 0.05:
                head.release(lid, tokens.pop(lid))
        seen |= {e.lease.state for e in head.ctl.ledger}
        head.cycle()
        clock.now += 0.5
        kept = head.metrics._counts[1]  # noqa: SLF001
        _same(kept, count_live(head.ctl.ledger.entries.values()))
        assert mirror == head.ctl.ledger.entries, "a watcher saw every change, drops included"
        # the queue usage the ledger keeps up (what the scheduler reads) equals a fresh sum, exactly
        assert head.ctl.ledger.queue_usage() == queue_usage(e.lease for e in head.ctl.ledger.holding())
        usage_seen |= bool(head.ctl.ledger.queue_usage())
        seen |= {e.lease.state for e in head.ctl.ledger}
        pruned += len(head.ctl.ledger.entries) < ledger_size
        ledger_size = len(head.ctl.ledger.entries)
    assert {LeaseState.PENDING, LeaseState.GRANTED, LeaseState.ACTIVE, LeaseState.RELEASED,
            LeaseState.EXPIRED} <= seen, seen
    assert pruned, "ended leases left the ledger"
    assert usage_seen


def test_counts_drop_keys_that_reach_zero_as_a_fresh_count_would() -> None:
    counts = count_live([])
    assert (counts.by_state, counts.queued, counts.active) == ({}, {}, {})
