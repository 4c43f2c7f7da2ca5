"""Elastic gangs (``min..max`` workers): the grammar, placement at the largest size that fits, the withdrawn
workers, shrinking through preemption and growing into idle cards, without churn.

Pure tier: snapshots, the engine, the cycle and the planners; no Ray.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.gang_request import GangMember, GangRequest
from orchestrator.core.lease import Lease, LeaseRequest, LeaseState
from orchestrator.core.priorities import Elastic, Fairness, PriorityClass, QueueConfig, SchedulerConfig
from orchestrator.core.reasons import Cause
from orchestrator.core.request import GpuRequest
from orchestrator.scheduling.cycle import PendingItem, schedule
from orchestrator.scheduling.elastic import plan_grow
from orchestrator.scheduling.engine import Placement, place
from orchestrator.scheduling.gang import GangPlacement, GangUnschedulable, place_elastic
from orchestrator.scheduling.plan import Waiting
from orchestrator.scheduling.policies import get_policy
from orchestrator.scheduling.preemption import PreemptionPlan, plan_preemption
from orchestrator.scheduling.snapshot import ClusterSnapshot, NodeSpec
from orchestrator.core.reasons import Reason
from orchestrator.sdk.inputs import as_spec

POLICY = get_policy("bestfit")
CFG = SchedulerConfig(
    classes={
        "inference": PriorityClass(priority=1000, preemptible=False),
        "training": PriorityClass(priority=100, min_runtime_s=0, grace_period_s=30, checkpoint=True),
        "batch": PriorityClass(priority=10, min_runtime_s=0, grace_period_s=0, checkpoint=False),
    },
    queues={"default": QueueConfig()}, default_class="training", elastic=Elastic(grow_after_s=300),
)
NOW = 1000.0


def cluster(*gpus: int) -> ClusterSnapshot:
    """Nodes n0, n1 ... of A100s, ``gpus[i]`` cards on node ``i``, all idle."""
    return ClusterSnapshot.build([NodeSpec(f"n{i}", "A100-80GB", g) for i, g in enumerate(gpus)])


def take(snap: ClusterSnapshot, node: str, cards: int) -> ClusterSnapshot:
    """``snap`` with ``cards`` whole cards of ``node`` taken (by work the test does not name)."""
    return hold(snap, "busy", GpuRequest.whole(cards), node=node)[0]


def members(gang_id: str, gang: GangRequest, *, cls: str = "training", queue: str = "default") -> list[PendingItem]:
    return [PendingItem(f"{gang_id}-w{i}", gang.worker, CFG.classes[cls].priority, cls, i * 1e-6, queue=queue,
                        gang=GangMember.of(gang, gang_id, i)) for i in range(gang.workers)]


def hold(snap: ClusterSnapshot, lid: str, req: GpuRequest, cls: str = "training", *, node: str,
         gang: str | None = None, elastic: tuple[int, int] | None = None,
         started: float = 0.0) -> tuple[ClusterSnapshot, Lease]:
    res = place(snap, req.model_copy(update={"node": node}), POLICY)
    assert isinstance(res, Placement), res
    lease = Lease.new(lid, req, now=started, owner=lid, priority=CFG.classes[cls].priority, priority_class=cls,
                      gang=gang, elastic=elastic)
    lease = lease.grant(res.allocation, 1, now=started, reason="test")
    lease = lease.transition(LeaseState.ACTIVE, now=started, reason="test", last_checkpoint_at=started)
    return snap.apply(res.allocation), lease


def running_gang(snap: ClusterSnapshot, gang_id: str, nodes: list[str], elastic: tuple[int, int], *,
                 started: float = 0.0) -> tuple[ClusterSnapshot, list[Lease]]:
    leases = []
    for i, node in enumerate(nodes):
        snap, lease = hold(snap, f"{gang_id}-w{i}", GpuRequest.whole(1), node=node, gang=gang_id, elastic=elastic,
                           started=started)
        leases.append(lease)
    return snap, leases


# ---- the grammar ------------------------------------------------------------------------------
def test_parse_elastic_forms_and_errors() -> None:
    g = GangRequest.parse("1-4x1")
    assert (g.min_workers, g.workers, g.least, g.elastic) == (1, 4, 1, True)
    assert g.describe().startswith("gang 1-4x[")
    assert GangRequest.parse(" 2 - 3 x mps:30%").worker.sm_percent == 30
    fixed = GangRequest.parse("2-2x1")
    assert not fixed.elastic and fixed.least == 2
    assert GangRequest.parse("2x1").min_workers is None
    for text, field in (("3-2x1", "gpu.min_workers"), ("0-2x1", "gpu.min_workers"), ("1-0x1", "gpu.workers")):
        with pytest.raises(InvalidRequestError) as e:
            GangRequest.parse(text)
        assert e.value.field == field, text
    with pytest.raises(InvalidRequestError) as e:
        GangRequest(workers=2, min_workers=3, worker=GpuRequest.whole(1))
    assert e.value.field == "gang.min_workers"
    with pytest.raises(InvalidRequestError) as e:
        GangMember(gang_id="g", index=0, size=2, min_size=3)
    assert e.value.field == "gang.min_workers"


def test_members_carry_the_range_and_old_json_reads_as_fixed() -> None:
    m = GangMember.of(GangRequest.parse("1-4x1"), "g", 3)
    assert (m.size, m.min_size, m.elastic) == (4, 1, (1, 4))
    assert m.gang(GpuRequest.whole(1)) == GangRequest.parse("1-4x1")
    old = LeaseRequest.parse({"lease_id": "g-w0", "request": "1", "gang": {"gang_id": "g", "index": 0, "size": 2}})
    assert old.gang is not None and old.gang.min_size is None and old.gang.elastic is None
    again = LeaseRequest.parse(LeaseRequest(lease_id="g-w0", request=GpuRequest.whole(1), gang=m).model_dump(mode="json"))
    assert again.gang == m


def test_job_spec_takes_the_elastic_text() -> None:
    spec = as_spec({"name": "t", "entrypoint": "true", "gpu": "1-4x1"})
    assert (spec.workers, spec.min_workers) == (4, 1) and spec.gang is not None and spec.gang.elastic
    assert spec.describe_gpu().startswith("gang 1-4x")
    with pytest.raises(InvalidRequestError) as e:
        as_spec({"name": "t", "entrypoint": "true", "gpu": "1", "min_workers": 2})
    assert e.value.field == "min_workers"


# ---- placement ----------------------------------------------------------------------------------
def test_placed_at_the_largest_size_that_fits() -> None:
    gang = GangRequest.parse("1-4x1")
    whole = place_elastic(cluster(2, 2), gang, POLICY)
    assert isinstance(whole, GangPlacement) and len(whole.placements) == 4
    assert whole.reason.cause is Cause.PLACED_GANG_ELASTIC and "at 4 of 1-4" in whole.reason.text
    snap = take(cluster(2, 2), "n1", 1)  # three cards free
    res = place_elastic(snap, gang, POLICY)
    assert isinstance(res, GangPlacement) and len(res.placements) == 3 and res.gang.workers == 3
    assert "at 3 of 1-4" in res.reason.text
    assert isinstance(place_elastic(take(snap, "n0", 2), gang, POLICY), GangPlacement)  # one card: the least


def test_never_below_its_least() -> None:
    snap = take(cluster(2, 2), "n1", 2)  # two cards free
    res = place_elastic(snap, GangRequest.parse("3-4x1"), POLICY)
    assert isinstance(res, GangUnschedulable) and res.gang.workers == 3
    assert isinstance(place_elastic(snap, GangRequest.parse("2-4x1"), POLICY), GangPlacement)


def test_same_node_elastic_takes_the_best_node() -> None:
    gang = GangRequest(workers=4, min_workers=2, worker=GpuRequest.whole(1), same_node=True)
    res = place_elastic(cluster(2, 3), gang, POLICY)
    assert isinstance(res, GangPlacement) and len(res.placements) == 3 and res.nodes == ("n1",)


# ---- the cycle: grants and withdrawn workers -----------------------------------------------------
def test_cycle_grants_k_and_withdraws_the_rest() -> None:
    gang = GangRequest.parse("1-4x1")
    plan = schedule(cluster(2, 1), members("g", gang), [], CFG, NOW, POLICY)
    assert sorted(g.item_id for g in plan.grants) == ["g-w0", "g-w1", "g-w2"]
    assert all(g.reason.cause is Cause.PLACED_GANG_ELASTIC for g in plan.grants)
    assert [t.item_id for t in plan.trims] == ["g-w3"] and not plan.waiting
    assert plan.trims[0].reason.cause is Cause.ELASTIC_TRIMMED and "runs at 3 of 1-4" in plan.trims[0].reason.text
    assert plan.to_json()["trims"][0]["cause"] == "elastic.trimmed"


def test_a_quota_that_does_not_borrow_caps_the_size() -> None:
    cfg = CFG.model_copy(update={"queues": {"default": QueueConfig(), "t": QueueConfig(quota_gpus=2, borrowing=False)}})
    plan = schedule(cluster(4), members("g", GangRequest.parse("1-4x1"), queue="t"), [], cfg, NOW, POLICY)
    assert len(plan.grants) == 2 and len(plan.trims) == 2
    assert "quota or limit leaves room for 2" in plan.trims[0].reason.text


def test_a_fixed_gang_has_no_trims() -> None:
    plan = schedule(cluster(2, 1), members("g", GangRequest.parse("3x1")), [], CFG, NOW, POLICY)
    assert len(plan.grants) == 3 and not plan.trims


def test_preempts_for_its_least_only() -> None:
    snap, a = hold(cluster(2), "a", GpuRequest.whole(1), "batch", node="n0")
    snap, b = hold(snap, "b", GpuRequest.whole(1), "batch", node="n0")
    plan = schedule(snap, members("g", GangRequest.parse("1-2x1"), cls="training"), [a, b], CFG, NOW, POLICY)
    assert not plan.grants and len(plan.preemptions) == 1, "one card frees the least, one worker"
    assert all(w.reason.cause is Cause.WAIT_PREEMPTING for w in plan.waiting)


# ---- shrink ---------------------------------------------------------------------------------------
def test_an_elastic_gang_shrinks_for_higher_priority_work() -> None:
    snap, gang = running_gang(cluster(4), "g", ["n0"] * 4, (1, 4))
    plan = plan_preemption(snap, GpuRequest.whole(1), gang, priority=1000, queue="default", config=CFG, now=NOW,
                           policy=POLICY)
    assert isinstance(plan, PreemptionPlan) and len(plan.victims) == 4
    assert all(v.reason.cause is Cause.VICTIM_SHRINK for v in plan.victims)
    assert "shrinks from 4 to 3 of 1-4" in plan.victims[0].reason.text


def test_no_shrink_cause_when_its_least_does_not_fit_after() -> None:
    snap, gang = running_gang(cluster(4), "g", ["n0"] * 4, (4, 4))  # "4-4": fixed in all but name
    plan = plan_preemption(snap, GpuRequest.whole(1), gang, priority=1000, queue="default", config=CFG, now=NOW,
                           policy=POLICY)
    assert isinstance(plan, PreemptionPlan) and all(v.reason.cause is Cause.VICTIM_PRIORITY for v in plan.victims)


def test_a_shrinkable_gang_goes_before_a_fixed_victim_of_its_priority() -> None:
    snap, gang = running_gang(cluster(4, 1), "g", ["n0"] * 4, (1, 4))
    snap, solo = hold(snap, "solo", GpuRequest.whole(1), node="n1")  # loses less work, but would lose its place
    plan = plan_preemption(snap, GpuRequest.whole(1), gang + [solo], priority=1000, queue="default", config=CFG,
                           now=NOW, policy=POLICY)
    assert isinstance(plan, PreemptionPlan)
    assert sorted(v.lease_id for v in plan.victims) == [m.lease_id for m in gang]


# ---- grow -----------------------------------------------------------------------------------------
def test_grows_into_idle_cards_after_running_long_enough() -> None:
    snap, gang = running_gang(cluster(4), "g", ["n0"] * 2, (1, 4))
    grows = plan_grow(snap, gang, [], CFG, NOW, POLICY)
    assert sorted(p.victim.lease_id for p in grows) == ["g-w0", "g-w1"]
    assert all(p.reason.cause is Cause.VICTIM_GROW and p.for_item == "g-w0" for p in grows)
    assert "grows from 2 to 4 of 1-4" in grows[0].reason.text
    assert plan_grow(snap, gang, [], CFG, 200.0, POLICY) == [], "ran 200 s of the 300 s between resizes"
    assert plan_grow(snap, gang, [], CFG.model_copy(update={"elastic": Elastic(grow=False)}), NOW, POLICY) == []


def test_no_grow_while_anything_waits_or_nothing_fits() -> None:
    snap, gang = running_gang(cluster(4), "g", ["n0"] * 2, (1, 4))
    waits = [Waiting("other", 0, 0.0, Reason(Cause.WAIT_NO_FIT, "no room"))]
    assert plan_grow(snap, gang, waits, CFG, NOW, POLICY) == []
    never = [Waiting("other", 0, 0.0, Reason(Cause.WAIT_NEVER_FITS, "no H100"))]
    assert plan_grow(snap, gang, never, CFG, NOW, POLICY) != []
    full = take(snap, "n0", 2)
    assert plan_grow(full, gang, [], CFG, NOW, POLICY) == []
    snap4, at_max = running_gang(cluster(4), "h", ["n0"] * 4, (1, 4))
    assert plan_grow(snap4, at_max, [], CFG, NOW, POLICY) == []
    checkpointing = [gang[0].transition(LeaseState.CHECKPOINTING, now=NOW, reason="t"), gang[1]]
    assert plan_grow(snap, checkpointing, [], CFG, NOW, POLICY) == []


def test_grow_within_a_quota_that_does_not_borrow() -> None:
    cfg = CFG.model_copy(update={"queues": {"default": QueueConfig(quota_gpus=3, borrowing=False)}})
    snap, gang = running_gang(cluster(4), "g", ["n0"] * 2, (1, 4))
    grows = plan_grow(snap, gang, [], cfg, NOW, POLICY, usage={"default": 2.0})
    assert grows and "grows from 2 to 3" in grows[0].reason.text
    assert plan_grow(snap, gang, [], cfg, NOW, POLICY, usage={"default": 3.0}) == []


def test_two_gangs_never_count_on_the_same_idle_card() -> None:
    snap, g1 = running_gang(cluster(3), "a", ["n0"], (1, 2))
    snap, g2 = running_gang(snap, "b", ["n0"], (1, 2))
    grows = plan_grow(snap, g1 + g2, [], CFG, NOW, POLICY)
    assert {p.victim.lease_id for p in grows} == {"a-w0"}, "one idle card: one gang grows"


def test_the_cycle_grows_and_extra_rounds_do_not_churn() -> None:
    snap, gang = running_gang(cluster(2, 2), "g", ["n0", "n0"], (1, 4))
    plan = schedule(snap, [], gang, CFG, NOW, POLICY, elastic=gang)
    assert {p.victim.lease_id for p in plan.preemptions} == {"g-w0", "g-w1"}
    # the resized attempt: the retry asks 1..4 and gets all four; then rounds with nothing new change nothing
    retry = schedule(cluster(2, 2), members("g2", GangRequest.parse("1-4x1")), [], CFG, NOW + 60, POLICY)
    assert len(retry.grants) == 4 and not retry.trims
    snap, grown = running_gang(cluster(2, 2), "g2", ["n0", "n0", "n1", "n1"], (1, 4), started=NOW + 60)
    for t in range(5):
        again = schedule(snap, [], grown, CFG, NOW + 1000 + t * 400, POLICY, elastic=grown)
        assert not again.preemptions and not again.grants
    # and at 3 of 4 with the fourth card busy: no grow, however long it runs
    busy = take(cluster(2, 2), "n1", 1)
    busy, three = running_gang(busy, "g3", ["n0", "n0", "n1"], (1, 4))
    for t in range(5):
        assert not schedule(busy, [], three, CFG, NOW + t * 400, POLICY, elastic=three).preemptions


def test_an_sdk_gang_lease_and_a_requeued_worker_refuse_an_elastic_gang() -> None:
    """A resize requeues every worker (a job's next attempt): neither an SDK gang lease nor a worker lease asking to
    be requeued on its own may be elastic."""
    from orchestrator.control.controller import HeadController
    from orchestrator.control.store import MemoryStore
    from orchestrator.core.config import RuntimeSettings
    from orchestrator.sdk.leases import gang_lease

    with pytest.raises(InvalidRequestError) as e:
        with gang_lease("1-2x1", head=object()):  # type: ignore[arg-type]
            pass
    assert e.value.field == "gang.min_workers"
    ctl = HeadController(RuntimeSettings(), MemoryStore(), clock=lambda: 0.0)
    member = GangMember.of(GangRequest.parse("1-2x1"), "g", 0).model_dump(mode="json")
    with pytest.raises(InvalidRequestError) as e:
        ctl.request_lease({"lease_id": "g-w0", "request": "1", "gang": member, "requeue_on_preempt": True})
    assert e.value.field == "lease_request.requeue_on_preempt"
    assert ctl.request_lease({"lease_id": "g-w0", "request": "1", "gang": member}) == "g-w0"
    assert ctl.ledger.get("g-w0").lease.elastic == (1, 2)
    from orchestrator.control.preempting import retry_of
    assert retry_of(ctl.ledger.get("g-w0"), "lost", 1.0).lease.elastic == (1, 2), "a retry keeps the range"


def test_with_fairness_on_a_gang_grows_into_an_idle_queues_cards_and_is_reclaimed_when_it_asks() -> None:
    cfg = CFG.model_copy(update={"queues": {"default": QueueConfig(), "a": QueueConfig(), "b": QueueConfig()},
                                 "fairness": Fairness(enabled=True)})
    snap, leases = running_gang(cluster(4), "g", ["n0"] * 2, (1, 4))
    leases = [replace(m, queue="a") for m in leases]
    plan = schedule(snap, [], leases, cfg, NOW, POLICY, elastic=leases)
    assert {p.victim.lease_id for p in plan.preemptions} == {"g-w0", "g-w1"}, "queue b asks nothing: a may grow"
    snap4, grown = running_gang(cluster(4), "h", ["n0"] * 4, (1, 4))
    grown = [replace(m, queue="a") for m in grown]
    asks = [PendingItem("b-1", GpuRequest.whole(1), 100, "training", 5.0, queue="b")]
    plan = schedule(snap4, asks, grown, cfg, NOW, POLICY, elastic=grown)
    assert {p.victim.lease_id for p in plan.preemptions} == {m.lease_id for m in grown}
    assert all(p.reason.cause is Cause.VICTIM_SHRINK and "fair share" in p.reason.text for p in plan.preemptions)
