"""Gang placement: ``place_gang(snapshot, gang, policy) -> GangPlacement | GangUnschedulable``.

A gang (:class:`~orchestrator.core.gang_request.GangRequest`) is ``workers`` identical workers that run
together or not at all -- a Ray Train run over a placement group. Pure, like the engine it builds on:
it imports no Ray, does no I/O and never changes the snapshot.

The script:

1. **capacity per node**: for every node where one worker fits (the engine's own feasibility,
   :func:`~orchestrator.scheduling.engine.feasible_nodes`), place workers pinned to that node one after
   the other on a copy of the snapshot until the gang is complete or the node is full. What one node
   holds depends only on that node's state, so these sequences are independent of each other and the
   chosen ones are applied together as they are;
2. **choose nodes** by the gang's preference:

   * ``same_node``: the best-scored node that holds every worker (else ``fit.gang_same_node``);
   * ``fewest_nodes`` (default): nodes that hold the most workers first (ties: the policy's score of
     their first worker, then node index), until the gang is complete. Workers are identical, so
     taking the largest capacities first spans the fewest nodes there can be;
   * neither: each worker where the policy scores best, one after the other (the engine's choice,
     which may spread the gang as the policy likes);
3. **all or nothing**: either every worker has a placement (:class:`GangPlacement`, cause
   ``placed.gang``), or none is granted (:class:`GangUnschedulable`), with a reason per worker that
   did not fit (``fit.gang`` and the engine's grouped reasons for the first of them).

**Elastic gangs** (``min_workers`` set): :func:`place_elastic` places the gang at the largest size ``k`` in
``min_workers..workers`` that fits now, all or nothing at ``k`` (cause ``placed.gang_elastic``, ``k`` in the
reason): ``place_gang`` at the most first; else from the most the first attempt's capacity pass found room
for (exact for ``fewest_nodes``, where nodes fill independently) downwards, one ``place_gang`` per size tried,
never below ``min_workers`` (below it: the :class:`GangUnschedulable` of the least size).

Worker ``i`` is bundle ``i`` of the gang's placement group; workers are numbered in node order of
the choice, so the workers of one node have consecutive indices.

Invariants: a :class:`GangPlacement` has exactly ``workers`` placements and ``snapshot.apply`` of all
of them together succeeds; a :class:`GangUnschedulable` grants nothing; the same inputs give the same
answer (every tie ends in the node index). Cost: one pinned placement per worker and feasible node
(at most ``workers`` per node), so a gang of 8 on 1,000 feasible nodes tries up to 8,000 placements;
the capacity pass stops at the first node that holds the whole gang when ``fewest_nodes`` is on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.core import codec
from orchestrator.core.reasons import Cause, Reason
from orchestrator.core.request import GpuRequest
from orchestrator.core.gang_request import GangRequest
from orchestrator.scheduling.engine import Placement, Unschedulable, feasible_nodes, place
from orchestrator.scheduling.policy import PlacementPolicy
from orchestrator.scheduling.snapshot import ClusterSnapshot


@codec.by_hand
@dataclass(frozen=True, slots=True)
class GangPlacement:
    """Every worker's placement (index = worker index = bundle index) and why (cause ``placed.gang``)."""

    gang: GangRequest
    placements: tuple[Placement, ...]
    reason: Reason

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes the gang spans, in worker order, each once."""
        return tuple(dict.fromkeys(p.allocation.node_name for p in self.placements))

    def apply(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """``snapshot`` with every worker's allocation taken."""
        for p in self.placements:
            snapshot = snapshot.apply(p.allocation)
        return snapshot

    def to_json(self) -> dict[str, Any]:
        # By hand: the gang as its description, the nodes computed, the placements shown as workers.
        return {"gang": self.gang.describe(), "nodes": list(self.nodes),
                "workers": [p.to_json() for p in self.placements], **self.reason.fields()}


@dataclass(frozen=True, slots=True)
class GangUnschedulable:
    """The gang does not fit as a whole; nothing of it is granted.

    ``placed``: how many workers would fit; ``workers``: (worker index, why it does not fit) for each
    worker left over; ``unschedulable``: the engine's grouped reasons for the first of them."""

    gang: GangRequest
    placed: int
    workers: tuple[tuple[int, Reason], ...]
    reason: Reason
    unschedulable: Unschedulable | None = None

    @property
    def message(self) -> str:
        return self.reason.text

    def worker_reason(self, index: int) -> Reason | None:
        """Why worker ``index`` does not fit (None: it would fit, the gang waits for the others)."""
        return next((r for i, r in self.workers if i == index), None)

    def to_json(self) -> dict[str, Any]:
        # By hand: the gang as its description, each worker's reason as a mapping, this reason after the rest.
        return {"gang": self.gang.describe(), "placed": self.placed,
                "workers": [{"worker": i, "reason": r.text, "cause": r.cause.value} for i, r in self.workers],
                "unschedulable": self.unschedulable.to_json() if self.unschedulable else None, **self.reason.fields()}


def _pinned(worker: GpuRequest, node: str) -> GpuRequest:
    return worker.model_copy(update={"node": node})


def _fill(snapshot: ClusterSnapshot, worker: GpuRequest, node: str, policy: PlacementPolicy,
          need: int) -> tuple[list[Placement], Unschedulable | None]:
    """Up to ``need`` workers placed one after the other on ``node`` alone, and why the next one did not fit."""
    req = _pinned(worker, node)
    sim, out = snapshot, []
    while len(out) < need:
        res = place(sim, req, policy)
        if not isinstance(res, Placement):
            return out, res
        out.append(res)
        sim = sim.apply(res.allocation)
    return out, None


def _ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    parts: list[str] = []
    for i in indices:
        if parts and parts[-1][1] == i - 1:
            parts[-1] = (parts[-1][0], i)
        else:
            parts.append((i, i))  # type: ignore[arg-type]
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in parts)  # type: ignore[misc]


def _workers_word(indices: list[int]) -> str:
    return f"worker{'s' if len(indices) != 1 else ''} {_ranges(indices)}"


def place_gang(snapshot: ClusterSnapshot, gang: GangRequest, policy: PlacementPolicy) -> GangPlacement | GangUnschedulable:
    """Place every worker of ``gang`` or none; see the module docstring."""
    n = gang.workers
    worker = gang.worker
    if not gang.same_node and not gang.fewest_nodes:
        return _place_in_turn(snapshot, gang, policy)
    nodes = feasible_nodes(snapshot, worker, policy)
    if not nodes:
        none = place(snapshot, worker, policy)
        assert isinstance(none, Unschedulable)
        why = Reason(Cause.FIT_GANG, f"no worker of {gang.describe()} fits anywhere: {none.message}")
        return GangUnschedulable(gang, 0, tuple((i, why) for i in range(n)), why, none)
    st = snapshot.static
    fills: list[tuple[int, float, int, list[Placement], Unschedulable | None]] = []
    for node, score in nodes:  # best-scored first
        got, stop = _fill(snapshot, worker, st.names[node], policy, n)
        fills.append((len(got), score, node, got, stop))
        if len(got) == n:
            break  # one node holds it all: no placement spans fewer nodes, and this is the best-scored such node
    fills.sort(key=lambda f: (-f[0], f[1], f[2]))
    if gang.same_node:
        if fills[0][0] < n:
            most = ", ".join(f"{st.names[f[2]]} holds {f[0]}" for f in fills[:3])
            why = Reason(Cause.FIT_GANG_SAME_NODE, f"no node holds all {n} workers of {gang.describe()} ({most})")
            return GangUnschedulable(gang, 0, tuple((i, why) for i in range(n)), why, fills[0][4])
        chosen = [fills[0]]
    else:
        chosen, total = [], 0
        for f in fills:
            if total >= n:
                break
            chosen.append(f)
            total += f[0]
        if total < n:
            return _short(snapshot, gang, policy, fills, total)
    placements: list[Placement] = []
    spans: list[str] = []
    for count, _, node, got, _ in chosen:
        take = got[: n - len(placements)]
        spans.append(f"{_workers_word(list(range(len(placements), len(placements) + len(take))))} on {st.names[node]}")
        placements.extend(take)
    k = len(chosen)
    pref = "one node, as required" if gang.same_node else (
        "the fewest nodes that hold it" if k > 1 else "one node")
    held = ", ".join(f"{st.names[f[2]]} {f[0]}" for f in fills[:4])
    why = Reason(Cause.PLACED_GANG, f"{gang.describe()}: {'; '.join(spans)} ({k} node{'s' if k != 1 else ''}: {pref}; "
                                    f"workers each node holds: {held}); per worker: {placements[0].alternative.reason}")
    return GangPlacement(gang, tuple(placements), why)


def place_elastic(snapshot: ClusterSnapshot, gang: GangRequest,
                  policy: PlacementPolicy) -> GangPlacement | GangUnschedulable:
    """An elastic gang at the largest size from ``gang.least`` to ``gang.workers`` that fits (see the module
    docstring); a fixed gang as :func:`place_gang`. The placement's ``gang`` is the size placed (fixed)."""
    res = place_gang(snapshot, gang.sized(gang.workers) if gang.elastic else gang, policy)
    if not gang.elastic:
        return res
    if isinstance(res, GangPlacement):
        return _elastic_reason(res, gang)
    hint = res.placed if not gang.same_node and res.placed else gang.workers - 1
    for k in range(min(hint, gang.workers - 1), gang.least - 1, -1):
        got = place_gang(snapshot, gang.sized(k), policy)
        if isinstance(got, GangPlacement):
            return _elastic_reason(got, gang)
        if k == gang.least:
            return got
    return place_gang(snapshot, gang.sized(gang.least), policy)


def _elastic_reason(res: GangPlacement, gang: GangRequest) -> GangPlacement:
    k = len(res.placements)
    why = Reason(Cause.PLACED_GANG_ELASTIC, f"elastic {gang.describe()} at {k} of {gang.least}-{gang.workers} "
                 f"workers (the most that fit now{'' if k < gang.workers else ': all'}): {res.reason.text}")
    return GangPlacement(res.gang, res.placements, why)


def _place_in_turn(snapshot: ClusterSnapshot, gang: GangRequest, policy: PlacementPolicy) -> GangPlacement | GangUnschedulable:
    """Each worker where the policy scores best, given the workers before it."""
    sim, placements = snapshot, []
    for i in range(gang.workers):
        res = place(sim, gang.worker, policy)
        if not isinstance(res, Placement):
            left = list(range(i, gang.workers))
            why = Reason(Cause.FIT_GANG, f"{_workers_word(left)} of {gang.describe()} find no room once "
                                         f"{_workers_word(list(range(i))) if i else 'no worker'} placed: {res.message}")
            return GangUnschedulable(gang, i, tuple((j, why) for j in left), why, res)
        placements.append(res)
        sim = sim.apply(res.allocation)
    nodes = list(dict.fromkeys(p.allocation.node_name for p in placements))
    why = Reason(Cause.PLACED_GANG, f"{gang.describe()}: each worker where {policy.name} scored best, on "
                                    f"{', '.join(nodes)}; per worker: {placements[0].alternative.reason}")
    return GangPlacement(gang, tuple(placements), why)


def _short(snapshot: ClusterSnapshot, gang: GangRequest, policy: PlacementPolicy,
           fills: list[tuple[int, float, int, list[Placement], Unschedulable | None]], total: int) -> GangUnschedulable:
    """Every node is full before the gang is: the workers beyond ``total`` wait, and why (the engine's reasons
    on the cluster with the ``total`` that fit already placed)."""
    sim = snapshot
    for f in fills:
        for p in f[3]:
            sim = sim.apply(p.allocation)
    res = place(sim, gang.worker, policy)
    detail = res.message if isinstance(res, Unschedulable) else "no node has room left"
    left = list(range(total, gang.workers))
    st = snapshot.static
    held = ", ".join(f"{st.names[f[2]]} holds {f[0]}" for f in fills[:4] if f[0])
    why = Reason(Cause.FIT_GANG, f"only {total} of {gang.workers} workers of {gang.describe()} fit ({held}); "
                                 f"{_workers_word(left)}: {detail}")
    return GangUnschedulable(gang, total, tuple((i, why) for i in left), why,
                             res if isinstance(res, Unschedulable) else None)
