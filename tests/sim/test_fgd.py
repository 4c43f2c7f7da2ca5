"""FGD's fragmentation measure and the policies on the engine, on hand-checked cases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.core.catalogue import MODEL_NAMES
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.request import GpuRequest
from orchestrator.scheduling.engine import Placement, place
from orchestrator.scheduling.fgd import DefaultPolicy, FgdPolicy
from orchestrator.scheduling.fragmentation import (
    FragModel,
    TaskType,
    cpu_per_gpu_milli,
    normalise_workload,
    paper_score,
)
from orchestrator.scheduling.policies import get_policy
from orchestrator.scheduling.snapshot import ClusterSnapshot, NodeSpec
from orchestrator.sim.openb import load_pods
from orchestrator.sim.workload import typical_workload

T4 = MODEL_NAMES.index("T4")
P100 = MODEL_NAMES.index("P100")
# Half the pods want 0.5 GPU, a quarter one whole GPU on a P100 only, a quarter are CPU-only.
WL = normalise_workload([(TaskType(1000, 500, 1), 2), (TaskType(4000, 1000, 1, ("P100",)), 1), (TaskType(8000, 0, 0), 1)])


def frag(free: list[int], cpu: int = 32000, model: int = T4, wl=WL) -> float:
    fm = FragModel(wl, MODEL_NAMES)
    f = np.array([free])
    return float(fm.frag(f, np.ones_like(f, dtype=bool), np.array([cpu]), np.array([model]))[0])


def test_fragment_by_hand() -> None:
    # GPUs free 300 and 1000 on a T4: the 0.5-share type fits, its fragment is the 300;
    # the P100-only type cannot run here (all 1300 is fragment); CPU-only types use no GPU (all).
    assert frag([300, 1000]) == pytest.approx(0.5 * 300 + 0.25 * 1300 + 0.25 * 1300)
    # On a P100 the whole-GPU type fits and its fragment is the 300 too.
    assert frag([300, 1000], model=P100) == pytest.approx(0.5 * 300 + 0.25 * 300 + 0.25 * 1300)
    # Too little CPU for the 0.5-share type (needs 1000): all free GPU is fragment for it.
    assert frag([300, 1000], cpu=500) == pytest.approx(1300.0)
    # A node with nothing free has no fragment.
    assert frag([0, 0]) == 0.0


def test_paper_score_truncates_like_the_reference() -> None:
    # int64(sigmoid((before - after) / 1000) * 100), negated: delta 0 -> 50, small increases tie.
    assert paper_score(np.array([0.0]))[0] == -50
    assert paper_score(np.array([10.0, 30.0])).tolist() == [-49.0, -49.0]
    assert paper_score(np.array([-500.0]))[0] == -62


def test_workload_normalises_and_accepts_requests() -> None:
    wl = normalise_workload([(GpuRequest.timeslice(0.25, cpu_milli=100), 3), (GpuRequest.whole(0, cpu_milli=5), 1)])
    assert [p for _, p in wl] == [0.75, 0.25]
    assert wl[0][0] == TaskType(100, 250, 1) and wl[1][0] == TaskType(5, 0, 0)
    with pytest.raises(ValueError):
        normalise_workload([])


def test_typical_workload_of_the_tiny_trace(tiny: tuple[Path, Path]) -> None:
    wl = typical_workload(load_pods(tiny[1]), coverage=0.95)
    assert sum(p for _, p in wl) == pytest.approx(1.0)
    assert len(wl) == 7  # seven distinct shapes, one pod each: 95% needs all of them
    assert typical_workload(load_pods(tiny[1]), coverage=0.5)[0][1] == pytest.approx(1 / 4)


def snapshot() -> ClusterSnapshot:
    return ClusterSnapshot.build([NodeSpec("a", "T4", 2, cpu_milli=32000), NodeSpec("b", "T4", 2, cpu_milli=32000)])


def test_fgd_fills_the_partial_gpu_instead_of_opening_a_new_one() -> None:
    policy = FgdPolicy(WL)
    snap = snapshot()
    first = place(snap, GpuRequest.timeslice(0.5, cpu_milli=1000), policy)
    assert isinstance(first, Placement)
    snap = snap.apply(first.allocation)
    second = place(snap, GpuRequest.timeslice(0.5, cpu_milli=1000), policy)
    assert isinstance(second, Placement)
    # Completing the half-used GPU leaves no fragment; opening another GPU would.
    assert (second.allocation.node, second.allocation.gpus) == (first.allocation.node, first.allocation.gpus)


def test_fgd_node_memo_gives_the_fresh_answer() -> None:
    """The policy memoises node scores across snapshots; a fresh policy on a fresh build must agree."""
    rng = np.random.default_rng(7)
    reqs = [GpuRequest.timeslice(f, cpu_milli=c) for f, c in [(0.5, 1000), (0.3, 12000), (0.2, 1000)]]
    reqs.append(GpuRequest.whole(1, cpu_milli=2000))
    warm, snap, applied = FgdPolicy(WL), snapshot(), []
    for _ in range(8):
        r = reqs[int(rng.integers(len(reqs)))]
        got = place(snap, r, warm)
        fresh_snap = snapshot()
        for a in applied:
            fresh_snap = fresh_snap.apply(a)
        want = place(fresh_snap, r, FgdPolicy(WL))
        assert type(got) is type(want)
        if not isinstance(got, Placement):
            break
        assert (got.allocation.node, got.allocation.gpus, got.score) == (want.allocation.node, want.allocation.gpus, want.score)
        applied.append(got.allocation)
        snap = snap.apply(got.allocation)
    assert applied


def test_registry_builds_fgd_and_default() -> None:
    assert get_policy("fgd", workload=WL).name == "fgd"
    d = get_policy("default", workload=WL)
    assert d.name == "default" and d.frag_model.with_memory


# ---- default: FGD plus CPU stranding ------------------------------------------------------------------

def test_cpu_per_gpu_milli_by_hand() -> None:
    # GPU types: 0.5 x (1000 CPU, 500 milli) and 0.25 x (4000 CPU, 1000 milli); the CPU-only type is left out.
    assert cpu_per_gpu_milli(WL) == pytest.approx((0.5 * 1000 + 0.25 * 4000) / (0.5 * 500 + 0.25 * 1000))
    assert cpu_per_gpu_milli(normalise_workload([(TaskType(0, 500, 1), 1)])) == 0.0
    assert cpu_per_gpu_milli(normalise_workload([(TaskType(8000, 0, 0), 1)])) == 0.0


def cpu_tight_and_cpu_rich() -> ClusterSnapshot:
    # "a" comes first (FGD's ties go to it) but has 8 cores per card; "b" has 32.
    return ClusterSnapshot.build([NodeSpec("a", "T4", 2, cpu_milli=16000), NodeSpec("b", "T4", 2, cpu_milli=64000)])


def test_default_sends_cpu_only_pods_where_they_strand_no_gpu() -> None:
    snap, cpu_only = cpu_tight_and_cpu_rich(), GpuRequest.whole(0, cpu_milli=12000)
    # FGD: the 4 cores left on "a" still fit every typical GPU type, so both nodes score the same
    # and the first one wins -- although 4 cores feed only 1333 of a's 2000 free GPU-milli at 3 CPU-milli each.
    fgd = place(snap, cpu_only, FgdPolicy(WL))
    assert isinstance(fgd, Placement) and fgd.allocation.node_name == "a"
    ours = DefaultPolicy(WL)
    assert ours.stranded(np.array([2000.0]), np.array([4000.0])) == pytest.approx([2000 - 4000 / 3])
    got = place(snap, cpu_only, ours)
    assert isinstance(got, Placement) and got.allocation.node_name == "b"
    # The reason names the score's terms for the chosen node (on "a" the stranded term would be +667).
    assert got.reason.text.endswith("fragmentation +0 milli, CPU-stranded GPU +0 milli)")
    assert "fragmentation +0 milli)" in fgd.reason.text and "stranded" not in fgd.reason.text
    # Turned off, default is FGD with memory: node order decides again.
    off = place(snap, cpu_only, DefaultPolicy(WL, strand_weight=0))
    assert isinstance(off, Placement) and off.allocation.node_name == "a"


def test_default_keeps_gpu_pods_consolidated_when_nothing_strands() -> None:
    # A light share strands nothing anywhere: FGD's answer (first node, and the same card next) stands.
    snap, policy = cpu_tight_and_cpu_rich(), DefaultPolicy(WL)
    first = place(snap, GpuRequest.timeslice(0.5, cpu_milli=1000), policy)
    assert isinstance(first, Placement) and first.allocation.node_name == "a"
    second = place(snap.apply(first.allocation), GpuRequest.timeslice(0.5, cpu_milli=1000), policy)
    assert isinstance(second, Placement) and second.allocation.gpus == first.allocation.gpus


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
@pytest.mark.parametrize("name", ["strand_weight", "scarcity_weight"])
def test_default_rejects_a_bad_weight(name: str, bad: float) -> None:
    with pytest.raises(InvalidRequestError, match=f"{name}.*finite number >= 0"):
        DefaultPolicy(WL, **{name: bad})


# ---- default: the scarcity of constrained models ---------------------------------------------------------

def scarce_p100_and_cpu_tight_t4() -> ClusterSnapshot:
    # WL's P100-only type is half its GPU demand and P100 half the GPUs here: P100's scarcity is 1.
    return ClusterSnapshot.build([NodeSpec("t", "T4", 2, cpu_milli=10000), NodeSpec("p", "P100", 2, cpu_milli=64000)])


def test_scarcity_by_hand() -> None:
    st = scarce_p100_and_cpu_tight_t4().static
    sc, floor = DefaultPolicy(WL).scarcity(st)
    assert (sc[P100], sc[T4], floor) == (1.0, 0.0, 0.0)
    # Twice the P100 capacity: the constrained half of the demand claims half of it.
    big = ClusterSnapshot.build([NodeSpec("t", "T4", 2), NodeSpec("p", "P100", 2), NodeSpec("q", "P100", 2)]).static
    assert DefaultPolicy(WL).scarcity(big)[0][P100] == pytest.approx(0.5 / (4 / 6))
    # No constrained type in the workload: no term at all.
    free = normalise_workload([(TaskType(1000, 500, 1), 1)])
    assert not DefaultPolicy(free).scarcity(st)[0].any()


def test_default_keeps_unconstrained_shares_off_a_scarce_model() -> None:
    snap, share = scarce_p100_and_cpu_tight_t4(), GpuRequest.timeslice(0.5, cpu_milli=6000)
    # The stranding term alone sends the CPU-heavy share to the CPU-rich P100 node (on "t" the 4 cores
    # left feed 1333 of 1500 free milli) -- and so takes a card that P100-only pods need.
    alone = place(snap, share, DefaultPolicy(WL, scarcity_weight=0))
    assert isinstance(alone, Placement) and alone.allocation.node_name == "p"
    got = place(snap, share, DefaultPolicy(WL))
    assert isinstance(got, Placement) and got.allocation.node_name == "t"
    assert got.reason.text.endswith("CPU-stranded GPU +167 milli, scarce-model GPU +0 milli)")
    # A P100-only pod pays nothing for its own model.
    own = place(snap, GpuRequest.timeslice(0.5, cpu_milli=6000, models=("P100",)), DefaultPolicy(WL))
    assert isinstance(own, Placement) and own.allocation.node_name == "p" and "scarce-model GPU +0 milli" in own.reason.text


def test_frag_tables_levels_agree_with_the_model_with_and_without_lookup_tables() -> None:
    wl = normalise_workload([(TaskType(1000, 500, 1, memory_mib=2048), 2), (TaskType(4000, 1000, 1, memory_mib=8192), 1)])
    policy = DefaultPolicy(wl)
    t = policy.tables(snapshot().static)
    rng = np.random.default_rng(3)
    cpu, mem = rng.integers(0, 32001, 200), rng.integers(0, 262145, 200)
    want = policy.frag_model.levels(cpu, mem)
    assert t._lut_c is not None and t._lut_m is not None  # noqa: SLF001
    assert (t.levels(cpu, mem) == want).all()
    t._lut_m = None  # noqa: SLF001 - as for a memory grid too fine for a table
    assert (t.levels(cpu, mem) == want).all()


def test_stranding_fades_where_the_workload_asks_more_cpu_per_gpu_than_the_cluster_has() -> None:
    # WL asks 3 CPU-milli per GPU-milli; 2 GPUs with 4, 7.5 and 16 cores: c / r = 0.67, 1.25, 2.67.
    ours = DefaultPolicy(WL)
    on = lambda cpu: ours.strand_weight_on(ClusterSnapshot.build([NodeSpec("a", "T4", 2, cpu_milli=cpu)]).static)  # noqa: E731
    assert (on(4000), on(7500), on(16000)) == (0.0, pytest.approx(1.0), 2.0)


# ---- default: nodes that host-bound types need ----------------------------------------------------------

# FGD's typical pods: only 1-GPU pods. The demand adds a rare 8-GPU pod asking 120 cores, which only
# a 128-core node can hold (as openb's 39 G3 nodes among 617 eight-GPU nodes).
SMALL_WL = normalise_workload([(TaskType(4000, 1000, 1), 1)])
BIG_DEMAND = normalise_workload([(TaskType(4000, 1000, 1), 9), (TaskType(120000, 1000, 8), 1)])


def big_and_small_8gpu() -> ClusterSnapshot:
    # "big" first: on equal scores the first node in order wins.
    return ClusterSnapshot.build([NodeSpec("big", "G3", 8, cpu_milli=128000), NodeSpec("small", "G2", 8, cpu_milli=96000)])


def test_host_scarcity_by_hand() -> None:
    st = big_and_small_8gpu().static
    policy = DefaultPolicy(SMALL_WL, demand=BIG_DEMAND)
    # The 8-GPU type is 800 / 1700 of the GPU demand, fits half the GPUs (big) of the 16 with its
    # count: its claim beyond an even spread is 0.47 x 16 x (1/8 - 1/16) = 0.47 on big, 0 on small.
    assert policy.host_scarcity(st).tolist() == pytest.approx([800 / 1700, 0.0])
    # Unconstrained types add nothing; without the rare type in the demand there is no term at all.
    assert not DefaultPolicy(SMALL_WL).host_scarcity(st).any()
    # The 1-GPU pod could use small (0): its floor is 0; the 8-GPU pod's only node is big: it pays nothing.
    assert policy.scarcity_floor(st, GpuRequest.whole(1, cpu_milli=4000)) == 0.0
    assert policy.scarcity_floor(st, GpuRequest.whole(8, cpu_milli=120000)) == pytest.approx(800 / 1700)


def test_default_keeps_small_pods_off_the_only_node_a_big_pod_fits() -> None:
    snap, pod = big_and_small_8gpu(), GpuRequest.whole(1, cpu_milli=4000)
    # Without the term the pod takes the first node, and the 8-GPU 120-core pod then fits nowhere.
    off = place(snap, pod, DefaultPolicy(SMALL_WL, demand=BIG_DEMAND, scarcity_weight=0))
    assert isinstance(off, Placement) and off.allocation.node_name == "big"
    got = place(snap, pod, DefaultPolicy(SMALL_WL, demand=BIG_DEMAND))
    assert isinstance(got, Placement) and got.allocation.node_name == "small"
    assert "scarce-model GPU +0 milli" in got.reason.text
    big = place(snap.apply(got.allocation), GpuRequest.whole(8, cpu_milli=120000), DefaultPolicy(SMALL_WL, demand=BIG_DEMAND))
    assert isinstance(big, Placement) and big.allocation.node_name == "big"


def test_host_scarcity_fades_with_the_stranding_term() -> None:
    # Typical pods asking 20 cores per GPU on a cluster of 14 per GPU: stranding is off (c / r < 1),
    # and so is the host term that offsets its pull towards CPU-rich nodes.
    hungry = normalise_workload([(TaskType(20000, 1000, 1), 1)])
    st = big_and_small_8gpu().static
    policy = DefaultPolicy(hungry, demand=BIG_DEMAND)
    assert policy.strand_weight_on(st) == 0.0 and not policy.host_scarcity(st).any()
    assert DefaultPolicy(SMALL_WL, demand=BIG_DEMAND).host_scarcity(st).any()


def test_default_keeps_cpu_only_pods_off_the_only_node_a_big_pod_fits() -> None:
    # A CPU-only pod takes no GPU but 20 of the cores the 120-core 8-GPU pod needs on "big".
    snap, pod = big_and_small_8gpu(), GpuRequest.whole(0, cpu_milli=20000)
    off = place(snap, pod, DefaultPolicy(SMALL_WL, demand=BIG_DEMAND, scarcity_weight=0))
    assert isinstance(off, Placement) and off.allocation.node_name == "big"
    got = place(snap, pod, DefaultPolicy(SMALL_WL, demand=BIG_DEMAND))
    assert isinstance(got, Placement) and got.allocation.node_name == "small"
