"""Hierarchical weighted fair share by dominant resource, pure.

The queues form a tree (``QueueConfig.parent``; a queue without one hangs off the root): an
organisation, its teams, their users -- any depth. Jobs are submitted to leaves. Each queue has a
**guarantee** (``quota_gpus``), a **weight** and a **limit** (``limit_gpus``).

**Fair share** (:func:`compute`), top down, at every node of the tree: the node's share is divided
among its children by weighted water-filling over what they *ask* (held plus pending, the whole
subtree's):

1. each child first gets its guarantee, but never more than it asks or its limit allows (if the
   guarantees together exceed the node's share, they are scaled down in proportion);
2. what is left is divided in proportion to the children's weights; a child that asks for less than
   its portion (or reaches its limit) keeps only what it asks, and the rest is divided again among
   the others, until nothing is left or every child has what it asks.

So a queue that asks nothing holds no share (its share flows to its siblings), a queue never gets
more than it asks, and among queues asking more than they can get, shares above the guarantees are
in proportion to the weights (max-min fairness, weighted). The root's share is the cluster. What a child
"asks" here is what its subtree can take: its ask, within its limit, and for a parent within what its own
work and its children can take under their limits -- so a limited child never strands its parent's share.

**Dominant resource.** Shares are computed in *dominant-share units*: the fraction of the cluster a
queue's demand takes of the resource it needs most (GPUs, host CPU or host memory: DRF,
Ghodsi et al. 2011). A queue's guarantee and limit, given in GPUs, convert through its own demand
mix (``k`` = dominant share per GPU of its mix; ``1/cluster GPUs`` for a GPU-dominant mix), and its
fair share converts back to GPUs the same way. Where every queue's dominant resource is the GPU --
any cluster of GPU jobs -- this is exactly weighted water-filling of GPUs; where queues' dominant
resources differ, dividing one cluster (1.0) is conservative (true DRF could give both more).

**Time decay** (:class:`DecayedUsage`): each queue's dominant-share usage integrated over time with a
half-life (Slurm's fair-share usage, KAI's time-based fair share). It never changes how much a queue's
fair share is -- that stays the function of weights, guarantees and demand above, so a team's share is
explainable from the config alone -- but it orders the queues that compete for the same capacity (the
one that used least lately goes first, :func:`FairShares.order_key`), so a team that was idle is
served before teams that ran the cluster while it was away, and it is not charged for their use.

**Reclaim** (:func:`reclaim_block`): a lease may be taken from queue A for a request of queue B,
though A's priority is not lower, only when B is below its fair share and, at the level of the tree
where their paths part (the children A', B' of their lowest common ancestor), A' holds a larger fraction
of its fair share than B' by more than ``fairness.reclaim_tolerance`` (a band: demand moves the shares a
little every cycle, and reclaiming across each small move would keep cards checkpointing instead of
working), and A' after losing the lease still holds at least as large a fraction of its fair share as B'
after gaining the request:
``(used_A' - g) / fair_A' >= (used_B' + d) / fair_B'``. The reverse move then fails the same test, so
a reclaim is never undone by the next (no thrashing), and each one moves both sides toward fair share.

Invariants: the children's shares of a node sum to at most the node's; a share is never above what
its queue asks nor its limit; the result is a function of its inputs alone (no clock, no I/O).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from orchestrator.core import codec
from orchestrator.core.errors import ConfigError
from orchestrator.core.lease import Lease
from orchestrator.core.priorities import SchedulerConfig
from orchestrator.core.reasons import Cause, Reason, ReasonFields

ROOT = ""
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Resources:
    """A demand or usage vector: GPUs (fractions count), host CPU milli-cores, host memory MiB."""

    gpus: float = 0.0
    cpu_milli: float = 0.0
    memory_mib: float = 0.0

    def __add__(self, other: "Resources") -> "Resources":
        return Resources(self.gpus + other.gpus, self.cpu_milli + other.cpu_milli, self.memory_mib + other.memory_mib)

    def dominant(self, capacity: "Resources") -> float:
        """The largest fraction of ``capacity`` this takes of any one resource (0 for a resource it lacks)."""
        return max((mine / cap for mine, cap in ((self.gpus, capacity.gpus), (self.cpu_milli, capacity.cpu_milli),
                                                  (self.memory_mib, capacity.memory_mib)) if cap > 0), default=0.0)

    def scaled(self, f: float) -> "Resources":
        return Resources(self.gpus * f, self.cpu_milli * f, self.memory_mib * f)


ZERO = Resources()


def lease_resources(lease: Lease) -> Resources:
    """What a holding lease takes (its GPUs as its queue's usage counts them, and its host CPU/memory)."""
    if not lease.holding:
        return ZERO
    return Resources(lease.gpus_held, float(lease.request.cpu_milli), float(lease.request.host_memory_mib))


@dataclass(frozen=True, slots=True)
class QueueTree:
    """The queues as a tree: ``parent`` of each queue (:data:`ROOT` for a top-level one) and its children in
    name order. Built from the config, whose validator already refused unknown parents and circles."""

    parent: Mapping[str, str]
    children: Mapping[str, tuple[str, ...]]

    @classmethod
    def of(cls, config: SchedulerConfig) -> "QueueTree":
        parent = {name: (q.parent or ROOT) for name, q in config.queues.items()}
        kids: dict[str, list[str]] = {ROOT: []}
        for name in sorted(parent):
            kids.setdefault(parent[name], []).append(name)
        return cls(parent, {k: tuple(v) for k, v in kids.items()})

    def path(self, queue: str) -> tuple[str, ...]:
        """The queue's ancestors from the top level down, itself last (ROOT not included)."""
        out = [queue]
        while (up := self.parent.get(out[-1], ROOT)) != ROOT:
            out.append(up)
        return tuple(reversed(out))

    def is_leaf(self, queue: str) -> bool:
        return not self.children.get(queue)

    def rollup(self, values: Mapping[str, Resources]) -> dict[str, Resources]:
        """Each queue's own value plus its descendants' (the root's under :data:`ROOT`)."""
        out: dict[str, Resources] = {}

        def walk(q: str) -> Resources:
            total = values.get(q, ZERO)
            for c in self.children.get(q, ()):
                total = total + walk(c)
            out[q] = total
            return total
        walk(ROOT)
        return out

    def parting(self, a: str, b: str) -> tuple[str, str] | None:
        """The children of ``a`` and ``b``'s lowest common ancestor on each one's path; None when one is the
        other's ancestor (or they are the same queue)."""
        pa, pb = self.path(a), self.path(b)
        i = 0
        while i < min(len(pa), len(pb)) and pa[i] == pb[i]:
            i += 1
        if i >= len(pa) or i >= len(pb):
            return None
        return pa[i], pb[i]


@dataclass(frozen=True, slots=True)
class ShareLine(ReasonFields):
    """One queue's standing: what it is guaranteed, weighs, may hold at most, holds, asks (held + pending)
    and its fair share -- in GPUs -- with its dominant shares of the cluster and why it stands where it does
    (cause ``fair.*``)."""

    queue: str
    parent: str
    depth: int
    guarantee_gpus: float
    weight: float
    limit_gpus: float | None
    used_gpus: float
    asked_gpus: float
    fair_share_gpus: float
    used_dominant: float
    fair_dominant: float
    decayed_usage: float
    reason: Reason

    def to_json(self) -> dict[str, Any]:
        return codec.dump(self)

    @property
    def ratio(self) -> float:
        """Used over fair share (inf when it holds something and its fair share is 0; 0 when it holds nothing)."""
        if self.used_dominant <= _EPS:
            return 0.0
        return self.used_dominant / self.fair_dominant if self.fair_dominant > _EPS else float("inf")


@dataclass(frozen=True, slots=True)
class FairShares:
    """Every queue's :class:`ShareLine`, by name, in tree order (parents before children, names sorted)."""

    lines: Mapping[str, ShareLine]
    capacity: Resources
    tree: QueueTree = field(repr=False, compare=False)

    def line(self, queue: str) -> ShareLine | None:
        return self.lines.get(queue)

    def fair_gpus(self, queue: str) -> float:
        line = self.lines.get(queue)
        return line.fair_share_gpus if line is not None else 0.0

    def order_key(self, queue: str) -> tuple[float, float]:
        """Queues that compete for the same capacity go in this order: furthest below their fair share first
        (used over fair), then least decayed usage per unit of fair share."""
        line = self.lines.get(queue)
        if line is None:
            return (float("inf"), float("inf"))
        decayed = line.decayed_usage / line.fair_dominant if line.fair_dominant > _EPS else float("inf")
        return (round(line.ratio, 9), round(decayed, 9))

    def moved(self, queue: str, amount: Resources, *, taken: bool = False) -> "FairShares":
        """These shares with ``amount`` added to what ``queue`` and every queue above it hold (a grant), or
        taken from it (``taken``: a victim): the fair shares stay, the standing changes. Reasons are not redone
        (a cycle uses this between its own decisions; views show the shares as computed)."""
        if queue not in self.lines:
            return self
        sign = -1.0 if taken else 1.0
        lines = dict(self.lines)
        for q in self.tree.path(queue):
            line = lines[q]
            lines[q] = _with(line, used_gpus=round(max(0.0, line.used_gpus + sign * amount.gpus), 6),
                             used_dominant=round(max(0.0, line.used_dominant + sign * amount.dominant(self.capacity)), 9))
        return FairShares(lines, self.capacity, self.tree)

    def to_json(self) -> dict[str, Any]:
        return {"capacity": {"gpus": self.capacity.gpus, "cpu_milli": self.capacity.cpu_milli,
                             "memory_mib": self.capacity.memory_mib},
                "queues": [line.to_json() for line in self.lines.values()]}


def _divide(amount: float, kids: Sequence[tuple[str, float, float, float, float]]) -> dict[str, float]:
    """Weighted water-filling of ``amount`` over ``(name, asks, guarantee, weight, limit)``; see the module
    docstring, steps 1-2. Every value is in the same unit; the result never exceeds ``min(asks, limit)``."""
    cap = {n: max(0.0, min(a, lim)) for n, a, _, _, lim in kids}
    give = {n: min(g, cap[n]) for n, _, g, _, _ in kids}
    promised = sum(give.values())
    if promised >= amount - _EPS:
        f = amount / promised if promised > _EPS else 0.0
        return {n: v * f for n, v in give.items()}
    rest = amount - promised
    weight = {n: w for n, _, _, w, _ in kids}
    active = [n for n, *_ in kids if give[n] < cap[n] - _EPS]
    while rest > _EPS and active:
        total_w = sum(weight[n] for n in active)
        full = [n for n in active if rest * weight[n] / total_w >= cap[n] - give[n] - _EPS]
        if not full:
            for n in active:
                give[n] += rest * weight[n] / total_w
            rest = 0.0
            break
        for n in full:
            rest -= cap[n] - give[n]
            give[n] = cap[n]
        active = [n for n in active if n not in full]
    return give


def compute(config: SchedulerConfig, capacity: Resources, used: Mapping[str, Resources],
            asked: Mapping[str, Resources], decayed: Mapping[str, float] | None = None) -> FairShares:
    """Every queue's fair share; see the module docstring. ``used``: what each queue's holding leases take;
    ``asked``: what each queue holds plus what its pending requests ask (a queue's own, not its children's);
    ``decayed``: :attr:`DecayedUsage.usage` (None: no history). Queues unknown to the config are ignored."""
    tree = QueueTree.of(config)
    known = set(config.queues)
    used_up = tree.rollup({q: r for q, r in used.items() if q in known})
    asked_up = tree.rollup({q: r for q, r in asked.items() if q in known})
    decayed_up = _rollup_floats(tree, {q: v for q, v in (decayed or {}).items() if q in known})
    gpu_cap = capacity.gpus

    def per_gpu(q: str) -> float:
        """Dominant share per GPU of the queue's demand mix (1/cluster GPUs when GPU-dominant or asking none)."""
        mix = asked_up.get(q, ZERO)
        if mix.gpus <= _EPS:
            return 1.0 / gpu_cap if gpu_cap > 0 and mix.dominant(capacity) <= _EPS else float("inf")
        return mix.dominant(capacity) / mix.gpus

    fair_dom: dict[str, float] = {ROOT: 1.0}
    order: list[str] = []

    def to_dom(q: str, gpus: float) -> float:
        k = per_gpu(q)
        return gpus * k if k != float("inf") else 0.0

    takeable: dict[str, float] = {}

    def can_take(q: str) -> float:
        """What the subtree of ``q`` can hold at most: its ask, within its limit and, for a parent, what its own
        work and its children can take under *their* limits (else a limited child strands its parent's share)."""
        lim = config.queues[q].limit_gpus
        kids = tree.children.get(q, ())
        most = asked_up.get(q, ZERO).dominant(capacity)
        if kids:
            own = asked.get(q, ZERO).dominant(capacity) if q in known else 0.0
            most = min(most, own + sum(can_take(c) for c in kids))
        takeable[q] = min(most, to_dom(q, lim)) if lim is not None else most
        return takeable[q]
    for top in tree.children.get(ROOT, ()):
        can_take(top)

    def walk(node: str) -> None:
        kids = tree.children.get(node, ())
        spec = [(c, takeable[c], to_dom(c, config.queues[c].quota_gpus or 0.0), config.queues[c].weight, float("inf"))
                for c in kids]
        fair_dom.update(_divide(fair_dom[node], spec))
        for c in kids:
            order.append(c)
            walk(c)
    walk(ROOT)

    lines: dict[str, ShareLine] = {}
    for qname in order:
        q = config.queues[qname]
        k = per_gpu(qname)
        fd = fair_dom[qname]
        fair_gpus = fd / k if 0 < k < float("inf") else 0.0
        u, a = used_up.get(qname, ZERO), asked_up.get(qname, ZERO)
        ud = u.dominant(capacity)
        line = ShareLine(queue=qname, parent=tree.parent[qname], depth=len(tree.path(qname)) - 1,
                         guarantee_gpus=q.quota_gpus or 0.0, weight=q.weight, limit_gpus=q.limit_gpus,
                         used_gpus=round(u.gpus, 6), asked_gpus=round(a.gpus, 6), fair_share_gpus=round(fair_gpus, 6),
                         used_dominant=round(ud, 9), fair_dominant=round(fd, 9),
                         decayed_usage=round(decayed_up.get(qname, 0.0), 6), reason=Reason(Cause.FAIR_AT, ""))
        lines[qname] = _explained(line, q.limit_gpus)
    return FairShares(lines, capacity, tree)


def _explained(line: ShareLine, limit: float | None) -> ShareLine:
    """The line with its reason: above, below or at its fair share, and what bounds that share."""
    fair, used, asked = line.fair_share_gpus, line.used_gpus, line.asked_gpus
    if asked <= _EPS:
        why = Reason(Cause.FAIR_IDLE, f"queue {line.queue} asks for nothing: its share goes to its siblings")
    elif used > fair + 1e-6:
        why = Reason(Cause.FAIR_ABOVE, f"queue {line.queue} holds {used:g} GPUs, above its fair share of {fair:.3g} "
                     f"(weight {line.weight:g}, guarantee {line.guarantee_gpus:g}): the excess may be reclaimed "
                     "for queues below theirs")
    elif used < fair - 1e-6:
        bound = ("what it asks" if fair >= asked - 1e-6 else
                 f"its limit of {limit:g}" if limit is not None and fair >= limit - 1e-6 else
                 f"its weight {line.weight:g} among its siblings")
        why = Reason(Cause.FAIR_BELOW, f"queue {line.queue} holds {used:g} GPUs, below its fair share of {fair:.3g} "
                     f"(bounded by {bound}): it goes first and may reclaim from queues above theirs")
    else:
        why = Reason(Cause.FAIR_AT, f"queue {line.queue} holds its fair share of {fair:.3g} GPUs")
    return _with(line, reason=why)


def _with(line: ShareLine, **changes: Any) -> ShareLine:
    return ShareLine(**{**{f: getattr(line, f) for f in ShareLine.__dataclass_fields__}, **changes})


def _rollup_floats(tree: QueueTree, values: Mapping[str, float]) -> dict[str, float]:
    out = tree.rollup({q: Resources(v) for q, v in values.items()})
    return {q: r.gpus for q, r in out.items()}


def usage_by_queue(leases: Iterable[Lease]) -> dict[str, Resources]:
    """What the holding leases among ``leases`` take, per queue."""
    out: dict[str, Resources] = {}
    for lease in leases:
        if lease.holding:
            out[lease.queue] = out.get(lease.queue, ZERO) + lease_resources(lease)
    return out


@dataclass(frozen=True, slots=True)
class DecayedUsage:
    """Each queue's dominant-share usage integrated over time, halved every ``half_life_s``: usage-seconds,
    as Slurm's fair-share usage. Immutable; :meth:`advance` gives the next."""

    usage: Mapping[str, float] = field(default_factory=dict)
    at: float | None = None

    def advance(self, now: float, dominant_now: Mapping[str, float], half_life_s: float) -> "DecayedUsage":
        """The usage at ``now`` given that each queue held ``dominant_now`` (its dominant share) since the last
        call. A clock that went back changes nothing."""
        if half_life_s <= 0:
            raise ConfigError("fairness.half_life_s", half_life_s, "> 0")
        if self.at is None or now <= self.at:
            return DecayedUsage(dict(self.usage), now if self.at is None else self.at)
        dt = now - self.at
        f = 0.5 ** (dt / half_life_s)
        keys = set(self.usage) | set(dominant_now)
        return DecayedUsage({q: self.usage.get(q, 0.0) * f + dominant_now.get(q, 0.0) * dt for q in keys
                             if self.usage.get(q, 0.0) * f + dominant_now.get(q, 0.0) * dt > 1e-12}, now)


def reclaim_block(shares: FairShares, *, victim_queue: str, victim: Resources, requester_queue: str,
                  asks: Resources, tolerance: float = 0.0) -> Reason | None:
    """Why a lease taking ``victim`` of ``victim_queue`` may *not* be reclaimed for a request of
    ``requester_queue`` asking ``asks`` (an ``ineligible.*`` reason); None when it may (module docstring,
    Reclaim). Dominant-share units throughout, so CPU- and memory-heavy work counts by what it takes most."""
    cap = shares.capacity
    req = shares.line(requester_queue)
    if req is None or req.used_dominant >= req.fair_dominant - 1e-9:
        return Reason(Cause.INELIGIBLE_FAIR_SHARE, f"queue {requester_queue} is not below its fair share")
    parting = shares.tree.parting(victim_queue, requester_queue)
    if parting is None:
        return Reason(Cause.INELIGIBLE_FAIR_SHARE, f"queues {victim_queue} and {requester_queue} are one line of "
                      "the tree: fair share moves only between siblings")
    a, b = (shares.lines[p] for p in parting)
    if b.fair_dominant <= 1e-12:
        return Reason(Cause.INELIGIBLE_FAIR_SHARE, f"queue {b.queue} has no fair share")
    before_a = a.used_dominant / a.fair_dominant if a.fair_dominant > 1e-12 else float("inf")
    before_b = b.used_dominant / b.fair_dominant
    if before_a - before_b <= tolerance + 1e-9:
        return Reason(Cause.INELIGIBLE_FAIR_SHARE,
                      f"queue {a.queue} holds {before_a:.0%} of its fair share and queue {b.queue} {before_b:.0%}: "
                      f"within the {tolerance:.0%} band in which shares are left alone")
    after_a = (a.used_dominant - victim.dominant(cap)) / a.fair_dominant if a.fair_dominant > 1e-12 else float("inf")
    after_b = (b.used_dominant + asks.dominant(cap)) / b.fair_dominant
    if after_a + 1e-9 < after_b:
        return Reason(Cause.INELIGIBLE_FAIR_SHARE,
                      f"queue {a.queue} would hold {after_a:.0%} of its fair share after, less than the "
                      f"{after_b:.0%} queue {b.queue} would: taking it would only move the unfairness")
    return None


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index of ``values``: 1 when all are equal, 1/n when one has everything (1 for none)."""
    vals = [v for v in values]
    if not vals:
        return 1.0
    sq = sum(v * v for v in vals)
    return (sum(vals) ** 2) / (len(vals) * sq) if sq > 0 else 1.0
