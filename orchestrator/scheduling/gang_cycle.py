"""Step 2 of the cycle (:mod:`.cycle`) for a gang: all its pending workers at once. Pure, as the cycle.

Split from :mod:`.cycle` (one concept a module): the gang's gates (its queue tree's limit, its queue's quota),
its placement (:func:`~.gang.place_elastic`: every worker, or an elastic gang's largest size that fits), the
preemption planned for it (:func:`~.preemption.plan_gang_preemption`) and its waits, each with its reason; and
:func:`reserved`, the reservation of a starving request's nodes, which single requests share.

**Elastic gangs** (``GangMember.min_size``): every attempt queues its *most* workers. The gates let it through
when its *least* fits the limit and (a queue that does not borrow) the quota, and cap its size at what they
leave; the placement takes the largest size ``k`` that fits, grants workers ``0..k-1`` (cause
``placed.gang_elastic``) and withdraws the others (:class:`~.plan.Trim`, cause ``elastic.trimmed``: the head
ends their pending leases RELEASED, never granted). A preemption, a reservation and the quota a nominated gang
counts are planned for its least size: the next cycle places it at the most that fits then.

Invariant (the ledger's view of an elastic attempt): its granted workers are ``0..k-1`` with
``min_size <= k <= size``, each other worker's lease ended RELEASED without ever being granted, in the same plan.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from orchestrator.core.lease import Lease
from orchestrator.core.priorities import SchedulerConfig
from orchestrator.core.reasons import Cause, Reason
from orchestrator.scheduling.admission import never_fits
from orchestrator.scheduling.engine import Unschedulable
from orchestrator.scheduling.fair_cycle import FairCycle
from orchestrator.scheduling.gang import GangPlacement, place_elastic, place_gang
from orchestrator.scheduling.plan import Grant, PendingItem, Preemption, Trim, Waiting
from orchestrator.scheduling.policy import PlacementPolicy
from orchestrator.scheduling.preemption import NoPreemption, PreemptionPlan, plan_gang_preemption
from orchestrator.scheduling.snapshot import ClusterSnapshot

#: Quota sums compare with this slack (as the cycle's).
_EPS = 1e-9


def reserved(fc: FairCycle, work: ClusterSnapshot, holding: Sequence[Lease], item: PendingItem, now: float,
             why: Reason, fits: Callable[[ClusterSnapshot], bool], taken: set[str],
             preemptions: list[Preemption]) -> Reason | None:
    """The ``wait.reserved`` reason when ``item`` (a request, or a gang's first worker) starves and
    :meth:`FairCycle.reserve` found nodes for it -- their holders of no higher priority preempted for it
    (:meth:`FairCycle.clear`) -- ; None otherwise."""
    if not fc.starving(item, now):
        return None
    nodes = fc.reserve(work, holding, item, fits)
    if not nodes:
        return None
    victims = fc.clear(work, holding, item, now, taken, fits)
    for v in victims:
        taken.add(v.lease_id)
        preemptions.append(Preemption(v, item.item_id, v.reason))
    bound = fc.config.fairness.starvation_bound_s
    clearing = f"; preempting {', '.join(v.lease_id for v in victims)} there" if victims else ""
    return Reason(Cause.WAIT_RESERVED, f"waited {now - item.submitted_at:.0f}s, over the {bound:g}s bound: node(s) "
                  f"{','.join(nodes)} reserved for it (only preemptible lower-priority work backfills there)"
                  f"{clearing}; {why.text}")


def gang_step(work: ClusterSnapshot, members: list[PendingItem], pos: int, eff: float, holding: Sequence[Lease],
              config: SchedulerConfig, now: float, policy: PlacementPolicy, usage: dict[str, float], taken: set[str],
              grants: list[Grant], preemptions: list[Preemption], waiting: list[Waiting], trims: list[Trim],
              fc: FairCycle) -> ClusterSnapshot:
    """Step 2 for a gang's pending workers, all at once: every worker granted (cause ``placed.gang``; an elastic
    gang: the first ``k``, the rest withdrawn) or none; a preemption planned for the whole gang; else each worker
    waits, saying on what. ``eff``: its first worker's effective priority. Returns the working snapshot with what
    was granted."""
    first = members[0]
    spec = first.gang
    assert spec is not None
    members = sorted(members, key=lambda m: (m.gang.index, m.item_id))  # type: ignore[union-attr]
    label = f"gang {spec.gang_id}"

    def wait_all(why: Reason, unsched: Unschedulable | None = None, per_worker: Any = None,
                 would: tuple[str, ...] = (), blocked: Reason | None = None) -> None:
        for m in members:
            i = m.gang.index  # type: ignore[union-attr]
            own = per_worker(i) if per_worker is not None else None
            text = f"worker {i} of {label}: {own.text if own else 'waits with its gang'}; {why.text}" if per_worker else \
                f"worker {i} of {label}: {why.text}"
            waiting.append(Waiting(m.item_id, pos, eff, Reason(why.cause, text), unsched, would_preempt=would,
                                   preemption_blocked=blocked))

    indices = {m.gang.index for m in members}  # type: ignore[union-attr]
    if len(indices) < spec.size or len(members) != spec.size:
        missing = sorted(set(range(spec.size)) - indices)
        wait_all(Reason(Cause.WAIT_GANG_MEMBERS, f"{len(indices)} of {spec.size} workers are queued; waiting for "
                        f"worker(s) {','.join(map(str, missing)) or '(duplicates)'} to be queued (again) before "
                        "the gang is placed, all or nothing"))
        return work
    gang = spec.gang(first.request)
    per = first.demand
    least = gang.least
    demand = least * per  # what it asks at the least: all of it for a fixed gang
    used = usage.get(first.queue, 0.0)
    _, q = config.queue(first.queue) if first.queue in config.queues else ("", None)
    quota = fc.quota(first.queue, q)
    over_quota = quota is not None and used + demand > quota + _EPS
    room, which = fc.headroom(first.queue, usage)
    if demand > room + _EPS:
        wait_all(Reason(Cause.WAIT_LIMIT, f"queue {which}'s limit of {config.queues[which].limit_gpus:g} GPUs leaves "
                        f"{max(room, 0.0):g} for queue {first.queue}, and the gang asks {demand:g}"))
        return work
    if over_quota and q is not None and not q.borrowing:
        wait_all(Reason(Cause.WAIT_QUOTA, f"queue {first.queue} is at its quota of {quota:g} GPUs and does not borrow"))
        return work
    most = _most(gang.workers, least, per, room, None if q is None or q.borrowing or quota is None else quota - used)
    view = fc.view(work, first)
    res = place_elastic(view, gang.model_copy(update={"workers": most}) if most < gang.workers else gang, policy)
    if isinstance(res, GangPlacement):
        k = len(res.placements)
        got = k * per
        work = res.apply(work)
        usage[first.queue] = used + got
        fc.granted(first.queue, got)
        beyond = quota is not None and used + got > quota + _EPS
        cause = Cause.PLACED_BORROWING if beyond else res.reason.cause
        for m, p in zip(members, res.placements):
            text = f"worker {m.gang.index} of {label}: {p.reason.text}; {res.reason.text}"  # type: ignore[union-attr]
            if beyond:
                text += f" (borrowing beyond queue {first.queue}'s quota)"
            grants.append(Grant(m.item_id, p, Reason(cause, text)))
        capped = f"; its queue's quota or limit leaves room for {most}" if most < gang.workers else ""
        for m in members[k:]:
            trims.append(Trim(m.item_id, Reason(Cause.ELASTIC_TRIMMED, (
                f"worker {m.gang.index} of {label}: not granted this attempt: the elastic gang "  # type: ignore[union-attr]
                f"runs at {k} of {least}-{gang.workers} workers, the most that fit now{capped}; it grows "
                "through a checkpoint when idle cards fit more"))))
        return work
    least_gang = gang.sized(least)
    never = never_fits(first.request, work)
    if never is not None:
        wait_all(Reason(Cause.WAIT_NEVER_FITS, f"{never.detail}: it can run only once a node that has it joins"),
                 res.unschedulable)
        return work
    if any(m.nominated for m in members):
        usage[first.queue] = used + demand  # what is being freed for it counts
        fc.granted(first.queue, demand)
        wait_all(Reason(Cause.WAIT_VICTIMS, "waiting for the leases being preempted for its gang to be released"),
                 res.unschedulable, res.worker_reason)
        return work

    def fits(sim: ClusterSnapshot) -> bool:
        return isinstance(place_gang(sim, least_gang, policy), GangPlacement)
    if over_quota:
        why = Reason(Cause.WAIT_BORROW_ONLY, f"{res.message}; queue {first.queue} is over its quota, "
                     "so it only borrows idle capacity and preempts nothing")
        wait_all(reserved(fc, work, holding, first, now, why, fits, taken, preemptions) or why, res.unschedulable,
                 res.worker_reason)
        return work
    candidates = [lease for lease in holding if lease.lease_id not in taken]
    plan = plan_gang_preemption(view, least_gang, candidates, priority=first.priority, queue=first.queue,
                                config=config, now=now, policy=policy, in_flight=frozenset(taken), demand=demand,
                                fair=fc.plans_fair())
    if isinstance(plan, PreemptionPlan):
        usage[first.queue] = used + demand
        for v in plan.victims:
            taken.add(v.lease_id)
            # One preemption per victim, for the gang's first worker: the head asks it once.
            preemptions.append(Preemption(v, first.item_id, v.reason))
        fc.planned(first.queue, demand, plan.victims)
        wait_all(plan.reason, res.unschedulable, res.worker_reason, would=tuple(v.lease_id for v in plan.victims))
    else:
        assert isinstance(plan, NoPreemption)
        why = Reason(Cause.WAIT_NO_FIT, res.message)
        wait_all(reserved(fc, work, holding, first, now, why, fits, taken, preemptions) or why, res.unschedulable,
                 res.worker_reason, blocked=plan.reason)
    return work


def _most(workers: int, least: int, per: float, room: float, quota_left: float | None) -> int:
    """The most workers (``least``..``workers``) the queue tree's ``room`` and, for a queue that does not borrow,
    what its quota leaves allow; ``least`` when even that does not fit (the caller's gates said it does)."""
    most = workers
    for left in (room, quota_left):
        if left is not None and left != float("inf") and per > 0:
            most = min(most, int((left + _EPS) / per))
    return max(least, most)
