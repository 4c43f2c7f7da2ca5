"""The queue as autoscaler demand: the Ray resource bundles a cluster that can grow should be able to fit.

Pure: no Ray, no I/O. :func:`autoscaler_demand` reads the ledger's pending and occupying leases and returns a
:class:`Demand`; the head actor sends its bundles to Ray (``ray.autoscaler.sdk.request_resources``, through
:mod:`orchestrator.rayport.ray_api.autoscaler`) when :class:`DemandPacer` says so, and the head's status shows
them (``autoscaler_demand``). ``docs/runtime.md`` ("Growing the cluster") is the design note.

What Ray does with it. ``request_resources`` sets one cluster-wide constraint, replacing the previous one: the
autoscaler (Ray's, or KubeRay's sidecar) fits the bundles on every node *as if the node were idle* and launches
nodes for what is left over. Ray sees none of our leases as usage (each node's agent holds all of its cards in
placement groups), so a demand of the pending leases alone would fit on the busy nodes and launch nothing. Hence
two kinds of bundle:

* **held** -- one per node with cards taken by a lease (holding, or ended and still being revoked):
  ``{"GPU": cards taken}`` plus the host CPU and memory its leases asked for; sorted by node name. They stand
  for capacity already spoken for. A card counts once, whatever shares it holds; a free card counts as free
  even where a request could not use it (another sharing mode): then the autoscaler sees room and adds nothing,
  the safe way to be wrong (the other way, a request no new node can serve would add nodes without end);
* **pending** -- for each pending lease whose wait more capacity would cure (:data:`GROWS`), what one node needs
  to host it: whole cards ``{"GPU": count}``; a fractional share (MIG, MPS, time-slice, or a request that names
  only compute or memory) ``{"GPU": 1}``, since a node with one card can host it; plus ``CPU`` (cores) and
  ``memory`` (bytes) where the request sets ``cpu_milli`` / ``host_memory_mib``. A gang is one bundle per
  worker, all or none, or -- a same-node gang -- one bundle holding every worker. A request with fallbacks asks
  for its first choice. The GPU models a request allows and a node pin are not expressed (Ray's autoscaler
  knows node types by resources; a pinned request waits for its node, which no new node is).

Invariants:

* nothing pending that capacity would cure -> the demand is empty (sending it clears a previous request, and
  the held bundles are not sent on their own: they would only keep nodes);
* at most ``max_bundles`` pending bundles, taken in the scheduler's order (``waiting.position``, then queue
  position): an item whose bundles do not all fit in what is left is left out whole (``left_out`` counts its
  bundles) and the next one is tried; the held bundles (one per busy node) come on top of the cap;
* deterministic: the same ledger gives the same bundles in the same order, each with a reason -- a pending
  bundle's cause is its lease's wait cause, a held bundle's is ``placed``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Sequence

from orchestrator.control.ledger import Ledger, LedgerEntry
from orchestrator.core.config import Tuning
from orchestrator.core.lease import LeaseState
from orchestrator.core.reasons import Cause, Reason
from orchestrator.core.request import GpuRequest, ShareKind

__all__ = ["EVERY_S", "GROWS", "MAX_BUNDLES", "Bundle", "Demand", "DemandPacer", "Shape", "autoscaler_demand",
           "demand_of"]

#: The defaults of ``settings.tuning.autoscaler_demand_every_s`` and ``..._max_bundles``, which the head reads.
EVERY_S = Tuning().autoscaler_demand_every_s
MAX_BUNDLES = Tuning().autoscaler_demand_max_bundles

#: Wait causes that more nodes would cure. Not the others: a queue at its quota, limit or window quota
#: (``wait.quota``, ``wait.borrow_only``, ``wait.window``, ``wait.limit``) waits on policy, and growing the
#: cluster for it would make the quota a cost; ``wait.victims`` / ``wait.preempting`` wait for room being freed;
#: ``wait.gang_members`` for its gang's other workers to be queued.
GROWS = frozenset({
    Cause.WAIT_NO_FIT,       # nothing fits now and no preemption helps
    Cause.WAIT_NEVER_FITS,   # no node of the cluster could hold it: only a new one can
    # it starves and nodes are being emptied for it: a new node serves it sooner. (The scheduler gives this cause
    # over a borrow-only or window wait too, once such a request starves: it then asks for nodes as well.)
    Cause.WAIT_RESERVED,
    Cause.WAIT_RESERVATION,  # it fits only on nodes reserved for a starving request: a new node serves it
})

_MIB = 1024 * 1024

#: A bundle's resources as sent: ``(name, amount)`` pairs sorted by name (hashable, so demands compare).
Shape = tuple[tuple[str, float], ...]


@dataclass(frozen=True, slots=True)
class Bundle:
    """One bundle of the demand: the Ray resources, what it stands for (``held`` or ``pending``), the leases
    behind it and why it is asked for."""

    resources: Shape
    kind: Literal["held", "pending"]
    leases: tuple[str, ...]
    reason: Reason

    def to_json(self) -> dict[str, Any]:
        return {"resources": dict(self.resources), "for": self.kind, "leases": list(self.leases),
                **self.reason.fields()}


@dataclass(frozen=True, slots=True)
class Demand:
    """The bundles to send (held first, then pending) and how many pending bundles the cap left out."""

    bundles: tuple[Bundle, ...] = ()
    left_out: int = 0

    def shapes(self) -> tuple[Shape, ...]:
        """What ``request_resources`` is given, in order: two demands with equal shapes ask Ray for the same."""
        return tuple(b.resources for b in self.bundles)

    def to_json(self) -> list[dict[str, Any]]:
        return [b.to_json() for b in self.bundles]


def demand_of(ledger: Ledger, max_bundles: int = MAX_BUNDLES) -> Demand:
    """:func:`autoscaler_demand` over the ledger's pending and occupying leases."""
    return autoscaler_demand(ledger.in_state_any_order(LeaseState.PENDING), ledger.occupying_any_order(),
                             max_bundles=max_bundles)


def autoscaler_demand(pending: Iterable[LedgerEntry], occupying: Iterable[LedgerEntry], *,
                      max_bundles: int = MAX_BUNDLES) -> Demand:
    """The bundles a cluster should fit so that the pending leases more capacity would cure can run (see the
    module docstring for the shapes, the cap and the order). ``pending``: the ledger's pending entries, in any
    order (their ``waiting`` says why each waits; one with none, not yet scheduled, asks for nothing);
    ``occupying``: the entries whose devices are taken."""
    if max_bundles < 1:
        raise ValueError(f"max_bundles must be at least 1, got {max_bundles}")
    items = _pending_items(pending)
    if not items:
        return Demand()
    asked: list[Bundle] = []
    left_out = 0
    for item in items:
        if len(asked) + len(item) <= max_bundles:
            asked.extend(item)
        else:
            left_out += len(item)
    return Demand(_held(occupying) + tuple(asked), left_out) if asked else Demand((), left_out)


def _pending_items(pending: Iterable[LedgerEntry]) -> list[tuple[Bundle, ...]]:
    """Each pending request's (or gang's) bundles, in the scheduler's order; requests no capacity would cure,
    pinned ones and those that ask for nothing a node has are left out."""
    growing = sorted((e for e in pending if e.waiting is not None and e.waiting.reason.cause in GROWS
                      and e.spec.request.node is None), key=lambda e: (e.waiting.position, e.seq))  # type: ignore[union-attr]
    gangs: dict[str, list[LedgerEntry]] = {}
    order: list[LedgerEntry | str] = []
    for e in growing:
        g = e.spec.gang
        if g is None:
            order.append(e)
        elif g.gang_id not in gangs:
            gangs[g.gang_id] = [e]
            order.append(g.gang_id)
        else:
            gangs[g.gang_id].append(e)
    items = []
    for o in order:
        if isinstance(o, str):
            item = _gang_bundles(gangs[o])
        else:
            shape = _request_shape(o.spec.request)
            item = (Bundle(shape, "pending", (o.lease_id,), _pending_reason(o, shape)),) if shape else ()
        if item:
            items.append(item)
    return items


def _gang_bundles(workers: Sequence[LedgerEntry]) -> tuple[Bundle, ...]:
    """One bundle per worker queued, or one for all of them when the gang needs one node."""
    first = workers[0]
    spec = first.spec.gang
    assert spec is not None
    shape = _request_shape(first.spec.request)
    if not shape:
        return ()
    if not spec.same_node:
        return tuple(Bundle(shape, "pending", (w.lease_id,), _pending_reason(
            w, shape, f"worker {w.spec.gang.index + 1} of {spec.size} of gang {spec.gang_id}")) for w in workers)  # type: ignore[union-attr]
    n = len(workers)
    together: Shape = tuple((k, _amount(k, v * n)) for k, v in shape)
    return (Bundle(together, "pending", tuple(w.lease_id for w in workers), _pending_reason(
        first, together, f"gang {spec.gang_id}, {n} worker(s) on one node")),)


def _request_shape(r: GpuRequest) -> Shape:
    """What one node needs to host ``r``'s first choice, as Ray resources (zero amounts left out)."""
    whole = r.kind is ShareKind.WHOLE
    gpus = r.count if whole else 1
    out = {"GPU": gpus, "CPU": r.cpu_milli / 1000, "memory": r.host_memory_mib * _MIB}
    return tuple((k, _amount(k, v)) for k, v in sorted(out.items()) if v > 0)


def _amount(name: str, v: float) -> float:
    """GPUs and bytes as integers; CPU cores to Ray's resolution (1/10,000), rounded up."""
    return int(round(v)) if name in ("GPU", "memory") else math.ceil(v * 10_000 - 1e-9) / 10_000


def _describe(shape: Shape) -> str:
    return ", ".join(f"{k}={v / _MIB:.0f}MiB" if k == "memory" else f"{k}={v:g}" for k, v in shape)


def _pending_reason(e: LedgerEntry, shape: Shape, what: str = "") -> Reason:
    w = e.waiting
    assert w is not None
    r = e.spec.request
    notes = []
    if r.models:
        notes.append(f"models {'|'.join(r.models)} not expressed")
    if r.fallback:
        notes.append(f"first of {len(r.fallback) + 1} choices")
    if r.kind is not ShareKind.WHOLE:
        notes.append("a share of one card")
    note = f" ({'; '.join(notes)})" if notes else ""
    return Reason(w.reason.cause, f"lease {e.lease_id} ({what or r.describe()}) waits ({w.reason.cause.value}): "
                  f"a node with {_describe(shape)} would host it{note}")


def _held(occupying: Iterable[LedgerEntry]) -> tuple[Bundle, ...]:
    """One bundle per node with taken cards: the cards, and the host CPU and memory its leases asked for."""
    cards: dict[str, set[int]] = {}
    cpu: dict[str, int] = {}
    mem: dict[str, int] = {}
    leases: dict[str, list[str]] = {}
    for e in occupying:
        a = e.lease.allocation
        if a is None:
            continue
        n = a.node_name
        cards.setdefault(n, set()).update(a.gpu_indices)
        cpu[n] = cpu.get(n, 0) + a.cpu_milli
        mem[n] = mem.get(n, 0) + a.host_memory_mib
        leases.setdefault(n, []).append(e.lease_id)
    out = []
    for n in sorted(cards):
        raw = {"GPU": len(cards[n]), "CPU": cpu[n] / 1000, "memory": mem[n] * _MIB}
        shape: Shape = tuple((k, _amount(k, v)) for k, v in sorted(raw.items()) if v > 0)
        if not shape:
            continue
        ids = tuple(sorted(leases[n]))
        out.append(Bundle(shape, "held", ids, Reason(Cause.PLACED, (
            f"node {n}: {_describe(shape)} taken by {len(ids)} lease(s); asked for so that the autoscaler, which "
            "fits the demand on every node as if idle, counts them as taken"))))
    return tuple(out)


@dataclass
class DemandPacer:
    """When the head looks at the demand and sends it: the head actor keeps one and asks it each loop.

    Invariants: the demand is looked at (:meth:`due`) at most every ``every_s`` and never while a send is in
    flight; a look sends (:meth:`look` returns True) only when the shapes differ from the last ones Ray took, or
    none was taken yet -- so a (re)started head's first look sends its demand, empty or not, replacing what an
    earlier incarnation asked; a send that failed (:meth:`done` with an error) leaves the last taken shapes as
    they were, so the same demand is sent again at the next look."""

    every_s: float = EVERY_S
    taken: tuple[Shape, ...] | None = None  # the shapes Ray last took (None: none yet)
    taken_at: float | None = None
    sending: tuple[Shape, ...] | None = None  # the shapes of the send in flight
    last_look: float = field(default=-math.inf)
    last_error: str = ""
    sends: int = 0

    def due(self, now: float) -> bool:
        """Whether to look at the demand now."""
        return self.sending is None and now - self.last_look >= self.every_s

    def look(self, shapes: tuple[Shape, ...], now: float) -> bool:
        """Record a look at ``now``; True (and the send counted as in flight) when ``shapes`` are to be sent."""
        self.last_look = now
        if shapes == self.taken:
            return False
        self.sending = shapes
        return True

    def done(self, now: float, error: str = "") -> None:
        """The send in flight ended: taken at ``now``, or failed with ``error`` (tried again at the next look)."""
        if self.sending is None:
            return
        if error:
            self.last_error = error
        else:
            self.taken, self.taken_at, self.last_error = self.sending, now, ""
            self.sends += 1
        self.sending = None
