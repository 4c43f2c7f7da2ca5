"""The scheduling cycle: ordering, aging, quotas, grants without over-commit, no churn."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.lease import Lease, LeaseState
from orchestrator.core.priorities import QueueConfig, SchedulerConfig
from orchestrator.core.reasons import Cause
from orchestrator.core.request import GpuRequest
from orchestrator.scheduling.cycle import (
    PendingItem,
    effective_priority,
    order,
    schedule,
)
from orchestrator.scheduling.policies import get_policy
from orchestrator.scheduling.snapshot import ClusterSnapshot, NodeSpec

POLICY = get_policy("bestfit")
CFG = SchedulerConfig(queues={"default": QueueConfig(), "small": QueueConfig(quota_gpus=1, borrowing=False),
                              "lender": QueueConfig(quota_gpus=1, borrowing=True)})


def snap(gpus: int = 2) -> ClusterSnapshot:
    return ClusterSnapshot.build([NodeSpec("n0", "A100-80GB", gpus)])


def usage(s: ClusterSnapshot) -> tuple:
    """What a snapshot says is used, its rows read afresh from the intern table: comparable across families."""
    return tuple(b"".join(r.tobytes() for r in s.gpu_row(i).values()) for i in range(s.n_nodes)) + (
        s.cpu_used.tobytes(), s.mem_used.tobytes())


def item(i: str, req: GpuRequest, cls: str = "training", t: float = 0.0, queue: str = "default") -> PendingItem:
    return PendingItem(i, req, CFG.classes[cls].priority, cls, t, queue)


def test_priority_then_time_then_id() -> None:
    items = [item("b", GpuRequest.whole(1), "batch", 0), item("t2", GpuRequest.whole(1), "training", 5),
             item("t1", GpuRequest.whole(1), "training", 5), item("i", GpuRequest.whole(1), "inference", 9)]
    assert [x.item_id for x in order(items, CFG, now=10)] == ["i", "t1", "t2", "b"]


def test_aging_lifts_but_never_past_the_next_class() -> None:
    old = item("b", GpuRequest.whole(1), "batch", 0)
    assert effective_priority(old, CFG, now=60 * 30) == 10 + 30
    assert effective_priority(old, CFG, now=60 * 10_000) < CFG.classes["training"].priority


def test_grants_in_order_and_never_overcommit() -> None:
    pending = [item(f"j{k}", GpuRequest.whole(1), t=k) for k in range(3)]
    plan = schedule(snap(2), pending, [], CFG, now=10, policy=POLICY)
    assert [g.item_id for g in plan.grants] == ["j0", "j1"]
    assert len({g.placement.allocation.gpus for g in plan.grants}) == 2
    (w,) = plan.waiting
    assert w.item_id == "j2" and "fewer free whole GPUs" in w.reason.text
    assert w.reason.cause is Cause.WAIT_NO_FIT and w.unschedulable is not None
    assert [r.cause for _, r, _ in w.unschedulable.reasons] == [Cause.FIT_WHOLE]
    assert all(g.reason.cause is Cause.PLACED for g in plan.grants)


def test_quota_without_borrowing_waits_with_reason() -> None:
    pending = [item("a", GpuRequest.whole(1), queue="small", t=0), item("b", GpuRequest.whole(1), queue="small", t=1)]
    plan = schedule(snap(2), pending, [], CFG, now=10, policy=POLICY)
    assert [g.item_id for g in plan.grants] == ["a"]
    assert "quota" in plan.waiting[0].reason.text and plan.waiting[0].reason.cause is Cause.WAIT_QUOTA


def test_quota_counts_what_the_queue_already_holds() -> None:
    """A lease granted in an earlier cycle counts against its queue's quota (``queue_usage`` of the holding)."""
    s = snap(2)
    first = schedule(s, [item("a", GpuRequest.whole(1), queue="small")], [], CFG, now=10, policy=POLICY)
    (g,) = first.grants
    held = Lease.new("a", GpuRequest.whole(1), now=10, queue="small").grant(g.placement.allocation, 1, now=10,
                                                                              reason="granted")
    plan = schedule(s.apply(g.placement.allocation), [item("b", GpuRequest.whole(1), queue="small", t=1)], [held],
                    CFG, now=11, policy=POLICY)
    assert not plan.grants and plan.waiting[0].reason.cause is Cause.WAIT_QUOTA


def test_borrowing_grants_idle_capacity_and_says_so() -> None:
    pending = [item("a", GpuRequest.whole(1), queue="lender", t=0), item("b", GpuRequest.whole(1), queue="lender", t=1)]
    plan = schedule(snap(2), pending, [], CFG, now=10, policy=POLICY)
    assert [g.item_id for g in plan.grants] == ["a", "b"]
    assert "borrowing" in plan.grants[1].reason.text
    assert [g.reason.cause for g in plan.grants] == [Cause.PLACED, Cause.PLACED_BORROWING]


def test_preemption_is_planned_once_and_then_no_churn() -> None:
    s = snap(2)
    leases = []
    for k in range(2):
        p = schedule(s, [item(f"t{k}", GpuRequest.whole(1))], [], CFG, now=0, policy=POLICY).grants[0].placement
        s = s.apply(p.allocation)
        lease = Lease.new(f"t{k}", GpuRequest.whole(1), now=0, priority=100, priority_class="training")
        leases.append(lease.grant(p.allocation, k + 1, now=0, reason="x").transition(LeaseState.ACTIVE, now=0, reason="x"))
    # What s holds, rebuilt from scratch in a snapshot family of its own: no cycle below may change s.
    held = snap(2)
    for lease in leases:
        held = held.apply(lease.allocation)
    inf = item("inf", GpuRequest.whole(1), "inference", t=100)
    plan = schedule(s, [inf], leases, CFG, now=100, policy=POLICY)
    assert usage(s) == usage(held), "planning a preemption must not change the snapshot it decides over"
    assert len(plan.preemptions) == 1 and not plan.grants
    victim = plan.preemptions[0].victim.lease_id
    assert plan.waiting[0].would_preempt == (victim,)
    assert plan.waiting[0].reason.cause is Cause.WAIT_PREEMPTING
    assert plan.preemptions[0].reason.cause is Cause.VICTIM_PRIORITY
    # Extra rounds while the victim checkpoints: nothing new is preempted (no churn).
    nominated = PendingItem(inf.item_id, inf.request, inf.priority, inf.priority_class, inf.submitted_at, nominated=True)
    for now in (101, 102, 103):
        again = schedule(s, [nominated], leases, CFG, now=now, policy=POLICY, in_flight=frozenset({victim}))
        assert not again.preemptions and not again.grants
        assert again.waiting[0].reason.cause is Cause.WAIT_VICTIMS
    # Once the victim is released, the inference item is granted its card.
    gone = next(lease for lease in leases if lease.lease_id == victim).allocation
    released = s.release(gone)
    rest = [lease for lease in leases if lease.lease_id != victim]
    final = schedule(released, [nominated], rest, CFG, now=104, policy=POLICY)
    assert [g.item_id for g in final.grants] == ["inf"] and not final.preemptions
    assert usage(s) == usage(held) and usage(released) == usage(held.release(gone)), \
        "scheduling must not change the snapshots it decides over"


def test_plan_json_carries_cause_codes() -> None:
    """What ``explain --json`` shows: every reason as its text and its stable cause code."""
    pending = [item("a", GpuRequest.whole(1), queue="small", t=0), item("b", GpuRequest.whole(1), queue="small", t=1),
               item("c", GpuRequest.whole(2), t=2), item("d", GpuRequest.whole(3), t=3)]
    out = schedule(snap(2), pending, [], CFG, now=10, policy=POLICY).to_json()
    assert [g["cause"] for g in out["grants"]] == ["placed"]
    # c could run on the idle cluster (none free now); d never could (no node has 3 cards).
    assert {w["item_id"]: w["cause"] for w in out["waiting"]} == {"b": "wait.quota", "c": "wait.no_fit",
                                                                  "d": "wait.never_fits"}
    c = next(w for w in out["waiting"] if w["item_id"] == "c")
    assert c["preemption_blocked_cause"] == "no_preemption.none_eligible" and c["preemption_blocked"]
    assert [r["cause"] for r in c["unschedulable"]["reasons"]] == ["fit.whole"]


def _two_held_cards() -> tuple[ClusterSnapshot, list[Lease]]:
    s, leases = snap(2), []
    for k in range(2):
        p = schedule(s, [item(f"t{k}", GpuRequest.whole(1))], [], CFG, now=0, policy=POLICY).grants[0].placement
        s = s.apply(p.allocation)
        lease = Lease.new(f"t{k}", GpuRequest.whole(1), now=0, priority=100, priority_class="training")
        leases.append(lease.grant(p.allocation, k + 1, now=0, reason="x").transition(LeaseState.ACTIVE, now=0, reason="x"))
    return s, leases


def test_equal_requests_that_wait_cost_one_placement_and_one_preemption_plan_per_cycle(monkeypatch) -> None:
    import orchestrator.scheduling.cycle as cycle

    calls = {"place": 0, "plan": 0}
    real_place, real_plan = cycle.place, cycle.plan_preemption

    def counting_place(*a, **k):  # type: ignore[no-untyped-def]
        calls["place"] += 1
        return real_place(*a, **k)

    def counting_plan(*a, **k):  # type: ignore[no-untyped-def]
        calls["plan"] += 1
        return real_plan(*a, **k)

    s, leases = _two_held_cards()
    monkeypatch.setattr(cycle, "place", counting_place)
    monkeypatch.setattr(cycle, "plan_preemption", counting_plan)
    batch = [item(f"b{k}", GpuRequest.whole(1), "batch", t=k) for k in range(20)]  # may preempt no training
    plan = schedule(s, batch, leases, CFG, now=100, policy=POLICY)
    assert calls == {"place": 1, "plan": 1}
    assert len(plan.waiting) == 20 and not plan.grants and not plan.preemptions
    assert {w.preemption_blocked.cause for w in plan.waiting} == {Cause.NO_PREEMPTION_NONE_ELIGIBLE}  # type: ignore[union-attr]
    assert [w.position for w in plan.waiting] == list(range(20))
    # A plan that takes victims changes what the next equal request may take: it is asked again.
    calls.update(place=0, plan=0)
    infs = [item(f"i{k}", GpuRequest.whole(1), "inference", t=k) for k in range(2)]
    plan = schedule(s, infs, leases, CFG, now=100, policy=POLICY)
    assert calls == {"place": 2, "plan": 2}
    assert sorted(p.victim.lease_id for p in plan.preemptions) == ["t0", "t1"]  # two victims, not one twice


_SHAPES = [GpuRequest.whole(1), GpuRequest.whole(2), GpuRequest.timeslice(0.25), GpuRequest.mps(30),
           GpuRequest.mig("3g.40gb"), GpuRequest.mig("1g.10gb")]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(_SHAPES) - 1), st.sampled_from(["training", "batch", "inference"])),
                min_size=1, max_size=14),
       st.booleans())
def test_a_plans_end_state_is_its_grants_applied_in_order(asks: list[tuple[int, str]], with_gang: bool) -> None:
    """``Plan.after`` (what the controller takes instead of applying every grant again) is the snapshot the plan
    was made on with each grant's allocation applied, in plan order, gang workers included."""
    from orchestrator.core.gang_request import GangMember, GangRequest

    base = ClusterSnapshot.build([NodeSpec("n0", "A100-80GB", 2), NodeSpec("n1", "H100-80GB", 4)])
    pending = [item(f"r{k}", _SHAPES[s], cls, t=float(k)) for k, (s, cls) in enumerate(asks)]
    if with_gang:
        gang = GangRequest.parse("2x1")
        pending += [PendingItem(f"g-w{i}", gang.worker, CFG.classes["training"].priority, "training", 0.5 + i * 1e-6,
                                gang=GangMember.of(gang, "g", i)) for i in range(2)]
    plan = schedule(base, pending, [], CFG, now=100.0, policy=get_policy("default"))
    again = base
    for g in plan.grants:
        again = again.apply(g.placement.allocation)
    assert plan.after is not None and plan.after.same_state(again)
    assert usage(plan.after) == usage(again)
    assert plan.grants or plan.after.same_state(base)
