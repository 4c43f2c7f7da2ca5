"""The placement engine: ``place(snapshot, request, policy) -> Placement | Unschedulable``.

Pure: imports no Ray, does no I/O, never changes the snapshot. One call
reads as a short script:

1. **resolve** the request into alternatives, cheapest first
   (:func:`orchestrator.scheduling.alternatives.resolve`);
2. for each alternative, **filter** nodes on what is node-wide (the node and
   model constraints, free CPU and host memory) -- a few vector operations;
3. **score states, not nodes**: every node's GPU state is interned
   (``snapshot.gstate``); for each distinct state not seen before with this
   (policy, alternative) the engine enumerates the candidate slots
   (:func:`~orchestrator.scheduling.candidates.enumerate_slots`), builds the
   before/after rows and asks the policy for a score; the best slot of each
   state is memoised in a per-(policy, alternative) table (:mod:`.state_scores`). A node's score is
   its state's best score plus the policy's node-wide term;
4. **choose** the lowest score; ties go to a random node when an ``rng`` is
   given (as kube-scheduler samples among equal top scores) and to the lowest
   node index otherwise;
5. if no alternative fits, return :class:`Unschedulable` with the rejected
   nodes **grouped by reason** ("812 nodes: not enough free GPU memory"),
   each a :class:`~orchestrator.core.reasons.Reason` with its ``fit.*`` cause.

Invariants: the memo tables live in the snapshot family's cache (key
``("engine", policy.key, alt_key)``) and are keyed by the interned state id,
which is a pure function of the state's bytes, so caching never changes an
answer; an answer given without an ``rng`` is remembered with the snapshot it
was decided on (its ``derived`` memo, keyed by policy, request and
alternatives), and so is only ever given again for that very snapshot; a :class:`Placement` always fits the snapshot it was decided on
(``snapshot.apply`` accepts it); every decision carries a reason with a cause.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from orchestrator.core import codec
from orchestrator.core.allocation import Allocation
from orchestrator.core.catalogue import MIG_COMPUTE_SLICES, MODEL_NAMES
from orchestrator.core.reasons import Cause, Reason, ReasonFields
from orchestrator.core.request import (
    Alternative,
    GpuRequest,
    ResolvedRequest,
    ShareKind,
)
from orchestrator.scheduling.alternatives import resolve
from orchestrator.scheduling.candidates import (
    FIT_REASONS,
    MIG_SLOT,
    alt_key,
    memory_need,
    random_slot,
    slot_take,
)
from orchestrator.scheduling.policy import NodeContext, PlacementPolicy
from orchestrator.scheduling.snapshot import MODEL_INDEX, ClusterSnapshot
from orchestrator.scheduling.state_scores import StateTable, ensure_scored

INF = np.inf


@dataclass(frozen=True, slots=True)
class Placement(ReasonFields):
    """Where a request goes, and why (cause ``placed``). Its JSON (derived, :mod:`~orchestrator.core.codec`)
    leaves out the alternative: the allocation says what was taken."""

    allocation: Allocation
    alternative: Annotated[Alternative, Field(exclude=True)]
    policy: str
    score: float
    feasible_nodes: int
    reason: Reason

    def to_json(self) -> dict[str, Any]:
        return codec.dump(self)


@dataclass(frozen=True, slots=True)
class Unschedulable:
    """No alternative fits. ``reasons`` groups the rejected nodes: ((alternative, reason), count), largest first."""

    request: GpuRequest
    reasons: tuple[tuple[str, Reason, int], ...]
    nodes: int

    @property
    def message(self) -> str:
        parts = [f"{count} node{'s' if count != 1 else ''}: {reason} [{alt}]" for alt, reason, count in self.reasons]
        return f"no node fits {self.request.describe()} ({self.nodes} nodes): " + "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        # By hand: the request as its description, the reasons grouped, the message computed.
        return {"request": self.request.describe(), "nodes": self.nodes,
                "reasons": [{"alternative": a, "reason": r.text, "cause": r.cause.value, "nodes": c}
                            for a, r, c in self.reasons],
                "message": self.message}


def place(snapshot: ClusterSnapshot, request: GpuRequest, policy: PlacementPolicy, *,
          rng: np.random.Generator | None = None, resolved: ResolvedRequest | None = None) -> Placement | Unschedulable:
    """Decide where ``request`` goes under ``policy``. Pure; see the module docstring.

    Without an ``rng`` the answer is a pure function of (snapshot, request, alternatives, policy), so it is
    remembered with the snapshot (:meth:`~.snapshot.ClusterSnapshot.derived`, which dies with it): asked again
    on the same snapshot -- the fast grant path after the cycle's :func:`warm` asked first -- it is the same
    answer, and the node totals its computation read are marked read again, as that computation marked them."""
    resolved = resolved or resolve(request)
    if rng is not None:
        return _place(snapshot, request, resolved, policy, rng)[0]
    memo: dict[Any, tuple[Placement | Unschedulable, int]] = snapshot.derived(("engine", "place"), dict)
    key = (policy.key, request, resolved)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _place(snapshot, request, resolved, policy, None)
    else:
        kept = snapshot.static.cache(("engine", "node_totals"), OrderedDict)
        for alt in resolved.alternatives[:hit[1]]:
            e = kept.get(k := (policy.key, alt_key(alt), request))
            if e is not None:
                kept.move_to_end(k)
                e.placed = True
    return hit[0]


def _place(snapshot: ClusterSnapshot, request: GpuRequest, resolved: ResolvedRequest, policy: PlacementPolicy,
           rng: np.random.Generator | None) -> tuple[Placement | Unschedulable, int]:
    """:func:`place`'s answer, computed, and how many alternatives it read (in order) to find it."""
    grouped: Counter[tuple[str, Reason]] = Counter()
    for i, alt in enumerate(resolved.alternatives):
        out = _place_alternative(snapshot, request, alt, policy, rng)
        if isinstance(out, Placement):
            if i > 0:
                label = _alt_label if request.fallback else (lambda a: a.kind.value)
                tried = "; ".join(f"{label(a)} did not fit" for a in resolved.alternatives[:i])
                out = replace(out, reason=replace(out.reason, text=f"{out.reason.text} ({tried})"))
            return out, i + 1
        for reason, count in out.items():
            grouped[(_alt_label(alt), reason)] += count
    reasons = tuple((a, r, c) for (a, r), c in sorted(grouped.items(), key=lambda kv: (-kv[1], kv[0][0], kv[0][1].text)))
    return Unschedulable(request, reasons, snapshot.n_nodes), len(resolved.alternatives)


def feasible_nodes(snapshot: ClusterSnapshot, request: GpuRequest, policy: PlacementPolicy, *,
                   resolved: ResolvedRequest | None = None) -> list[tuple[int, float]]:
    """Every node where ``request`` fits now, as (node index, score), best first: nodes of the first
    alternative that fits them, in the order :func:`place` tries alternatives, then by score, then node
    index. Pure; what :func:`place` would choose among is the head of this list (without an ``rng``).
    The gang placement (:mod:`.gang`) reads it to know which nodes to try."""
    resolved = resolved or resolve(request)
    seen: set[int] = set()
    out: list[tuple[int, float]] = []
    for alt in resolved.alternatives:
        table = snapshot.static.cache(("engine", policy.key, alt_key(alt)), StateTable)
        totals = _node_totals(snapshot, request, alt, policy, table)
        idx = np.flatnonzero(totals.feasible)
        scores = totals.total[idx]
        for k in np.lexsort((idx, scores)):
            node = int(idx[k])
            if node not in seen:
                seen.add(node)
                out.append((node, float(scores[k])))
    return out


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


_NOT_ENOUGH_CPU = Reason(Cause.FIT_CPU, "not enough free CPU")
_NOT_ENOUGH_HOST_MEMORY = Reason(Cause.FIT_HOST_MEMORY, "not enough free host memory")
_NO_SUCH_MIG_PROFILE = Reason(Cause.FIT_MIG_PROFILE, "GPU model offers no such MIG profile")


def _node_filter(snap: ClusterSnapshot, req: GpuRequest, alt: Alternative, nodes: np.ndarray | None = None
                 ) -> tuple[np.ndarray | None, list[tuple[np.ndarray, Reason]]]:
    """Node-wide checks, in order, over ``nodes`` (None: every node); returns the passing mask
    (None: every node passes) and the (passing mask, reason) of each check, for
    :func:`_filter_reasons` when nothing fits. Each check reads only its own node."""
    st = snap.static
    checks: list[tuple[np.ndarray, Reason]] = []
    model = st.model if nodes is None else st.model[nodes]
    if req.node is not None:
        pin = st.index.get(req.node, -1)
        if nodes is None:
            m = np.zeros(st.n, dtype=bool)
            if pin >= 0:
                m[pin] = True
        else:
            m = nodes == pin
        checks.append((m, Reason(Cause.FIT_NODE_PIN, f"not node {req.node}")))
    if req.models:
        allowed = np.array([MODEL_INDEX[x] for x in req.models], dtype=np.int16)
        checks.append((np.isin(model, allowed), Reason(Cause.FIT_MODEL, f"GPU model not in {'|'.join(req.models)}")))
    if alt.kind is ShareKind.MIG:
        allowed = np.array([MODEL_INDEX[x] for x, _ in alt.profiles], dtype=np.int16)
        checks.append((np.isin(model, allowed), _NO_SUCH_MIG_PROFILE))
    if req.cpu_milli or req.host_memory_mib:
        cpu_free, mem_free = _host_free(snap)
        if nodes is not None:
            cpu_free, mem_free = cpu_free[nodes], mem_free[nodes]
        if req.cpu_milli:
            checks.append((cpu_free >= req.cpu_milli, _NOT_ENOUGH_CPU))
        if req.host_memory_mib:
            checks.append((mem_free >= req.host_memory_mib, _NOT_ENOUGH_HOST_MEMORY))
    if not checks:
        return None, checks
    ok = checks[0][0]
    for m, _ in checks[1:]:
        ok = ok & m
    return ok, checks


def _filter_reasons(checks: list[tuple[np.ndarray, Reason]], n: int) -> Counter[Reason]:
    """Nodes rejected by each node-wide check (the first check a node fails names it)."""
    reasons: Counter[Reason] = Counter()
    ok = np.ones(n, dtype=bool)
    for m, why in checks:
        c = int(np.count_nonzero(ok & ~m))
        if c:
            reasons[why] += c
        ok &= m
    return reasons


@dataclass(slots=True)
class _NodeTotals:
    """One (policy, alternative, request)'s total score on every node of
    the snapshot whose dynamic vectors are ``gstate``/``cpu_used``/``mem_used``: ``total`` (N,)
    the state's best score plus the policy's node-wide term, INF where the node fails a node-wide
    check or its state has no slot; ``feasible`` (N,) the nodes that have a slot; ``memo`` the
    per-candidate terms ``node_score`` kept in its :class:`NodeContext` memo, per node, for
    the winner's ``explain``; ``request`` and ``alt`` what they are the totals of, and ``placed``
    whether a placement read them since the last :func:`warm` (which then brings them up to date)."""

    gstate: np.ndarray
    cpu_used: np.ndarray
    mem_used: np.ndarray
    total: np.ndarray
    feasible: np.ndarray
    request: GpuRequest
    alt: Alternative
    memo: dict[str, np.ndarray] = field(default_factory=dict)
    placed: bool = True


# How many requests' node totals a snapshot family keeps (least recently used go first); a
# request whose totals are gone is scored over every node again.
_NODE_TOTALS_KEPT = 64


def warm(snapshot: ClusterSnapshot, policy: PlacementPolicy, most: int = 4) -> int:
    """Bring the node totals of the requests placed under ``policy`` since the last call (the most recent
    ``most`` of them) up to date with ``snapshot``, scoring the states its nodes are in that are new, and
    decide each such request's placement on ``snapshot`` (:func:`place`, as the head's scheduler asks: its
    alternatives all, no ``rng``) and the snapshot it leaves (``snapshot.prepare``); returns how many totals
    were brought up to date.

    For idle time (the head calls it at the end of each cycle): the next placement of such a request on
    ``snapshot`` -- the fast grant path's -- then finds its answer ready instead of recomputing the totals of
    the nodes the last placements changed and choosing among them (docs/load.md). Pure in the sense of
    :func:`place`: it fills the caches exactly as that placement would have, so it never changes an answer;
    it only moves the work. A request not placed since the last call is left alone, so the work it does is
    bounded by what the placements since then did."""
    kept = snapshot.static.cache(("engine", "node_totals"), OrderedDict)
    recent = [e for (pkey, _, _), e in reversed(kept.items()) if e.placed and pkey == policy.key][:most]
    placed = {id(e) for e in kept.values() if e.placed}
    for e in reversed(recent):  # oldest first: the least recently used order stays as the placements left it
        res = place(snapshot, e.request, policy)
        if isinstance(res, Placement):
            snapshot.prepare(res.allocation)
    for e in kept.values():
        if id(e) not in placed:  # read (or made) by the placements just asked, not by one since the last call
            e.placed = False
    for e in reversed(recent):
        table = snapshot.static.cache(("engine", policy.key, alt_key(e.alt)), StateTable)
        _node_totals(snapshot, e.request, e.alt, policy, table)
        e.placed = False  # as a placement would have left them, but not read by one since
    return len(recent)


def _node_totals(snap: ClusterSnapshot, req: GpuRequest, alt: Alternative, policy: PlacementPolicy,
                 table: StateTable) -> _NodeTotals:
    """The request's :class:`_NodeTotals` on ``snap``.

    A node's total is a pure function of that node's GPU state, free CPU and free memory (and
    of the family's static part): the state's memo, the node-wide checks, and the policy's
    ``node_score``, which reads only its own node (:class:`~.policy.PlacementPolicy`). So the
    totals kept from the last snapshot this request was placed on are recomputed only for the
    nodes whose state, CPU or memory differ (values are compared, so any order of snapshots is
    fine): after a placement, one node. Each value is computed as a full pass would (the same
    elementwise operations on the same inputs), so keeping them never changes an answer."""
    st = snap.static
    kept = st.cache(("engine", "node_totals"), OrderedDict)
    key = (policy.key, alt_key(alt), req)  # the whole request: whatever of it node_score reads
    e = kept.get(key)
    if e is None:
        nodes = None
        e = _NodeTotals(snap.gstate, snap.cpu_used, snap.mem_used, np.full(st.n, INF), np.zeros(st.n, dtype=bool),
                        req, alt)
        kept[key] = e
        if len(kept) > _NODE_TOTALS_KEPT:
            kept.popitem(last=False)
    else:
        kept.move_to_end(key)
        e.placed = True
        if e.gstate is snap.gstate and e.cpu_used is snap.cpu_used and e.mem_used is snap.mem_used:
            return e
        nodes = np.flatnonzero((snap.gstate != e.gstate) | (snap.cpu_used != e.cpu_used) | (snap.mem_used != e.mem_used))
        e.gstate, e.cpu_used, e.mem_used = snap.gstate, snap.cpu_used, snap.mem_used
        if not len(nodes):
            return e
        e.total[nodes] = INF
        e.feasible[nodes] = False
    ok, _ = _node_filter(snap, req, alt, nodes)
    idx = np.arange(st.n) if nodes is None else nodes
    if ok is not None:
        idx = idx[ok]
    states = snap.gstate[idx]
    ensure_scored(st, states, alt, policy, table)
    scores = table.score.values[states]
    feasible = np.isfinite(scores)
    cand, total, cand_states = idx[feasible], scores[feasible], states[feasible]
    if len(cand):
        ctx = _context(snap, cand, cand_states, table, policy)
        extra = policy.node_score(snap, cand, alt, req, ctx)
        e.total[cand] = total if extra is None else total + extra
        e.feasible[cand] = True
        for name, values in (ctx.memo.items() if ctx is not None else ()):
            col = e.memo.get(name)
            if col is None:
                col = e.memo[name] = np.full(st.n, np.nan)
            col[cand] = values
    return e


def _context(snap: ClusterSnapshot, cand: np.ndarray, cand_states: np.ndarray, table: StateTable,
             policy: PlacementPolicy) -> NodeContext | None:
    """The :class:`NodeContext` of candidate nodes ``cand`` (in states ``cand_states``), when the policy asks for one."""
    if not policy.capabilities.node_context:
        return None
    cpu_free, mem_free = _host_free(snap)
    return NodeContext(snap.static, cand_states, table.slot.values[cand_states], cpu_free[cand], mem_free[cand])


def _place_alternative(snap: ClusterSnapshot, req: GpuRequest, alt: Alternative, policy: PlacementPolicy,
                       rng: np.random.Generator | None) -> Placement | Counter[Reason]:
    st = snap.static
    table = st.cache(("engine", policy.key, alt_key(alt)), StateTable)
    totals = _node_totals(snap, req, alt, policy, table)
    n_feasible = int(np.count_nonzero(totals.feasible))
    if not n_feasible:
        ok, checks = _node_filter(snap, req, alt)
        states = snap.gstate if ok is None else snap.gstate[np.flatnonzero(ok)]
        reasons = _filter_reasons(checks, st.n)
        for code, c in zip(*np.unique(table.reason.values[states], return_counts=True)):
            reasons[FIT_REASONS[int(code)]] += int(c)  # type: ignore[index]
        return reasons
    total = totals.total
    best = total.min()
    if not np.isfinite(best):  # a node-wide term of +inf: rank among the feasible nodes only
        total = np.where(totals.feasible, total, np.nan)
        best = np.nanmin(total)
    ties = np.flatnonzero(total == best)  # node indices, ascending: the lowest index first
    node = int(ties[0] if rng is None or len(ties) == 1 else ties[int(rng.integers(len(ties)))])
    slot = int(table.slot.values[snap.gstate[node]])
    if rng is not None and policy.capabilities.random_slot:
        slot = random_slot(st, int(snap.gstate[node]), alt, rng, slot)
    alloc = _allocation(snap, node, slot, alt, req)
    why = ""
    if policy.capabilities.node_context:  # the winner's terms, as node_score kept them for it
        one = np.array([node])
        ctx = _context(snap, one, snap.gstate[one], table, policy)
        assert ctx is not None
        ctx.memo.update((name, col[one]) for name, col in totals.memo.items())
        why = policy.explain(ctx, 0)
    return Placement(alloc, alt, policy.name, float(best), n_feasible,
                     _placed_reason(alloc, alt, policy.name, float(best), n_feasible, len(ties), why))


def _placed_reason(alloc: Allocation, alt: Alternative, policy: str, score: float, feasible: int, tied: int,
                   why: str) -> Reason:
    where = f"{alloc.node_name} GPU {','.join(map(str, alloc.gpu_indices)) or '-'}"
    if alloc.kind is ShareKind.MIG:
        where += f" MIG {alloc.mig_profile}@{alloc.mig_start}"
    return Reason(Cause.PLACED, f"{alt.reason}; {policy} chose {where} (score {score:.4g}, best of "
                                f"{feasible} feasible node{'s' if feasible != 1 else ''}, {tied} tied"
                                f"{'; ' + why if why else ''})")


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
        mem = int(memory_need(alt, np.array([st.gpu_memory[node]]))[0])
    uuids = st.uuids[node]
    return Allocation(
        node=node, node_name=st.names[node], kind=kind, gpus=cols,
        gpu_indices=tuple(int(st.gpu_index[node, j]) for j in cols), gpu_uuids=tuple(uuids[j] for j in cols),
        model=model_name, milli=milli if kind is not ShareKind.MIG else 0, memory_mib=mem,
        mig_profile=mig_profile, mig_start=mig_start, mig_uuid=mig_uuid,
        sm_percent=alt.sm_percent, client_priority=alt.client_priority,
        cpu_milli=req.cpu_milli, host_memory_mib=req.host_memory_mib,
    )
