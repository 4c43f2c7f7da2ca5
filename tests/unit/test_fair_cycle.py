"""The queue tree in the scheduling cycle: fair-share order and reclaim at equal priority, the per-cycle
reclaim cap, limits, reservations with backfill, and who may submit. Each test fails when its rule breaks
(the same scenario without the rule is asserted to behave otherwise where that is the point)."""

from __future__ import annotations

from typing import Any

from orchestrator.core.lease import Lease, LeaseState
from orchestrator.core.priorities import SchedulerConfig
from orchestrator.core.reasons import Cause
from orchestrator.core.request import GpuRequest
from orchestrator.scheduling.cycle import PendingItem, schedule
from orchestrator.scheduling.engine import Placement, place
from orchestrator.scheduling.policies import get_policy
from orchestrator.scheduling.snapshot import ClusterSnapshot, NodeSpec

POLICY = get_policy("bestfit")
NOW = 10_000.0
ONE = GpuRequest(kind="whole", count=1)
CLASSES = {"training": {"priority": 100, "min_runtime_s": 0, "grace_period_s": 30},
           "batch": {"priority": 10, "min_runtime_s": 0, "checkpoint": False},
           "service": {"priority": 100, "preemptible": False},
           "inference": {"priority": 1000, "preemptible": False}}  # above training: training ages (capped below it)


def cfg(queues: dict[str, Any], **fairness: Any) -> SchedulerConfig:
    return SchedulerConfig.model_validate({"classes": CLASSES, "default_class": "training",
                                           "queues": {"default": {}, **queues}, "fairness": fairness})


def cluster(nodes: int = 2, gpus: int = 4) -> ClusterSnapshot:
    return ClusterSnapshot.build([NodeSpec(f"n{i}", "A100-80GB", gpus) for i in range(nodes)])


def hold(snap: ClusterSnapshot, config: SchedulerConfig, specs: list[tuple[str, str, str]],
         request: GpuRequest = ONE, nodes: list[str] | None = None) -> tuple[ClusterSnapshot, list[Lease]]:
    """(id, queue, class) each granted ``request`` (on ``nodes[i]`` when given, else where bestfit puts it),
    started an hour ago."""
    leases = []
    for i, (lid, queue, cls) in enumerate(specs):
        res = place(snap, request.model_copy(update={"node": nodes[i]}) if nodes else request, POLICY)
        assert isinstance(res, Placement), res
        snap = snap.apply(res.allocation)
        lease = Lease.new(lid, request, now=NOW - 3600, owner=lid, priority=config.classes[cls].priority,
                          priority_class=cls, queue=queue)
        lease = lease.grant(res.allocation, len(leases) + 1, now=NOW - 3600, reason="test")
        leases.append(lease.transition(LeaseState.ACTIVE, now=NOW - 3600, reason="test", last_checkpoint_at=NOW - 60))
    return snap, leases


def pending(item_id: str, queue: str, cls: str = "training", request: GpuRequest = ONE, at: float = NOW - 10,
            config: SchedulerConfig | None = None) -> PendingItem:
    c = config or cfg({})
    return PendingItem(item_id, request, c.classes[cls].priority, cls, at, queue=queue)


def test_a_queue_below_its_fair_share_reclaims_at_equal_priority_only_with_fairness() -> None:
    on = cfg({"a": {}, "b": {}}, enabled=True, max_reclaims_per_cycle=8)
    snap, leases = hold(cluster(), on, [(f"a{i}", "a", "training") for i in range(8)])
    want = [pending(f"b{i}", "b") for i in range(4)]
    plan = schedule(snap, want, leases, on, NOW, POLICY)
    assert plan.shares is not None and plan.shares.fair_gpus("b") == 4 and plan.shares.fair_gpus("a") == 4
    assert len(plan.preemptions) == 4
    assert {p.victim.queue for p in plan.preemptions} == {"a"}
    assert all(p.reason.cause is Cause.VICTIM_FAIRSHARE for p in plan.preemptions)
    assert "above its fair share of 4" in plan.preemptions[0].reason.text
    # flat quotas (today's scheduler): the same request waits, nothing is preempted
    off = cfg({"a": {}, "b": {}})
    flat = schedule(snap, want, leases, off, NOW, POLICY)
    assert not flat.preemptions and flat.shares is None
    assert all(w.reason.cause is Cause.WAIT_NO_FIT for w in flat.waiting)


def test_reclaim_stops_at_fair_share_and_respects_the_cap() -> None:
    on = cfg({"a": {}, "b": {}}, enabled=True, max_reclaims_per_cycle=8)
    snap, leases = hold(cluster(), on, [(f"a{i}", "a", "training") for i in range(4)]
                        + [(f"b{i}", "b", "training") for i in range(4)])
    plan = schedule(snap, [pending("b-more", "b")], leases, on, NOW, POLICY)
    assert not plan.preemptions  # b holds its fair share: taking from a would only move the unfairness
    blocked = plan.waiting[0].preemption_blocked
    assert blocked is not None and "fair share" in blocked.text
    capped = cfg({"a": {}, "b": {}}, enabled=True, max_reclaims_per_cycle=1)
    snap, leases = hold(cluster(), capped, [(f"a{i}", "a", "training") for i in range(8)])
    plan = schedule(snap, [pending(f"b{i}", "b") for i in range(4)], leases, capped, NOW, POLICY)
    assert len(plan.preemptions) == 1


def test_weights_set_how_far_reclaim_goes() -> None:
    on = cfg({"a": {"weight": 1}, "b": {"weight": 3}}, enabled=True, max_reclaims_per_cycle=8)
    snap, leases = hold(cluster(), on, [(f"a{i}", "a", "training") for i in range(8)])
    plan = schedule(snap, [pending(f"b{i}", "b") for i in range(8)], leases, on, NOW, POLICY)
    assert plan.shares is not None and plan.shares.fair_gpus("b") == 6
    assert len(plan.preemptions) == 6


def test_a_higher_priority_lease_is_never_reclaimed_for_fair_share() -> None:
    on = cfg({"a": {}, "b": {}}, enabled=True)
    snap, leases = hold(cluster(), on, [(f"a{i}", "a", "service") for i in range(8)])
    plan = schedule(snap, [pending("b0", "b", "batch")], leases, on, NOW, POLICY)
    assert not plan.preemptions


def test_the_queue_furthest_below_its_share_goes_first() -> None:
    on = cfg({"a": {}, "b": {}}, enabled=True, reclaim=False)
    snap, leases = hold(cluster(1, 4), on, [("a0", "a", "training"), ("a1", "a", "training"),
                                            ("a2", "a", "training")])
    # one card left; a's request was queued first, but b holds nothing
    plan = schedule(snap, [pending("a-next", "a", at=NOW - 100), pending("b-first", "b", at=NOW - 5)], leases, on,
                    NOW, POLICY)
    assert [g.item_id for g in plan.grants] == ["b-first"]
    off = cfg({"a": {}, "b": {}})
    assert [g.item_id for g in schedule(snap, [pending("a-next", "a", at=NOW - 100), pending("b-first", "b")],
                                        leases, off, NOW, POLICY).grants] == ["a-next"]


def test_a_limit_caps_a_queue_and_its_parent_caps_its_children() -> None:
    config = cfg({"org": {"limit_gpus": 3}, "t1": {"parent": "org"}, "t2": {"parent": "org", "limit_gpus": 1}})
    snap, leases = hold(cluster(), config, [("t1a", "t1", "training"), ("t2a", "t2", "training")])
    plan = schedule(snap, [pending("t2b", "t2", at=NOW - 20), pending("t1b", "t1"), pending("t1c", "t1")], leases,
                    config, NOW, POLICY)
    assert [g.item_id for g in plan.grants] == ["t1b"]
    waits = {w.item_id: w for w in plan.waiting}
    assert waits["t2b"].reason.cause is Cause.WAIT_LIMIT and "queue t2's limit of 1" in waits["t2b"].reason.text
    assert waits["t1c"].reason.cause is Cause.WAIT_LIMIT and "queue org's limit of 3" in waits["t1c"].reason.text


def test_a_starving_gang_sized_request_reserves_a_node_and_only_preemptible_lower_work_backfills() -> None:
    config = cfg({}, starvation_bound_s=600)
    four = GpuRequest(kind="whole", count=4)
    # one card busy on each node: the 4-card request fits nowhere and may not preempt (equal priority)
    snap, leases = hold(cluster(), config, [("x0", "default", "training"), ("x1", "default", "training")],
                        nodes=["n0", "n1"])
    big = pending("big", "default", request=four, at=NOW - 1000)
    small = pending("small", "default", at=NOW - 900)
    lowly = pending("lowly", "default", "batch", at=NOW - 800)
    plan = schedule(snap, [big, small, lowly], leases, config, NOW, POLICY)
    waits = {w.item_id: w for w in plan.waiting}
    assert waits["big"].reason.cause is Cause.WAIT_RESERVED and plan.reserved
    reserved = set(plan.reserved)
    # the reserved node's holder, of no higher priority, is preempted for it: the wait ends within a grace
    assert [(p.victim.lease_id, p.reason.cause) for p in plan.preemptions] == [
        ("x0" if "n0" in reserved else "x1", Cause.VICTIM_RESERVATION)]
    granted = {g.item_id: g.placement.allocation.node_name for g in plan.grants}
    assert granted["small"] not in reserved  # equal priority: kept off the reserved node
    assert "lowly" in granted  # batch is preemptible and lower: it may backfill anywhere
    # under the bound there is no reservation, and small may take a card on either node
    young = schedule(snap, [pending("big", "default", request=four, at=NOW - 10), small], leases, config, NOW, POLICY)
    assert not young.reserved and young.waiting[0].reason.cause is Cause.WAIT_NO_FIT


def test_who_may_submit_to_a_queue() -> None:
    config = cfg({"org": {"submitters": ["u-alice"]}, "t1": {"parent": "org"}, "open": {}})
    assert config.may_submit("t1", "u-alice", trusted=False)
    assert not config.may_submit("t1", "u-bob", trusted=False)
    assert not config.may_submit("t1", None, trusted=False)
    assert config.may_submit("t1", None, trusted=True)
    assert config.may_submit("open", "u-bob", trusted=False)


def test_a_queue_above_its_share_does_not_age_past_one_below_it() -> None:
    """Fairness on: the older request of the queue above its share waits behind the queue below its share
    (else a requeued victim, keeping its old position, takes back the very card reclaimed from it)."""
    on = cfg({"a": {}, "b": {}}, enabled=True, reclaim=False)
    snap, leases = hold(cluster(1, 4), on, [("a0", "a", "training"), ("a1", "a", "training"),
                                            ("a2", "a", "training")])
    old_a = pending("a-requeued", "a", at=NOW - 3600)  # aged an hour: 60 points at 1 a minute
    plan = schedule(snap, [old_a, pending("b-new", "b", at=NOW - 1)], leases, on, NOW, POLICY)
    assert [g.item_id for g in plan.grants] == ["b-new"]



# ---- consolidation (issue #37 item 6) ----------------------------------------------------------------
def test_a_request_blocked_by_scattered_shares_gets_them_moved_when_consolidation_is_on() -> None:
    """Two nodes of two cards, one card taken on each by equal-priority training that requeues: a 2-card
    request fits nowhere and may preempt nothing. With consolidation one share moves (it lands on the other
    node's free card) and the request takes the node it left; without it, the request waits."""
    two = GpuRequest(kind="whole", count=2)
    base = {"classes": CLASSES, "default_class": "training", "queues": {"default": {}}}
    off = SchedulerConfig.model_validate(base)
    on = SchedulerConfig.model_validate({**base, "consolidation": {"enabled": True, "max_cost_gpu_s": 1e9}})
    snap, leases = hold(cluster(2, 2), on, [("x0", "default", "training"), ("x1", "default", "training")],
                        nodes=["n0", "n1"])
    big = pending("big", "default", request=two, at=NOW - 100)
    movable = {"x0": NOW - 50, "x1": NOW - 40}  # both queued after big: their retries come after it
    plan = schedule(snap, [big], leases, on, NOW, POLICY, movable=movable)
    assert len(plan.preemptions) == 1 and plan.preemptions[0].reason.cause is Cause.VICTIM_CONSOLIDATE
    assert "resumes on n" in plan.preemptions[0].reason.text
    assert not schedule(snap, [big], leases, off, NOW, POLICY, movable=movable).preemptions
    # a share queued before the request is not moved: its retry would take the room straight back
    assert not schedule(snap, [big], leases, on, NOW, POLICY, movable={"x0": NOW - 500, "x1": NOW - 400}).preemptions
    # nor one whose holder does not requeue, nor beyond the cost bound
    assert not schedule(snap, [big], leases, on, NOW, POLICY, movable={}).preemptions
    tight = SchedulerConfig.model_validate({**base, "consolidation": {"enabled": True, "max_cost_gpu_s": 1}})
    assert not schedule(snap, [big], leases, tight, NOW, POLICY, movable=movable).preemptions


def test_a_move_needs_somewhere_for_the_moved_share_to_go() -> None:
    """Both nodes' other cards taken by work that may not move: moving x0 would free n0 for the request but
    leave x0 nowhere to land, so nothing is moved."""
    two = GpuRequest(kind="whole", count=2)
    on = SchedulerConfig.model_validate({"classes": CLASSES, "default_class": "training", "queues": {"default": {}},
                                         "consolidation": {"enabled": True, "max_cost_gpu_s": 1e9}})
    snap, leases = hold(cluster(2, 2), on, [("x0", "default", "training"), ("s1", "default", "service")],
                        nodes=["n0", "n1"])
    plan = schedule(snap, [pending("big", "default", request=two, at=NOW - 100)], leases, on, NOW, POLICY,
                    movable={"x0": NOW - 50})
    assert plan.preemptions and plan.preemptions[0].victim.lease_id == "x0"  # x0 lands on n1's free card
    snap2, leases2 = hold(cluster(2, 2), on, [("x0", "default", "training"), ("s1", "default", "service"),
                                              ("s2", "default", "service")], nodes=["n0", "n1", "n1"])
    stuck = schedule(snap2, [pending("big", "default", request=two, at=NOW - 100)], leases2, on, NOW, POLICY,
                     movable={"x0": NOW - 50})
    assert not stuck.preemptions and stuck.waiting[0].reason.cause is Cause.WAIT_NO_FIT


def test_with_fair_shares_only_a_queue_below_its_share_starves_and_no_victim_is_below_its_own() -> None:
    """Team a holds its fair share (4 of 8) and asks more: its old request is not starving -- it waits because
    the share is full -- so nothing is reserved or preempted for it; team b's old request is below its share."""
    on = cfg({"a": {}, "b": {}}, enabled=True, reclaim=False, starvation_bound_s=600)
    snap, leases = hold(cluster(2, 4), on, [("a0", "a", "training"), ("a1", "a", "training"), ("a2", "a", "training"),
                                            ("a3", "a", "training"), ("b0", "b", "training"), ("b1", "b", "training"),
                                            ("b2", "b", "training"), ("b3", "b", "training")])
    plan = schedule(snap, [pending("a-more", "a", at=NOW - 1000)], leases, on, NOW, POLICY)
    assert not plan.reserved and not plan.preemptions
    snap2, leases2 = hold(cluster(2, 4), on, [(f"a{i}", "a", "training") for i in range(6)]
                          + [("b0", "b", "training"), ("b1", "b", "training")])
    plan2 = schedule(snap2, [pending("b-old", "b", at=NOW - 1000)], leases2, on, NOW, POLICY)
    assert plan2.reserved and [p.victim.queue for p in plan2.preemptions] == ["a"]
