"""Carrying out preemptions on the ledger: a victim's way from holding to PREEMPTED.

The rules -- who may be preempted, how long a victim's grace lasts, when it is
requeued -- are :mod:`.preempting`'s pure functions; the decision to preempt is
the scheduler's plan (or a repartition's drain, :mod:`.repartition_hooks`).
This module applies them. Each public function here is a method of
:class:`~orchestrator.control.controller.HeadController` (its class body binds
them by name), so ``ctl`` is the controller and the state it changes -- the
ledger, the snapshot through ``_free`` and the ``_dirty`` mark -- is the
controller's; nothing here keeps state of its own.

Invariants:

* **Written before anyone is told.** A victim's CHECKPOINTING or PREEMPTED
  entry is in the store before its id is put in the report the wrapper acts
  on (asks the holder to checkpoint, or stops it).
* **Nothing is preempted twice.** A victim already CHECKPOINTING is skipped;
  ``ack_preemption`` of a PREEMPTED lease answers it as it is.
* **A retry is written before the entry that points to it** (a victim that
  asked to be requeued, :func:`~orchestrator.control.preempting.requeued_if_asked`).
* **A card is not handed on under a running victim.** A victim's devices are
  freed at once only when nothing can still use them; else it keeps them,
  revoking, until its agent confirms it stopped
  (:func:`~orchestrator.control.revocation.must_confirm`).
* **A grace period ends.** A victim still CHECKPOINTING past its deadline is
  ended as if it had acknowledged without a checkpoint (step 4 of the cycle).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Sequence

from orchestrator.control import preempting, revocation
from orchestrator.control.ledger import LedgerEntry
from orchestrator.control.reconcile_report import ReconcileReport
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.lease import LeaseState
from orchestrator.scheduling.cycle import Plan

if TYPE_CHECKING:  # the controller binds these functions as its methods
    from orchestrator.control.controller import HeadController


def start_preemptions(ctl: HeadController, plan: Plan, now: float, report: ReconcileReport) -> None:
    """Carry out the plan's preemptions: ask checkpointing victims to checkpoint (grace period),
    stop the others at once. Written to the store before anyone is told."""
    victims = []
    for p in plan.preemptions:
        e = ctl.ledger.find(p.victim.lease_id)
        if e is None or not e.lease.holding or e.lease.state is LeaseState.CHECKPOINTING:
            continue
        by = ctl.ledger.find(p.for_item)
        for_owner = (by.spec.owner if by else p.for_item).removeprefix("job:")
        victims.append((e, p.for_item, p.reason.cause.value, f"preempted for {for_owner or p.for_item}: {p.reason}"))
    ctl._preempt(victims, now, report)


def preempt(ctl: HeadController, victims: Sequence[tuple[LedgerEntry, str, str, str]], now: float,
            report: ReconcileReport) -> None:
    """Preempt each ``(entry, for_item, cause, why)``: ask it to checkpoint or stop it (its class decides)."""
    asked: list[LedgerEntry] = []
    stopped: list[tuple[LedgerEntry, LedgerEntry]] = []
    for e, for_item, cause, why in victims:
        _, pclass = ctl.sched_config.priority_class(e.lease.priority_class or None)
        new = preempting.ask_or_stop(e, pclass, for_item=for_item, now=now, cause=cause, why=why)
        if new.state is LeaseState.CHECKPOINTING:
            asked.append(new)
        else:
            stopped.append((e, new))
    ctl.ledger.commit(asked)
    for e, new in stopped:
        _settle_preempted(ctl, e, new)
    report.checkpoint_requested.extend(e.lease_id for e in asked)
    report.preempted.extend(e.lease_id for e, _ in stopped)


def ack_preemption(ctl: HeadController, lease_id: str, checkpoint_path: str | None, token: int | None = None,
                   reason: str = "checkpoint acknowledged") -> dict[str, Any]:
    """The victim checkpointed (or stopped): end the lease as PREEMPTED and free its devices. Idempotent."""
    e = ctl.ledger.get(lease_id)
    if e.lease.state is LeaseState.PREEMPTED:
        return e.to_dict()
    if token is not None:
        ctl._check_token(e, token)
    if e.lease.state is not LeaseState.CHECKPOINTING:
        raise InvalidRequestError("lease_id", lease_id, "a lease being preempted (checkpointing)",
                                  detail=f"lease is {e.lease.state.value}")
    new = preempting.acknowledged(e, checkpoint_path, reason, ctl.clock())
    return _settle_preempted(ctl, e, new, checkpointed=checkpoint_path is not None).to_dict(reveal=token is not None)


def _settle_preempted(ctl: HeadController, e: LedgerEntry, new: LedgerEntry, *,
                      checkpointed: bool = False) -> LedgerEntry:
    """Write a victim's PREEMPTED entry: requeued to resume if it asked, and its devices freed now
    or fenced until its agent confirms (:func:`.revocation.must_confirm`)."""
    node = e.lease.allocation.node_name if e.lease.allocation else ""
    fenced = revocation.must_confirm(e, node in ctl.registered_nodes(), checkpointed=checkpointed)
    out = preempting.requeued_if_asked(replace(new, revoking=fenced), ctl.clock())
    ctl.ledger.commit(out)  # the retry first: it is written before the entry that points to it
    new = out[-1]
    if not fenced:
        ctl._free(e)
    ctl._dirty = True
    return new


def report_checkpoint(ctl: HeadController, lease_id: str, checkpoint_path: str,
                      at: float | None = None) -> dict[str, Any]:
    """A holder wrote a checkpoint (periodic or not): less work is lost if it is preempted now."""
    e = ctl.ledger.get(lease_id)
    if not e.lease.holding:
        return e.to_dict()
    new = preempting.checkpoint_reported(e, checkpoint_path, ctl.clock() if at is None else at)
    ctl.ledger.commit([new])
    return new.to_dict()


# ---- step 4 of the cycle -----------------------------------------------------------------------------
def end_overdue_checkpoints(ctl: HeadController, now: float, report: ReconcileReport) -> None:
    """Stop the victims still checkpointing past their grace deadline: PREEMPTED without a checkpoint."""
    for e in ctl.ledger.in_state(LeaseState.CHECKPOINTING):
        if e.preempt_deadline is not None and now > e.preempt_deadline:
            ctl.ack_preemption(e.lease_id, None, reason="grace period over without a checkpoint: stopped")
            report.preempted.append(e.lease_id)
