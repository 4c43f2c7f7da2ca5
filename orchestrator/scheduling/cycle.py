"""One scheduling cycle, pure: ``schedule(snapshot, pending, holding, config, now, policy) -> Plan``.

It reads as a numbered script (Kueue's scheduling cycle):

1. **order** the pending items: effective priority (class priority plus
   aging, capped below the next class) descending, then submission time,
   then id;
2. for each item, on a working copy of the snapshot that already holds this
   cycle's grants:
   a. **quota**: each of the item's alternatives counts what it would hold
      (:func:`~.alternatives.alternative_demand`: a 1g slice 1/7, a whole
      card 1); one that would take its queue beyond its quota may only borrow
      idle capacity (no preemption on its behalf), and not at all when the
      queue does not allow borrowing; quotas are those of the time window in
      force when the caller passes one (:mod:`.windows`), and a wait its
      quota causes says so (cause ``wait.window``). A grant adds what it
      holds to its queue's usage, whichever alternative it is;
   b. **place**: if the engine finds room, **grant** it (apply to the working
      snapshot, so later items see it taken);
   c. otherwise, unless victims are already being preempted for it
      (``nominated``), **plan a preemption** on the working snapshot, for the
      request's choices in the order it gives them (its own alternatives, then
      each fallback's), each only within its queue's quota: the first choice
      some set of victims makes room for is planned, its reason naming it; the
      victims go into the plan and are excluded from later items' plans, so
      nothing is preempted twice;
      an item that preempts (or waits for victims chosen for it) counts
      against its queue's quota as if granted, so two items never both
      claim the last of a quota, each preempting for it;
   d. otherwise it stays **pending** with the engine's grouped reasons, its
      queue position and what would admit it -- or, when no card of the
      cluster could hold it even idle (:func:`~.admission.never_fits`: the
      cluster shrank after it was queued), with cause ``wait.never_fits``
      and no preemption tried.

A gang's pending workers take step 2 together (:mod:`.gang_cycle`: all or nothing; an elastic gang at the
largest size that fits, its other workers withdrawn). After step 2, a running elastic gang below its most may be
asked to checkpoint and resume larger on idle capacity (:mod:`.elastic`, cause ``victim.grow``).

The queue tree adds fair share, limits and reservations to steps 1 and 2 (:mod:`.fair_cycle`: the
fair-share order, ``max(guarantee, fair share)`` as the quota, reclaim at equal priority, ``wait.limit``,
``wait.reserved`` and backfill); without them configured the cycle is the one above.

The plan is the whole output; the head applies it (store first, then act).
Every grant, preemption and waiting item carries a
:class:`~orchestrator.core.reasons.Reason` (``placed*``, ``victim.*``,
``wait.*``); ``to_json`` gives texts and cause codes.
Invariants: the input snapshot is never changed; a lease appears as a victim
at most once per plan; no grant in the plan over-commits the snapshot (each
was applied to the working copy before the next was placed).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Mapping, Sequence

from orchestrator.core.clock import format_hhmm
from orchestrator.core.lease import Lease
from orchestrator.core.priorities import SchedulerConfig
from orchestrator.core.reasons import Cause, Reason
from orchestrator.core.request import Alternative, GpuRequest, ResolvedRequest
from orchestrator.scheduling.admission import never_fits
from orchestrator.scheduling.alternatives import alternative_demand, resolve
from orchestrator.scheduling.candidates import alt_key
from orchestrator.scheduling.engine import Placement, Unschedulable, place
from orchestrator.scheduling.plan import Grant, PendingItem, Plan, Preemption, Trim, Waiting
from orchestrator.scheduling.consolidate import movable_leases, plan_move
from orchestrator.scheduling.elastic import plan_grow
from orchestrator.scheduling.fair_cycle import FairCycle
from orchestrator.scheduling.fairshare import FairShares
from orchestrator.scheduling.gang_cycle import gang_step, reserved
from orchestrator.scheduling.policy import PlacementPolicy
from orchestrator.scheduling.preemption import (
    NoPreemption,
    PreemptionPlan,
    plan_preemption,
    queue_usage,
)
from orchestrator.scheduling.snapshot import ClusterSnapshot
from orchestrator.scheduling.windows import WindowStatus


def effective_priority(item: PendingItem, config: SchedulerConfig, now: float) -> float:
    aged = item.priority + config.aging_per_minute * max(0.0, now - item.submitted_at) / 60.0
    return min(aged, config.aging_cap(item.priority))


def order(pending: Sequence[PendingItem], config: SchedulerConfig, now: float,
          shares: FairShares | None = None) -> list[PendingItem]:
    """Step 1: effective priority, then submission time and id. With ``shares`` (fairness on), within one
    priority the queue's standing against its fair share comes before aging: a queue above its share must not
    take back, by having waited longer, the card a queue below its share is reclaiming (aging still orders
    items of one queue, and never lifts one class above the next)."""
    if shares is None:
        return sorted(pending, key=lambda i: (-effective_priority(i, config, now), i.submitted_at, i.item_id))
    return sorted(pending, key=lambda i: (-i.priority, shares.order_key(i.queue), -effective_priority(i, config, now),
                                          i.submitted_at, i.item_id))


def schedule(snapshot: ClusterSnapshot, pending: Sequence[PendingItem],
             holding: Sequence[Lease] | Callable[[], Sequence[Lease]], config: SchedulerConfig, now: float,
             policy: PlacementPolicy, *, in_flight: frozenset[str] = frozenset(), window: WindowStatus | None = None,
             usage: Mapping[str, float] | None = None, decayed: Mapping[str, float] | None = None,
             movable: Mapping[str, float] | None = None,
             elastic: Sequence[Lease] | Callable[[], Sequence[Lease]] | None = None) -> Plan:
    """Run one cycle; see the module docstring. ``holding``: the holding leases, or a function returning them
    (called only if a preemption is planned); ``in_flight``: lease ids already being preempted; ``window``: the
    time window whose quotas ``config`` carries (its waits name it), None for none; ``usage``: what
    :func:`~.preemption.queue_usage` gives over ``holding``, when the caller keeps it up already; ``decayed``: each
    queue's decayed usage (:class:`~.fairshare.DecayedUsage`), for the fair-share order; ``movable``: the leases
    whose holders requeue on preemption, each with the submission time its retry keeps, which consolidation
    may move (:mod:`.consolidate`); ``elastic``: the holding workers of elastic gangs (or a function returning
    them, called only when nothing waits), which may be asked to grow (:mod:`.elastic`; None: none run)."""
    work = snapshot
    if callable(holding):
        holding = _Later(holding)
    # Only a quota reads what queues hold: without one, skip the pass over every holding lease.
    fc = FairCycle.start(config, snapshot, pending, holding, decayed, in_flight)
    quotas = any(q.quota_gpus is not None for q in config.queues.values()) or fc.limited
    usage = (dict(usage) if usage is not None else queue_usage(holding)) if quotas else {}
    grants: list[Grant] = []
    preemptions: list[Preemption] = []
    waiting: list[Waiting] = []
    trims: list[Trim] = []
    taken = set(in_flight)
    ordered = order(pending, config, now, fc.shares)
    gangs: dict[str, list[PendingItem]] = {}
    for item in ordered:
        if item.gang is not None:
            gangs.setdefault(item.gang.gang_id, []).append(item)
    # Which alternatives the quota leaves a request and what place / never_fits / plan_preemption said for it, by
    # (request, priority, queue), since ``work``, ``usage`` or ``taken`` last changed (each change clears it): an
    # equal request asked again with nothing changed gets the same answers without asking (a queue of a thousand
    # equal requests costs one plan, not a thousand).
    memo: dict[tuple[Any, ...], _Asked] = {}
    # Requests resolved once a cycle; and the (choice, priority, queue, demand)s that even preempting every
    # eligible lease would not fit: this cycle only adds grants and victims, so such a choice stays hopeless.
    resolved_of: dict[GpuRequest, ResolvedRequest] = {}
    hopeless: set[tuple[Any, ...]] = set()
    for pos, item in enumerate(ordered):
        if item.gang is not None:  # the gang's turn comes with its first worker in queue order
            members = gangs.pop(item.gang.gang_id, None)
            if members is not None:
                work = gang_step(work, members, pos, effective_priority(item, config, now), holding, config, now,
                                 policy, usage, taken, grants, preemptions, waiting, trims, fc)
                memo.clear()
            continue
        eff = effective_priority(item, config, now)
        _, q = config.queue(item.queue) if item.queue in config.queues else ("", None)
        quota = fc.quota(item.queue, q)
        used = usage.get(item.queue, 0.0)
        windowed = _window_text(window, item.queue)
        view = fc.view(work, item)
        asked = memo.setdefault((item.request, item.priority, item.queue, view is work), _Asked())
        if asked.alts is None:
            asked.alts = _alternatives(item.request, resolved_of, used, quota, fc.headroom(item.queue, usage)[0])
        alts = asked.alts
        if not alts.all.alternatives:  # every alternative would break a limit: nothing to place or preempt for
            room, which = fc.headroom(item.queue, usage)
            waiting.append(Waiting(item.item_id, pos, eff, Reason(
                Cause.WAIT_LIMIT, f"queue {which}'s limit of {config.queues[which].limit_gpus:g} GPUs leaves "
                f"{max(room, 0.0):g} for queue {item.queue}, and it asks at least {alts.least:g}")))
            continue
        over_quota = not alts.within.alternatives  # every alternative would take the queue beyond its quota
        if over_quota and q is not None and not q.borrowing:
            if windowed:
                waiting.append(Waiting(item.item_id, pos, eff, Reason(
                    Cause.WAIT_WINDOW, f"queue {item.queue} holds {used:g} GPUs and asks "
                    f"{alts.least:g} more: over its cap of {quota:g} GPUs, no borrowing, {windowed}")))
                continue
            waiting.append(Waiting(item.item_id, pos, eff, Reason(
                Cause.WAIT_QUOTA, f"queue {item.queue} is at its quota of {quota:g} GPUs and does not borrow")))
            continue
        if asked.res is None:  # a queue that borrows may take any alternative that fits idle, else those within
            asked.res = place(view, item.request, policy,
                              resolved=alts.within if q is not None and not q.borrowing else alts.all)
        res = asked.res
        if isinstance(res, Placement):
            memo.clear()
            work = work.apply(res.allocation)
            got = res.allocation.gpu_demand  # what was granted counts, not what the first choice asks
            usage[item.queue] = used + got
            fc.granted(item.queue, got)
            beyond = quota is not None and used + got > quota + _EPS
            why = res.reason if not beyond else Reason(
                Cause.PLACED_BORROWING, f"{res.reason.text} (borrowing beyond queue {item.queue}'s quota)")
            grants.append(Grant(item.item_id, res, why))
            continue
        if asked.never is _UNASKED:
            asked.never = never_fits(item.request, work)  # the whole cluster: a reservation is not a shrink
        never = asked.never
        if never is not None:  # no preemption could help either: say so rather than "not enough free"
            waiting.append(Waiting(item.item_id, pos, eff, Reason(
                Cause.WAIT_NEVER_FITS, f"{never.detail}: it can run only once a node that has it joins"), res))
            continue
        if item.nominated:
            memo.clear()
            # what is being freed for it counts: its cheapest choice within the quota (the plan's is not kept)
            usage[item.queue] = used + (alts.least_within if alts.within.alternatives else item.demand)
            fc.granted(item.queue, usage[item.queue] - used)
            waiting.append(Waiting(item.item_id, pos, eff, Reason(
                Cause.WAIT_VICTIMS, "waiting for the leases being preempted for it to be released"), res))
            continue
        if over_quota:
            cause, why = (Cause.WAIT_WINDOW, f" of {quota:g} GPUs, {windowed}") if windowed and q else (
                Cause.WAIT_BORROW_ONLY, "")
            waiting.append(_reserving(fc, work, holding, item, policy, now, alts, Waiting(item.item_id, pos, eff, Reason(
                cause, f"{res.message}; queue {item.queue} is over its quota{why}, "
                "so it only borrows idle capacity and preempts nothing"), res), taken, preemptions))
            if fc.reserver is item:
                memo.clear()
            continue
        if asked.plan is None:
            candidates = [lease for lease in holding if lease.lease_id not in taken]
            asked.plan = _plan_in_order(view, item, alts, candidates, config=config, now=now, policy=policy,
                                        in_flight=frozenset(taken), hopeless=hopeless, fair=fc.plans_fair())
        plan = asked.plan
        if isinstance(plan, NoPreemption) and config.consolidation.enabled and movable:
            moved = plan_move(view, item.request, item.request.describe(),
                              movable_leases(holding, movable, config, now, taken, item, fc.shares is not None),
                              policy=policy, now=now, config=config, resolved=alts.within)
            plan = moved if moved is not None else plan
        if isinstance(plan, PreemptionPlan):
            memo.clear()
            assert isinstance(plan.placement, Placement)
            usage[item.queue] = used + plan.placement.allocation.gpu_demand
            for v in plan.victims:
                taken.add(v.lease_id)
                preemptions.append(Preemption(v, item.item_id, v.reason))
            fc.planned(item.queue, plan.placement.allocation.gpu_demand, plan.victims)
            waiting.append(Waiting(item.item_id, pos, eff, plan.reason, res,
                                   would_preempt=tuple(v.lease_id for v in plan.victims)))
        else:
            assert isinstance(plan, NoPreemption)
            waiting.append(_reserving(fc, work, holding, item, policy, now, alts, Waiting(
                item.item_id, pos, eff, Reason(Cause.WAIT_NO_FIT, res.message), res, preemption_blocked=plan.reason),
                taken, preemptions))
            if fc.reserver is item:
                memo.clear()
    if elastic is not None and config.elastic.grow and all(w.reason.cause is Cause.WAIT_NEVER_FITS for w in waiting):
        preemptions.extend(plan_grow(work, elastic() if callable(elastic) else elastic, waiting, config, now, policy,
                                     in_flight=frozenset(taken), usage=usage,
                                     room=lambda q: fc.headroom(q, usage)[0]))
    return Plan(tuple(grants), tuple(preemptions), tuple(waiting), after=work, shares=fc.shares,
                reserved=fc.reserved, trims=tuple(trims))


def _reserving(fc: FairCycle, work: ClusterSnapshot, holding: Sequence[Lease], item: PendingItem,
               policy: PlacementPolicy, now: float, alts: "_QuotaAlternatives", waiting: Waiting,
               taken: set[str], preemptions: list[Preemption]) -> Waiting:
    """``waiting``, or -- when ``item`` starves and nodes can be reserved for it -- the same wait saying so
    (cause ``wait.reserved``), the nodes reserved in ``fc`` for the rest of the cycle."""
    why = reserved(fc, work, holding, item, now, waiting.reason,
                    lambda sim: isinstance(place(sim, item.request, policy, resolved=alts.all), Placement),
                    taken, preemptions)
    return waiting if why is None else replace(waiting, reason=why)


_UNASKED: Any = object()


class _Later(Sequence[Lease]):
    """The holding leases, asked for the first time they are read (most cycles plan no preemption)."""

    def __init__(self, get: Callable[[], Sequence[Lease]]) -> None:
        self._get: Callable[[], Sequence[Lease]] | None = get
        self._got: Sequence[Lease] = ()

    def _leases(self) -> Sequence[Lease]:
        if self._get is not None:
            self._got, self._get = self._get(), None
        return self._got

    def __getitem__(self, i: Any) -> Any:
        return self._leases()[i]

    def __len__(self) -> int:
        return len(self._leases())

    def __iter__(self) -> Iterator[Lease]:
        return iter(self._leases())


@dataclass(slots=True)
class _Asked:
    """What ``schedule`` learnt about one request shape since the state last changed (None / ``_UNASKED``: not
    asked yet)."""

    alts: "_QuotaAlternatives | None" = None
    res: Placement | Unschedulable | None = None
    never: Any = _UNASKED
    plan: PreemptionPlan | NoPreemption | None = None


#: Quota sums compare with this slack: seven 1g slices (1/7 GPU each) are one GPU, not one and a rounding error.
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class _QuotaAlternatives:
    """A request's alternatives (``all``) and those its queue may take within its quota now (``within``, in the
    same order); ``least``: the least any alternative adds to the queue's usage, ``least_within`` of those within;
    ``beyond``: what the quota rules out, for the reason when nothing is planned."""

    all: ResolvedRequest
    within: ResolvedRequest
    least: float
    least_within: float
    beyond: str


def _alternatives(request: GpuRequest, resolved_of: dict[GpuRequest, ResolvedRequest], used: float,
                  quota: float | None, headroom: float = float("inf")) -> _QuotaAlternatives:
    """Which of ``request``'s alternatives keep its queue (holding ``used`` GPUs) within ``quota`` (None: all);
    those that would take more than ``headroom`` (what the queue tree's limits leave it) are not alternatives."""
    res = resolved_of.get(request)
    if res is None:
        res = resolved_of[request] = resolve(request)
    demands = [alternative_demand(a) for a in res.alternatives]
    least = min(demands, default=0.0)
    if headroom != float("inf"):
        kept = [(a, d) for a, d in zip(res.alternatives, demands) if d <= headroom + _EPS]
        res = replace(res, alternatives=tuple(a for a, _ in kept))
        demands = [d for _, d in kept]
    if quota is None:
        within = res
    else:
        within = replace(res, alternatives=tuple(a for a, d in zip(res.alternatives, demands) if used + d <= quota + _EPS))
    beyond = "" if quota is None else ", ".join(
        f"{a.reason.split(':', 1)[0] if request.fallback else a.kind.value} ({d:.3g} GPUs)"
        for a, d in zip(res.alternatives, demands) if used + d > quota + _EPS)
    least_within = min((alternative_demand(a) for a in within.alternatives), default=0.0)
    return _QuotaAlternatives(res, within, least, least_within, beyond)


def _plan_in_order(work: ClusterSnapshot, item: PendingItem, alts: _QuotaAlternatives, candidates: Sequence[Lease], *,
                   config: SchedulerConfig, now: float, policy: PlacementPolicy, in_flight: frozenset[str],
                   hopeless: set[tuple[Any, ...]], fair: FairShares | None = None) -> PreemptionPlan | NoPreemption:
    """Step 2c for a request: a preemption for its first choice that can be made to fit within its queue's quota,
    then its next, in the order the request gives them (a request without fallback is one choice: all its
    alternatives within the quota at once). Each plan's fit test is that choice's alternatives alone, and its
    reclaim rule reads the most that choice adds to the queue (:func:`~.preemption.ineligibility`)."""
    groups: dict[int, list[Alternative]] = {}
    for a in alts.within.alternatives:
        groups.setdefault(a.choice, []).append(a)
    last: NoPreemption | None = None
    for n, group in enumerate(groups.values()):
        demand = max(alternative_demand(a) for a in group)
        key = (tuple(alt_key(a) for a in group), item.priority, item.queue, demand, fair is not None)
        if key in hopeless:
            continue
        one = replace(alts.all, alternatives=tuple(group)) if len(groups) > 1 else alts.within
        plan = plan_preemption(work, item.request, candidates, priority=item.priority, queue=item.queue,
                               config=config, now=now, policy=policy, in_flight=in_flight, demand=demand,
                               resolved=one, give_up_early=n + 1 < len(groups), fair=fair)
        if isinstance(plan, PreemptionPlan):
            if n:  # its text names the choice (preemption's ``what``); say why not an earlier one
                plan = replace(plan, reason=Reason(plan.reason.cause, f"{plan.reason.text}; no preemption within "
                                                   "the quota makes room for an earlier choice"))
            return plan
        if plan.reason.cause is Cause.NO_PREEMPTION_NOT_ENOUGH:
            hopeless.add(key)
        last = plan
    if last is None:
        last = NoPreemption(Reason(Cause.NO_PREEMPTION_NOT_ENOUGH, "even preempting every eligible lease would "
                                   "not make room for any of its choices"))
    if alts.beyond:
        last = replace(last, reason=Reason(last.reason.cause, f"{last.reason.text}; beyond its queue's quota, "
                                           f"so not preempted for: {alts.beyond}"))
    return last


def _window_text(window: WindowStatus | None, queue: str) -> str:
    """``set by window day 08:00-22:00 until 22:00`` when the window in force sets ``queue``'s quota, else ''."""
    if window is None or window.window is None or queue not in window.window.queues:
        return ""
    until = ""
    if window.next_change_in_s is not None:
        until = f" until {format_hhmm(window.time_of_day_s + window.next_change_in_s)}"
    return f"set by time window {window.window.describe()}{until}"
