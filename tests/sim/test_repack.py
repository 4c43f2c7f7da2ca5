"""Re-packing: a request that fits nowhere gets room by moving a share, or nothing changes."""

from __future__ import annotations

from orchestrator.core.request import GpuRequest
from orchestrator.scheduling.alternatives import resolve
from orchestrator.scheduling.engine import Placement, place
from orchestrator.scheduling.fgd import DefaultPolicy
from orchestrator.scheduling.fragmentation import TaskType
from orchestrator.scheduling.snapshot import ClusterSnapshot, NodeSpec
from orchestrator.sim.repack import Ledger, try_repack

WL = ((TaskType(1000, 300, 1), 0.5), (TaskType(1000, 700, 1), 0.5))


def setup() -> tuple[ClusterSnapshot, Ledger, dict, DefaultPolicy]:
    snap = ClusterSnapshot.build([NodeSpec("a", "T4", 1, cpu_milli=8000), NodeSpec("b", "T4", 1, cpu_milli=8000)])
    policy = DefaultPolicy(WL, repack=True)
    ledger, reqs = Ledger(), {}
    for pod, (frac, node) in enumerate([(0.6, "a"), (0.3, "b"), (0.3, "b")]):
        r = GpuRequest.timeslice(frac, cpu_milli=1000, node=node)
        res = place(snap, r, policy)
        assert isinstance(res, Placement)
        snap = snap.apply(res.allocation)
        ledger.add(pod, res.allocation)
        reqs[pod] = (GpuRequest.timeslice(frac, cpu_milli=1000), resolve(GpuRequest.timeslice(frac, cpu_milli=1000)))
    return snap, ledger, reqs, policy


def test_moving_one_share_makes_room() -> None:
    snap, ledger, reqs, policy = setup()
    want = GpuRequest.timeslice(0.7, cpu_milli=1000)
    assert not isinstance(place(snap, want, policy), Placement)
    done = try_repack(snap, want, resolve(want), policy, ledger, reqs)
    assert done is not None
    new, placement, moved = done
    assert len(moved) == 1 and moved[0][0] in (1, 2) and moved[0][1].node_name == "a"  # a 0.3 share joined the 0.6
    assert placement.allocation.node_name == "b" and ledger.migrations == 1
    assert new.allocated_milli() == 1900 and snap.allocated_milli() == 1200  # the old snapshot is untouched
    assert ledger.allocs[moved[0][0]].node_name == "a"


def test_no_room_changes_nothing() -> None:
    snap, ledger, reqs, policy = setup()
    want = GpuRequest.whole(2, cpu_milli=1000)  # no node has two cards
    assert try_repack(snap, want, resolve(want), policy, ledger, reqs) is None
    big = GpuRequest.timeslice(0.9, cpu_milli=1000)  # both 0.3 shares would have to fit a's 0.4 hole
    before = dict(ledger.allocs)
    assert try_repack(snap, big, resolve(big), policy, ledger, reqs) is None
    assert ledger.allocs == before and ledger.migrations == 0
