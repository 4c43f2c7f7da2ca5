"""Consolidation: move one or two running shares so that a request that fits nowhere does. Pure.

A request can wait with every card it could use partly taken -- a 1-card share on each of two nodes
blocks a 2-card request on either -- and no preemption helps when nothing is of lower priority. Such
shares need not stop: a lease whose holder requeues on preemption (``requeue_on_preempt``) and whose
class checkpoints can be *moved*: asked to checkpoint, stopped, queued again keeping its position, and
resumed elsewhere from its checkpoint, losing no step.

:func:`plan_move` (off unless ``consolidation.enabled``): the movable leases -- in ``movable``, of a
preemptible class that checkpoints, past its minimum runtime, not being preempted already -- cheapest
first (:func:`~.preemption.preemption_cost_gpu_s`: work since the checkpoint plus the measured restore,
x GPUs); try each one alone, then each pair on one node (``max_moves`` 2): the request must place with
them released, **and each of them must place again on what is left after it** (so the moved work has
somewhere to go now, not only someday), and their cost together must stay within ``max_cost_gpu_s``.
The first such set is the plan (cause ``victim.consolidate``); the request then waits for it as for
any victims. Only leases whose retry the cycle considers after the request are moved (lower priority,
or its priority and submitted after it), so the retry -- keeping its old position -- cannot take the
room back and set off the same move again.

Invariants: the snapshot is never changed; a plan moves only leases in ``movable``; every moved lease
had a place to go on the snapshot the plan was made on; at most ``max_moves`` leases, within the cost.
"""

from __future__ import annotations

from itertools import combinations
from typing import Mapping, Sequence

from orchestrator.core.lease import Lease, LeaseState
from orchestrator.core.priorities import SchedulerConfig
from orchestrator.core.reasons import Cause, Reason
from orchestrator.core.request import GpuRequest, ResolvedRequest
from orchestrator.scheduling.engine import Placement, place
from orchestrator.scheduling.plan import PendingItem
from orchestrator.scheduling.policy import PlacementPolicy
from orchestrator.scheduling.preemption import PreemptionPlan, Victim, preemption_cost_gpu_s, work_lost_gpu_s
from orchestrator.scheduling.snapshot import ClusterSnapshot

#: The cheapest movable leases a plan looks at (pairs among them: at most 28 tries).
MAX_CANDIDATES = 8


def movable_leases(holding: Sequence[Lease], movable: Mapping[str, float], config: SchedulerConfig, now: float,
                   taken: set[str] | frozenset[str], item: PendingItem, fair: bool) -> list[Lease]:
    """The leases a move may take for ``item``, cheapest first (then by id): see the module docstring. Only
    those whose retry the cycle will consider after ``item`` -- of lower priority, or of its priority (and,
    with fairness on, its queue) submitted after it -- so the retry cannot take back the room it left."""
    out = []
    for lease in holding:
        cls = config.classes.get(lease.priority_class)
        after = lease.priority < item.priority or (
            lease.priority == item.priority and movable.get(lease.lease_id, 0.0) > item.submitted_at
            and (not fair or lease.queue == item.queue))
        if (lease.lease_id not in movable or not after or lease.lease_id in taken or lease.allocation is None
                or not lease.holding or lease.state is LeaseState.CHECKPOINTING
                or cls is None or not cls.preemptible or not cls.checkpoint):
            continue
        started = lease.started_at if lease.started_at is not None else now
        if now - started < cls.min_runtime_s:
            continue
        out.append(lease)
    return sorted(out, key=lambda lease: (preemption_cost_gpu_s(lease, now), lease.lease_id))[:MAX_CANDIDATES]


def plan_move(work: ClusterSnapshot, request: GpuRequest, what: str, candidates: Sequence[Lease], *,
              policy: PlacementPolicy, now: float, config: SchedulerConfig,
              resolved: ResolvedRequest | None = None) -> PreemptionPlan | None:
    """The cheapest set of at most ``consolidation.max_moves`` of ``candidates`` (:func:`movable_leases`) whose
    move admits ``request`` and whose members each land again; None when there is none within the cost."""
    bound = config.consolidation.max_cost_gpu_s
    sets: list[tuple[Lease, ...]] = [(lease,) for lease in candidates]
    if config.consolidation.max_moves >= 2:
        sets += [pair for pair in combinations(candidates, 2)
                 if pair[0].allocation and pair[1].allocation and pair[0].allocation.node_name == pair[1].allocation.node_name]
    sets.sort(key=lambda s: (sum(preemption_cost_gpu_s(m, now) for m in s), tuple(m.lease_id for m in s)))
    for moved in sets:
        cost = sum(preemption_cost_gpu_s(m, now) for m in moved)
        if cost > bound:
            break  # sorted by cost: every later set costs more
        sim = work
        for m in moved:
            sim = sim.release(m.allocation)  # type: ignore[arg-type]
        placed = place(sim, request, policy, resolved=resolved)
        if not isinstance(placed, Placement):
            continue
        rest = sim.apply(placed.allocation)
        landed: list[str] = []
        for m in moved:
            again = place(rest, m.request, policy)
            if not isinstance(again, Placement):
                break
            rest = rest.apply(again.allocation)
            landed.append(again.allocation.node_name)
        if len(landed) != len(moved):
            continue
        victims = tuple(
            Victim(m.lease_id, m.owner, m.priority, m.priority_class, m.queue, m.gpus_held, work_lost_gpu_s(m, now),
                   m.restore_estimate_s, m.started_at if m.started_at is not None else 0.0,
                   reason=Reason(Cause.VICTIM_CONSOLIDATE,
                                 f"moved to make room for {what}: its {m.allocation.node_name} share "  # type: ignore[union-attr]
                                 f"checkpoints and resumes on {node} (cost {preemption_cost_gpu_s(m, now):.0f} "
                                 f"GPU-s, bound {bound:g})"))
            for m, node in zip(moved, landed))
        return PreemptionPlan(victims, placed, len(candidates), Reason(
            Cause.WAIT_PREEMPTING, f"moving {len(moved)} running share(s) ({', '.join(m.lease_id for m in moved)}; "
            f"cost {cost:.0f} GPU-s) admits {what} on {placed.allocation.node_name}"))
    return None
