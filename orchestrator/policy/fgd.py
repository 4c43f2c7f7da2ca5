"""Fragmentation Gradient Descent (FGD) and our ``default`` policy built on it.

FGD is the placement policy of Weng et al., "Beware of Fragmentation:
Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent"
(USENIX ATC'23). This module follows the paper's reference simulator
(Alibaba/HKUST ``kubernetes-scheduler-simulator``: ``pkg/utils/frag.go``
``NodeGpuShareFragAmount`` and ``pkg/simulator/plugin/fgd_score.go``); the
correspondence is written next to each function and in
``docs/trace-evaluation.md``.

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
given and the policy's fixed workload, so the engine may cache scores of
nodes in identical states; lower scores are better.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

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
    def of(cls, obj: Any) -> "TaskType":
        """A TaskType from itself, or from a :class:`~orchestrator.model.request.GpuRequest`."""
        if isinstance(obj, TaskType):
            return obj
        kind = getattr(getattr(obj, "kind", None), "value", None)
        if kind == "whole":
            count = int(obj.count)
            return cls(int(obj.cpu_milli), MILLI if count else 0, count, tuple(obj.models), int(obj.host_memory_mib))
        if kind == "timeslice":
            return cls(int(obj.cpu_milli), round(obj.fraction * MILLI), 1, tuple(obj.models), int(obj.host_memory_mib))
        if kind == "mps":
            return cls(int(obj.cpu_milli), int(obj.sm_percent) * 10, 1, tuple(obj.models), int(obj.host_memory_mib))
        raise TypeError(f"cannot read a task type from {obj!r}")


Workload = tuple[tuple[TaskType, float], ...]


def normalise_workload(workload: Iterable[tuple[Any, float]]) -> Workload:
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
    """

    def __init__(self, workload: Workload, model_names: Sequence[str], *, with_memory: bool = False) -> None:
        self.workload = workload
        self.model_names = tuple(model_names)
        self.with_memory = with_memory
        types = [t for t, _ in workload]
        self.p = np.array([p for _, p in workload], dtype=np.float64)
        self.milli = np.array([t.gpu_milli for t in types], dtype=np.int64)
        self.count = np.array([t.gpu_count for t in types], dtype=np.int64)
        self.cpu = np.array([t.cpu_milli for t in types], dtype=np.int64)
        self.mem = np.array([t.memory_mib for t in types], dtype=np.int64)
        self.gpu_type = self.milli > 0
        # access[t, m]: may type t run on model m? Last column: a node without GPUs.
        access = np.zeros((len(types), len(self.model_names) + 1), dtype=bool)
        for i, t in enumerate(types):
            for j, m in enumerate(self.model_names):
                access[i, j] = bool(m) and (not t.models or m in t.models)
        self.access = access
        # p of CPU-only types: their fragment is always all the free GPU-milli.
        self.p_cpu_only = float(self.p[~self.gpu_type].sum())

    def frag(self, free: np.ndarray, present: np.ndarray, cpu_free: np.ndarray, model: np.ndarray,
             mem_free: np.ndarray | None = None) -> np.ndarray:
        """Fragmentation (GPU-milli) of M node rows.

        ``free`` (M, G) free milli per GPU, ``present`` (M, G) which GPUs exist,
        ``cpu_free`` (M,), ``model`` (M,) index into ``model_names`` (-1: none),
        ``mem_free`` (M,) needed only ``with_memory``.
        Reference: ``NodeGpuShareFragAmountScore`` = ``NodeGpuShareFragAmount``
        summed over all quadrants but Q3 (the satisfied part).
        """
        f = np.where(present, free, 0).astype(np.int64, copy=False)
        total = f.sum(axis=1).astype(np.float64)                               # (M,)
        gi = np.flatnonzero(self.gpu_type)
        if gi.size == 0:
            return total * self.p_cpu_only
        milli = self.milli[gi]
        ge = f[:, None, :] >= milli[None, :, None]                             # (M, T, G)
        enough_gpus = ge.sum(axis=2) >= self.count[gi][None, :]               # (M, T)
        midx = np.where(np.asarray(model) < 0, len(self.model_names), model)
        fits = enough_gpus & (np.asarray(cpu_free)[:, None] >= self.cpu[gi][None, :]) & self.access[gi][:, midx].T
        if self.with_memory and mem_free is not None:
            fits &= np.asarray(mem_free)[:, None] >= self.mem[gi][None, :]
        partial = np.where(ge, 0, f[:, None, :]).sum(axis=2)                  # (M, T)
        per_type = np.where(fits, partial, total[:, None])                     # (M, T)
        return per_type @ self.p[gi] + total * self.p_cpu_only


def paper_score(delta: np.ndarray) -> np.ndarray:
    """The reference simulator's FGD node score as a lower-is-better number.

    ``fgd_score.go``: ``int64(sigmoid((before - after) / 1000) * 100)``, higher
    better; we return its negation so that lower is better, keeping the
    integer truncation (and with it the ties the paper breaks at random).
    """
    s = 1.0 / (1.0 + np.exp(np.asarray(delta, dtype=np.float64) / MILLI))
    return -np.floor(s * 100.0)
