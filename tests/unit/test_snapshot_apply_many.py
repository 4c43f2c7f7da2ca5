"""ClusterSnapshot.apply_many (the head's rebuild) leaves what successive apply() calls leave, misfits skipped."""

from __future__ import annotations

import random

from orchestrator.core.errors import CapacityError
from orchestrator.core.request import GpuRequest
from orchestrator.scheduling.engine import Placement, place
from orchestrator.scheduling.policies import get_policy
from orchestrator.scheduling.snapshot import ClusterSnapshot, NodeSpec

FORMS = ("1", "2", "mps:30%,10GiB", "timeslice:0.5", "mig:1g.10gb", "mig:3g.40gb")


def _fill(empty: ClusterSnapshot, rng: random.Random) -> list:
    snap, allocs = empty, []
    for _ in range(40):  # fill the cluster as the head would
        req = GpuRequest.parse(rng.choice(FORMS)).model_copy(update={"cpu_milli": rng.choice((0, 8000, 30000))})
        res = place(snap, req, get_policy("bestfit"))
        if isinstance(res, Placement):
            snap = snap.apply(res.allocation)
            allocs.append(res.allocation)
    return allocs


def test_apply_many_equals_successive_applies_and_names_the_misfits() -> None:
    nodes = [NodeSpec(f"n{i}", "A100-80GB", 4, mig_enabled=(0,) if i % 2 else ()) for i in range(6)]
    empty = ClusterSnapshot.build(nodes)
    for seed in range(20):
        rng = random.Random(seed)
        # two clusters' worth of placements replayed on one: some no longer fit, part-way through a
        # multi-GPU one or on host CPU, as leases whose devices vanished would not
        replay = _fill(empty, rng) + _fill(empty, rng)
        rng.shuffle(replay)
        one, expect_failed = empty, []
        for k, a in enumerate(replay):
            try:
                one = one.apply(a)
            except CapacityError:
                expect_failed.append(k)
        many, failed = empty.apply_many(replay)
        assert failed == expect_failed and expect_failed  # the duplicates cannot all fit
        assert many.same_state(one)
        assert int(empty.cpu_used.sum()) == 0 and empty.allocated_milli() == 0  # the receiver is unchanged
