"""Arrival replay: the FGD paper's experiment on an openb pod list.

One run (``replay``) is one policy and one seed:

1. **order** the pods -- the reference simulator's artifact shuffles them
   with the seed (``--shuffle-pod=true`` in ``generate_run_scripts.py``);
   ``order="trace"`` keeps the file's order instead;
2. **resample** until the arrived GPU request reaches ``target_pct`` of the
   cluster's GPU capacity: pods drawn uniformly with the seed from the list
   are appended, stopping before the draw that would pass the target
   (``TunePodsByNodeTotalResource``); a list already above the target has
   random pods removed;
3. **permute the nodes** with the seed: the reference simulator renames its
   nodes ``NNNN-<name>`` with a seeded permutation and its scores' ties go
   to the first node in that order; we build the snapshot in that order and
   let the engine take the lowest index among equal scores (``random``
   alone samples its ties, as the paper's Random does);
4. **place** each pod in turn, no departures; a pod that fits nowhere is
   dropped (counted in ``failed``). Node CPU, host memory, GPU model
   constraints and all-or-nothing multi-GPU requests are the engine's checks;
5. **measure** at every ``step_pct`` of arrival from 0 to ``target_pct``:
   the allocation ratio (allocated GPU-milli / total GPU-milli, %) and the
   fragmentation rate (fragmented / idle GPU-milli, %, against the pod list's
   typical workload); a checkpoint is the state after the last pod whose
   arrival does not pass it, so the last one is the final state.

Same inputs and seed, same result: every random choice comes from
``numpy.random.default_rng(seed)``, split into independent streams.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from orchestrator.core.catalogue import MODEL_NAMES
from orchestrator.core.request import GpuRequest, ResolvedRequest
from orchestrator.scheduling.alternatives import resolve
from orchestrator.scheduling.engine import Placement, place
from orchestrator.scheduling.fragmentation import FragModel, Workload
from orchestrator.scheduling.policies import get_policy
from orchestrator.scheduling.policy import PlacementPolicy
from orchestrator.scheduling.snapshot import ClusterSnapshot, NodeSpec
from orchestrator.sim.curve import curve_stats
from orchestrator.sim.openb import MILLI, NodeTable, PodTable, load_nodes, load_pods
from orchestrator.sim.repack import Ledger, try_repack
from orchestrator.sim.workload import typical_workload

PAPER_POLICIES: tuple[str, ...] = ("random", "bestfit", "dotproduct", "packing", "clustering", "fgd", "default")
ORDERS = ("shuffled", "trace")


@dataclass(frozen=True)
class ArrivalResult:
    """One policy, one seed. Percentages are of the cluster's GPU-milli."""

    policy: str
    seed: int
    checkpoints: tuple[int, ...]
    allocation_pct: tuple[float, ...]
    fragmentation_pct: tuple[float, ...]
    unallocated_gpus: float
    pods: int
    placed: int
    failed: int
    failed_gpu_milli: int
    wall_s: float
    migrations: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "seed": self.seed,
            "allocation_pct": {str(k): round(v, 4) for k, v in zip(self.checkpoints, self.allocation_pct)},
            "fragmentation_pct": {str(k): round(v, 4) for k, v in zip(self.checkpoints, self.fragmentation_pct)},
            "unallocated_gpus_at_end": round(self.unallocated_gpus, 3),
            "pods": self.pods, "placed": self.placed, "failed": self.failed,
            "failed_gpu_milli": self.failed_gpu_milli, "migrations": self.migrations, "wall_s": round(self.wall_s, 3),
        }


@dataclass(frozen=True)
class ArrivalSummary:
    """The mean over seeds of one policy's runs (what the CLI prints)."""

    policy: str
    seeds: tuple[int, ...]
    checkpoints: tuple[int, ...]
    allocation_pct: tuple[float, ...]
    allocation_std: tuple[float, ...]
    fragmentation_pct: tuple[float, ...]
    unallocated_gpus: float
    failed: float
    wall_s: float
    migrations: float = 0.0
    runs: tuple[ArrivalResult, ...] = field(repr=False, default=())

    @classmethod
    def of(cls, runs: list[ArrivalResult]) -> "ArrivalSummary":
        if not runs:
            raise ValueError("no runs to summarise")
        a = np.array([r.allocation_pct for r in runs])
        f = np.array([r.fragmentation_pct for r in runs])
        return cls(runs[0].policy, tuple(r.seed for r in runs), runs[0].checkpoints, tuple(a.mean(0)),
                   tuple(a.std(0)), tuple(f.mean(0)), float(np.mean([r.unallocated_gpus for r in runs])),
                   float(np.mean([r.failed for r in runs])), float(sum(r.wall_s for r in runs)),
                   float(np.mean([r.migrations for r in runs])), tuple(sorted(runs, key=lambda r: r.seed)))

    @property
    def auc(self) -> float | None:
        """Mean over seeds of the area under the curve, 50-130% (see :mod:`orchestrator.sim.curve`)."""
        cs = curve_stats(self.policy, self.runs) if self.runs else None
        return cs.auc.mean if cs is not None and cs.auc is not None else None

    def at(self, step: int) -> list[int]:
        """Indices of the checkpoints that are multiples of ``step`` (always including the last)."""
        last = len(self.checkpoints) - 1
        return [i for i, k in enumerate(self.checkpoints) if k % step == 0 or i == last]

    def to_dict(self, per_seed: bool = False, step: int = 10) -> dict[str, Any]:
        key = str(self.checkpoints[-1])
        sel = self.at(step)
        pick = lambda vals: {str(self.checkpoints[i]): round(vals[i], 4) for i in sel}  # noqa: E731
        d: dict[str, Any] = {
            "policy": self.policy, "seeds": len(self.seeds), "seed_values": list(self.seeds),
            "allocation_pct": pick(self.allocation_pct),
            "allocation_std": pick(self.allocation_std),
            "fragmentation_pct": pick(self.fragmentation_pct),
            f"unallocated_gpus_at_{key}": round(self.unallocated_gpus, 3),
            "failed_pods": round(self.failed, 2), "migrations": round(self.migrations, 2),
            "cpu_s": round(self.wall_s, 2),
        }
        if self.runs:
            cs = curve_stats(self.policy, self.runs)
            d["curve"] = {str(k): round(v.mean, 4) for k, v in cs.points.items()}
            d["curve_std"] = {str(k): round(v.sd, 4) for k, v in cs.points.items()}
            d["auc_50_130"] = round(cs.auc.mean, 4) if cs.auc else None
            d["auc_std"] = round(cs.auc.sd, 4) if cs.auc else None
        if per_seed:
            d["runs"] = [r.to_dict() for r in self.runs]
        return d


# ---- inputs -----------------------------------------------------------------------------------------

def node_specs(nodes: NodeTable, order: np.ndarray | None = None) -> list[NodeSpec]:
    """Engine node specs of a node list, in ``order`` (default: the file's)."""
    idx = range(len(nodes)) if order is None else order
    return [NodeSpec(name=nodes.name[i], model=nodes.model[i] or None, gpus=int(nodes.gpus[i]),
                     cpu_milli=int(nodes.cpu_milli[i]), memory_mib=int(nodes.memory_mib[i])) for i in idx]


def pod_request(cpu_milli: int, memory_mib: int, num_gpu: int, gpu_milli: int, models: tuple[str, ...]) -> GpuRequest:
    """The engine request of one openb pod (see the module docstring of :mod:`orchestrator.sim.openb`)."""
    kw: dict[str, Any] = dict(cpu_milli=cpu_milli, host_memory_mib=memory_mib, models=models)
    if num_gpu == 0:
        return GpuRequest.whole(0, **kw)
    if gpu_milli < MILLI:
        return GpuRequest.timeslice(gpu_milli / MILLI, **kw)
    return GpuRequest.whole(num_gpu, **kw)


def pod_shapes(pods: PodTable) -> tuple[np.ndarray, list[GpuRequest]]:
    """Each pod's shape id, and one request per distinct shape (requests are built once)."""
    keys: dict[tuple, int] = {}
    ids = np.empty(len(pods), dtype=np.int64)
    reqs: list[GpuRequest] = []
    for i in range(len(pods)):
        k = (int(pods.cpu_milli[i]), int(pods.memory_mib[i]), int(pods.num_gpu[i]), int(pods.gpu_milli[i]),
             pods.models[i])
        sid = keys.get(k)
        if sid is None:
            sid = keys[k] = len(reqs)
            reqs.append(pod_request(*k))
        ids[i] = sid
    return ids, reqs


def arrival_sequence(pods: PodTable, capacity_milli: int, rng: np.random.Generator, *,
                     target_pct: float = 130.0, order: str = "shuffled") -> np.ndarray:
    """Indices into ``pods`` in submission order, resampled to ``target_pct`` of capacity."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    n = len(pods)
    req = pods.gpu_request_milli
    seq = list(rng.permutation(n)) if order == "shuffled" else list(range(n))
    target = target_pct / 100.0 * capacity_milli
    arrived = int(req.sum())
    if arrived >= target:
        keep = list(seq)
        while arrived > target and keep:
            j = keep.pop(int(rng.integers(len(keep))))
            arrived -= int(req[j])
        return np.asarray(keep, dtype=np.int64)
    if not req.any():
        return np.asarray(seq, dtype=np.int64)  # no GPU requests: nothing to resample towards
    while True:
        j = int(rng.integers(n))
        if arrived + int(req[j]) > target:
            break
        arrived += int(req[j])
        seq.append(j)
    return np.asarray(seq, dtype=np.int64)


# ---- metrics ----------------------------------------------------------------------------------------

class FragGauge:
    """Cluster fragmentation rate of a snapshot against a workload (the paper's "frag ratio")."""

    def __init__(self, workload: Workload) -> None:
        self.model = FragModel(workload, MODEL_NAMES)

    def rate_pct(self, snap: ClusterSnapshot) -> float:
        st = snap.static
        free = snap.free_milli()
        frag = self.model.frag(free, st.present, st.cpu_total - snap.cpu_used, st.model.astype(np.int64))
        idle = float(np.where(st.present, free, 0).sum())
        return 100.0 * float(frag.sum()) / idle if idle > 0 else 0.0


# ---- one run ----------------------------------------------------------------------------------------

def make_policy(name: str, workload: Workload, demand: Workload = ()) -> PlacementPolicy:
    """The policy ``name`` for a replay: FGD and ``default`` measure fragmentation against
    ``workload`` (the paper's typical pods); ``default`` also reads ``demand`` (every shape of
    the pod list, :func:`demand_workload`) for its scarcity terms."""
    if name == "default" and demand:
        return get_policy(name, workload=workload, demand=demand)
    return get_policy(name, workload=workload) if name in ("fgd", "default") else get_policy(name)


def demand_workload(pods: PodTable) -> Workload:
    """Every shape of a pod list with its share of the pods (coverage 100%, memory kept).

    The typical pods (95% of the pods by count) leave out rare shapes, and on openb the rare
    shapes are the big ones: 8-GPU pods are 1.7% of ``multigpu20``'s pods but 16% of its GPU
    demand. ``default``'s scarcity terms weigh GPU demand, so they read all of it."""
    return typical_workload(pods, coverage=1.0, with_memory=True)


@dataclass(frozen=True)
class ReplaySetup:
    """What every replay of (nodes, pods, policy, seed) starts from.

    The seed is split into three streams, always in this order, so arrival and
    timeline replays of one seed share the node order and the tie-breaks:
    ``order_rng`` (pod shuffling and resampling), the node permutation (already
    applied to ``snapshot``), and ``rng`` (the ``random`` policy's ties; None for
    every other policy: ties go to the first node, as in the paper's simulator).
    """

    order_rng: np.random.Generator
    snapshot: ClusterSnapshot
    policy: PlacementPolicy
    rng: np.random.Generator | None
    shape: np.ndarray
    requests: list
    resolved: list
    workload: Workload


def seed_streams(seed: int) -> tuple[np.random.Generator, np.random.Generator, np.random.Generator]:
    """The three independent streams of a seed, in :class:`ReplaySetup`'s order: pod order and
    resampling, node permutation, ties."""
    order_rng, node_rng, tie_rng = np.random.default_rng(seed).spawn(3)
    return order_rng, node_rng, tie_rng


def setup_replay(nodes: NodeTable, pods: PodTable, policy_name: str, seed: int,
                 workload: Workload | None = None) -> ReplaySetup:
    order_rng, node_rng, tie_rng = seed_streams(seed)
    workload = workload if workload is not None else typical_workload(pods, with_memory=True)
    shape, reqs = pod_shapes(pods)
    return ReplaySetup(order_rng, ClusterSnapshot.build(node_specs(nodes, node_rng.permutation(len(nodes)))),
                       make_policy(policy_name, workload, demand_workload(pods) if policy_name == "default" else ()),
                       tie_rng if policy_name == "random" else None,
                       shape, reqs, [resolve(r) for r in reqs], workload)


def replay(nodes: NodeTable, pods: PodTable, policy_name: str, seed: int, *, target_pct: float = 130.0,
           step_pct: float = 1.0, order: str = "shuffled", workload: Workload | None = None) -> ArrivalResult:
    """One arrival replay; see the module docstring."""
    t0 = time.perf_counter()
    capacity = nodes.total_gpu_milli
    if capacity <= 0:
        raise ValueError("the node list has no GPUs")
    setup = setup_replay(nodes, pods, policy_name, seed, workload)
    workload, snap, policy, rng = setup.workload, setup.snapshot, setup.policy, setup.rng
    shape, reqs, resolved = setup.shape, setup.requests, setup.resolved
    seq = arrival_sequence(pods, capacity, setup.order_rng, target_pct=target_pct, order=order)
    gpu_req = pods.gpu_request_milli
    gauge = FragGauge(workload)

    checkpoints = tuple(int(round(k)) for k in np.arange(0, target_pct + 1e-9, step_pct))
    alloc_at: list[float] = []
    frag_at: list[float] = []
    next_k = 0
    arrived = allocated = placed = failed = failed_milli = 0

    def record() -> None:
        alloc_at.append(100.0 * allocated / capacity)
        frag_at.append(gauge.rate_pct(snap))

    ledger = Ledger() if policy.capabilities.repack else None
    placed_req: dict[int, tuple[GpuRequest, ResolvedRequest]] = {}
    for k, j in enumerate(seq):
        g = int(gpu_req[j])
        while next_k < len(checkpoints) and arrived + g > checkpoints[next_k] / 100.0 * capacity:
            record()
            next_k += 1
        s = int(shape[j])
        res = place(snap, reqs[s], policy, rng=rng, resolved=resolved[s])
        if not isinstance(res, Placement) and ledger is not None and g:
            done = try_repack(snap, reqs[s], resolved[s], policy, ledger, placed_req)
            if done is not None:
                snap, res = done[0], done[1]
        elif isinstance(res, Placement):
            snap = snap.apply(res.allocation)
        if isinstance(res, Placement):
            allocated += g
            placed += 1
            if ledger is not None:
                ledger.add(k, res.allocation)
                placed_req[k] = (reqs[s], resolved[s])
        else:
            failed += 1
            failed_milli += g
        arrived += g
    while next_k < len(checkpoints):
        record()
        next_k += 1
    return ArrivalResult(policy_name, seed, checkpoints, tuple(alloc_at), tuple(frag_at),
                         (capacity - allocated) / MILLI, len(seq), placed, failed, failed_milli,
                         time.perf_counter() - t0, ledger.migrations if ledger is not None else 0)


# ---- many runs, in parallel --------------------------------------------------------------------------

_TRACE_CACHE: dict[tuple[str, str], tuple[NodeTable, PodTable, Workload]] = {}


def load_trace(nodes_path: str, pods_path: str) -> tuple[NodeTable, PodTable, Workload]:
    """The node and pod lists of a trace and its typical workload, loaded once per process."""
    key = (nodes_path, pods_path)
    if key not in _TRACE_CACHE:
        pods = load_pods(pods_path)
        # Shapes carry their largest host-memory request: ``default`` checks it, ``fgd`` ignores it.
        _TRACE_CACHE[key] = (load_nodes(nodes_path), pods, typical_workload(pods, with_memory=True))
    return _TRACE_CACHE[key]


def _run_one(args: tuple[str, str, str, int, dict[str, Any]]) -> ArrivalResult:
    nodes_path, pods_path, policy, seed, kw = args
    nodes, pods, workload = load_trace(nodes_path, pods_path)
    return replay(nodes, pods, policy, seed, workload=workload, **kw)


def run_parallel(fn: Any, jobs: list[Any], workers: int, first: Any = None) -> list[Any]:
    """``[fn(j) for j in jobs]`` on ``workers`` processes (forked: the parent's loaded traces are shared).

    ``first(job)`` true marks the long jobs, submitted first so that the pool's tail is short.
    Results keep the jobs' order.
    """
    order = sorted(range(len(jobs)), key=lambda i: not first(jobs[i])) if first else list(range(len(jobs)))
    results: list[Any] = [None] * len(jobs)
    if workers <= 1 or len(jobs) <= 1:
        for i in order:
            results[i] = fn(jobs[i])
        return results
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx) as pool:
        futs = {i: pool.submit(fn, jobs[i]) for i in order}
        for i, f in futs.items():
            results[i] = f.result()
    return results


def run_arrival(nodes_path: str, pods_path: str, policies: list[str] | tuple[str, ...], seeds: list[int] | range, *,
                workers: int = 2, **kw: Any) -> list[ArrivalSummary]:
    """Every (policy, seed) replay, ``workers`` processes at a time; one summary per policy, in order.

    The files are read (and checked) here first, so a bad row fails fast with
    its :class:`~orchestrator.sim.openb.TraceFormatError` before any worker starts.
    """
    load_trace(nodes_path, pods_path)
    jobs = [(nodes_path, pods_path, p, int(s), kw) for p in policies for s in seeds]
    results = run_parallel(_run_one, jobs, workers, first=lambda j: j[2] in ("fgd", "default"))
    by_policy: dict[str, list[ArrivalResult]] = {}
    for r in results:
        assert r is not None
        by_policy.setdefault(r.policy, []).append(r)
    return [ArrivalSummary.of(by_policy[p]) for p in policies]
