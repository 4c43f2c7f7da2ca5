"""How preemption and loss change one ledger entry: pure functions from an entry to its next one.

The controller decides *which* entries change (from the scheduler's plan, an
agent's report, a deadline); these functions say *how*, so each rule is
stated once:

* a victim that holds devices and whose class checkpoints is asked to
  (CHECKPOINTING, with a deadline of its class's grace period); any other
  victim is stopped at once (PREEMPTED);
* an acknowledged checkpoint ends the lease PREEMPTED with the path recorded;
* a lost lease that asked to be requeued gets a new attempt
  (:func:`orchestrator.core.ids.next_attempt`) that keeps its queue position.

Invariant: every result is a legal edge of :data:`orchestrator.core.lease.LEASE_TRANSITIONS`
(``Lease.transition`` raises otherwise) and carries its reason.
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.control.ledger import LedgerEntry
from orchestrator.core.ids import next_attempt
from orchestrator.core.lease import Lease, LeaseState
from orchestrator.core.priorities import PriorityClass


def ask_or_stop(e: LedgerEntry, pclass: PriorityClass, *, for_item: str, why: str, now: float,
                cause: str = "") -> LedgerEntry:
    """The victim's next entry: CHECKPOINTING if it runs and its class checkpoints, else PREEMPTED.

    ``cause`` is the scheduler's code for choosing it (``victim.priority`` or ``victim.reclaim``)."""
    if e.lease.state is LeaseState.ACTIVE and pclass.checkpoint:
        return replace(e, lease=e.lease.transition(
            LeaseState.CHECKPOINTING, now=now, reason=f"asked to checkpoint within {pclass.grace_period_s:g}s; {why}"),
            preempt_for=for_item, preempt_reason=why, preempt_cause=cause, preempt_deadline=now + pclass.grace_period_s)
    return replace(e, lease=e.lease.transition(
        LeaseState.PREEMPTED, now=now,
        reason=why + ("" if e.lease.state is LeaseState.ACTIVE else " (not started: nothing to checkpoint)")),
        preempt_for=for_item, preempt_reason=why, preempt_cause=cause)


def acknowledged(e: LedgerEntry, checkpoint_path: str | None, reason: str, now: float) -> LedgerEntry:
    """A CHECKPOINTING victim that checkpointed (``checkpoint_path``) or ran out of time (None): PREEMPTED."""
    return replace(e, lease=e.lease.transition(
        LeaseState.PREEMPTED, now=now, reason=f"{reason}; {e.preempt_reason}",
        checkpoint_path=checkpoint_path or e.lease.checkpoint_path,
        last_checkpoint_at=now if checkpoint_path else e.lease.last_checkpoint_at))


def checkpoint_reported(e: LedgerEntry, checkpoint_path: str, at: float) -> LedgerEntry:
    """A holder wrote a checkpoint on its own: less work is lost if it is preempted now."""
    return replace(e, lease=replace(e.lease, checkpoint_path=checkpoint_path, last_checkpoint_at=at))


def retry_of(e: LedgerEntry, reason: str, now: float, *, resume_from: str | None = None) -> LedgerEntry:
    """A new pending attempt of a lost (or preempted, asked to requeue) lease, at the same queue position
    (sequence and submission time); ``resume_from`` is the checkpoint its holder starts from."""
    new_id = next_attempt(e.lease_id)
    spec = e.spec.model_copy(update={"lease_id": new_id, "resume_from": resume_from or e.spec.resume_from})
    return LedgerEntry(Lease.new(new_id, spec.request, now=now, owner=spec.owner, priority=e.lease.priority,
                                 priority_class=e.lease.priority_class, queue=e.lease.queue,
                                 reason=f"requeued: {reason}", gang=e.lease.gang,
                                 elastic=e.lease.elastic),
                       spec, e.seq, e.enqueued_at, attempt_of=e.lease_id)


def requeued_if_asked(new: LedgerEntry, now: float) -> list[LedgerEntry]:
    """A preempted entry, preceded by its resuming attempt when its request asked to be requeued."""
    if not new.spec.requeue_on_preempt:
        return [new]
    path = new.lease.checkpoint_path
    retry = retry_of(new, f"preempted; resumes from {path or 'the start'}", now, resume_from=path)
    return [retry, replace(new, requeued_as=retry.lease_id)]
