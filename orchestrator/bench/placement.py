"""Placement throughput benchmark: a synthetic cluster filled by an openb-like request stream.

The cluster: ``nodes`` nodes of 8 GPUs, a mix of models; one node in ten
has two MIG-enabled cards (on-demand placements). The stream mirrors the
openb ``default`` pod list (about 13% CPU-only pods, 48% one whole GPU, 38%
a fraction of a GPU drawn from the trace's popular sizes, 1% multi-GPU) plus
a few MIG slices and MPS shares. Requests are placed one by one (``place``
then ``apply``) until the cluster is full: 500 requests in a row found no
room, or the arrived GPU request reached 100% of capacity.

Timing covers exactly what a scheduler does per request: the decision and
the ledger update. Generating the stream is not timed.

A placements-per-second figure moves with the machine (the same code reads
531 to 2,100/s on the machines this project has run on), so
:func:`run_with_reference` also runs a *reference* policy (``random``: a
uniformly random feasible node, the cheapest score there is) on the same
cluster and stream in the same process, right after, and reports the
policy's speed as a ratio to it (``ratio_to_reference``); that ratio is what
the project holds the policy to (``default`` >= 0.5 x ``random``, issue #16).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchestrator.core.stats import quantile
from orchestrator.core.request import GpuRequest
from orchestrator.scheduling.engine import Placement, place
from orchestrator.scheduling.fragmentation import TaskType
from orchestrator.scheduling.policies import get_policy
from orchestrator.scheduling.snapshot import ClusterSnapshot, NodeSpec

# (model, share of nodes, cpu milli, memory MiB, MIG-capable)
_NODE_MIX = (
    ("A100-80GB", 0.30, 128_000, 1_048_576, True),
    ("H100-80GB", 0.20, 192_000, 2_097_152, True),
    ("V100M32", 0.20, 96_000, 393_216, False),
    ("T4", 0.15, 64_000, 262_144, False),
    ("G2", 0.15, 96_000, 786_432, False),
)
# openb default: fractional gpu_milli values and their weights (top of the trace's histogram).
_FRACTIONS = ((810, 1078), (470, 750), (320, 328), (650, 253), (230, 140), (460, 128), (590, 75),
              (160, 74), (550, 72), (220, 62), (370, 47), (110, 24), (480, 19), (50, 7))


def build_cluster(nodes: int, seed: int = 0) -> ClusterSnapshot:
    rng = np.random.default_rng(seed)
    shares = np.array([m[1] for m in _NODE_MIX])
    picks = rng.choice(len(_NODE_MIX), size=nodes, p=shares / shares.sum())
    specs = []
    for i, k in enumerate(picks):
        model, _, cpu, mem, mig = _NODE_MIX[k]
        specs.append(NodeSpec(f"node-{i:05d}", model, 8, cpu_milli=cpu, memory_mib=mem,
                              mig_enabled=(6, 7) if (mig and i % 10 == 0) else ()))
    return ClusterSnapshot.build(specs)


def request_stream(n: int, seed: int = 1) -> list[GpuRequest]:
    """``n`` requests drawn like the openb default list (see the module docstring)."""
    rng = np.random.default_rng(seed)
    fr_vals = np.array([f for f, _ in _FRACTIONS])
    fr_w = np.array([w for _, w in _FRACTIONS], dtype=float)
    fr_w /= fr_w.sum()
    kinds = rng.choice(7, size=n, p=[0.13, 0.46, 0.34, 0.01, 0.02, 0.02, 0.02])
    out: list[GpuRequest] = []
    for k in kinds:
        cpu = int(rng.choice([1000, 2000, 4000, 6000, 8000, 12000, 16000]))
        mem = int(rng.choice([2048, 4096, 8192, 12288, 16384, 32768]))
        common = dict(cpu_milli=cpu, host_memory_mib=mem)
        if k == 0:
            r = GpuRequest.whole(0, **common)
        elif k == 1:
            r = GpuRequest.whole(1, **common)
        elif k == 2:
            r = GpuRequest.timeslice(float(rng.choice(fr_vals, p=fr_w)) / 1000, **common)
        elif k == 3:
            r = GpuRequest.whole(int(rng.choice([2, 4, 8])), **common)
        elif k == 4:
            r = GpuRequest.mig(str(rng.choice(["1g.10gb", "2g.20gb", "3g.40gb"])), **common)
        elif k == 5:
            r = GpuRequest.mps(int(rng.choice([20, 30, 50])), **common)
        else:
            r = GpuRequest(memory_mib=int(rng.choice([8192, 16384])), compute=float(rng.choice([0.1, 0.25])),
                           isolation=str(rng.choice(["hard", "soft", "none"])), **common)
        out.append(r)
    return out


def stream_workload(stream: list[GpuRequest], coverage: float = 0.95) -> tuple:
    """FGD's target workload for a stream: its most frequent task shapes covering ``coverage``
    of the requests, popularity-weighted (the paper's *typical pods*)."""
    counts: Counter = Counter()
    for r in stream:
        try:
            counts[TaskType.of(r)] += 1
        except TypeError:  # MIG and unified requests have no share-of-a-card shape
            continue
    total = sum(counts.values())
    kept, cum = [], 0
    for t, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if cum >= coverage * total:
            break
        kept.append((t, n / total))
        cum += n
    return tuple(kept)


def _gpu_demand(r: GpuRequest) -> float:
    if r.kind is None:
        return r.compute or 0.1
    return {"whole": r.count, "timeslice": r.fraction or 0, "mps": (r.sm_percent or 0) / 100,
            "mig": 0.3}.get(r.kind.value, 1.0)


@dataclass
class BenchResult:
    nodes: int
    gpus: int
    policy: str
    placements: int
    unschedulable: int
    placements_per_s: float
    decisions_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    allocation_pct: float
    wall_s: float
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def run(nodes: int, policy: str = "default", seed: int = 0, max_fail_streak: int = 500) -> BenchResult:
    snap = build_cluster(nodes, seed)
    cap_gpus = int(snap.static.present.sum())
    rng = np.random.default_rng(seed + 7)
    stream = request_stream(int(cap_gpus * 2.2), seed + 1)
    pol = get_policy(policy, workload=stream_workload(stream)) if policy in ("fgd", "default") else get_policy(policy)
    lat: list[float] = []
    placed = failed = streak = 0
    arrived = 0.0
    t_all = time.perf_counter()
    for r in stream:
        t0 = time.perf_counter()
        res = place(snap, r, pol, rng=rng)
        if isinstance(res, Placement):
            snap = snap.apply(res.allocation)
            placed += 1
            streak = 0
        else:
            failed += 1
            streak += 1
        lat.append(time.perf_counter() - t0)
        arrived += _gpu_demand(r)
        if streak >= max_fail_streak or arrived >= cap_gpus:
            break
    wall = time.perf_counter() - t_all
    ms = np.array(lat) * 1000
    return BenchResult(
        nodes=nodes, gpus=cap_gpus, policy=pol.name, placements=placed, unschedulable=failed,
        placements_per_s=placed / wall, decisions_per_s=len(lat) / wall,
        p50_ms=quantile(ms.tolist(), 0.5) or 0.0, p99_ms=quantile(ms.tolist(), 0.99) or 0.0, max_ms=float(ms.max()),
        allocation_pct=100 * snap.allocated_milli() / snap.capacity_milli(), wall_s=wall, seed=seed,
    )


REFERENCE_POLICY = "random"


def run_with_reference(nodes: int, policy: str = "default", seed: int = 0,
                       reference: str = REFERENCE_POLICY) -> dict[str, Any]:
    """:func:`run` for ``policy`` then for ``reference`` (same cluster, stream and seed), as one dict:
    the policy's fields plus ``reference_policy``, ``reference_placements_per_s``,
    ``reference_p99_ms`` and ``ratio_to_reference`` (policy / reference placements per second)."""
    res = run(nodes, policy, seed)
    ref = run(nodes, reference, seed)
    d = res.to_dict()
    d.update(reference_policy=ref.policy, reference_placements_per_s=round(ref.placements_per_s, 4),
             reference_p99_ms=round(ref.p99_ms, 4),
             ratio_to_reference=round(res.placements_per_s / ref.placements_per_s, 4))
    return d
