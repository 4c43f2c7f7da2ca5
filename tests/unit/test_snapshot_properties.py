"""Property tests of the placement engine's invariants.

For random clusters and random sequences of placements and releases, an
independent reference ledger (plain dicts, built from the allocations alone)
must agree with the snapshot, and the reference must never show an
over-committed GPU: whole cards exclusive, MIG instances disjoint and at
valid placements (and only at the fixed layout's slots where there is one),
MPS SM shares <= 100% and memory <= the card, time-slices within the
configured oversubscription, node CPU and memory within capacity. Releasing
everything restores the original snapshot exactly.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.core.catalogue import MIG_COMPUTE_SLICES, gpu_model
from orchestrator.core.request import GpuRequest, ShareKind
from orchestrator.scheduling.engine import Placement, place
from orchestrator.scheduling.policies import get_policy
from orchestrator.scheduling.snapshot import ClusterSnapshot, Mode, NodeSpec

MODELS = ("A100-80GB", "H100-80GB", "A100-40GB", "T4", "P100")


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[NodeSpec], int]:
    specs = []
    for i in range(draw(st.integers(1, 4))):
        model = draw(st.sampled_from(MODELS))
        gpus = draw(st.integers(1, 4))
        mig = ()
        layout: tuple = ()
        if gpu_model(model).mig_capable:
            mig = tuple(sorted(draw(st.sets(st.integers(0, gpus - 1), max_size=gpus))))
            if mig and draw(st.booleans()):
                # A fixed layout on the first MIG card: a 3g at 0 and two 1g behind it (a valid mix).
                p = gpu_model(model).mig_profiles
                layout = ((mig[0], p[3].name, 0, f"MIG-{i}-a"), (mig[0], p[0].name, 4, f"MIG-{i}-b"),
                          (mig[0], p[0].name, 5, f"MIG-{i}-c"))
        specs.append(NodeSpec(f"n{i}", model, gpus, cpu_milli=draw(st.sampled_from([8000, 32000])),
                              memory_mib=65536, mig_enabled=mig, mig_layout=layout))
    return specs, draw(st.sampled_from([1000, 2000]))


def requests() -> st.SearchStrategy[GpuRequest]:
    common = dict(cpu_milli=st.sampled_from([0, 1000, 4000]), host_memory_mib=st.sampled_from([0, 8192]))
    return st.one_of(
        st.builds(GpuRequest.whole, st.integers(0, 3), **common),
        st.builds(GpuRequest.mig, st.sampled_from(["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "7g.80gb", "1g.5gb", "3g.20gb"]), **common),
        st.builds(GpuRequest.mps, st.integers(1, 100), st.one_of(st.none(), st.integers(0, 30000)), **common),
        st.builds(GpuRequest.timeslice, st.sampled_from([0.1, 0.25, 0.5, 0.75, 1.0]), **common),
        st.builds(lambda m, c, i: GpuRequest(memory_mib=m, compute=c, isolation=i),
                  st.sampled_from([0, 4096, 12288, 30000]), st.sampled_from([0.1, 0.3, 0.6]),
                  st.sampled_from(["hard", "soft", "none"])),
    )


def reference_check(snap: ClusterSnapshot, held: list) -> None:
    """Rebuild usage from the allocations alone, check it is legal and equals the snapshot."""
    stt = snap.static
    n, g = stt.n, stt.g
    holders = np.zeros((n, g), dtype=int)
    milli = np.zeros((n, g), dtype=int)
    mem = np.zeros((n, g), dtype=int)
    kinds: dict[tuple[int, int], set] = defaultdict(set)
    mig_slices: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    cpu = np.zeros(n, dtype=int)
    hmem = np.zeros(n, dtype=int)
    for a in held:
        cpu[a.node] += a.cpu_milli
        hmem[a.node] += a.host_memory_mib
        for j in a.gpus:
            holders[a.node, j] += 1
            kinds[(a.node, j)].add(a.kind)
            if a.kind is ShareKind.MIG:
                prof = gpu_model(a.model).profile(a.mig_profile)
                assert a.mig_start in prof.placements, "MIG instance at an invalid placement"
                assert stt.mig_enabled[a.node, j], "MIG slice on a card without MIG"
                if stt.mig_fixed[a.node, j]:
                    assert stt.mig_uuid.get((a.node, j, a.mig_start)) is not None, "MIG slice outside the fixed layout"
                mig_slices[(a.node, j)].append((a.mig_start, prof.memory_slices, prof.compute_slices))
                mem[a.node, j] += prof.memory_mib
            else:
                assert not stt.mig_enabled[a.node, j], "non-MIG share on a MIG card"
                milli[a.node, j] += a.milli
                mem[a.node, j] += a.memory_mib
    assert (cpu <= stt.cpu_total).all() and (hmem <= stt.mem_total).all(), "host over-committed"
    for (i, j), ks in kinds.items():
        assert len(ks) == 1, f"GPU {i}/{j} mixes sharing kinds {ks}"
        k = next(iter(ks))
        gmem = stt.gpu_memory[i]
        if k is ShareKind.WHOLE:
            assert holders[i, j] == 1, "whole card held twice"
        elif k is ShareKind.MPS:
            assert milli[i, j] <= 1000, "MPS SM shares over 100%"
            assert mem[i, j] <= gmem, "MPS memory limits over the card"
        elif k is ShareKind.TIMESLICE:
            assert milli[i, j] <= stt.timeslice_capacity_milli, "time-slices over the oversubscription"
            assert mem[i, j] <= gmem
        elif k is ShareKind.MIG:
            used = 0
            for start, size, _ in mig_slices[(i, j)]:
                mask = ((1 << size) - 1) << start
                assert not used & mask, "MIG instances overlap"
                used |= mask
            assert sum(c for *_, c in mig_slices[(i, j)]) <= MIG_COMPUTE_SLICES
            assert int(snap.mig_mask[i, j]) == used
    # The snapshot agrees with the reference.
    assert (snap.holders == holders).all()
    assert (np.where(stt.mig_enabled, 0, snap.used_milli) == milli).all()
    assert (snap.used_mem == mem).all()
    assert (snap.cpu_used == cpu).all() and (snap.mem_used == hmem).all()
    free_mode = (holders == 0) & ~stt.mig_enabled
    assert (snap.mode[free_mode] == Mode.FREE).all()


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cluster=clusters(), ops=st.lists(st.tuples(st.booleans(), requests(), st.integers(0, 10**6)), max_size=25),
       policy=st.sampled_from(["bestfit", "packing", "spread", "random", "dotproduct", "clustering"]))
def test_no_overcommit_and_release_restores(cluster, ops, policy) -> None:
    specs, ts_cap = cluster
    s0 = ClusterSnapshot.build(specs, timeslice_capacity_milli=ts_cap)
    pol = get_policy(policy)
    rng = np.random.default_rng(0)
    snap, held = s0, []
    for is_release, req, pick in ops:
        before = snap
        if is_release and held:
            a = held.pop(pick % len(held))
            snap = snap.release(a)
        else:
            res = place(snap, req, pol, rng=rng)
            assert before.same_state(snap), "place() changed its snapshot"
            if isinstance(res, Placement):
                snap = snap.apply(res.allocation)
                held.append(res.allocation)
            else:
                assert res.reasons, "an Unschedulable must say why"
                assert sum(c for *_, c in res.reasons) >= 1
        reference_check(snap, held)
    for a in reversed(held):
        snap = snap.release(a)
    assert snap.same_state(s0), "releasing everything must restore the original snapshot"
