"""Growing elastic gangs into idle capacity: ``plan_grow(...) -> [Preemption]``, pure, over the cycle's end state.

An elastic gang (``min..max`` workers, :mod:`orchestrator.core.gang_request`) is resized only through a
checkpoint and a new attempt: the head asks it to checkpoint (the ordinary preemption path, cause
``victim.grow``), the job requeues ``max`` workers, and the next cycle places the largest size that fits
(:func:`~.gang.place_elastic`). Shrinking is a preemption like any other (:mod:`.preemption`, ``victim.shrink``);
this module decides the other way.

A running elastic gang grows when, at the end of a cycle (the plan's grants applied):

1. **nothing waits** that the capacity could serve instead: no pending item waits, except those no card of the
   cluster could ever hold (``wait.never_fits``) -- idle capacity is the gang's only when the queue is served;
2. **it is below its most** and every worker is ACTIVE, none being preempted;
3. **it has run long enough**: its current attempt started ``scheduler.elastic.grow_after_s`` ago or more (and
   its class's ``min_runtime_s``), and its class is preemptible and checkpoints -- a resize costs a checkpoint
   and a restore, and each resize starts a new attempt, so this is also the rate limit: one gang resizes at most
   once per ``grow_after_s``;
4. **one more worker fits**: with its own workers' cards released, the gang places at ``k+1`` or more workers
   (within what its queue's limits and, for a queue that does not borrow, its quota leave). The cards it will take
   are then taken on the working snapshot, so two gangs never count on the same idle card. Fair share does not
   cap it: a queue's fair share is bounded by what it asks, and a running gang asks what it holds, so the cap
   would forbid every grow; with nothing waiting (1) no queue below its share wants the cards, and when one does
   later, its reclaim shrinks the gang back through a checkpoint -- the capacity moves only when it is wanted.

Gangs are considered highest priority first, then earliest started, then gang id (deterministic).
Invariants: the snapshot is never changed; a gang at its most, or one whose size ``k+1`` does not fit, is never
asked to grow -- so rounds with nothing new change nothing (no churn); a lease in ``in_flight`` is never a victim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from orchestrator.core.gang_request import GangRequest
from orchestrator.core.lease import Lease, LeaseState
from orchestrator.core.priorities import SchedulerConfig
from orchestrator.core.reasons import Cause, Reason
from orchestrator.scheduling.gang import GangPlacement, place_elastic
from orchestrator.scheduling.plan import Preemption, Waiting
from orchestrator.scheduling.policy import PlacementPolicy
from orchestrator.scheduling.preemption import Victim, work_lost_gpu_s
from orchestrator.scheduling.snapshot import ClusterSnapshot

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class RunningGang:
    """A running elastic gang: its holding workers (in lease-id order), its least and most, when it started."""

    gang_id: str
    leases: tuple[Lease, ...]
    least: int
    most: int

    @property
    def size(self) -> int:
        return len(self.leases)

    @property
    def started_at(self) -> float:
        """Its latest worker's start: the attempt has run since then."""
        return max((m.started_at if m.started_at is not None else float("inf")) for m in self.leases)


def running_elastic(holding: Sequence[Lease]) -> list[RunningGang]:
    """The elastic gangs among the holding leases."""
    by: dict[str, list[Lease]] = {}
    for lease in holding:
        if lease.elastic is not None and lease.gang is not None and lease.holding:
            by.setdefault(lease.gang, []).append(lease)
    return [RunningGang(g, tuple(sorted(ms, key=lambda m: m.lease_id)), *ms[0].elastic)  # type: ignore[misc]
            for g, ms in by.items()]


def plan_grow(work: ClusterSnapshot, holding: Sequence[Lease], waiting: Sequence[Waiting], config: SchedulerConfig,
              now: float, policy: PlacementPolicy, *, in_flight: frozenset[str] = frozenset(),
              usage: Mapping[str, float] | None = None,
              room: Callable[[str], float] | None = None) -> list[Preemption]:
    """The grows this cycle (see the module docstring): one preemption per worker of each gang that grows, for
    its own first worker, cause ``victim.grow``. ``work``: the cycle's working snapshot; ``usage``: GPUs held per
    queue (needed where a queue has a quota); ``room``: what the queue tree's limits leave a queue (None: no
    limit); ``shares``: the cycle's fair shares (fairness on)."""
    if not config.elastic.grow or any(w.reason.cause is not Cause.WAIT_NEVER_FITS for w in waiting):
        return []
    gangs = [g for g in running_elastic(holding) if g.size < g.most]
    gangs.sort(key=lambda g: (-max(m.priority for m in g.leases), g.started_at, g.gang_id))
    out: list[Preemption] = []
    for g in gangs:
        extra = _extra_allowed(g, config, usage or {}, room)
        if extra < 1 or not _may_resize(g, config, now, in_flight):
            continue
        sim = work
        for m in g.leases:
            sim = sim.release(m.allocation)  # type: ignore[arg-type]
        most = min(g.most, g.size + extra)
        first = g.leases[0]
        res = place_elastic(sim, GangRequest(workers=most, min_workers=g.size + 1, worker=first.request), policy)
        if not isinstance(res, GangPlacement):
            continue
        work = res.apply(sim)
        k = len(res.placements)
        why = Reason(Cause.VICTIM_GROW, f"elastic gang {g.gang_id} grows from {g.size} to {k} of {g.least}-{g.most} "
                     f"workers: idle cards on {','.join(res.nodes)} fit {k - g.size} more and nothing waits for them; "
                     f"it checkpoints and resumes larger (ran {now - g.started_at:.0f}s, at least "
                     f"{config.elastic.grow_after_s:g}s between resizes)")
        for m in g.leases:
            a = m.allocation
            assert a is not None
            out.append(Preemption(Victim(m.lease_id, m.owner, m.priority, m.priority_class, m.queue, m.gpus_held,
                                         work_lost_gpu_s(m, now), m.restore_estimate_s, m.started_at or 0.0,
                                         reason=why), first.lease_id, why))
    return out


def _may_resize(g: RunningGang, config: SchedulerConfig, now: float, in_flight: frozenset[str]) -> bool:
    """Every worker ACTIVE and not being preempted, its class preemptible and checkpointing, and run long enough."""
    if any(m.state is not LeaseState.ACTIVE or m.lease_id in in_flight for m in g.leases):
        return False
    cls = config.classes.get(g.leases[0].priority_class)
    if cls is None or not cls.preemptible or not cls.checkpoint:
        return False
    return now - g.started_at >= max(config.elastic.grow_after_s, cls.min_runtime_s)


def _extra_allowed(g: RunningGang, config: SchedulerConfig, usage: Mapping[str, float],
                   room: Callable[[str], float] | None) -> int:
    """How many more workers its queue's limits and quota (a queue that does not borrow) allow."""
    first = g.leases[0]
    per = first.gpus_held
    if per <= 0:
        return 0
    left = [room(first.queue) if room is not None else float("inf")]
    q = config.queues.get(first.queue)
    if q is not None and q.quota_gpus is not None and not q.borrowing:
        left.append(q.quota_gpus - usage.get(first.queue, 0.0))
    most = min(left)
    return g.most - g.size if most == float("inf") else min(g.most - g.size, int((most + _EPS) / per))
