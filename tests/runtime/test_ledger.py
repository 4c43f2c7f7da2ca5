"""The ledger's stored form and the preemption rules on one entry: every field, both ways. Pure."""

from __future__ import annotations

import json

from orchestrator.control import preempting
from orchestrator.control.handout import Handout
from orchestrator.control.ledger import Ledger, LedgerEntry
from orchestrator.control.store import MemoryStore
from orchestrator.core.allocation import Allocation
from orchestrator.core.lease import Lease, LeaseRequest, LeaseState, make_token
from orchestrator.core.priorities import DEFAULT_CLASSES
from orchestrator.core.request import GpuRequest
from orchestrator.core.statemachine import Transition

ALLOC = Allocation.from_json({"node": "n1", "kind": "mps", "gpu_indices": [1], "gpu_uuids": ["GPU-1"], "milli": 300,
                              "memory_mib": 20480, "sm_percent": 30, "model": "A100-80GB", "cpu_milli": 1000})
SPEC = LeaseRequest(lease_id="job-1.a1", request=GpuRequest.mps(30, 20480), owner="job:job-1", priority_class="training",
                    queue="research", requeue_on_loss=False, enqueued_at=5.0)


#: The token of the grant the fencing counter reached 7 with (its counter, then random bits).
TOKEN_7 = make_token(7, SPEC.lease_id, b"s" * 32)


def _active(now: float = 100.0) -> LedgerEntry:
    lease = Lease.new(SPEC.lease_id, SPEC.request, now=10.0, owner=SPEC.owner, priority=100,
                      priority_class="training", queue="research")
    lease = lease.grant(ALLOC, TOKEN_7, now=20.0, reason="placed: best fit").transition(
        LeaseState.ACTIVE, now=30.0, reason="activated by a1")
    return LedgerEntry(lease, SPEC, seq=3, enqueued_at=5.0, handout=Handout("ab" * 28, "n1", 0.3, 1.0, {"A": "1"}),
                       holder="actor-1", attempt_of="job-1.a0", requeued_as=None)


def test_lease_new_starts_pending_with_its_defaults() -> None:
    le = Lease.new("x", GpuRequest.whole(1), now=3.0)
    assert (le.owner, le.priority, le.priority_class, le.queue, le.state, le.fencing_token) == (
        "", 0, "", "default", LeaseState.PENDING, 0)
    assert le.history == (Transition(3.0, LeaseState.PENDING, "requested"),)


def test_an_entry_with_every_field_set_survives_its_stored_form() -> None:
    e = preempting.ask_or_stop(_active(), DEFAULT_CLASSES["training"], for_item="inf-1.a1", why="preempted for inf-1",
                               now=100.0, cause="victim.reclaim")
    e = preempting.checkpoint_reported(e, "/ck/old.pt", 90.0)
    back = LedgerEntry.from_json(json.loads(json.dumps(e.to_json())))
    assert back == e  # dataclass equality: every field, the history and the allocation included
    assert back.handout == Handout("ab" * 28, "n1", 0.3, 1.0, {"A": "1"})
    view = back.to_dict()
    assert (view["holder"], view["attempt_of"], view["preempt_for"], view["preempt_reason"], view["preempt_deadline"]) == (
        "actor-1", "job-1.a0", "inf-1.a1", "preempted for inf-1", 160.0)
    assert view["handout"]["env_vars"] == {"A": "1"} and view["request_spec"]["sm_percent"] == 30
    assert view["why_pending"] is None and view["checkpoint_path"] == "/ck/old.pt"
    assert view["preempt_cause"] == "victim.reclaim"


def test_a_running_checkpointing_victim_is_asked_with_a_deadline() -> None:
    e = preempting.ask_or_stop(_active(), DEFAULT_CLASSES["training"], for_item="inf-1.a1", why="preempted for inf",
                               now=100.0)
    assert e.state is LeaseState.CHECKPOINTING
    assert e.lease.history[-1] == Transition(100.0, LeaseState.CHECKPOINTING,
                                             "asked to checkpoint within 60s; preempted for inf")
    assert (e.preempt_for, e.preempt_reason, e.preempt_deadline) == ("inf-1.a1", "preempted for inf", 160.0)


def test_a_victim_that_does_not_checkpoint_or_never_started_is_stopped_at_once() -> None:
    batch = preempting.ask_or_stop(_active(), DEFAULT_CLASSES["batch"], for_item="i", why="preempted for i", now=50.0)
    assert batch.state is LeaseState.PREEMPTED and batch.lease.history[-1] == Transition(50.0, LeaseState.PREEMPTED,
                                                                                         "preempted for i")
    assert (batch.preempt_for, batch.preempt_reason, batch.preempt_deadline) == ("i", "preempted for i", None)
    granted = LedgerEntry(Lease.new("g", GpuRequest.whole(1), now=1.0).grant(ALLOC, 2, now=2.0, reason="placed"),
                          SPEC, 1, 1.0)
    stopped = preempting.ask_or_stop(granted, DEFAULT_CLASSES["training"], for_item="i", why="why", now=9.0)
    assert stopped.state is LeaseState.PREEMPTED
    assert stopped.lease.history[-1].reason == "why (not started: nothing to checkpoint)"


def test_an_acknowledged_checkpoint_ends_the_lease_with_its_path() -> None:
    asked = preempting.ask_or_stop(_active(), DEFAULT_CLASSES["training"], for_item="i", why="for i", now=100.0)
    done = preempting.acknowledged(asked, "/ck/new.pt", "checkpoint acknowledged", 104.0)
    assert done.state is LeaseState.PREEMPTED
    assert done.lease.history[-1] == Transition(104.0, LeaseState.PREEMPTED, "checkpoint acknowledged; for i")
    assert (done.lease.checkpoint_path, done.lease.last_checkpoint_at) == ("/ck/new.pt", 104.0)
    older = preempting.checkpoint_reported(asked, "/ck/old.pt", 95.0)
    timed_out = preempting.acknowledged(older, None, "grace period over", 161.0)
    assert (timed_out.lease.checkpoint_path, timed_out.lease.last_checkpoint_at) == ("/ck/old.pt", 95.0)


def test_a_retry_keeps_the_queue_position_and_points_back() -> None:
    e = _active()
    r = preempting.retry_of(e, "node n1 lost", 200.0)
    assert r.lease_id == "job-1.a2" and r.attempt_of == "job-1.a1" and r.spec.lease_id == "job-1.a2"
    assert (r.seq, r.enqueued_at, r.lease.priority, r.lease.priority_class) == (3, 5.0, 100, "training")
    assert r.lease.state is LeaseState.PENDING and r.lease.owner == "job:job-1"
    assert r.lease.history == (Transition(200.0, LeaseState.PENDING, "requeued: node n1 lost"),)
    assert r.spec.queue == "research" and r.spec.requeue_on_loss is False


def test_restore_takes_the_largest_counters_and_latest_follows_retries() -> None:
    store = MemoryStore()
    ledger = Ledger(store, "ns")
    ledger.fencing, ledger.seq = 4, 2
    ledger.put_meta()
    first = _active()
    ledger.commit([preempting.retry_of(first, "lost", 1.0), LedgerEntry(
        first.lease, first.spec, first.seq, first.enqueued_at, requeued_as="job-1.a2")])
    again = Ledger(store, "ns")
    assert {e.lease_id for e in again.restore()} == {"job-1.a1", "job-1.a2"}
    assert (again.fencing, again.seq) == (7, 3)  # the token's counter 7 and seq 3 of the entries beat the stored 4, 2
    assert again.latest("job-1.a1").lease_id == "job-1.a2"
    assert store.get("ns/meta") == {"fencing": 4, "seq": 2}


def test_restore_keeps_the_stored_counter_when_the_leases_it_covered_were_pruned() -> None:
    """Tokens are never reissued: after pruning, the stored counter is above every remaining lease's token."""
    store = MemoryStore()
    ledger = Ledger(store, "ns")
    ledger.commit([_active()])  # token 7, seq 3
    ledger.fencing, ledger.seq = 12, 9  # leases with tokens 8..12 were granted, ended and pruned since
    ledger.put_meta()
    again = Ledger(store, "ns")
    again.restore()
    assert (again.fencing, again.seq) == (12, 9)


def test_in_state_any_order_holds_what_in_state_holds() -> None:
    """The same entries as ``in_state``, which alone promises the ledger's order."""
    ledger = Ledger(MemoryStore(), "ns")
    first = _active()
    retry = preempting.retry_of(first, "lost", 1.0)
    ledger.commit([first, retry])
    for states in ((LeaseState.ACTIVE,), (LeaseState.PENDING,), (LeaseState.ACTIVE, LeaseState.PENDING),
                   (LeaseState.RELEASED,)):
        assert sorted(e.lease_id for e in ledger.in_state_any_order(*states)) == \
            sorted(e.lease_id for e in ledger.in_state(*states))
    assert [e.lease_id for e in ledger.in_order({retry.lease_id, first.lease_id})] == [first.lease_id, retry.lease_id]


def _prune_by_scan(ledger: Ledger, cutoff: float) -> list[str]:
    """What prune_ended must do, as a walk of every ended lease in the ledger's order (the reference)."""
    out = []
    for e in ledger.in_state(LeaseState.RELEASED, LeaseState.PREEMPTED, LeaseState.EXPIRED, LeaseState.LOST):
        if e.revoking or e.lease.history[-1].at > cutoff or not ledger.latest(e.lease_id).lease.terminal:
            continue
        ledger.drop(e.lease_id)
        out.append(e.lease_id)
    return out


def test_prune_from_the_ended_heap_drops_what_a_scan_of_every_ended_lease_drops() -> None:
    import random
    from dataclasses import replace

    rng = random.Random(7)
    fast, slow = Ledger(MemoryStore(), "rgo"), Ledger(MemoryStore(), "rgo")
    live: list[LedgerEntry] = []
    now = 0.0
    for step in range(600):
        now += rng.uniform(0.0, 2.0)
        changes: list[LedgerEntry] = []
        r = rng.random()
        if r < 0.4 or not live:  # a new lease, granted
            lid = f"l{step}"
            spec = SPEC.model_copy(update={"lease_id": lid})
            lease = Lease.new(lid, SPEC.request, now=now).grant(ALLOC, step + 1, now=now, reason="placed")
            e = LedgerEntry(lease, spec, seq=step, enqueued_at=now)
            live.append(e)
            changes.append(e)
        elif r < 0.8:  # one ends, some fenced until their agent confirms, some requeued as a new attempt
            e = live.pop(rng.randrange(len(live)))
            state = rng.choice([LeaseState.RELEASED, LeaseState.LOST, LeaseState.EXPIRED])
            ended = replace(e, lease=e.lease.transition(state, now=now, reason="ended"),
                            revoking=state is LeaseState.LOST and rng.random() < 0.5)
            if state is LeaseState.LOST and rng.random() < 0.5:
                rid = f"{e.lease_id}.r"
                retry = LedgerEntry(Lease.new(rid, SPEC.request, now=now).grant(ALLOC, 10_000 + step, now=now,
                                                                                reason="placed"),
                                    SPEC.model_copy(update={"lease_id": rid}), seq=step, enqueued_at=now)
                ended = replace(ended, requeued_as=rid)
                live.append(retry)
                changes.append(retry)
            changes.append(ended)
        else:  # an agent confirms a fenced lease stopped
            fenced = [e for e in fast.entries.values() if e.revoking]
            if fenced and rng.random() < 0.15:  # rarely: some stay fenced past the cutoff
                changes.append(replace(rng.choice(fenced), revoking=False))
        fast.commit(changes)
        slow.commit(changes)
        if step % 25 == 0:
            cutoff = now - rng.uniform(0.0, 120.0)
            assert fast.prune_ended(cutoff) == _prune_by_scan(slow, cutoff)
            assert fast.entries == slow.entries
    assert len(fast.entries) < 600
    # After a restore the heap is rebuilt from the stored entries.
    again = Ledger(fast.store, "rgo")
    again.restore()
    ref = Ledger(fast.store, "rgo-ref")
    for e in again.in_state(*LeaseState):
        ref._put(e)  # noqa: SLF001 - the same entries, in the same order, without a store round trip
    assert again.prune_ended(now) == _prune_by_scan(ref, now)


def test_nominated_is_kept_as_a_scan_of_the_occupying_victims_would_find_it() -> None:
    """``Ledger.nominated`` (asked before every plan) against its definition: the requests some occupying
    victim is still leaving for, checkpointing or revoking, over random preemptions, checkpoints, ends,
    confirmations, restores and drops."""
    import random
    from dataclasses import replace

    def scan(ledger: Ledger) -> set[str]:
        return {e.preempt_for for e in ledger.occupying() if e.preempt_for and (
            e.lease.state is LeaseState.CHECKPOINTING or e.revoking)}

    rng = random.Random(11)
    ledger = Ledger(MemoryStore(), "rgo")
    now, seen = 0.0, 0
    for step in range(800):
        now += 1.0
        live = [e for e in ledger.entries.values() if not e.lease.terminal]
        r = rng.random()
        if r < 0.3 or not live:  # a new lease, granted and running
            lid = f"l{step}"
            lease = Lease.new(lid, SPEC.request, now=now).grant(ALLOC, step + 1, now=now, reason="placed")
            ledger.commit([LedgerEntry(lease.transition(LeaseState.ACTIVE, now=now, reason="a"),
                                       SPEC.model_copy(update={"lease_id": lid}), seq=step, enqueued_at=now)])
        elif r < 0.55:  # a victim chosen for one of a few requests: asked to checkpoint, or stopped (fenced)
            e = rng.choice(live)
            if e.lease.state is LeaseState.ACTIVE:
                ledger.commit([preempting.ask_or_stop(e, DEFAULT_CLASSES[rng.choice(["training", "batch"])],
                                                      for_item=f"inf-{rng.randrange(4)}", why="preempted", now=now)])
        elif r < 0.8:  # a live one ends: preempted (its agent to confirm, or not), released, lost
            e = rng.choice(live)
            state = rng.choice([LeaseState.PREEMPTED, LeaseState.RELEASED, LeaseState.LOST])
            ledger.commit([replace(e, lease=e.lease.transition(state, now=now, reason="ended"),
                                   revoking=state is not LeaseState.RELEASED and rng.random() < 0.6)])
        elif r < 0.95:  # an agent confirms a fenced one stopped
            fenced = [e for e in ledger.entries.values() if e.revoking]
            if fenced:
                ledger.commit([replace(rng.choice(fenced), revoking=False)])
        else:  # an ended one leaves the ledger
            ended = [e for e in ledger.entries.values() if e.lease.terminal]
            if ended:
                ledger.drop(rng.choice(ended).lease_id)
        assert ledger.nominated() == scan(ledger), step
        seen += bool(ledger.nominated())
        if step % 200 == 199:  # a restored ledger builds the same index from the store
            again = Ledger(ledger.store, "rgo")
            again.restore()
            assert again.nominated() == scan(again) == scan(ledger)
    assert seen > 100  # the index was not empty all along
