"""Policies: FGD's table decomposition against the per-type definition, the built-in workload,
and the paper's baselines on hand-checked cases."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.core.catalogue import MODEL_NAMES
from orchestrator.core.priorities import POLICY_NAMES
from orchestrator.core.request import GpuRequest
from orchestrator.scheduling.engine import Placement, place
from orchestrator.scheduling.fragmentation import (
    FragModel,
    TaskType,
    normalise_workload,
)
from orchestrator.scheduling.policies import get_policy
from orchestrator.scheduling.policy import Capabilities, PlacementPolicy
from orchestrator.scheduling.snapshot import ClusterSnapshot, NodeSpec
from orchestrator.scheduling.workloads import DEFAULT_WORKLOAD

T4, V100 = MODEL_NAMES.index("T4"), MODEL_NAMES.index("V100M32")


def naive_frag(wl, free, cpu, mem, model, with_memory) -> float:
    """The fragment as the reference simulator states it, one task type at a time."""
    total = float(sum(free))
    out = 0.0
    for t, p in wl:
        if t.gpu_milli <= 0:
            out += p * total
            continue
        ok_gpus = [f for f in free if f >= t.gpu_milli]
        fits = (len(ok_gpus) >= t.gpu_count and cpu >= t.cpu_milli and (not with_memory or mem >= t.memory_mib)
                and (not t.models or MODEL_NAMES[model] in t.models))
        out += p * (sum(f for f in free if f < t.gpu_milli) if fits else total)
    return out


@pytest.mark.parametrize("with_memory", [False, True])
def test_frag_decomposition_equals_the_per_type_definition(with_memory: bool) -> None:
    rng = np.random.default_rng(3)
    wl = normalise_workload([(TaskType(int(rng.choice([1000, 4000, 8000, 16000])), int(rng.choice([0, 250, 500, 810, 1000])),
                                       int(rng.choice([1, 2])), ("T4",) if rng.random() < 0.2 else (),
                                       int(rng.choice([2048, 8192, 65536]))), float(rng.random())) for _ in range(40)])
    fm = FragModel(wl, MODEL_NAMES, with_memory=with_memory)
    free = rng.choice([0, 90, 250, 500, 730, 1000], size=(200, 4))
    cpu = rng.integers(0, 20000, size=200)
    mem = rng.integers(0, 70000, size=200)
    model = rng.choice([T4, V100], size=200)
    got = fm.frag(free, np.ones_like(free, dtype=bool), cpu, model, mem)
    want = [naive_frag(wl, list(free[i]), cpu[i], mem[i], model[i], with_memory) for i in range(200)]
    assert got == pytest.approx(want, abs=1e-5)


def test_fgd_and_default_work_without_a_workload() -> None:
    assert len(DEFAULT_WORKLOAD) == 35 and sum(p for _, p in DEFAULT_WORKLOAD) == pytest.approx(1.0)
    s = ClusterSnapshot.build([NodeSpec(f"n{i}", "T4", 4) for i in range(3)])
    for name in ("fgd", "default"):
        p = get_policy(name)
        assert p.workload == DEFAULT_WORKLOAD
        first = place(s, GpuRequest.timeslice(0.5, cpu_milli=1000), p)
        assert isinstance(first, Placement)
        second = place(s.apply(first.allocation), GpuRequest.timeslice(0.5, cpu_milli=1000), p)
        assert isinstance(second, Placement)
        assert (second.allocation.node, second.allocation.gpus) == (first.allocation.node, first.allocation.gpus)


def test_policies_with_equal_parameters_share_a_small_key() -> None:
    a, b = get_policy("fgd"), get_policy("fgd")
    assert a.key == b.key and len(a.key) == 2
    assert get_policy("default").key != a.key


def two_nodes() -> ClusterSnapshot:
    return ClusterSnapshot.build([NodeSpec("a", "T4", 2, cpu_milli=64000), NodeSpec("b", "T4", 2, cpu_milli=64000)])


def test_bestfit_by_the_paper_formula() -> None:
    s = two_nodes()
    s = s.apply(place(s, GpuRequest.timeslice(0.3, cpu_milli=8000), get_policy("bestfit")).allocation)
    # Node a: 56 cores and 1700 milli free. 1 - (0.5*(56000-4000)/128000 + 0.5*(1700-500)/8000) = 0.7219 -> 72.
    p = place(s, GpuRequest.timeslice(0.5, cpu_milli=4000), get_policy("bestfit"))
    assert p.allocation.node_name == "a" and p.score == -72
    assert p.allocation.gpus == (0,)  # the tightest GPU that fits (700 free) rather than the idle one


def test_packing_tiers_and_cpu_only_ties() -> None:
    s = two_nodes()
    pack = get_policy("packing")
    a = place(s, GpuRequest.timeslice(0.3), pack)
    assert a.allocation.node_name == "a" and a.score == -31  # idle node: 33 - 2 GPUs
    s = s.apply(a.allocation)
    b = place(s, GpuRequest.timeslice(0.3), pack)
    assert (b.allocation.node_name, b.allocation.gpus) == ("a", (0,)) and b.score == -93  # shared GPU: 100 - 70/10
    w = place(s, GpuRequest.whole(1), pack)
    assert w.allocation.node_name == "a" and w.score == -49  # a free card on a used node: 50 - 1
    assert place(s, GpuRequest.whole(0, cpu_milli=1000), pack).score == 0


def test_clustering_prefers_the_same_category() -> None:
    s = two_nodes()
    clu = get_policy("clustering")
    s = s.apply(place(s, GpuRequest.whole(1, node="a"), clu).allocation)
    share = place(s, GpuRequest.timeslice(0.5), clu)
    assert share.allocation.node_name == "b"  # idle node (25-50) beats another category (0-25)
    whole = place(s, GpuRequest.whole(1), clu)
    assert whole.allocation.node_name == "a" and whole.score == -(75 + 25 * (8000 - 1000) // 8000)


def test_random_picks_random_gpus_with_a_seed_and_is_reproducible() -> None:
    s = ClusterSnapshot.build([NodeSpec("a", "T4", 8)])
    pick = lambda seed: place(s, GpuRequest.timeslice(0.2), get_policy("random"),  # noqa: E731
                              rng=np.random.default_rng(seed)).allocation.gpus
    assert pick(5) == pick(5)
    assert len({pick(k) for k in range(30)}) > 3


@pytest.mark.parametrize("name", sorted(POLICY_NAMES))
def test_every_policy_meets_the_contract_and_declares_its_capabilities(name: str) -> None:
    p = get_policy(name)
    assert isinstance(p, PlacementPolicy) and isinstance(p.capabilities, Capabilities)
    assert p.capabilities.node_context == (name in ("bestfit", "dotproduct", "fgd", "default"))
    assert p.capabilities.random_slot == (name == "random")
    assert not p.capabilities.repack
    assert get_policy("default", repack=True).capabilities.repack


def test_memos_live_in_the_family_cache_only() -> None:
    """Engine and policies keep their tables in the snapshot family's one cache, attached nowhere else."""
    snap = ClusterSnapshot.build([NodeSpec("a", "T4", 2), NodeSpec("b", "V100M32", 4)])
    attrs = set(vars(snap.static))
    for name in ("fgd", "default", "bestfit", "dotproduct"):
        res = place(snap, GpuRequest.timeslice(0.5, cpu_milli=1000), get_policy(name))
        assert isinstance(res, Placement)
        snap = snap.apply(res.allocation)
    assert set(vars(snap.static)) == attrs
    owners = {key[0] for key in snap.static._caches}  # noqa: SLF001 - what the cache holds, by owner
    assert owners == {"engine", "fgd", "candidates.free_totals"}
