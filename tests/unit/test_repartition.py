"""The MIG repartition planner: fewest GPUs, cheapest to drain, only their leases, never inference, valid layouts.

The demo cluster's a100-1 has MIG on GPU 2 (3g.40gb@0 + 2g.20gb@4 + 1g.10gb@6) and GPU 3
(4g.40gb@0 + 1g.10gb@4 + 1g.10gb@5 + 1g.20gb@6); its other GPUs and the other nodes have none.
Leases are placed by the real engine on the real snapshot, so their allocations are what the head holds.
"""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.core.config import DEMO_CONFIG, load_config, parse_config
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.lease import Lease
from orchestrator.core.priorities import SchedulerConfig
from orchestrator.core.reasons import Cause
from orchestrator.core.request import GpuRequest
from orchestrator.scheduling.engine import Placement, place
from orchestrator.scheduling.policies import get_policy
from orchestrator.scheduling.repartition import (
    PRESETS,
    MigSlot,
    MigTarget,
    plan_repartition,
    target_from,
    validate_layout,
)
from orchestrator.scheduling.snapshot import ClusterSnapshot

CLASSES = SchedulerConfig().classes
NIGHT = MigTarget(name="night", model="A100-80GB", layout=("7g.80gb",), gpus=1)
PRIORITY = {"inference": 1000, "training": 100, "batch": 10}


class Cluster:
    """The demo cluster's snapshot and the leases placed on it so far."""

    def __init__(self, config: Any = None) -> None:
        cfg = config or load_config(DEMO_CONFIG)
        self.snap = ClusterSnapshot.build([n.inventory() for n in cfg.nodes])
        self.leases: list[Lease] = []

    def hold(self, lease_id: str, request: str, klass: str = "training") -> Lease:
        req = GpuRequest.parse(request)
        p = place(self.snap, req, get_policy("bestfit"))
        assert isinstance(p, Placement), p
        self.snap = self.snap.apply(p.allocation)
        lease = Lease.new(lease_id, req, now=0.0, priority=PRIORITY[klass], priority_class=klass).grant(
            p.allocation, len(self.leases) + 1, now=0.0, reason="test")
        self.leases.append(lease)
        return lease

    def plan(self, target: MigTarget, **kw: Any):
        return plan_repartition(self.snap, self.leases, target, CLASSES, **kw)


def _gpus(plan) -> list[tuple[str, int]]:
    return [(c.node, c.gpu_index) for c in plan.changes]


def _skipped(plan) -> dict[tuple[str, int], Cause]:
    return {(s.node, s.gpu_index): s.reason.cause for s in plan.skipped}


def test_an_idle_cluster_changes_one_gpu_for_one_and_says_why_the_other_is_left() -> None:
    c = Cluster()
    plan = c.plan(NIGHT)
    assert _gpus(plan) == [("a100-1", 2)]  # a tie on cost: the lowest node and index
    ch = plan.changes[0]
    assert ch.old_layout == (MigSlot(0, "3g.40gb"), MigSlot(4, "2g.20gb"), MigSlot(6, "1g.10gb"))
    assert ch.new_layout == (MigSlot(0, "7g.80gb"),) and ch.drain == ()
    assert ch.reason.cause is Cause.REPARTITION_CHOSEN and "3g.40gb@0" in ch.reason.text and "no lease" in ch.reason.text
    assert _skipped(plan) == {("a100-1", 3): Cause.REPARTITION_NOT_NEEDED}
    assert plan.meets_target and plan.reason.cause is Cause.REPARTITION_CHOSEN


def test_the_gpu_with_fewest_leases_is_chosen_and_only_its_leases_drain() -> None:
    c = Cluster()
    c.hold("w", "1")  # a whole card elsewhere: never listed
    c.hold("t2a", "mig:3g.40gb")
    c.hold("t2b", "mig:2g.20gb")
    c.hold("t3", "mig:4g.40gb")
    where = {x.lease_id: x.allocation.gpu_indices for x in c.leases}  # type: ignore[union-attr]
    assert where["t2a"] == where["t2b"] == (2,) and where["t3"] == (3,)
    plan = c.plan(NIGHT)
    assert _gpus(plan) == [("a100-1", 3)] and plan.changes[0].drain == ("t3",)
    both = c.plan(NIGHT.model_copy(update={"gpus": 2}))
    assert _gpus(both) == [("a100-1", 3), ("a100-1", 2)]  # cheapest first
    assert dict(zip(_gpus(both), (ch.drain for ch in both.changes))) == {("a100-1", 3): ("t3",),
                                                                         ("a100-1", 2): ("t2a", "t2b")}


def test_a_lower_priority_lease_is_cheaper_to_drain() -> None:
    c = Cluster()
    c.hold("t", "mig:3g.40gb", "training")  # GPU 2
    c.hold("b", "mig:4g.40gb", "batch")  # GPU 3
    assert _gpus(c.plan(NIGHT)) == [("a100-1", 3)]


def test_an_inference_lease_protects_its_gpu_unless_the_target_allows_draining_it() -> None:
    c = Cluster()
    c.hold("t", "mig:3g.40gb", "training")  # GPU 2
    c.hold("i", "mig:4g.40gb", "inference")  # GPU 3
    plan = c.plan(NIGHT)
    assert _gpus(plan) == [("a100-1", 2)] and plan.changes[0].drain == ("t",)
    assert _skipped(plan) == {("a100-1", 3): Cause.REPARTITION_PROTECTED}
    both = c.plan(NIGHT.model_copy(update={"gpus": 2}))
    assert _gpus(both) == [("a100-1", 2)] and not both.meets_target
    assert both.reason.cause is Cause.REPARTITION_SHORT
    assert "i (inference 1000)" in next(s.reason.text for s in both.skipped if s.gpu_index == 3)
    forced = c.plan(NIGHT.model_copy(update={"gpus": 2, "allow_non_preemptible": True}))
    assert sorted(_gpus(forced)) == [("a100-1", 2), ("a100-1", 3)] and forced.meets_target


def test_a_gpu_at_the_target_layout_counts_and_nothing_changes() -> None:
    cfg = parse_config({"nodes": [{"name": "n", "model": "A100-80GB", "gpus": 2,
                                   "mig": {0: [{"profile": "7g.80gb", "start": 0}],
                                           1: [{"profile": "1g.10gb", "start": 0}]}}]})
    c = Cluster(cfg)
    plan = c.plan(NIGHT)
    assert plan.changes == () and plan.reason.cause is Cause.REPARTITION_NOTHING
    assert _skipped(plan) == {("n", 0): Cause.REPARTITION_HAS_LAYOUT, ("n", 1): Cause.REPARTITION_NOT_NEEDED}
    every = c.plan(PRESETS["training"])  # every MIG card to one full slice: only GPU 1 left to change
    assert _gpus(every) == [("n", 1)]


def test_busy_and_unhealthy_gpus_are_left_alone() -> None:
    c = Cluster()
    assert _gpus(c.plan(NIGHT, busy={("a100-1", 2)})) == [("a100-1", 3)]
    c.snap = c.snap.with_health("a100-1", 3, False)
    plan = c.plan(NIGHT, busy={("a100-1", 2)})
    assert plan.changes == () and not plan.meets_target
    assert _skipped(plan) == {("a100-1", 2): Cause.REPARTITION_BUSY, ("a100-1", 3): Cause.REPARTITION_UNHEALTHY}


def test_a_free_slice_target_takes_the_cheapest_gpu_that_covers_what_is_missing() -> None:
    c = Cluster()
    small = MigTarget(name="day", free_profile="1g.10gb", free_at_least=5)
    # free 1g.10gb now: GPU 2 has one (@6), GPU 3 two (@4, @5): 3 of 5. Filling either card gives 7.
    assert _gpus(c.plan(small)) == [("a100-1", 2)]
    c.hold("t", "mig:3g.40gb")  # GPU 2 now holds a lease: GPU 3 is cheaper
    plan = c.plan(small)
    assert _gpus(plan) == [("a100-1", 3)] and plan.changes[0].new_layout == tuple(MigSlot(s, "1g.10gb") for s in range(7))
    assert c.plan(small.model_copy(update={"free_at_least": 3})).changes == ()  # met already
    many = c.plan(small.model_copy(update={"free_at_least": 15}))  # 3 now, +6 and +5 = 14: both cards, short
    assert sorted(_gpus(many)) == [("a100-1", 2), ("a100-1", 3)] and not many.meets_target


def test_the_inference_preset_fills_every_mig_card_with_its_smallest_slice() -> None:
    plan = Cluster().plan(target_from("inference"))
    assert sorted(_gpus(plan)) == [("a100-1", 2), ("a100-1", 3)]
    assert all(ch.new_layout == tuple(MigSlot(s, "1g.10gb") for s in range(7)) for ch in plan.changes)


def test_the_planner_leaves_its_inputs_as_they_were() -> None:
    c = Cluster()
    c.hold("t", "mig:3g.40gb")
    before, leases = c.snap, list(c.leases)
    c.plan(NIGHT.model_copy(update={"gpus": 2}))
    assert c.snap is before and c.snap.same_state(before) and c.leases == leases


def test_invalid_layouts_and_targets_are_typed_errors_naming_the_profile_and_its_starts() -> None:
    with pytest.raises(InvalidRequestError) as e:
        validate_layout("A100-80GB", ["3g.40gb@2"])
    assert e.value.field == "layout.3g.40gb" and e.value.allowed == "0, 4"
    with pytest.raises(InvalidRequestError) as e:
        validate_layout("A100-80GB", ["4g.40gb@0", "3g.40gb@0"])
    assert e.value.field == "layout.3g.40gb" and e.value.allowed == "4" and "overlaps" in str(e.value)
    with pytest.raises(InvalidRequestError) as e:
        validate_layout("A100-80GB", ["7g.80gb", "1g.10gb"])
    assert e.value.field == "layout.1g.10gb" and "no free start" in str(e.value)
    with pytest.raises(InvalidRequestError) as e:
        validate_layout("A100-80GB", ["9g.90gb"])
    assert e.value.field == "gpu.profile" and "7g.80gb" in e.value.allowed
    with pytest.raises(InvalidRequestError) as e:
        validate_layout("T4", ["1g.10gb"])
    assert e.value.field == "layout.model"
    assert validate_layout("A100-80GB", ["1g.10gb", "3g.40gb", "2g.20gb"]) == (
        MigSlot(0, "3g.40gb"), MigSlot(4, "2g.20gb"), MigSlot(6, "1g.10gb"))  # packed largest first
    assert validate_layout("A100-80GB", ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]) == (  # all-balanced
        MigSlot(0, "2g.20gb"), MigSlot(2, "1g.10gb"), MigSlot(3, "1g.10gb"), MigSlot(4, "3g.40gb"))
    with pytest.raises(InvalidRequestError) as e:
        validate_layout("A100-80GB", ["4g.40gb@0", "3g.40gb", "1g.10gb"])
    assert e.value.field == "layout.1g.10gb" and e.value.value == "4g.40gb@0 + 3g.40gb@4"
    with pytest.raises(InvalidRequestError) as e:
        target_from({"model": "A100-80GB", "layout": ["3g.40gb@1"]})
    assert e.value.field.endswith("layout.3g.40gb")
    with pytest.raises(InvalidRequestError) as e:
        target_from({"layout": ["7g.80gb"], "fill": "largest", "model": "A100-80GB"})
    assert "exactly one" in e.value.allowed
    with pytest.raises(InvalidRequestError) as e:
        target_from("dusk")
    assert e.value.field == "target" and "inference" in e.value.allowed


def test_a_lease_on_an_instance_the_new_layout_keeps_is_not_drained_and_inference_there_protects_nothing() -> None:
    c = Cluster()
    # GPU 3 is 4g.40gb@0 + 1g.10gb@4 + 1g.10gb@5 + 1g.20gb@6; the day layout keeps 4g@0 and 1g@4..5.
    day = MigTarget(name="day", model="A100-80GB", layout=("4g.40gb", "1g.10gb", "1g.10gb", "1g.10gb"),
                    nodes=("a100-1",), gpus=2)
    c.hold("big", "mig:4g.40gb", "training")  # GPU 3's 4g@0: kept
    c.hold("svc", "mig:1g.10gb", "inference")  # a 1g.10gb: GPU 2's @6 (kept there too) or GPU 3's @4 (kept)
    c.hold("odd", "mig:1g.20gb", "training")  # GPU 3's 1g.20gb@6: removed (1g.10gb@6 replaces it)
    plan = c.plan(day)
    drains = {(ch.node, ch.gpu_index): ch.drain for ch in plan.changes}
    assert drains[("a100-1", 3)] == ("odd",), drains  # neither the 4g run nor the inference replica moves
    assert plan.meets_target and "keeps" in next(ch.reason.text for ch in plan.changes if ch.gpu_index == 3)
    ch3 = next(ch for ch in plan.changes if ch.gpu_index == 3)
    assert ch3.kept == (MigSlot(0, "4g.40gb"), MigSlot(4, "1g.10gb"), MigSlot(5, "1g.10gb"))
    assert ch3.removed == (MigSlot(6, "1g.20gb"),) and ch3.added == (MigSlot(6, "1g.10gb"),)


def test_inference_on_an_instance_the_new_layout_removes_still_protects_its_gpu() -> None:
    c = Cluster()
    c.hold("svc", "mig:1g.20gb", "inference")  # GPU 3's 1g.20gb@6, which the day layout removes
    day = MigTarget(name="day", model="A100-80GB", layout=("4g.40gb", "1g.10gb", "1g.10gb", "1g.10gb"),
                    nodes=("a100-1",), gpus=2)
    plan = c.plan(day)
    assert _skipped(plan)[("a100-1", 3)] is Cause.REPARTITION_PROTECTED and not plan.meets_target
