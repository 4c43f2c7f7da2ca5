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
        """A TaskType from itself, or from a :class:`~orchestrator.core.request.GpuRequest`."""
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


# ---- the engine-facing policies ------------------------------------------------------------------
#
# The engine memoises ``gpu_score`` per interned GPU state, and a GPU state
# does not include the node's free CPU and host memory -- but a task type that
# lacks CPU turns the node's whole free GPU into a fragment, so FGD's score
# depends on them. The two terms are therefore split:
#
# * ``gpu_score`` ranks the slots (which GPU, which cards) of each state by
#   the fragmentation increase with CPU and memory taken as plentiful
#   (``slot_rank_only``: the engine keeps the best slot and counts it as 0,
#   so it never breaks ties between nodes);
# * ``node_score`` scores the slot the engine chose for each node's state
#   exactly, with the node's free CPU and memory, as a gather from tables:
#   ``frag = table[frag_state, level]`` before and after (:class:`_FragTables`).

from orchestrator.core.errors import InvalidRequestError  # noqa: E402
from orchestrator.core.catalogue import MODEL_NAMES  # noqa: E402
from orchestrator.scheduling.engine import alt_key, state_free, state_free_after  # noqa: E402
from orchestrator.scheduling.policies import Policy  # noqa: E402

_MIG = "mig"


class _FragTables:
    """FGD's memo for one family of snapshots (it hangs off their static part).

    * A *frag state* is what fragmentation depends on in a GPU state: the
      model and the multiset of free milli per GPU (sorted; absent and
      unhealthy GPUs count 0). Many GPU states share one; ids are interned.
    * ``of_state[sid]``: the frag state of interned GPU state ``sid`` (-1: not yet).
    * ``after[alt][sid]``: the frag state after ``alt`` takes the slot the
      engine chose on ``sid`` (-1: not yet).
    * ``frag[f, level]``: the fragmentation of frag state ``f`` at a CPU/memory
      level, filled lazily (NaN: not yet).

    Every entry is a pure function of its key, so the tables only ever save
    work; they never change an answer.
    """

    def __init__(self, fm: FragModel, st: Any) -> None:
        self.fm = fm
        self.st = st
        self.ids: dict[bytes, int] = {}
        self.n = 0
        self.total = np.zeros(64)
        self.supply = np.zeros((64, len(fm.shapes)))
        self.frag = np.full((64, len(fm.plev)), np.nan)
        self.of_state = np.full(max(64, st.n_states), -1, dtype=np.int64)
        self.after: dict[tuple, np.ndarray] = {}
        self.n_levels = len(fm.plev)
        self._last: tuple | None = None  # (gstate, cpu_used, mem_used, frag) of the last snapshot seen
        # Level lookup tables: free CPU (memory) // q -> level index, q the gcd of the thresholds.
        self._lut_c = self._lut(fm.cpu_thr, int(st.cpu_total.max(initial=0)), fm.nm)
        self._lut_m = self._lut(fm.mem_thr, int(st.mem_total.max(initial=0)), 1) if fm.with_memory else None

    @staticmethod
    def _lut(thr: np.ndarray, top: int, scale: int) -> tuple[int, np.ndarray] | None:
        """(q, table): the level index (times ``scale``) of a free amount x is ``table[x // q]``,
        q the gcd of the thresholds (a small table stays in cache; a division is cheaper than
        a cache miss). None: too fine a grid (searchsorted instead)."""
        q = (int(np.gcd.reduce(thr)) if len(thr) else 1) or 1
        if top // q >= 1 << 22:
            return None
        return q, (np.searchsorted(thr, np.arange(top // q + 1) * q, side="right") * scale).astype(np.int32)

    def levels(self, cpu_free: np.ndarray, mem_free: np.ndarray) -> np.ndarray:
        """:meth:`FragModel.levels` through the lookup tables (the model's own search when a grid
        is too fine for one)."""
        fm = self.fm
        if self._lut_c is None or (fm.with_memory and self._lut_m is None):
            return fm.levels(cpu_free, mem_free)
        q, lut = self._lut_c
        lc = lut[cpu_free // q if q > 1 else cpu_free]
        if not fm.with_memory:
            return fm.level_of[lc + (fm.nm - 1)]
        q, lut = self._lut_m
        return fm.level_of[lc + lut[mem_free // q if q > 1 else mem_free]]

    # -- frag states ---------------------------------------------------------------------------------
    def intern(self, free: np.ndarray, model: np.ndarray) -> np.ndarray:
        """Frag-state ids of K rows of free milli (K, G) on models (K,)."""
        rows = np.empty((len(free), free.shape[1] + 1), dtype=np.int32)
        rows[:, 0] = model
        rows[:, 1:] = np.sort(free, axis=1)
        raw, w = rows.tobytes(), rows.shape[1] * 4
        keys = [raw[i:i + w] for i in range(0, len(raw), w)]
        get = self.ids.get
        out = [get(k) for k in keys]
        if None in out:
            new: list[int] = []
            for k, key in enumerate(keys):
                if out[k] is None:
                    f = self.ids.get(key)
                    if f is None:
                        f = self.ids[key] = self.n + len(new)
                        new.append(k)
                    out[k] = f
            need = self.n + len(new)
            if need > len(self.total):
                cap = max(need, 2 * len(self.total))
                self.total = np.concatenate([self.total, np.zeros(cap - len(self.total))])
                self.supply = np.concatenate([self.supply, np.zeros((cap - len(self.supply), self.supply.shape[1]))])
                self.frag = np.concatenate([self.frag, np.full((cap - len(self.frag), self.n_levels), np.nan)])
            sel = rows[np.asarray(new)]
            self.total[self.n:need], self.supply[self.n:need] = self.fm.supply(sel[:, 1:], sel[:, 0])
            self.n = need
        return np.asarray(out, dtype=np.int64)

    def states(self, sids: np.ndarray) -> np.ndarray:
        """Frag states of GPU states ``sids``."""
        if len(self.of_state) < self.st.n_states:
            self.of_state = np.concatenate([self.of_state, np.full(self.st.n_states, -1, dtype=np.int64)])
        f = self.of_state[sids]
        miss = f < 0
        if miss.any():
            ids = np.unique(sids[miss])
            self.of_state[ids] = self.intern(state_free(self.st, ids), self.st.model[self.st.rep_node[ids]])
            f = self.of_state[sids]
        return f

    def after_table(self, alt: Any) -> np.ndarray:
        """``after[alt]``, grown to the number of interned GPU states."""
        key = alt_key(alt)
        a = self.after.get(key)
        if a is None or len(a) < self.st.n_states:
            grown = np.full(max(64, 2 * self.st.n_states), -1, dtype=np.int64)
            if a is not None:
                grown[: len(a)] = a
            a = self.after[key] = grown
        return a

    def states_after(self, alt: Any, sids: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """Frag states after ``alt`` takes ``slots`` on GPU states ``sids`` (normally already
        known from :meth:`FgdPolicy.remember_best`; derived from the slot otherwise)."""
        a = self.after_table(alt)
        f = a[sids]
        if len(f) and f.min() < 0:
            miss = f < 0
            ids, first = np.unique(sids[miss], return_index=True)
            free = state_free_after(self.st, ids, slots[miss][first], alt)
            a[ids] = self.intern(free, self.st.model[self.st.rep_node[ids]])
            f = a[sids]
        return f

    def current(self, snap: Any) -> np.ndarray:
        """(N,) every node's fragmentation in ``snap``.

        Kept from the last snapshot asked about and recomputed only where a
        node's GPU state, CPU or memory differs (values are compared, so any
        order of snapshots is fine): a placement changes one node."""
        st = snap.static
        last = self._last
        if last is not None and last[0] is snap.gstate and last[1] is snap.cpu_used and last[2] is snap.mem_used:
            return last[3]
        if last is None:
            nodes = np.arange(st.n)
            frag = np.empty(st.n)
        else:
            nodes = np.flatnonzero((snap.gstate != last[0]) | (snap.cpu_used != last[1]) | (snap.mem_used != last[2]))
            frag = last[3] if len(nodes) < st.n // 8 else last[3].copy()
        if len(nodes):
            frag[nodes] = self.lookup(self.states(snap.gstate[nodes]),
                                      self.levels(st.cpu_total[nodes] - snap.cpu_used[nodes],
                                                  st.mem_total[nodes] - snap.mem_used[nodes]))
        self._last = (snap.gstate, snap.cpu_used, snap.mem_used, frag)
        return frag

    def lookup(self, f: np.ndarray, level: np.ndarray) -> np.ndarray:
        """Fragmentation of frag states ``f`` at ``level`` (filling missing entries)."""
        flat = f * self.n_levels + level
        v = self.frag.reshape(-1)[flat]
        if np.isnan(v.sum()):
            miss = np.isnan(v)
            fm, lm = f[miss], level[miss]
            v[miss] = self.fm.combine(self.total[fm], self.supply[fm], lm)
            self.frag.reshape(-1)[flat[miss]] = v[miss]
        return v


class FgdPolicy(Policy):
    """FGD as the reference simulator runs it (``fgd_score.go``).

    Score of a node: ``int(sigmoid((frag_before - frag_after) / 1000) * 100)``,
    negated so that lower is better, with the integer truncation kept -- it
    makes the ties the reference simulator resolves by node order, and the
    paper's figures are reproduced only with it (``docs/trace-evaluation.md``).
    A sharing request takes the GPU with the best score (lowest index among
    equals); whole cards the engine's choice (the lowest free indices when
    there is no NVLink island to keep).

    ``workload`` is the target workload; empty means the built-in one
    (:data:`orchestrator.scheduling.workloads.DEFAULT_WORKLOAD`, openb's typical
    pods). ``quantize=False`` scores by the exact fragmentation increase;
    ``with_memory=True`` also requires a task type's host memory to fit.
    """

    name = "fgd"
    wants_context = True
    slot_rank_only = True

    def __init__(self, workload: Iterable[tuple[Any, float]] = (), *, quantize: bool = True,
                 with_memory: bool = False, **params: Any) -> None:
        workload = tuple(workload)
        if not workload:
            from orchestrator.scheduling.workloads import DEFAULT_WORKLOAD

            workload = DEFAULT_WORKLOAD
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
        fm, t = self.frag_model, self.tables(view.static)
        top = np.full(len(view.state), fm.top_level)
        free_after = view.free("after")
        view.memo["fgd_free_after"] = free_after
        total, supply = fm.supply(free_after, view.model)
        return self.delta_score(fm.combine(total, supply, top) - t.lookup(t.states(view.state), top))

    def remember_best(self, view: Any, alt: Any, win: np.ndarray) -> None:
        """The engine's chosen candidate of each state: keep its frag state after ``alt``
        (only the winners are interned: most candidates are never looked at again)."""
        t = self.tables(view.static)
        t.after_table(alt)[view.state[win]] = t.intern(view.memo["fgd_free_after"][win], view.model[win])

    def node_score(self, snap: Any, nodes: np.ndarray, alt: Any, req: Any, ctx: Any) -> np.ndarray:
        return self.delta_score(self.frag_increase(snap, nodes, alt, req, ctx))

    def explain(self, ctx: Any, k: int) -> str:
        """The terms of candidate ``k``'s score, for the placement's reason."""
        terms = [f"fragmentation {ctx.memo['frag'][k]:+.0f} milli"]
        if "stranded" in ctx.memo:
            terms.append(f"CPU-stranded GPU {ctx.memo['stranded'][k]:+.0f} milli")
        return ", ".join(terms)

    def frag_increase(self, snap: Any, nodes: np.ndarray, alt: Any, req: Any, ctx: Any) -> np.ndarray:
        """(K,) how much each candidate node's fragmentation grows (GPU-milli) if it takes the request."""
        return self._frag_parts(snap, nodes, alt, req, ctx)[0]

    def _frag_parts(self, snap: Any, nodes: np.ndarray, alt: Any, req: Any, ctx: Any) -> tuple[np.ndarray, np.ndarray]:
        """(fragmentation increase, frag state after) of each candidate node."""
        t = self.tables(ctx.static)
        before = t.current(snap)[nodes]
        f_after = t.states_after(alt, ctx.states, ctx.slots)
        after = t.lookup(f_after, t.levels(ctx.cpu_free - req.cpu_milli, ctx.mem_free - req.host_memory_mib))
        ctx.memo["frag"] = inc = after - before
        return inc, f_after

    def tables(self, st: Any) -> _FragTables:
        """This policy's :class:`_FragTables` for the snapshot family of ``st``."""
        memo = st.__dict__.setdefault("_fgd_tables", {})
        t = memo.get(self.key)
        if t is None:
            t = memo[self.key] = _FragTables(self.frag_model, st)
        return t


def cpu_per_gpu_milli(workload: Workload) -> float:
    """Host CPU (milli) the workload's GPU task types ask per GPU-milli, popularity-weighted
    (CPU-only types excluded); 0 when they ask no CPU or there are none."""
    gpu = sum(p * t.total_gpu_milli for t, p in workload if t.gpu_count)
    cpu = sum(p * t.cpu_milli for t, p in workload if t.gpu_count)
    return cpu / gpu if gpu > 0 else 0.0


class DefaultPolicy(FgdPolicy):
    """Ours: FGD plus the two things its score does not see.

    1. **Host memory** in the fit test: a task type whose memory does not fit
       the node counts like one whose CPU does not (``with_memory=True``).
    2. **CPU stranding.** FGD feels a node's CPU only once it drops below what
       some typical type asks, so it fills a GPU-dense node (8 cards, 96
       cores) with CPU-hungry pods and CPU-only pods until its last free
       cards can never be used -- and on openb host CPU is as scarce as GPUs
       (the cluster has 17 cores per GPU, its GPU pods ask 11 per GPU and its
       CPU-only pods 3 more). A node's *stranded* GPU is the free GPU-milli
       its free CPU cannot feed at the workload's own CPU-per-GPU rate ``r``
       (:func:`cpu_per_gpu_milli`)::

           stranded(node) = max(0, free_gpu_milli - free_cpu_milli / r)

       and the node's score is FGD's on ``frag_increase + strand_weight x
       stranded_increase`` (both GPU-milli), with FGD's integer truncation
       kept, so ties still go to the first node in order. The effect: CPU-only
       and CPU-heavy pods go to CPU-rich nodes (openb's T4 nodes: 52 cores per
       card), GPU-heavy nodes keep the CPU their cards need.
       ``strand_weight=0`` turns it off (then ``default`` is FGD with memory).

    ``repack=True`` also asks the replay to move small shares when a GPU request
    fits nowhere (:mod:`orchestrator.sim.repack`); off by default, because on
    openb it finds room for ~3 pods a run at 2-4x the cost (``docs/trace-evaluation.md``).

    Invariant: like FGD, the score is a pure function of the node's GPU state,
    free CPU and free memory, so nodes in equal states score equally.
    """

    name = "default"

    def __init__(self, workload: Iterable[tuple[Any, float]] = (), *, strand_weight: float = 2.0,
                 repack: bool = False, **params: Any) -> None:
        params.setdefault("with_memory", True)
        if not (math.isfinite(strand_weight) and strand_weight >= 0):
            raise InvalidRequestError("strand_weight", strand_weight, "a finite number >= 0")
        super().__init__(workload, strand_weight=strand_weight, repack=repack, **params)
        self.repack = repack
        rate = cpu_per_gpu_milli(self.workload)
        self.strand_weight = float(strand_weight) if rate > 0 else 0.0
        self._gpu_per_cpu = 1.0 / rate if rate > 0 else 0.0

    def stranded(self, free_gpu_milli: np.ndarray, free_cpu_milli: np.ndarray) -> np.ndarray:
        """GPU-milli the free CPU cannot feed at the workload's CPU-per-GPU rate (>= 0)."""
        return np.maximum(free_gpu_milli - free_cpu_milli * self._gpu_per_cpu, 0.0)

    def frag_increase(self, snap: Any, nodes: np.ndarray, alt: Any, req: Any, ctx: Any) -> np.ndarray:
        inc, f_after = self._frag_parts(snap, nodes, alt, req, ctx)
        if not self.strand_weight:
            return inc
        t = self.tables(ctx.static)
        gpu_before = t.total[t.states(ctx.states)]
        gpu_after = t.total[f_after]
        ctx.memo["stranded"] = grow = (self.stranded(gpu_after, ctx.cpu_free - req.cpu_milli)
                                       - self.stranded(gpu_before, ctx.cpu_free))
        # Rounded like FragModel.combine, so equal states compare equal however they were reached.
        return np.round(inc + self.strand_weight * grow, 6)
