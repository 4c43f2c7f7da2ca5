"""Preemption planning: the minimal set of leases whose release admits a request.

Pure: a function of an immutable snapshot, the holding leases, the config and
the clock; it imports no Ray and changes nothing (tests assert the snapshot
is unchanged after planning). The head carries the plan out: it asks each
victim to checkpoint, waits up to its class's grace period, stops it and
releases its lease.

The algorithm (Kueue's, ``pkg/scheduler/preemption``):

1. **Eligible victims**: holding leases of a preemptible class, strictly lower
   priority than the requester -- or *borrowed* capacity (the victim's queue
   is over its quota) when the requester's queue is within its own, or, with
   fairness on, equal-priority work of a queue above its fair share when
   :func:`~.fairshare.reclaim_block` allows it (``victim.fairshare``); never a
   lease younger than its class's ``min_runtime_s``; never one already being
   preempted (CHECKPOINTING, or named in ``in_flight``).
2. **Order** them by :func:`victim_order_key`: lower priority first, then
   least cost (:func:`preemption_cost_gpu_s`: seconds since the last
   checkpoint plus the measured restore time, x GPUs held), then shortest
   restore time, then most recently started, then lease id -- a total
   order, so plans are deterministic.
3. **Remove until it fits**: release victims in that order on a copy of the
   snapshot until the request places.
4. **Add back what was not needed**: walk the chosen victims from the last
   to the first, re-apply each, and keep it running if the request still
   places. What remains is minimal: removing any one victim less makes the
   request not fit (under the engine's deterministic choice).

**Fallbacks.** The fit test is the engine's placement over the alternatives it is given (all of a request's,
or those of one of its choices, as the cycle asks in the order the request gives them, within its queue's
quota: :mod:`.cycle`), so a request whose every alternative is full may preempt for a later one -- a whole
card held by training when its MIG slices are all taken.

**Gangs.** The workers of a gang (leases with the same ``gang`` id) are one victim: released
together in step 3, added back together in step 4, ordered by :func:`unit_order_key` (for a
lease on its own, exactly :func:`victim_order_key`); a gang with one ineligible worker is
ineligible as a whole. A gang *requester* uses :func:`plan_gang_preemption`, whose fit test is
the whole gang placing (:func:`~orchestrator.scheduling.gang.place_gang`).

**Elastic gangs** (``Lease.elastic``): a running elastic gang above its least is *shrinkable*: preempted, it
checkpoints and its retry (``min..max`` again) comes back at once at what is left, so it loses its checkpoint
and restore but not its place in the queue, where a fixed victim waits for its whole size again. Among victims
of one priority the shrinkable come first (:func:`unit_order_key`); a chosen one whose least still fits once the
requester has landed has cause ``victim.shrink`` and says at how many workers it resumes.

Every answer carries a :class:`~orchestrator.core.reasons.Reason`: a victim's
cause is ``victim.priority`` when its priority is lower than the requester's,
else ``victim.reclaim`` (it was eligible only because its queue borrowed
beyond its quota); a lease that may not be preempted says why with an
``ineligible.*`` cause; a request no preemption helps, ``no_preemption.*``.

Invariants: the snapshot is never changed (simulated removals are new
snapshots); the victim set is minimal in the sense of step 4; no lease in
``in_flight`` or CHECKPOINTING is ever a victim; the same inputs give the same
plan (the victim order is total).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from orchestrator.core.lease import Lease, LeaseState
from orchestrator.core.priorities import SchedulerConfig
from orchestrator.core import codec
from orchestrator.core.reasons import Cause, Reason, ReasonFields
from orchestrator.core.request import GpuRequest, ResolvedRequest
from orchestrator.core.gang_request import GangRequest
from orchestrator.scheduling.engine import Placement, place
from orchestrator.scheduling.fairshare import FairShares, Resources, lease_resources, reclaim_block
from orchestrator.scheduling.gang import GangPlacement, place_elastic, place_gang
from orchestrator.scheduling.policy import PlacementPolicy
from orchestrator.scheduling.snapshot import ClusterSnapshot


@dataclass(frozen=True, slots=True)
class Victim(ReasonFields):
    """A lease chosen for preemption and why (cause ``victim.priority`` or ``victim.reclaim``)."""

    lease_id: str
    owner: str
    priority: int
    priority_class: str
    queue: str
    gpus: float
    work_lost_gpu_s: float
    restore_s: float
    started_at: float
    reason: Reason

    def to_json(self) -> dict[str, Any]:
        return codec.dump(self)


@dataclass(frozen=True, slots=True)
class PreemptionPlan(ReasonFields):
    """Victims (in order) whose release lets the request land at ``placement``."""

    victims: tuple[Victim, ...]
    placement: "Placement | GangPlacement"
    considered: int
    reason: Reason

    def to_json(self) -> dict[str, Any]:
        return codec.dump(self)


@dataclass(frozen=True, slots=True)
class NoPreemption:
    """Why no set of victims helps; ``ineligible`` says why each holding lease was not a candidate."""

    reason: Reason
    ineligible: tuple[tuple[str, Reason], ...] = ()

    def to_json(self) -> dict[str, Any]:
        # By hand: the reason first, each ineligible lease's reason as a mapping.
        return {**self.reason.fields(),
                "ineligible": [{"lease_id": i, "reason": r.text, "cause": r.cause.value} for i, r in self.ineligible]}


def work_lost_gpu_s(lease: Lease, now: float) -> float:
    """GPU-seconds of progress lost if ``lease`` stopped now without a new checkpoint."""
    since = next((t for t in (lease.last_checkpoint_at, lease.started_at) if t is not None), now)
    return max(0.0, now - since) * lease.gpus_held


def preemption_cost_gpu_s(lease: Lease, now: float) -> float:
    """What preempting ``lease`` now costs in GPU-seconds: the work since its checkpoint plus the time its resume
    is measured to take (``restore_estimate_s``, set by the head from its class's resumes) on the GPUs it holds."""
    return work_lost_gpu_s(lease, now) + lease.restore_estimate_s * lease.gpus_held


def victim_order_key(lease: Lease, now: float) -> tuple:
    """The documented victim order; ends in the lease id, so it is total."""
    started = lease.started_at
    return (lease.priority, round(preemption_cost_gpu_s(lease, now), 6), lease.restore_estimate_s,
            -(started if started is not None else 0.0), lease.lease_id)


#: Queue usage is summed in millionths of a GPU: exact for any share the engine hands out, so a sum kept up
#: as leases come and go (``Ledger.queue_usage``) equals a fresh one in any order, to the last bit.
USAGE_UNITS = 1_000_000


def usage_units(lease: Lease) -> int:
    """What ``lease`` adds to its queue's usage, in :data:`USAGE_UNITS` (0 when it holds nothing)."""
    return round(lease.gpus_held * USAGE_UNITS) if lease.holding else 0


def queue_usage(leases: Iterable[Lease]) -> dict[str, float]:
    """GPUs held per queue by the holding leases among ``leases``."""
    units: dict[str, int] = {}
    for lease in leases:
        if lease.holding:
            units[lease.queue] = units.get(lease.queue, 0) + usage_units(lease)
    return {q: n / USAGE_UNITS for q, n in units.items()}


def _borrowed(lease: Lease, queue: str, config: SchedulerConfig, usage: dict[str, float]) -> bool:
    """The lease's queue (not the requester's) holds more than its quota."""
    q = config.queues.get(lease.queue)
    return (q is not None and q.quota_gpus is not None and usage.get(lease.queue, 0.0) > q.quota_gpus
            and lease.queue != queue)


def ineligibility(lease: Lease, *, priority: int, queue: str, config: SchedulerConfig, now: float,
                  in_flight: frozenset[str], usage: dict[str, float], demand: float,
                  fair: FairShares | None = None, asks: Resources | None = None) -> Reason | None:
    """Why ``lease`` may not be preempted for this requester (an ``ineligible.*`` cause); None when it may.
    ``fair``: the cycle's fair shares when fairness reclaims: a lease of the requester's priority is then
    eligible when :func:`~.fairshare.reclaim_block` allows taking it for a request asking ``asks``."""
    if lease.state is LeaseState.CHECKPOINTING or lease.lease_id in in_flight:
        return Reason(Cause.INELIGIBLE_IN_FLIGHT, "already being preempted")
    if not lease.holding or lease.allocation is None:
        return Reason(Cause.INELIGIBLE_NOT_HOLDING, "holds no devices")
    cls = config.classes.get(lease.priority_class)
    if cls is not None and not cls.preemptible:
        return Reason(Cause.INELIGIBLE_CLASS, f"class {lease.priority_class} is not preemptible")
    _, own_q = config.queue(queue) if queue in config.queues else ("", None)
    within_own = own_q is None or own_q.quota_gpus is None or usage.get(queue, 0.0) + demand <= own_q.quota_gpus
    if lease.priority >= priority and config.fairness.enabled:
        # Fair share replaces reclaiming borrowed capacity (the guarantees are in the fair shares): a queue
        # without a quota would otherwise count as within it and take from any queue over its guarantee.
        if fair is None:
            return Reason(Cause.INELIGIBLE_PRIORITY, f"priority {lease.priority} is not lower than {priority}, "
                          "and this cycle's fair-share reclaims are spent")
        if lease.priority > priority:
            return Reason(Cause.INELIGIBLE_PRIORITY, f"priority {lease.priority} is higher than {priority}: fair "
                          "share moves capacity between work of one priority only")
        block = reclaim_block(fair, victim_queue=lease.queue, victim=lease_resources(lease), requester_queue=queue,
                              asks=asks or Resources(demand), tolerance=config.fairness.reclaim_tolerance)
        if block is not None:
            return Reason(block.cause, f"priority {lease.priority} is not lower than {priority}, and {block.text}")
    elif lease.priority >= priority and not (_borrowed(lease, queue, config, usage) and within_own):
        return Reason(Cause.INELIGIBLE_PRIORITY, f"priority {lease.priority} is not lower than {priority}")
    if cls is not None and cls.min_runtime_s:
        ran = now - (lease.started_at if lease.started_at is not None else now)
        if ran < cls.min_runtime_s:
            return Reason(Cause.INELIGIBLE_MIN_RUNTIME,
                          f"younger than the {cls.min_runtime_s:g}s minimum runtime of class {lease.priority_class}")
    return None


Fits = Callable[[ClusterSnapshot], "Placement | GangPlacement | None"]


def plan_preemption(snapshot: ClusterSnapshot, request: GpuRequest, holding: Sequence[Lease], *, priority: int,
                    queue: str, config: SchedulerConfig, now: float, policy: PlacementPolicy,
                    in_flight: frozenset[str] = frozenset(), demand: float = 0.0,
                    resolved: ResolvedRequest | None = None, give_up_early: bool = False,
                    fair: FairShares | None = None) -> PreemptionPlan | NoPreemption:
    """Plan the minimal preemption that admits ``request``; see the module docstring. ``resolved``: the
    alternatives it may land on (default: all of the request's; the cycle passes one choice's, within its
    queue's quota); ``give_up_early``: first check that releasing every eligible victim would make room (one
    placement instead of one per victim when nothing would: for a choice that is likely not to fit); ``fair``:
    the cycle's fair shares when fairness reclaims (:func:`ineligibility`)."""
    def fits(sim: ClusterSnapshot) -> Placement | None:
        res = place(sim, request, policy, resolved=resolved)
        return res if isinstance(res, Placement) else None
    what = request.describe()
    if resolved is not None and request.fallback and len({a.choice for a in resolved.alternatives}) == 1:
        alt = resolved.alternatives[0]  # one choice of a chain: name it, and which it is
        what = f"{request.choices[alt.choice].describe()} ({alt.reason.split(':', 1)[0]})"
    asks = Resources(demand, float(request.cpu_milli), float(request.host_memory_mib))
    return _plan(snapshot, fits, what, holding, priority=priority, queue=queue, config=config, now=now,
                 in_flight=in_flight, demand=demand, give_up_early=give_up_early, fair=fair, asks=asks, policy=policy)


def plan_gang_preemption(snapshot: ClusterSnapshot, gang: GangRequest, holding: Sequence[Lease], *, priority: int,
                         queue: str, config: SchedulerConfig, now: float, policy: PlacementPolicy,
                         in_flight: frozenset[str] = frozenset(), demand: float = 0.0,
                         fair: FairShares | None = None) -> PreemptionPlan | NoPreemption:
    """The minimal preemption that admits every worker of ``gang`` at once (:func:`~.gang.place_gang` on the
    simulated snapshot is the fit test): the same algorithm, the same victim order."""
    def fits(sim: ClusterSnapshot) -> GangPlacement | None:
        res = place_gang(sim, gang, policy)
        return res if isinstance(res, GangPlacement) else None
    return _plan(snapshot, fits, gang.describe(), holding, priority=priority, queue=queue, config=config, now=now,
                 in_flight=in_flight, demand=demand, fair=fair, asks=Resources(demand), policy=policy)


def victim_units(eligible: Sequence[Lease], ineligible: list[tuple[str, Reason]],
                 holding: Sequence[Lease]) -> list[tuple[Lease, ...]]:
    """The eligible leases as victims: each on its own, except the workers of a gang, which are one victim
    (all its holding workers, or none: a gang with one ineligible worker is ineligible as a whole, and
    its other workers are added to ``ineligible`` saying so)."""
    members: dict[str, list[Lease]] = {}
    for lease in holding:
        if lease.gang is not None and lease.holding:
            members.setdefault(lease.gang, []).append(lease)
    blocked = {lid for lid, _ in ineligible}
    units: list[tuple[Lease, ...]] = []
    done: set[str] = set()
    for lease in eligible:
        if lease.gang is None:
            units.append((lease,))
            continue
        if lease.gang in done:
            continue
        done.add(lease.gang)
        gang = members.get(lease.gang, [lease])
        stuck = [m for m in gang if m.lease_id in blocked]
        if stuck:
            first = next(r for lid, r in ineligible if lid == stuck[0].lease_id)
            why = Reason(first.cause, f"its gang {lease.gang} is preempted whole, and its worker lease "
                                      f"{stuck[0].lease_id} may not be: {first.text}")
            ineligible.extend((m.lease_id, why) for m in gang if m.lease_id not in blocked)
            continue
        units.append(tuple(sorted(gang, key=lambda m: m.lease_id)))
    return units


def shrinkable(unit: Sequence[Lease]) -> bool:
    """The victim is an elastic gang running above its least workers (it can resume at once, smaller)."""
    e = unit[0].elastic
    return e is not None and unit[0].gang is not None and len(unit) > e[0]


def unit_order_key(unit: Sequence[Lease], now: float) -> tuple:
    """:func:`victim_order_key` for a victim of one or more leases (a gang): its lowest priority, then a
    :func:`shrinkable` elastic gang before the rest, the work all of it loses, its longest restore, its latest
    start, its first lease id. For one lease it is :func:`victim_order_key` with the shrinkable mark after the
    priority."""
    if len(unit) == 1:
        k = victim_order_key(unit[0], now)
        return (k[0], 1) + k[1:]
    started = max((m.started_at if m.started_at is not None else 0.0) for m in unit)
    return (min(m.priority for m in unit), 0 if shrinkable(unit) else 1,
            round(sum(preemption_cost_gpu_s(m, now) for m in unit), 6),
            max(m.restore_estimate_s for m in unit), -started, min(m.lease_id for m in unit))


def _resumes_at(unit: Sequence[Lease], after: ClusterSnapshot, policy: PlacementPolicy | None) -> int:
    """How many workers the shrinkable elastic gang ``unit`` resumes with on ``after`` (0: not even its least).
    Its placement preferences are not on its leases: the default's (fewest nodes) stand in for them."""
    if policy is None or not shrinkable(unit):
        return 0
    least, most = unit[0].elastic  # type: ignore[misc]
    res = place_elastic(after, GangRequest(workers=most, min_workers=least, worker=unit[0].request), policy)
    return len(res.placements) if isinstance(res, GangPlacement) else 0


def _plan(snapshot: ClusterSnapshot, fits: Fits, what: str, holding: Sequence[Lease], *, priority: int,
          queue: str, config: SchedulerConfig, now: float, in_flight: frozenset[str],
          demand: float, give_up_early: bool = False, fair: FairShares | None = None,
          asks: Resources | None = None, policy: PlacementPolicy | None = None) -> PreemptionPlan | NoPreemption:
    """Steps 1-4 of the module docstring over victims of one or more leases (:func:`victim_units`)."""
    usage = queue_usage(holding)
    eligible: list[Lease] = []
    ineligible: list[tuple[str, Reason]] = []
    for lease in holding:
        why = ineligibility(lease, priority=priority, queue=queue, config=config, now=now, in_flight=in_flight,
                            usage=usage, demand=demand, fair=fair, asks=asks)
        if why is None:
            eligible.append(lease)
        else:
            ineligible.append((lease.lease_id, why))
    units = victim_units(eligible, ineligible, holding)
    if not units:
        return NoPreemption(Reason(Cause.NO_PREEMPTION_NONE_ELIGIBLE,
                                   "no running lease may be preempted for it" + _grouped(ineligible)), tuple(ineligible))
    units.sort(key=lambda u: unit_order_key(u, now))

    def release(sim: ClusterSnapshot, unit: tuple[Lease, ...]) -> ClusterSnapshot:
        for m in unit:
            sim = sim.release(m.allocation)  # type: ignore[arg-type]
        return sim

    def reapply(sim: ClusterSnapshot, unit: tuple[Lease, ...]) -> ClusterSnapshot:
        for m in unit:
            sim = sim.apply(m.allocation)  # type: ignore[arg-type]
        return sim

    def not_enough() -> NoPreemption:
        n = sum(len(u) for u in units)
        return NoPreemption(Reason(Cause.NO_PREEMPTION_NOT_ENOUGH,
                                   f"even preempting all {n} eligible leases would not make room"),
                            tuple(ineligible))

    if give_up_early:  # fits is monotone in what is released: if all of it does not make room, no part does
        everything = snapshot
        for unit in units:
            everything = release(everything, unit)
        if fits(everything) is None:
            return not_enough()
    sim = snapshot
    chosen: list[tuple[Lease, ...]] = []
    placed = None
    for unit in units:
        sim = release(sim, unit)
        chosen.append(unit)
        placed = fits(sim)
        if placed is not None:
            break
    if placed is None:
        return not_enough()
    # Add back, last chosen first, every victim the request does not need.
    for unit in reversed(chosen[:-1]):
        trial = reapply(sim, unit)
        again = fits(trial)
        if again is not None:
            sim, placed = trial, again
            chosen.remove(unit)
    landing = _landing(placed)
    after = placed.apply(sim) if isinstance(placed, GangPlacement) else sim.apply(placed.allocation)
    resumes = {u[0].lease_id: _resumes_at(u, after, policy) for u in chosen}
    victims = tuple(
        Victim(lease.lease_id, lease.owner, lease.priority, lease.priority_class, lease.queue, lease.gpus_held,
               work_lost_gpu_s(lease, now), lease.restore_estimate_s,
               lease.started_at if lease.started_at is not None else 0.0,
               reason=_shrink_reason(lease, len(unit), resumes[unit[0].lease_id],
                                     _victim_reason(lease, what, priority, now, landing, config, usage, queue, fair)))
        for unit in chosen for lease in unit
    )
    n_eligible = sum(len(u) for u in units)
    return PreemptionPlan(victims, placed, n_eligible,  # type: ignore[arg-type]
                          Reason(Cause.WAIT_PREEMPTING, f"preempting {len(victims)} of {n_eligible} eligible "
                                 f"lease(s) admits {what} on {landing}"))


def _shrink_reason(lease: Lease, running: int, resumes: int, why: Reason) -> Reason:
    """``why`` as ``victim.shrink`` when the elastic gang of ``lease`` resumes at once with ``resumes`` workers."""
    if not resumes or lease.elastic is None:
        return why
    least, most = lease.elastic
    return Reason(Cause.VICTIM_SHRINK, f"elastic gang {lease.gang} shrinks from {running} to {resumes} of "
                  f"{least}-{most} workers: it checkpoints and resumes at once on what is left (it keeps its place; "
                  f"only the checkpoint and the restore are lost); {why.text}")


def _landing(placed: "Placement | GangPlacement") -> str:
    if isinstance(placed, Placement):
        return placed.allocation.node_name
    return ",".join(placed.nodes)


def _grouped(ineligible: Sequence[tuple[str, Reason]]) -> str:
    if not ineligible:
        return ""
    counts: Counter[str] = Counter(why.text for _, why in ineligible)
    return " (" + "; ".join(f"{n} lease{'s' if n != 1 else ''}: {why}" for why, n in
                            sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) + ")"


def _victim_reason(lease: Lease, what: str, priority: int, now: float, landing: str,
                   config: SchedulerConfig, usage: dict[str, float], queue: str = "",
                   fair: FairShares | None = None) -> Reason:
    """Why an eligible lease is a victim: a lower priority, or else (it was eligible only so) capacity
    its queue borrowed beyond its quota, taken back for a requester within its own."""
    a = lease.allocation
    where = f"{a.node_name} GPU {','.join(map(str, a.gpu_indices))}" if a else "?"
    gang = f" (a worker of gang {lease.gang}, preempted whole)" if lease.gang else ""
    need = (f"its {where}{gang} is needed for {what} (would land on {landing}); "
            f"work lost if stopped now {work_lost_gpu_s(lease, now):.0f} GPU-s")
    if lease.priority < priority:
        return Reason(Cause.VICTIM_PRIORITY, f"{lease.priority_class or 'priority'} {lease.priority} < {priority}: {need}")
    quota = config.queues[lease.queue].quota_gpus
    mine, theirs = (fair.line(lease.queue), fair.line(queue)) if fair is not None else (None, None)
    if mine is not None and theirs is not None and config.fairness.enabled:
        return Reason(Cause.VICTIM_FAIRSHARE,
                      f"fair share: queue {lease.queue} holds {mine.used_gpus:g} GPUs, above its fair share of "
                      f"{mine.fair_share_gpus:.3g}; queue {queue} holds {theirs.used_gpus:g}, below its "
                      f"{theirs.fair_share_gpus:.3g} (it checkpoints and resumes later): {need}")
    return Reason(Cause.VICTIM_RECLAIM,
                  f"reclaimed: queue {lease.queue} holds {usage.get(lease.queue, 0.0):g} GPUs, beyond its quota of "
                  f"{quota:g}, and the requester's queue is within its own (priority {lease.priority} is not lower "
                  f"than {priority}): {need}")
