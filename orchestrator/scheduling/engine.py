"""The placement engine: ``place(snapshot, request, policy) -> Placement | Unschedulable``.

Pure: imports no Ray, does no I/O, never changes the snapshot. One call
reads as a short script:

1. **resolve** the request into alternatives, cheapest first
   (:func:`orchestrator.core.request.resolve`);
2. for each alternative, **filter** nodes on what is node-wide (the node and
   model constraints, free CPU and host memory) -- a few vector operations;
3. **score states, not nodes**: every node's GPU state is interned
   (``snapshot.gstate``); for each distinct state not seen before with this
   (policy, alternative) the engine enumerates the candidate slots (a GPU, a
   MIG placement, a set of whole GPUs), builds the before/after rows and asks
   the policy for a score; the best slot of each state is memoised in a
   per-(policy, alternative) table. A node's score is its state's best score
   plus the policy's node-wide term;
4. **choose** the lowest score; ties go to a random node when an ``rng`` is
   given (as kube-scheduler samples among equal top scores) and to the lowest
   node index otherwise;
5. if no alternative fits, return :class:`Unschedulable` with the rejected
   nodes **grouped by reason** ("812 nodes: not enough free GPU memory").

The memo tables are keyed by the interned state id, which is a pure
function of the state's bytes, so caching never changes an answer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from orchestrator.core.catalogue import MIG_COMPUTE_SLICES, MODEL_NAMES, gpu_model
from orchestrator.core.request import Alternative, GpuRequest, ResolvedRequest, ShareKind, resolve
from orchestrator.core.allocation import Allocation
from orchestrator.scheduling.snapshot import MODEL_INDEX, ClusterSnapshot, Mode, _Static

INF = np.inf


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a request goes, and why."""

    allocation: Allocation
    alternative: Alternative
    policy: str
    score: float
    feasible_nodes: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"allocation": self.allocation.to_json(), "policy": self.policy, "score": self.score,
                "feasible_nodes": self.feasible_nodes, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Unschedulable:
    """No alternative fits. ``reasons`` groups the rejected nodes: ((alternative, reason), count), largest first."""

    request: GpuRequest
    reasons: tuple[tuple[str, str, int], ...]
    nodes: int

    @property
    def message(self) -> str:
        parts = [f"{count} node{'s' if count != 1 else ''}: {reason} [{alt}]" for alt, reason, count in self.reasons]
        return f"no node fits {self.request.describe()} ({self.nodes} nodes): " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"request": self.request.describe(), "nodes": self.nodes,
                "reasons": [{"alternative": a, "reason": r, "nodes": c} for a, r, c in self.reasons],
                "message": self.message}


@dataclass(slots=True)
class CandidateView:
    """M candidate placements, each on one interned GPU state, for a policy to score.

    ``before``/``after`` map a field name (``mode``, ``used_milli``, ``used_mem``,
    ``mig_mask``, ``mig_compute``, ``holders``, ``healthy``) to an (M, G) array;
    ``take`` is the (M, G) mask of GPUs the candidate uses; ``present`` the
    GPUs that exist; ``capacity`` the compute cap per GPU for its mode;
    ``model`` (M,) the model index; ``gpu_memory`` (M,) MiB per GPU.
    ``state`` is the interned state id of each candidate and ``slot`` its slot.
    ``static`` is the snapshot family's static part (for per-state tables a
    policy keeps); ``memo`` is scratch space a policy may fill in ``gpu_score``
    and read back in ``remember_best``.
    """

    state: np.ndarray
    slot: np.ndarray
    take: np.ndarray
    present: np.ndarray
    model: np.ndarray
    gpu_memory: np.ndarray
    island: np.ndarray
    before: dict[str, np.ndarray]
    after: dict[str, np.ndarray]
    timeslice_capacity_milli: int
    static: Any = None
    memo: dict = field(default_factory=dict)

    def free(self, which: str = "before") -> np.ndarray:
        """(M, G) free milli per GPU (MIG cards: by free compute slices; absent or unhealthy: 0)."""
        rows = self.before if which == "before" else self.after
        return _free_milli(rows, self.present, self.timeslice_capacity_milli)


@dataclass(slots=True)
class NodeContext:
    """What the engine already knows about the candidate nodes, for a policy's ``node_score``.

    ``states`` (K,) the interned GPU state of each node; ``slots`` (K,) the best
    slot the engine memoised for that state (what the node would be given);
    ``cpu_free``/``mem_free`` (K,) the node's free host CPU (milli) and memory
    (MiB) before the request; ``static`` the snapshot's static part (for
    per-state tables a policy keeps). All arrays are read-only views.
    ``memo`` is scratch space for this one request: a policy may keep the terms
    of its ``node_score`` there and name them in ``explain`` for the winner.
    """

    static: _Static
    states: np.ndarray
    slots: np.ndarray
    cpu_free: np.ndarray
    mem_free: np.ndarray
    memo: dict = field(default_factory=dict)


def state_free(st: _Static, ids: np.ndarray) -> np.ndarray:
    """(K, G) free milli per GPU of interned states ``ids`` (as :meth:`CandidateView.free` shows them)."""
    reps = st.rep_node[ids]
    return _free_milli({f: st.rep_rows[f][ids] for f in ("mode", "mig_compute", "used_milli", "healthy")},
                       st.present[reps], st.timeslice_capacity_milli)


def _free_milli(rows: dict[str, np.ndarray], present: np.ndarray, ts_cap: int) -> np.ndarray:
    mode = rows["mode"]
    cap = np.where(mode == Mode.TIMESLICE, ts_cap, 1000)
    free = np.where(mode == Mode.MIG, ((MIG_COMPUTE_SLICES - rows["mig_compute"].astype(np.int64)) * 1000) // MIG_COMPUTE_SLICES,
                    cap - rows["used_milli"])
    # A time-sliced card offers at most one card's worth to any one request.
    free = np.minimum(free, 1000)
    return np.where(present & rows["healthy"], free, 0)


# Reasons a state cannot host an alternative. Codes index _REASONS.
_REASONS = (
    "",
    "no GPUs on the node",
    "all GPUs unhealthy",
    "fewer free whole GPUs than requested",
    "no NVLink island with enough free GPUs",
    "no GPU with enough free compute",
    "not enough free GPU memory",
    "GPU model does not support MPS",
    "no MIG-enabled GPU",
    "MIG: no free valid placement for the profile",
    "cards in another sharing mode",
    "MIG: profile not offered by this model",
)
R_NOGPU, R_UNHEALTHY, R_WHOLE, R_NVLINK, R_COMPUTE, R_MEMORY, R_NOMPS, R_NOMIG, R_MIGFULL, R_MODE, R_MIGPROF = range(1, 12)


@dataclass(slots=True)
class _StateTable:
    """Memo of (policy, alternative) over interned states: best score, best slot, reason code."""

    score: np.ndarray = field(default_factory=lambda: np.zeros(0))
    slot: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    reason: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int16))
    done: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    upto: int = 0  # every state id below this one is done

    def grow(self, n: int) -> None:
        if n <= len(self.done):
            return
        cap = max(n, 2 * len(self.done), 64)
        def ext(a: np.ndarray, fill: Any) -> np.ndarray:
            b = np.full(cap, fill, dtype=a.dtype)
            b[: len(a)] = a
            return b
        self.score, self.slot = ext(self.score, INF), ext(self.slot, -1)
        self.reason, self.done = ext(self.reason, 0), ext(self.done, False)


def _tables(st: _Static) -> dict[Any, _StateTable]:
    t = getattr(st, "_engine_tables", None)
    if t is None:
        t = st._engine_tables = {}  # type: ignore[attr-defined]
    return t


def alt_key(alt: Alternative) -> tuple:
    """Hashable identity of an alternative, for memo tables keyed by it (the engine's and a policy's)."""
    return (alt.kind, alt.count, alt.milli, alt.memory_mib, alt.profiles, alt.nvlink)


def place(snapshot: ClusterSnapshot, request: GpuRequest, policy: Any, *, rng: np.random.Generator | None = None,
          resolved: ResolvedRequest | None = None) -> Placement | Unschedulable:
    """Decide where ``request`` goes under ``policy``. Pure; see the module docstring."""
    resolved = resolved or resolve(request)
    grouped: Counter[tuple[str, str]] = Counter()
    for i, alt in enumerate(resolved.alternatives):
        out = _place_alternative(snapshot, request, alt, policy, rng)
        if isinstance(out, Placement):
            if i > 0:
                tried = "; ".join(f"{a.kind.value} did not fit" for a in resolved.alternatives[:i])
                out = _with_reason(out, f"{out.reason} ({tried})")
            return out
        for reason, count in out.items():
            grouped[(_alt_label(alt), reason)] += count
    reasons = tuple((a, r, c) for (a, r), c in sorted(grouped.items(), key=lambda kv: (-kv[1], kv[0])))
    return Unschedulable(request, reasons, snapshot.n_nodes)


def _with_reason(p: Placement, reason: str) -> Placement:
    return Placement(p.allocation, p.alternative, p.policy, p.score, p.feasible_nodes, reason)


def _alt_label(alt: Alternative) -> str:
    if alt.kind is ShareKind.MIG:
        return "mig:" + "|".join(sorted({p for _, p in alt.profiles}))
    if alt.kind is ShareKind.WHOLE:
        return f"whole x{alt.count}"
    return f"{alt.kind.value}:{alt.milli / 1000:g}"


def _host_free(snap: ClusterSnapshot) -> tuple[np.ndarray, np.ndarray]:
    """(N,) free host CPU (milli) and memory (MiB) of every node; computed once per snapshot."""
    def compute() -> tuple[np.ndarray, np.ndarray]:
        st = snap.static
        cpu, mem = st.cpu_total - snap.cpu_used, st.mem_total - snap.mem_used
        cpu.flags.writeable = mem.flags.writeable = False
        return cpu, mem
    return snap.derived("host_free", compute)


def _node_filter(snap: ClusterSnapshot, req: GpuRequest, alt: Alternative) -> tuple[np.ndarray | None, list[tuple[np.ndarray, str]]]:
    """Node-wide checks, in order; returns the passing mask (None: every node passes) and the
    (passing mask, reason) of each check, for :func:`_filter_reasons` when nothing fits."""
    st = snap.static
    checks: list[tuple[np.ndarray, str]] = []
    if req.node is not None:
        m = np.zeros(st.n, dtype=bool)
        if req.node in st.index:
            m[st.index[req.node]] = True
        checks.append((m, f"not node {req.node}"))
    if req.models:
        allowed = np.array([MODEL_INDEX[x] for x in req.models], dtype=np.int16)
        checks.append((np.isin(st.model, allowed), f"GPU model not in {'|'.join(req.models)}"))
    if alt.kind is ShareKind.MIG:
        allowed = np.array([MODEL_INDEX[x] for x, _ in alt.profiles], dtype=np.int16)
        checks.append((np.isin(st.model, allowed), "GPU model offers no such MIG profile"))
    if req.cpu_milli or req.host_memory_mib:
        cpu_free, mem_free = _host_free(snap)
        if req.cpu_milli:
            checks.append((cpu_free >= req.cpu_milli, "not enough free CPU"))
        if req.host_memory_mib:
            checks.append((mem_free >= req.host_memory_mib, "not enough free host memory"))
    if not checks:
        return None, checks
    ok = checks[0][0]
    for m, _ in checks[1:]:
        ok = ok & m
    return ok, checks


def _filter_reasons(checks: list[tuple[np.ndarray, str]], n: int) -> Counter[str]:
    """Nodes rejected by each node-wide check (the first check a node fails names it)."""
    reasons: Counter[str] = Counter()
    ok = np.ones(n, dtype=bool)
    for m, why in checks:
        c = int(np.count_nonzero(ok & ~m))
        if c:
            reasons[why] += c
        ok &= m
    return reasons


# A fresh family of snapshots (or a new alternative) with more unscored states than this
# scores only the states its nodes are in; fewer are scored all at once, by id range.
_RANGE_SCORING = 512


def _ensure_scored(st: _Static, states: np.ndarray, alt: Alternative, policy: Any, table: _StateTable) -> None:
    """Make sure every state in ``states`` has its (policy, alternative) memo.

    Ids are handed out in order, so the states created since this table was
    last brought up to date are an id range: a request usually finds one or
    two, and scoring them all skips a lookup over every node."""
    n = st.n_states
    table.grow(n)
    if table.upto == n:
        return
    if n - table.upto <= _RANGE_SCORING:
        ids = np.arange(table.upto, n)
        ids = ids[~table.done[ids]]
        table.upto = n
    else:
        missing = states[~table.done[states]]
        ids = np.unique(missing) if len(missing) else missing
    if len(ids):
        _score_states(st, ids, alt, policy, table)


def _place_alternative(snap: ClusterSnapshot, req: GpuRequest, alt: Alternative, policy: Any,
                       rng: np.random.Generator | None) -> Placement | Counter[str]:
    st = snap.static
    ok, checks = _node_filter(snap, req, alt)
    key = (policy.key, alt_key(alt))
    tables = _tables(st)
    table = tables.get(key)
    if table is None:
        table = tables[key] = _StateTable()
    if ok is None:
        idx = np.arange(st.n)
        states = snap.gstate
    else:
        idx = np.flatnonzero(ok)
        states = snap.gstate[idx]
    _ensure_scored(st, states, alt, policy, table)
    scores = table.score[states]
    feasible = np.isfinite(scores)
    n_feasible = int(np.count_nonzero(feasible))
    if not n_feasible:
        reasons = _filter_reasons(checks, st.n)
        for code, c in zip(*np.unique(table.reason[states], return_counts=True)):
            reasons[_REASONS[int(code)]] += int(c)
        return reasons
    if n_feasible < len(idx):
        cand, total, cand_states = idx[feasible], scores[feasible], states[feasible]
    else:
        cand, total, cand_states = idx, scores, states
    cpu_free, mem_free = _host_free(snap)
    ctx = NodeContext(st, cand_states, table.slot[cand_states], cpu_free[cand], mem_free[cand]) \
        if getattr(policy, "wants_context", False) else None
    extra = policy.node_score(snap, cand, alt, req, ctx) if ctx is not None else policy.node_score(snap, cand, alt, req)
    if extra is not None:
        total = total + extra
    best = total.min()
    ties = np.flatnonzero(total == best)
    pick = ties[0] if rng is None or len(ties) == 1 else ties[int(rng.integers(len(ties)))]
    node = int(cand[pick])
    slot = int(table.slot[snap.gstate[node]])
    if rng is not None and getattr(policy, "random_slot", False):
        slot = _random_slot(st, int(snap.gstate[node]), alt, rng, slot)
    alloc = _allocation(snap, node, slot, alt, req)
    where = f"{alloc.node_name} GPU {','.join(map(str, alloc.gpu_indices)) or '-'}"
    if alloc.kind is ShareKind.MIG:
        where += f" MIG {alloc.mig_profile}@{alloc.mig_start}"
    why = policy.explain(ctx, int(pick)) if ctx is not None and hasattr(policy, "explain") else ""
    reason = (f"{alt.reason}; {policy.name} chose {where} (score {float(best):.4g}, best of "
              f"{len(cand)} feasible node{'s' if len(cand) != 1 else ''}, {len(ties)} tied"
              f"{'; ' + why if why else ''})")
    return Placement(alloc, alt, policy.name, float(best), int(len(cand)), reason)


def _random_slot(st: _Static, sid: int, alt: Alternative, rng: np.random.Generator, best: int) -> int:
    """A uniformly random slot among those that fit on state ``sid`` (the paper's Random GPU
    selection); whole-card sets have one candidate, so they keep ``best``."""
    if alt.kind not in (ShareKind.MPS, ShareKind.TIMESLICE):
        return best
    _, cm, cs, _ = _candidates(st, np.array([sid]), alt)
    return int(cs[int(rng.integers(len(cs)))]) if len(cs) else best


# ---- per-state candidate enumeration -------------------------------------------------------------

def _rows(st: _Static, ids: np.ndarray) -> dict[str, np.ndarray]:
    return {f: a[ids] for f, a in st.rep_rows.items()}


def _candidates(st: _Static, ids: np.ndarray, alt: Alternative,
                before: dict[str, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every candidate slot of the states ``ids`` for ``alt`` (vectorised over them).

    Returns ``reason`` (per state: why it has no candidate, 0 if it has one),
    and per candidate the row ``cm`` into ``ids``, the ``slot`` and the ``take``
    mask of GPUs it uses. ``before`` is ``_rows(st, ids)`` when the caller has it."""
    reps = st.rep_node[ids]
    before = _rows(st, ids) if before is None else before
    present = st.present[reps]
    healthy = present & before["healthy"]
    model = st.model[reps]
    gmem = st.gpu_memory[reps]
    reason = np.zeros(len(ids), dtype=np.int16)
    no_gpu = ~present.any(axis=1)
    unhealthy = ~no_gpu & ~healthy.any(axis=1)
    kind = alt.kind

    cand_m: list[np.ndarray] = []
    cand_slot: list[np.ndarray] = []
    cand_take: list[np.ndarray] = []

    if kind is ShareKind.WHOLE and alt.count == 0:
        m = np.arange(len(ids))
        cand_m, cand_slot, cand_take = [m], [np.zeros(len(ids), dtype=np.int64)], [np.zeros_like(present)]
    elif kind is ShareKind.WHOLE:
        free_card = healthy & (before["mode"] == Mode.FREE) & ~st.mig_enabled[reps]
        if alt.memory_mib:
            free_card &= (gmem >= alt.memory_mib)[:, None]
        nfree = free_card.sum(axis=1)
        reason[:] = np.where(nfree < alt.count, R_WHOLE, 0)
        isl = st.island[reps]
        if alt.count == 1:
            # _choose_whole for one card, vectorised: the free card whose island has the
            # fewest free cards, then the lowest island, then the lowest index.
            g = free_card.shape[1]
            same = (isl[:, :, None] == isl[:, None, :]) & free_card[:, None, :]
            key = same.sum(axis=2) * (g * (g + 1)) + (isl.astype(np.int64) + 1) * g + np.arange(g)[None, :]
            rows = np.flatnonzero(nfree >= 1)
            col = np.argmin(np.where(free_card, key, np.iinfo(np.int64).max)[rows], axis=1)
            take = np.zeros((len(rows), g), dtype=bool)
            take[np.arange(len(rows)), col] = True
            cand_m, cand_slot, cand_take = [rows], [(1 << col).astype(np.int64)], [take]
        for m in (np.flatnonzero(nfree >= alt.count) if alt.count > 1 else ()):
            take = _choose_whole(free_card[m], isl[m], alt.count, need_nvlink=alt.nvlink)
            if take is None:
                reason[m] = R_NVLINK
                continue
            cand_m.append(np.array([m]))
            cand_slot.append(np.array([int(np.sum(take * (1 << np.arange(len(take)))))], dtype=np.int64))
            cand_take.append(take[None, :])
    elif kind in (ShareKind.MPS, ShareKind.TIMESLICE):
        want = Mode.MPS if kind is ShareKind.MPS else Mode.TIMESLICE
        cap = 1000 if kind is ShareKind.MPS else st.timeslice_capacity_milli
        mode_ok = healthy & ~st.mig_enabled[reps] & ((before["mode"] == Mode.FREE) | (before["mode"] == want))
        if kind is ShareKind.MPS:
            mode_ok &= st.mps_ok[reps][:, None]
        compute_ok = mode_ok & (before["used_milli"] + alt.milli <= cap)
        need_mem = _mem_need(alt, gmem)
        mem_ok = compute_ok & (before["used_mem"] + need_mem[:, None] <= gmem[:, None])
        reason[:] = np.select(
            [~mode_ok.any(axis=1) & (kind is ShareKind.MPS) & ~st.mps_ok[reps], ~mode_ok.any(axis=1),
             ~compute_ok.any(axis=1), ~mem_ok.any(axis=1)],
            [R_NOMPS, R_MODE, R_COMPUTE, R_MEMORY], 0)
        m, g = np.nonzero(mem_ok)
        take = np.zeros((len(m), present.shape[1]), dtype=bool)
        take[np.arange(len(m)), g] = True
        cand_m, cand_slot, cand_take = [m], [g.astype(np.int64)], [take]
    elif kind is ShareKind.MIG:
        mig = healthy & st.mig_enabled[reps]
        reason[:] = np.where(~mig.any(axis=1), R_NOMIG, R_MIGFULL)
        for model_name, prof_name in alt.profiles:
            prof = gpu_model(model_name).profile(prof_name)
            rows_of_model = model == MODEL_INDEX[model_name]
            base = mig & rows_of_model[:, None] & (before["mig_compute"] + prof.compute_slices <= MIG_COMPUTE_SLICES)
            fixed = st.mig_fixed[reps]
            bits = st.layout_bits.get(prof.name)
            for start in prof.placements:
                mask = prof.mask(start)
                ok = base & ((before["mig_mask"] & mask) == 0)
                layout_ok = ~fixed if bits is None else (~fixed | ((bits[reps] >> start) & 1).astype(bool))
                ok &= layout_ok
                m, g = np.nonzero(ok)
                if len(m):
                    take = np.zeros((len(m), present.shape[1]), dtype=bool)
                    take[np.arange(len(m)), g] = True
                    cand_m.append(m)
                    cand_slot.append((g * MIG_SLOT + start).astype(np.int64))
                    cand_take.append(take)
    reason = np.where(no_gpu & ~((kind is ShareKind.WHOLE) and alt.count == 0), R_NOGPU,
                      np.where(unhealthy & ~((kind is ShareKind.WHOLE) and alt.count == 0), R_UNHEALTHY, reason))
    if not cand_m:
        return reason, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros((0, present.shape[1]), dtype=bool)
    return reason, np.concatenate(cand_m), np.concatenate(cand_slot), np.concatenate(cand_take)


def _score_states(st: _Static, ids: np.ndarray, alt: Alternative, policy: Any, table: _StateTable) -> None:
    """Fill ``table`` for the given new state ids (vectorised over them)."""
    before = _rows(st, ids)
    reason, cm, cs, ct = _candidates(st, ids, alt, before)
    table.done[ids] = True
    table.score[ids] = INF
    table.reason[ids] = reason
    if not len(cm):
        return
    reps = st.rep_node[ids]
    present = st.present[reps]
    model = st.model[reps]
    gmem = st.gpu_memory[reps]
    b = {f: a[cm] for f, a in before.items()}
    after = _after(b, ct, cs, alt, gmem[cm], st.timeslice_capacity_milli, model[cm])
    view = CandidateView(state=ids[cm], slot=cs, take=ct, present=present[cm], model=model[cm], gpu_memory=gmem[cm],
                         island=st.island[reps][cm], before=b, after=after,
                         timeslice_capacity_milli=st.timeslice_capacity_milli, static=st)
    sc = np.asarray(policy.gpu_score(view, alt), dtype=np.float64)
    # Best per state: lowest score, then lowest slot (deterministic).
    order = np.lexsort((cs, sc, cm))
    cm_o = cm[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = cm_o[1:] != cm_o[:-1]
    win = order[first]
    table.score[ids[cm[win]]] = 0.0 if getattr(policy, "slot_rank_only", False) else sc[win]
    table.slot[ids[cm[win]]] = cs[win]
    table.reason[ids[cm[win]]] = 0
    remember = getattr(policy, "remember_best", None)
    if remember is not None:
        remember(view, alt, win)


# A *slot* is one int naming where a candidate goes on its node: for whole cards the
# bitmask of their GPU columns, for a MIG instance ``column * MIG_SLOT + start``, for
# a share its GPU column. ``_candidates`` makes them; these two read them.
MIG_SLOT = 8


def slot_take(slots: np.ndarray, alt: Alternative, g: int) -> np.ndarray:
    """(K, g) mask of the GPU columns that ``alt`` takes at each of ``slots``."""
    cols = np.arange(g)[None, :]
    slots = np.asarray(slots, dtype=np.int64)
    if alt.kind is ShareKind.WHOLE:
        return ((slots[:, None] >> cols) & 1).astype(bool) if alt.count else np.zeros((len(slots), g), dtype=bool)
    if alt.kind is ShareKind.MIG:
        return cols == (slots // MIG_SLOT)[:, None]
    return cols == slots[:, None]


def state_free_after(st: _Static, ids: np.ndarray, slots: np.ndarray, alt: Alternative) -> np.ndarray:
    """(K, G) free milli per GPU of states ``ids`` after ``alt`` takes ``slots`` there
    (what :meth:`CandidateView.free` ``("after")`` shows for that candidate)."""
    reps = st.rep_node[ids]
    before = _rows(st, ids)
    present = st.present[reps]
    take = slot_take(slots, alt, present.shape[1])
    after = _after(before, take, slots, alt, st.gpu_memory[reps], st.timeslice_capacity_milli, st.model[reps])
    return _free_milli(after, present, st.timeslice_capacity_milli)


def _mem_need(alt: Alternative, gmem: np.ndarray) -> np.ndarray:
    if alt.memory_mib is not None:
        return np.full(len(gmem), alt.memory_mib, dtype=np.int64)
    if alt.kind is ShareKind.MPS:
        # MPS without an explicit limit: the card's memory in proportion to the SM share.
        return (gmem * alt.milli) // 1000
    return np.zeros(len(gmem), dtype=np.int64)


def _choose_whole(free: np.ndarray, island: np.ndarray, count: int, need_nvlink: bool) -> np.ndarray | None:
    """Pick ``count`` free cards, all in one NVLink island when possible.

    Among islands with enough free cards, the one with the fewest free cards
    wins (keeps big islands whole for big requests); without one, a
    ``need_nvlink`` request fails and others take the lowest indices.
    """
    take = np.zeros(len(free), dtype=bool)
    best, best_free = None, None
    for k in np.unique(island[free]):
        members = np.flatnonzero(free & (island == k))
        if len(members) >= count and (best_free is None or len(members) < best_free):
            best, best_free = members, len(members)
    if best is not None:
        take[best[:count]] = True
        return take
    if need_nvlink and count > 1:
        return None
    take[np.flatnonzero(free)[:count]] = True
    return take


_CHANGES = {ShareKind.WHOLE: ("mode", "used_milli", "used_mem", "holders"),
            ShareKind.MPS: ("mode", "used_milli", "used_mem", "holders"),
            ShareKind.TIMESLICE: ("mode", "used_milli", "used_mem", "holders"),
            ShareKind.MIG: ("mig_mask", "mig_compute", "used_mem", "holders")}


def _after(b: dict[str, np.ndarray], take: np.ndarray, slot: np.ndarray, alt: Alternative, gmem: np.ndarray,
           ts_cap: int, model: np.ndarray) -> dict[str, np.ndarray]:
    kind = alt.kind
    # Copy what this kind changes; the other fields are shared with ``b`` (views are read-only).
    changed = _CHANGES[kind] if kind is not ShareKind.WHOLE or alt.count else ()
    a = {f: (v.copy() if f in changed else v) for f, v in b.items()}
    if kind is ShareKind.WHOLE:
        if alt.count:
            a["mode"][take] = Mode.WHOLE
            a["used_milli"][take] = 1000
            a["used_mem"] = np.where(take, gmem[:, None], a["used_mem"])
            a["holders"][take] += 1
    elif kind in (ShareKind.MPS, ShareKind.TIMESLICE):
        a["mode"][take] = Mode.MPS if kind is ShareKind.MPS else Mode.TIMESLICE
        a["used_milli"][take] += alt.milli
        a["used_mem"] += np.where(take, _mem_need(alt, gmem)[:, None], 0)
        a["holders"][take] += 1
    elif kind is ShareKind.MIG:
        start = slot % MIG_SLOT
        for i in range(len(slot)):
            prof = alt.profile_for(MODEL_NAMES[model[i]])
            assert prof is not None
            a["mig_mask"][i][take[i]] |= prof.mask(int(start[i]))
            a["mig_compute"][i][take[i]] += prof.compute_slices
            a["used_mem"][i][take[i]] += prof.memory_mib
            a["holders"][i][take[i]] += 1
    return a


def _allocation(snap: ClusterSnapshot, node: int, slot: int, alt: Alternative, req: GpuRequest) -> Allocation:
    st = snap.static
    model_name = MODEL_NAMES[st.model[node]] if st.model[node] >= 0 else None
    kind = alt.kind
    mig_profile = mig_start = mig_uuid = None
    milli, mem = alt.milli, 0
    cols = tuple(int(j) for j in np.flatnonzero(slot_take(np.array([slot]), alt, st.g)[0]))
    if kind is ShareKind.WHOLE:
        mem = int(st.gpu_memory[node]) if cols else 0
    elif kind is ShareKind.MIG:
        mig_start = slot % MIG_SLOT
        prof = alt.profile_for(model_name or "")
        assert prof is not None
        mig_profile = prof.name
        mig_uuid = st.mig_uuid.get((node, cols[0], mig_start))
        milli = prof.compute_slices * 1000 // MIG_COMPUTE_SLICES
        mem = prof.memory_mib
    else:
        mem = int(_mem_need(alt, np.array([st.gpu_memory[node]]))[0])
    uuids = st.uuids[node]
    return Allocation(
        node=node, node_name=st.names[node], kind=kind, gpus=cols,
        gpu_indices=tuple(int(st.gpu_index[node, j]) for j in cols), gpu_uuids=tuple(uuids[j] for j in cols),
        model=model_name, milli=milli if kind is not ShareKind.MIG else 0, memory_mib=mem,
        mig_profile=mig_profile, mig_start=mig_start, mig_uuid=mig_uuid,
        sm_percent=alt.sm_percent, client_priority=alt.client_priority,
        cpu_milli=req.cpu_milli, host_memory_mib=req.host_memory_mib,
    )
