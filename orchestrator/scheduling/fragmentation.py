"""The fragmentation measure of FGD, as pure functions: the paper's maths, without the engine.

FGD is the placement policy of Weng et al., "Beware of Fragmentation:
Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent"
(USENIX ATC'23). This module follows the paper's reference simulator
(Alibaba/HKUST ``kubernetes-scheduler-simulator``: ``pkg/utils/frag.go``
``NodeGpuShareFragAmount`` and ``pkg/simulator/plugin/fgd_score.go``); the
correspondence is written next to each function and in
``docs/trace-evaluation.md``. The policies that run it on the engine, with
their memo tables, are in :mod:`orchestrator.scheduling.fgd`.

Nomenclature
------------
*task type*
    ``(cpu_milli, gpu_milli per GPU, gpu_count, models)``: the shape of a pod,
    without its name. ``gpu_milli == 0`` is a CPU-only pod.
*workload*
    a tuple of ``(task type, popularity)`` with popularities summing to 1: the
    "target workload" the paper measures fragmentation against (its *typical
    pods*: the most frequent shapes covering 95% of the pods, renormalised).
*fragment of a node for a task type*
    the free GPU-milli of the node that a pod of that type could not use:
    all of it when the pod does not fit at all (too little CPU, too few GPUs
    with enough free milli, a model it may not run on, or a CPU-only type,
    which uses no GPU); otherwise the free milli on the GPUs that have less
    free than the type asks per GPU.
*fragmentation of a node*
    the popularity-weighted sum of its fragments over the workload.

FGD places a pod where the fragmentation grows the least (the "gradient").
Invariants: every function here is pure and depends only on the rows it is
given and the fixed workload (no snapshot, no engine, no cache), so callers
may cache results for nodes in identical states; lower scores are better.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from orchestrator.core.request import GpuRequest, ShareKind

MILLI = 1000


@dataclass(frozen=True, slots=True, order=True)
class TaskType:
    """The shape of a pod: what FGD's workload distribution is made of."""

    cpu_milli: int
    gpu_milli: int
    gpu_count: int
    models: tuple[str, ...] = ()
    memory_mib: int = 0

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_milli * self.gpu_count

    @classmethod
    def of(cls, obj: TaskType | GpuRequest) -> TaskType:
        """A TaskType from itself, or from a whole-card, time-slice or MPS :class:`GpuRequest`."""
        if isinstance(obj, TaskType):
            return obj
        if isinstance(obj, GpuRequest):
            cpu, models, mem = int(obj.cpu_milli), tuple(obj.models), int(obj.host_memory_mib)
            if obj.kind is ShareKind.WHOLE:
                count = int(obj.count)
                return cls(cpu, MILLI if count else 0, count, models, mem)
            if obj.kind is ShareKind.TIMESLICE:
                return cls(cpu, round(obj.fraction * MILLI), 1, models, mem)  # type: ignore[operator]
            if obj.kind is ShareKind.MPS:
                return cls(cpu, int(obj.sm_percent) * 10, 1, models, mem)  # type: ignore[arg-type]
        raise TypeError(f"cannot read a task type from {obj!r}")


Workload = tuple[tuple[TaskType, float], ...]


def normalise_workload(workload: Iterable[tuple[TaskType | GpuRequest, float]]) -> Workload:
    """``((TaskType, popularity), ...)`` with popularities summing to 1, most popular first."""
    items = [(TaskType.of(t), float(p)) for t, p in workload]
    if not items:
        raise ValueError("the workload is empty")
    if any(p < 0 or not math.isfinite(p) for _, p in items):
        raise ValueError("popularities must be finite and >= 0")
    total = sum(p for _, p in items)
    if total <= 0:
        raise ValueError("popularities sum to 0")
    items.sort(key=lambda tp: (-tp[1], tp[0]))
    return tuple((t, p / total) for t, p in items)


class FragModel:
    """A workload compiled to arrays, for fragmentation of many node rows at once.

    ``model_names`` is the snapshot's table of GPU model names (the rows carry
    an index into it; index -1 or '' is a node without GPUs).
    ``with_memory`` also requires a type's host memory to fit (the paper's
    fragment ignores memory; its filter does not).

    **Decomposition.** A type's fragment is ``total`` (all the node's free
    milli) unless it fits, and then ``partial`` (the free milli of the GPUs
    too small for it); so, with popularities summing to ``p_sum``::

        frag = total * p_sum - sum over GPU shapes g of  S_g(GPU state) * P_g(cpu_free, mem_free)

    where a *GPU shape* is ``(gpu_milli, gpu_count, models)``, ``S_g`` is
    ``total - partial_g`` when the shape fits the GPUs (enough of them with
    enough free milli, on a model it may use) and 0 otherwise -- a function of
    the GPU state alone -- and ``P_g`` is the popularity of the types of shape
    ``g`` whose CPU (and memory) fit: a step function of the node's free CPU
    and memory. Quantising them at the workload's distinct thresholds gives a
    few *levels* (:meth:`levels`); ``plev[level]`` is the (G_shapes,) vector of
    ``P_g`` at a level. CPU-only types enter through ``p_sum`` only.
    """

    def __init__(self, workload: Workload, model_names: Sequence[str], *, with_memory: bool = False) -> None:
        self.workload = workload
        self.model_names = tuple(model_names)
        self.with_memory = with_memory
        types = [t for t, _ in workload]
        p = np.array([pp for _, pp in workload], dtype=np.float64)
        self.p_sum = float(p.sum())
        self.p_cpu_only = float(sum(pp for t, pp in workload if t.gpu_milli <= 0))
        # GPU shapes, in order of first appearance, and each GPU type's shape.
        shapes: dict[tuple, int] = {}
        gpu = [i for i, t in enumerate(types) if t.gpu_milli > 0]
        shape_of = np.array([shapes.setdefault((types[i].gpu_milli, types[i].gpu_count, types[i].models), len(shapes))
                             for i in gpu], dtype=np.int64)
        self.shapes = tuple(shapes)
        self.g_milli = np.array([m for m, _, _ in self.shapes], dtype=np.int64)
        self.g_count = np.array([c for _, c, _ in self.shapes], dtype=np.int64)
        # g_access[g, m]: may shape g run on model m? Last column: a node without GPUs.
        self.g_access = np.zeros((len(self.shapes), len(self.model_names) + 1), dtype=bool)
        for g, (_, _, models) in enumerate(self.shapes):
            for j, name in enumerate(self.model_names):
                self.g_access[g, j] = bool(name) and (not models or name in models)
        # Thresholds: a type fits at CPU level lc iff its CPU's rank < lc (likewise memory).
        cpu = np.array([types[i].cpu_milli for i in gpu], dtype=np.int64)
        mem = np.array([types[i].memory_mib for i in gpu], dtype=np.int64)
        self.cpu_thr = np.unique(cpu)
        self.mem_thr = np.unique(mem) if with_memory else np.zeros(0, dtype=np.int64)
        rc = np.searchsorted(self.cpu_thr, cpu)
        rm = np.searchsorted(self.mem_thr, mem) if with_memory else np.full(len(gpu), -1)
        nc, nm = len(self.cpu_thr) + 1, len(self.mem_thr) + 1
        fit_c = rc[None, :] < np.arange(nc)[:, None]                                  # (nc, T)
        fit_m = rm[None, :] < np.arange(nm)[:, None]                                  # (nm, T)
        onehot = np.zeros((len(gpu), len(self.shapes)))
        onehot[np.arange(len(gpu)), shape_of] = p[gpu]
        table = np.einsum("ct,mt,tg->cmg", fit_c.astype(np.float64), fit_m.astype(np.float64), onehot)
        # Levels: the distinct P vectors; level_of[lc * nm + lm] -> level id.
        if self.shapes:
            self.plev, inv = np.unique(table.reshape(nc * nm, len(self.shapes)), axis=0, return_inverse=True)
            self.level_of = inv.reshape(-1).astype(np.int64)
        else:
            self.plev, self.level_of = np.zeros((1, 0)), np.zeros(nc * nm, dtype=np.int64)
        self.nm = nm
        self.top_level = int(self.level_of[-1])  # CPU and memory plentiful: every type fits

    # -- the two factors ---------------------------------------------------------------------------
    def levels(self, cpu_free: np.ndarray, mem_free: np.ndarray | None = None) -> np.ndarray:
        """(M,) level of each node's free CPU and memory (memory ignored when None or not ``with_memory``)."""
        lc = np.searchsorted(self.cpu_thr, np.asarray(cpu_free), side="right")
        if self.with_memory and mem_free is not None:
            lm = np.searchsorted(self.mem_thr, np.asarray(mem_free), side="right")
        else:
            lm = self.nm - 1
        return self.level_of[lc * self.nm + lm]

    def supply(self, free: np.ndarray, model: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``total`` (M,) and ``S`` (M, G_shapes) of M rows of free milli per GPU (absent GPUs: 0)."""
        f = np.asarray(free).astype(np.int64, copy=False)
        total = f.sum(axis=1)
        ge = f[:, None, :] >= self.g_milli[None, :, None]                              # (M, Gs, G)
        midx = np.where(np.asarray(model) < 0, len(self.model_names), model)
        fits = (ge.sum(axis=2) >= self.g_count[None, :]) & self.g_access[:, midx].T
        partial = np.where(ge, 0, f[:, None, :]).sum(axis=2)
        return total.astype(np.float64), np.where(fits, total[:, None] - partial, 0).astype(np.float64)

    def combine(self, total: np.ndarray, supply: np.ndarray, level: np.ndarray) -> np.ndarray:
        """Fragmentation from the two factors, rounded to 1e-6 milli so that equal
        fragmentation computed two ways compares equal."""
        return np.round(total * self.p_sum - np.einsum("mg,mg->m", supply, self.plev[level]), 6)

    def frag(self, free: np.ndarray, present: np.ndarray, cpu_free: np.ndarray, model: np.ndarray,
             mem_free: np.ndarray | None = None) -> np.ndarray:
        """Fragmentation (GPU-milli) of M node rows.

        ``free`` (M, G) free milli per GPU, ``present`` (M, G) which GPUs exist,
        ``cpu_free`` (M,), ``model`` (M,) index into ``model_names`` (-1: none),
        ``mem_free`` (M,) needed only ``with_memory``.
        Reference: ``NodeGpuShareFragAmountScore`` = ``NodeGpuShareFragAmount``
        summed over all quadrants but Q3 (the satisfied part).
        """
        total, sup = self.supply(np.where(present, free, 0), model)
        return self.combine(total, sup, self.levels(cpu_free, mem_free))


def paper_score(delta: np.ndarray) -> np.ndarray:
    """The reference simulator's FGD node score as a lower-is-better number.

    ``fgd_score.go``: ``int64(sigmoid((before - after) / 1000) * 100)``, higher
    better; we return its negation so that lower is better, keeping the
    integer truncation (and with it the ties the paper breaks at random).
    """
    s = np.divide(np.asarray(delta, dtype=np.float64), MILLI)  # a fresh buffer, then in place
    np.exp(s, out=s)
    s += 1.0
    np.divide(1.0, s, out=s)
    s *= 100.0
    np.floor(s, out=s)
    return np.negative(s, out=s)


def cpu_per_gpu_milli(workload: Workload) -> float:
    """Host CPU (milli) the workload's GPU task types ask per GPU-milli, popularity-weighted
    (CPU-only types excluded); 0 when they ask no CPU or there are none."""
    gpu = sum(p * t.total_gpu_milli for t, p in workload if t.gpu_count)
    cpu = sum(p * t.cpu_milli for t, p in workload if t.gpu_count)
    return cpu / gpu if gpu > 0 else 0.0
