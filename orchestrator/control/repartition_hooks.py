"""The controller's side of a MIG repartition: starting one, and the hooks the runner drives it through.

:mod:`.repartition` runs a repartition (cordon, drain, apply, uncordon) as a
state machine of its own; what it needs of the head's state goes through these
functions, each a method of
:class:`~orchestrator.control.controller.HeadController` (its class body binds
them by name). ``ctl`` is the controller and the state they change -- the
snapshot, the ledger through :func:`~orchestrator.control.victims.preempt` and
the ``_dirty`` mark -- is the controller's; nothing here keeps state of its own.

Invariants:

* **A started repartition's GPU takes no new grant from that moment:** it is
  marked unhealthy in the snapshot in the same call that starts it, and every
  rebuild of the snapshot keeps the live repartitions' cordons
  (:mod:`.snapshot_rebuild`).
* **A drain touches one GPU:** only the holding leases whose devices include
  it are preempted, through the checkpoint path, but for those on a MIG
  instance the new layout keeps (:func:`~orchestrator.scheduling.repartition.must_move`).
* **An ended repartition lifts its cordon** by the snapshot's rebuild before
  its next use (:func:`uncordon`), and the queue is scheduled again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Collection

from orchestrator.control.ledger import LedgerEntry
from orchestrator.control.reconcile_report import ReconcileReport
from orchestrator.core.lease import LeaseState
from orchestrator.core.reasons import Cause
from orchestrator.scheduling.repartition import MigSlot, MigTarget, RepartitionPlan, must_move, plan_repartition

if TYPE_CHECKING:  # the controller binds these functions as its methods
    from orchestrator.control.controller import HeadController


def request_repartition(ctl: HeadController, target: MigTarget, *, dry_run: bool = False) -> dict[str, Any]:
    """Plan ``target`` over the current snapshot and the holding leases, and (unless ``dry_run``) start it:
    the chosen GPUs are cordoned now and drained, reconfigured and uncordoned by the next cycles."""
    plan: RepartitionPlan = plan_repartition(
        ctl._snapshot, [e.lease for e in ctl.ledger.holding()], target, ctl.sched_config.classes,
        default_class=ctl.sched_config.default_class, busy=ctl.repartitions.busy())
    started = [] if dry_run else ctl.repartitions.start(plan, ctl.clock())
    for rec in started:
        ctl._snap = ctl._snapshot.with_health(rec.change.node, rec.change.gpu_index, False)
    if started:
        ctl._dirty = True
    return {"plan": plan.to_json(), "started": [r.repartition_id for r in started], "dry_run": dry_run}


def occupying_gpu(ctl: HeadController, node: str, gpu_index: int,
                  keep: Collection[MigSlot] = ()) -> list[LedgerEntry]:
    """The entries whose devices on ``node`` include GPU ``gpu_index`` (revoking ones included), but for
    those on an instance of ``keep`` (:func:`~orchestrator.scheduling.repartition.must_move`)."""
    return [e for e in ctl.ledger.occupying_on(node)
            if e.lease.allocation is not None and gpu_index in e.lease.allocation.gpu_indices
            and (not keep or must_move(e.lease, keep))]


def drain(ctl: HeadController, node: str, gpu_index: int, *, for_item: str, why: str, report: ReconcileReport,
          keep: Collection[MigSlot] = ()) -> list[str]:
    """Preempt every holding lease on one GPU through the checkpoint path (requeued if it asked), but for
    those on an instance of ``keep``; leases on other GPUs are not touched. Returns the ids asked or stopped."""
    victims = [(e, for_item, Cause.LEASE_DRAINED.value, why) for e in ctl.occupying_gpu(node, gpu_index, keep)
               if e.lease.holding and e.lease.state is not LeaseState.CHECKPOINTING]
    ctl._preempt(victims, ctl.clock(), report)
    return [e.lease_id for e, *_ in victims]


def uncordon(ctl: HeadController) -> None:
    """A repartition ended: rebuild the snapshot, which keeps only the live repartitions' cordons."""
    ctl._stale = True
    ctl._dirty = True
