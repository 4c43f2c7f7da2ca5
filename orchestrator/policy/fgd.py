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


# ---- the engine-facing policies ------------------------------------------------------------------
#
# The engine memoises ``gpu_score`` per interned GPU state, and a GPU state
# does not include the node's free CPU and host memory -- but a task type that
# lacks CPU turns the node's whole free GPU into a fragment, so FGD's score
# depends on them. The two terms are therefore split:
#
# * ``gpu_score`` ranks the slots (which GPU, which cards) of each state by
#   the fragmentation increase with CPU and memory taken as plentiful, and is
#   0 for each state's best slot (the rest > 0), so it never breaks ties
#   between nodes;
# * ``node_score`` finds that same slot again and scores it exactly, with the
#   node's free CPU and memory; it is memoised per node until the node's
#   state, CPU or memory changes (the memo hangs off the snapshot's static
#   part, like the engine's own tables, so a fresh build starts clean).

from orchestrator.model.catalogue import MODEL_NAMES  # noqa: E402
from orchestrator.policy.policies import Policy  # noqa: E402

_PLENTY = np.iinfo(np.int64).max // 4


def _alt_key(alt: Any) -> tuple:
    return (alt.kind, alt.count, alt.milli, alt.memory_mib, alt.profiles, getattr(alt, "nvlink", False))


class _NodeMemo:
    """Per node: the inputs its last score was computed from, and that score."""

    __slots__ = ("gstate", "cpu", "mem", "score")

    def __init__(self, n: int) -> None:
        self.gstate = np.full(n, -1, dtype=np.int64)
        self.cpu = np.full(n, -1, dtype=np.int64)
        self.mem = np.full(n, -1, dtype=np.int64)
        self.score = np.zeros(n, dtype=np.float64)


def _lowest_free(free_card: np.ndarray, count: int) -> np.ndarray:
    """(M, G) mask of the ``count`` lowest-index free cards of each row."""
    return free_card & (np.cumsum(free_card, axis=1) <= count)


class FgdPolicy(Policy):
    """FGD as the reference simulator runs it (``fgd_score.go``).

    Score of a node: ``int(sigmoid((frag_before - frag_after) / 1000) * 100)``,
    negated so that lower is better, with the integer truncation kept -- it
    makes the ties the reference simulator resolves by node order, and the
    paper's figures are reproduced only with it (``docs/trace-evaluation.md``).
    A sharing request takes the GPU with the best score (lowest index among
    equals); whole cards take the lowest free indices.

    ``quantize=False`` scores by the exact fragmentation increase;
    ``with_memory=True`` also requires a task type's host memory to fit.
    """

    name = "fgd"

    def __init__(self, workload: Iterable[tuple[Any, float]] = (), *, quantize: bool = True,
                 with_memory: bool = False, **params: Any) -> None:
        wl = normalise_workload(workload)
        super().__init__(workload=wl, quantize=quantize, with_memory=with_memory, **params)
        self.workload = wl
        self.quantize = quantize
        self.frag_model = FragModel(wl, MODEL_NAMES, with_memory=with_memory)

    def delta_score(self, delta: np.ndarray) -> np.ndarray:
        """Lower-is-better score of a fragmentation increase (GPU-milli)."""
        return paper_score(delta) if self.quantize else np.asarray(delta, dtype=np.float64)

    # -- engine hooks ------------------------------------------------------------------------------
    def gpu_score(self, view: Any, alt: Any) -> np.ndarray:
        fm = self.frag_model
        before, after = view.free("before"), view.free("after")
        plenty = np.full(len(view.state), _PLENTY, dtype=np.int64)
        s = self.delta_score(fm.frag(after, view.present, plenty, view.model, plenty)
                             - fm.frag(before, view.present, plenty, view.model, plenty))
        uniq, inv = np.unique(np.asarray(view.state), return_inverse=True)
        mins = np.full(len(uniq), np.inf)
        np.minimum.at(mins, inv, s)
        return s - mins[inv]

    def node_score(self, snap: Any, nodes: np.ndarray, alt: Any, req: Any) -> np.ndarray:
        st = snap.static
        memos = st.__dict__.setdefault("_fgd_node_memo", {})
        k = (self.key, _alt_key(alt), req.cpu_milli, req.host_memory_mib)
        memo = memos.get(k)
        if memo is None:
            memo = memos[k] = _NodeMemo(st.n)
        g = snap.gstate[nodes]
        cpu_used, mem_used = snap.cpu_used[nodes], snap.mem_used[nodes]
        stale = (memo.gstate[nodes] != g) | (memo.cpu[nodes] != cpu_used) | (memo.mem[nodes] != mem_used)
        if stale.any():
            s = nodes[stale]
            memo.score[s] = self._node_scores(snap, s, alt, req)
            memo.gstate[s], memo.cpu[s], memo.mem[s] = g[stale], cpu_used[stale], mem_used[stale]
        return memo.score[nodes]

    # -- the exact score of each node's chosen slot --------------------------------------------------
    def _node_scores(self, snap: Any, nodes: np.ndarray, alt: Any, req: Any) -> np.ndarray:
        st = snap.static
        fm = self.frag_model
        present = st.present[nodes]
        before = snap.free_milli()[nodes]
        model = st.model[nodes].astype(np.int64)
        cpu = st.cpu_total[nodes] - snap.cpu_used[nodes]
        mem = st.mem_total[nodes] - snap.mem_used[nodes]
        kind = alt.kind.value
        if kind == "whole":
            free_card = present & (snap.mode[nodes] == 0) & (before >= 1000)
            after = before - np.where(_lowest_free(free_card, alt.count), 1000, 0)
        elif kind in ("timeslice", "mps"):
            after = before - np.where(self._share_slot(snap, nodes, alt, before, present, model), alt.milli, 0)
        else:  # MIG and anything else: the fragmentation view of whole cards does not apply
            after = before
        delta = (fm.frag(after, present, cpu - req.cpu_milli, model, mem - req.host_memory_mib)
                 - fm.frag(before, present, cpu, model, mem))
        return self.delta_score(delta)

    def _share_slot(self, snap: Any, nodes: np.ndarray, alt: Any, before: np.ndarray, present: np.ndarray,
                    model: np.ndarray) -> np.ndarray:
        """(M, G) mask of the GPU ``gpu_score`` prefers on each node (same ranking, lowest index on ties)."""
        want = 2 if alt.kind.value == "mps" else 3  # Mode.MPS / Mode.TIMESLICE
        mode = snap.mode[nodes]
        ok = present & (before >= alt.milli) & ((mode == 0) | (mode == want))
        m, gi = np.nonzero(ok)
        take = np.zeros_like(present)
        if not len(m):
            return take
        rows_before = before[m]
        rows_after = rows_before.copy()
        rows_after[np.arange(len(m)), gi] -= alt.milli
        plenty = np.full(len(m), _PLENTY, dtype=np.int64)
        fm = self.frag_model
        s = self.delta_score(fm.frag(rows_after, present[m], plenty, model[m], plenty)
                             - fm.frag(rows_before, present[m], plenty, model[m], plenty))
        order = np.lexsort((gi, s, m))
        first = np.ones(len(order), dtype=bool)
        first[1:] = m[order][1:] != m[order][:-1]
        win = order[first]
        take[m[win], gi[win]] = True
        return take


class DefaultPolicy(FgdPolicy):
    """Ours: FGD with host memory in the fit test (a task type whose memory does not fit
    the node counts like one whose CPU does not).

    ``repack=True`` also asks the replay to move small shares when a GPU request
    fits nowhere (:mod:`orchestrator.sim.repack`); off by default, because on
    openb it finds room for ~3 pods a run at 2-4x the cost (``docs/trace-evaluation.md``).
    """

    name = "default"

    def __init__(self, workload: Iterable[tuple[Any, float]] = (), *, repack: bool = False, **params: Any) -> None:
        params.setdefault("with_memory", True)
        super().__init__(workload, repack=repack, **params)
        self.repack = repack
