"""Gangs: all-or-nothing placement, topology choice, a gang as one preemption victim, reasons.

Pure tier: snapshots, the engine, the cycle and the planner; no Ray.
"""

from __future__ import annotations

import pytest

from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.lease import Lease, LeaseRequest, LeaseState
from orchestrator.core.priorities import PriorityClass, QueueConfig, SchedulerConfig
from orchestrator.core.reasons import Cause
from orchestrator.core.request import GpuRequest
from orchestrator.core.gang_request import GangMember, GangRequest, is_gang_text
from orchestrator.scheduling.cycle import PendingItem, schedule
from orchestrator.scheduling.engine import Placement, place
from orchestrator.scheduling.gang import GangPlacement, GangUnschedulable, place_gang
from orchestrator.scheduling.policies import get_policy
from orchestrator.scheduling.preemption import NoPreemption, PreemptionPlan, plan_gang_preemption, plan_preemption
from orchestrator.scheduling.snapshot import ClusterSnapshot, NodeSpec

POLICY = get_policy("bestfit")
CFG = SchedulerConfig(
    classes={
        "inference": PriorityClass(priority=1000, preemptible=False),
        "training": PriorityClass(priority=100, min_runtime_s=0, grace_period_s=30),
    },
    queues={"default": QueueConfig()}, default_class="training",
)
NOW = 1000.0


def cluster(*gpus: int) -> ClusterSnapshot:
    return ClusterSnapshot.build([NodeSpec(f"n{i}", "A100-80GB", g) for i, g in enumerate(gpus)])


def take(snap: ClusterSnapshot, node: str, cards: int) -> ClusterSnapshot:
    res = place(snap, GpuRequest.whole(cards, node=node), POLICY)
    assert isinstance(res, Placement), res
    return snap.apply(res.allocation)


def used(s: ClusterSnapshot) -> tuple:
    return tuple(b"".join(r.tobytes() for r in s.gpu_row(i).values()) for i in range(s.n_nodes))


# ---- requests ---------------------------------------------------------------------------------
def test_parse_gang_forms() -> None:
    g = GangRequest.parse("2x4")
    assert (g.workers, g.worker.count, g.gpu_demand) == (2, 4, 8.0)
    assert GangRequest.parse("4xmps:30%").worker.sm_percent == 30
    assert is_gang_text("2x4") and not is_gang_text("4") and not is_gang_text("mig:1g.10gb")
    assert not is_gang_text("٣x1")  # ASCII digits only: int() reads "٣" as 3, so \d made this a gang of three
    with pytest.raises(InvalidRequestError) as e:
        GangRequest.parse("0x4")
    assert e.value.field == "gpu.workers"
    with pytest.raises(InvalidRequestError) as e:
        GangRequest(workers=2, worker=GpuRequest.whole(1, node="n0"))
    assert e.value.field == "gang.worker.node"
    with pytest.raises(InvalidRequestError) as e:
        GangMember(gang_id="g", index=2, size=2)
    assert e.value.field == "gang.index"


def test_lease_request_carries_its_gang() -> None:
    spec = LeaseRequest.parse({"lease_id": "g-w0", "request": "2", "gang": {"gang_id": "g", "index": 0, "size": 2}})
    assert spec.gang == GangMember(gang_id="g", index=0, size=2)


# ---- placement: all or nothing, topology ----------------------------------------------------
def test_never_a_partial_gang() -> None:
    snap = take(cluster(2, 2), "n1", 1)  # room: n0 two cards, n1 one card
    before = used(snap)
    res = place_gang(snap, GangRequest.parse("2x2"), POLICY)
    assert isinstance(res, GangUnschedulable)
    assert res.placed == 1 and [i for i, _ in res.workers] == [1]
    assert res.worker_reason(0) is None and res.worker_reason(1).cause is Cause.FIT_GANG
    assert "only 1 of 2 workers" in res.message and "worker 1" in res.message
    assert used(snap) == before, "deciding must not change the snapshot"


def test_fewest_nodes_takes_the_node_that_holds_the_whole_gang() -> None:
    snap = cluster(2, 4, 2)
    res = place_gang(snap, GangRequest.parse("2x2"), POLICY)
    assert isinstance(res, GangPlacement) and res.nodes == ("n1",)
    assert res.reason.cause is Cause.PLACED_GANG and "1 node" in res.reason.text
    taken = res.apply(snap)
    assert sorted(sum((p.allocation.gpu_indices for p in res.placements), ())) == [0, 1, 2, 3]
    assert used(taken) != used(snap)


def test_fewest_nodes_spans_two_when_no_node_holds_it() -> None:
    snap = take(cluster(4, 4, 4), "n0", 2)  # n0 holds one worker of 2 cards, n1 and n2 two each
    res = place_gang(snap, GangRequest.parse("3x2"), POLICY)
    assert isinstance(res, GangPlacement)
    assert len(res.nodes) == 2 and "n0" not in res.nodes
    # workers of one node are consecutive: bundle order follows the nodes
    nodes = [p.allocation.node_name for p in res.placements]
    assert nodes == sorted(nodes, key=nodes.index)


def test_without_fewest_nodes_the_policy_may_spread() -> None:
    snap = cluster(4, 4)
    spread = GangRequest(workers=2, worker=GpuRequest.whole(2), fewest_nodes=False)
    res = place_gang(snap, spread, get_policy("spread"))
    assert isinstance(res, GangPlacement) and sorted(res.nodes) == ["n0", "n1"]
    packed = place_gang(snap, GangRequest.parse("2x2"), get_policy("spread"))
    assert isinstance(packed, GangPlacement) and len(packed.nodes) == 1


def test_same_node_is_a_requirement() -> None:
    snap = cluster(4, 4)
    res = place_gang(snap, GangRequest(workers=3, worker=GpuRequest.whole(2), same_node=True), POLICY)
    assert isinstance(res, GangUnschedulable) and res.reason.cause is Cause.FIT_GANG_SAME_NODE
    assert res.placed == 0 and len(res.workers) == 3 and "holds 2" in res.message
    ok = place_gang(snap, GangRequest(workers=2, worker=GpuRequest.whole(2), same_node=True), POLICY)
    assert isinstance(ok, GangPlacement) and len(ok.nodes) == 1


def test_each_worker_in_one_nvlink_island() -> None:
    snap = ClusterSnapshot.build([NodeSpec("n0", "A100-80GB", 4, nvlink_islands=((0, 1), (2, 3)))])
    res = place_gang(snap, GangRequest(workers=2, worker=GpuRequest.whole(2, nvlink=True)), POLICY)
    assert isinstance(res, GangPlacement)
    assert sorted(tuple(p.allocation.gpu_indices) for p in res.placements) == [(0, 1), (2, 3)]


def test_shares_for_small_workers() -> None:
    res = place_gang(cluster(1), GangRequest.parse("3xmps:30%"), POLICY)
    assert isinstance(res, GangPlacement) and len(res.placements) == 3
    assert {p.allocation.kind.value for p in res.placements} == {"mps"}


# ---- the cycle ----------------------------------------------------------------------------------
def members(gang_id: str, gang: GangRequest, *, cls: str = "training", t: float = 0.0, only: range | None = None):
    return [PendingItem(f"{gang_id}-w{i}", gang.worker, CFG.classes[cls].priority, cls, t + i * 1e-6,
                        gang=GangMember.of(gang, gang_id, i))
            for i in (only if only is not None else range(gang.workers))]


def test_cycle_grants_every_worker_or_none() -> None:
    gang = GangRequest.parse("2x2")
    plan = schedule(cluster(2, 2), members("g", gang), [], CFG, NOW, POLICY)
    assert sorted(g.item_id for g in plan.grants) == ["g-w0", "g-w1"]
    assert all(g.reason.cause is Cause.PLACED_GANG and "of gang g" in g.reason.text for g in plan.grants)
    full = take(cluster(2, 2), "n1", 1)
    plan = schedule(full, members("g", gang), [], CFG, NOW, POLICY)
    assert not plan.grants
    why = {w.item_id: w.reason for w in plan.waiting}
    assert why["g-w0"].text.startswith("worker 0 of gang g: waits with its gang")
    assert why["g-w1"].text.startswith("worker 1 of gang g: only 1 of 2 workers")


def test_cycle_waits_until_every_worker_is_queued() -> None:
    gang = GangRequest.parse("2x1")
    plan = schedule(cluster(2), members("g", gang, only=range(1)), [], CFG, NOW, POLICY)
    assert not plan.grants
    assert plan.waiting[0].reason.cause is Cause.WAIT_GANG_MEMBERS and "worker(s) 1" in plan.waiting[0].reason.text


def test_a_later_request_may_not_split_the_gang_room() -> None:
    gang = GangRequest.parse("2x2")
    pending = members("g", gang, t=0.0) + [PendingItem("solo", GpuRequest.whole(1), 100, "training", 1.0)]
    plan = schedule(cluster(2, 2, 1), pending, [], CFG, NOW, POLICY)
    assert sorted(g.item_id for g in plan.grants) == ["g-w0", "g-w1", "solo"]
    nodes = {g.placement.allocation.node_name for g in plan.grants if g.item_id != "solo"}
    assert nodes == {"n0", "n1"}


# ---- preemption -------------------------------------------------------------------------------
def hold(snap: ClusterSnapshot, lid: str, req: GpuRequest, cls: str = "training", *, gang: str | None = None,
         node: str | None = None, started: float = 0.0, ckpt: float | None = None) -> tuple[ClusterSnapshot, Lease]:
    pinned = req.model_copy(update={"node": node}) if node else req
    res = place(snap, pinned, POLICY)
    assert isinstance(res, Placement), res
    lease = Lease.new(lid, req, now=started, owner=lid, priority=CFG.classes[cls].priority, priority_class=cls, gang=gang)
    lease = lease.grant(res.allocation, 1, now=started, reason="test")
    lease = lease.transition(LeaseState.ACTIVE, now=started, reason="test", last_checkpoint_at=ckpt)
    return snap.apply(res.allocation), lease


def test_a_gang_is_one_victim() -> None:
    snap = cluster(2, 2)
    snap, w0 = hold(snap, "g-w0", GpuRequest.whole(2), gang="g", node="n0", ckpt=999)
    snap, w1 = hold(snap, "g-w1", GpuRequest.whole(2), gang="g", node="n1", ckpt=999)
    before = used(snap)
    plan = plan_preemption(snap, GpuRequest.whole(1), [w0, w1], priority=1000, queue="default", config=CFG,
                           now=NOW, policy=POLICY)
    assert isinstance(plan, PreemptionPlan)
    assert sorted(v.lease_id for v in plan.victims) == ["g-w0", "g-w1"], "never half a gang"
    assert all("gang g, preempted whole" in v.reason.text for v in plan.victims)
    assert used(snap) == before


def test_a_single_lease_is_preferred_to_a_gang_that_loses_more() -> None:
    snap = cluster(2, 2)
    snap, w0 = hold(snap, "g-w0", GpuRequest.whole(1), gang="g", node="n0", ckpt=100)
    snap, w1 = hold(snap, "g-w1", GpuRequest.whole(1), gang="g", node="n0", ckpt=100)
    snap, solo = hold(snap, "solo", GpuRequest.whole(2), node="n1", ckpt=100)
    plan = plan_preemption(snap, GpuRequest.whole(1), [w0, w1, solo], priority=1000, queue="default", config=CFG,
                           now=NOW, policy=POLICY)
    # the gang loses 2 x 1 card x 900 s, the single lease 2 cards x 900 s: a tie on work, broken by id
    assert isinstance(plan, PreemptionPlan)
    assert [v.lease_id for v in plan.victims] in (["g-w0", "g-w1"], ["solo"])
    snap2 = cluster(2, 2)
    snap2, w0 = hold(snap2, "g-w0", GpuRequest.whole(1), gang="g", node="n0", ckpt=100)
    snap2, w1 = hold(snap2, "g-w1", GpuRequest.whole(1), gang="g", node="n0", ckpt=100)
    snap2, solo = hold(snap2, "solo", GpuRequest.whole(2), node="n1", ckpt=990)
    plan = plan_preemption(snap2, GpuRequest.whole(1), [w0, w1, solo], priority=1000, queue="default", config=CFG,
                           now=NOW, policy=POLICY)
    assert isinstance(plan, PreemptionPlan) and [v.lease_id for v in plan.victims] == ["solo"]


def test_a_gang_with_an_ineligible_worker_is_not_a_victim() -> None:
    snap = cluster(2, 2)
    snap, w0 = hold(snap, "g-w0", GpuRequest.whole(2), gang="g", node="n0")
    snap, w1 = hold(snap, "g-w1", GpuRequest.whole(2), gang="g", node="n1")
    w1 = w1.transition(LeaseState.CHECKPOINTING, now=NOW, reason="test")
    plan = plan_preemption(snap, GpuRequest.whole(1), [w0, w1], priority=1000, queue="default", config=CFG,
                           now=NOW, policy=POLICY)
    assert isinstance(plan, NoPreemption)
    why = dict(plan.ineligible)
    assert why["g-w0"].cause is Cause.INELIGIBLE_IN_FLIGHT and "gang g is preempted whole" in why["g-w0"].text


def test_room_for_a_whole_gang_at_once_minimal_set() -> None:
    snap = cluster(2, 2, 2)
    leases = []
    for node, ckpt in (("n0", 990), ("n1", 995), ("n2", 100)):
        for k in range(2):
            snap, lease = hold(snap, f"{node}-t{k}", GpuRequest.whole(1), node=node, ckpt=ckpt)
            leases.append(lease)
    gang = GangRequest.parse("2x2")
    before = used(snap)
    plan = plan_gang_preemption(snap, gang, leases, priority=1000, queue="default", config=CFG, now=NOW, policy=POLICY)
    assert isinstance(plan, PreemptionPlan) and isinstance(plan.placement, GangPlacement)
    # two whole nodes, the ones whose leases lose least (n0, n1); never a lease of n2
    assert sorted(v.lease_id for v in plan.victims) == ["n0-t0", "n0-t1", "n1-t0", "n1-t1"]
    assert used(snap) == before
    released = snap
    for lease in leases:
        if lease.lease_id in {v.lease_id for v in plan.victims}:
            released = released.release(lease.allocation)
    assert isinstance(place_gang(released, gang, POLICY), GangPlacement)


def test_cycle_preempts_for_a_gang_and_names_the_victims() -> None:
    snap = cluster(2, 2)
    snap, a = hold(snap, "a", GpuRequest.whole(2), node="n0", ckpt=990)
    snap, b = hold(snap, "b", GpuRequest.whole(2), node="n1", ckpt=990)
    gang = GangRequest.parse("2x2")
    plan = schedule(snap, members("g", gang, cls="inference"), [a, b], CFG, NOW, POLICY)
    assert sorted(p.victim.lease_id for p in plan.preemptions) == ["a", "b"]
    assert {p.for_item for p in plan.preemptions} == {"g-w0"}
    assert all(w.reason.cause is Cause.WAIT_PREEMPTING and w.would_preempt == ("a", "b") for w in plan.waiting)
    # the next cycle, victims in flight and the gang nominated: no second plan
    nominated = [PendingItem(m.item_id, m.request, m.priority, m.priority_class, m.submitted_at, nominated=True,
                             gang=m.gang) for m in members("g", gang, cls="inference")]
    again = schedule(snap, nominated, [a, b], CFG, NOW + 1, POLICY, in_flight=frozenset({"a", "b"}))
    assert not again.preemptions and all(w.reason.cause is Cause.WAIT_VICTIMS for w in again.waiting)
