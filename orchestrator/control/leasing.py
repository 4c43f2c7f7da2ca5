"""The head's lease-state handling: what a caller's lease call and the cycle's lease steps write to the ledger.

Each function here is a method of
:class:`~orchestrator.control.controller.HeadController` (its class body binds
them by name), so ``ctl`` is the controller and the state it changes -- the
ledger, the queue-order clock ``_last_enqueued``, the snapshot through
``_free`` and the ``_dirty`` mark -- is the controller's, set in its
``__init__``; nothing here keeps state of its own.

Invariants, besides the controller's contract (hard state first, idempotent calls):

* **A lease's token is checked before its holder changes it.** ``activate``
  and ``release`` of a granted lease need the lease's fencing token
  (:meth:`~orchestrator.control.controller.HeadController.check_token`); only a
  PENDING lease, which has none yet, is released without one.
* **A retry is written before the entry that points to it**
  (:func:`lose`: ``requeued_as``), so a restore never finds a dangling retry id.
* **Devices are freed only once nothing can still use them.** An ended lease
  whose workload may run on (``fence``, or a node that is still in Ray) keeps
  them, revoking, until its node's agent confirms (:mod:`.revocation`).
* **Devices given back mark the queue** (``_dirty``, through ``_free``), so
  the next cycle schedules it again; a loss (:func:`lose`) and a fenced
  release mark it whatever they freed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Mapping

from orchestrator.control import preempting, revocation
from orchestrator.control.ledger import LedgerEntry
from orchestrator.control.reconcile_report import ReconcileReport
from orchestrator.core import credentials
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.lease import Lease, LeaseRequest, LeaseState

if TYPE_CHECKING:  # the controller binds these functions as its methods
    from orchestrator.control.controller import HeadController


# ---- a caller's calls (the head service forwards these) --------------------------------------------
def request_lease(ctl: HeadController, data: LeaseRequest | Mapping[str, Any]) -> str:
    """Queue a caller's request in its priority class and queue (both checked); a known id with the same
    request answers that id, one with another request is refused."""
    spec = LeaseRequest.parse(data)
    known = ctl.ledger.find(spec.lease_id)
    if known is not None:
        if known.spec != spec:
            raise InvalidRequestError("lease_request.lease_id", spec.lease_id, "an id not used before",
                                      detail="that id already names a different request")
        return spec.lease_id
    if spec.gang is not None and spec.gang.elastic is not None and spec.requeue_on_preempt:
        # a resize requeues every worker (the job layer does); a worker's own retry would leave the rest behind
        raise InvalidRequestError("lease_request.requeue_on_preempt", True, "false for a worker of an elastic gang",
                                  detail="an elastic gang is resized through new attempts: submit it as a job")
    class_name, pclass = ctl.sched_config.priority_class(spec.priority_class or None)
    ctl.sched_config.leaf_queue(spec.queue)
    who = credentials.current()
    ctl.sched_config.check_submitter("request_lease", spec.queue, who.user, who.trusted)
    return ctl.enqueue(spec, class_name, pclass.priority)


def enqueue(ctl: HeadController, spec: LeaseRequest, class_name: str, priority: int) -> str:
    """Queue a request whose class and queue the caller already resolved (the job layer's admission did)."""
    known = ctl.ledger.find(spec.lease_id)
    if known is not None:
        return spec.lease_id
    now = ctl.clock()
    ctl.ledger.seq += 1
    ctl.ledger.put_meta()
    if spec.enqueued_at is not None:
        enqueued = spec.enqueued_at
    else:
        # The scheduler breaks priority ties by submission time, then id: keep arrival order strict.
        ctl._last_enqueued = enqueued = max(now, ctl._last_enqueued + 1e-6)
    entry = LedgerEntry(Lease.new(spec.lease_id, spec.request, now=now, owner=spec.owner,
                                  priority=spec.priority or priority, priority_class=class_name,
                                  queue=spec.queue, gang=spec.gang.gang_id if spec.gang else None,
                                  elastic=spec.gang.elastic if spec.gang else None),
                        spec, ctl.ledger.seq, enqueued)
    ctl.ledger.commit([entry])
    ctl._dirty = True
    return spec.lease_id


def activate(ctl: HeadController, lease_id: str, token: int, holder: str | None = None,
             workload: str | None = None) -> dict[str, Any]:
    """The holder started using its lease: ACTIVE (idempotent); the lease's public view, the token shown."""
    return ctl.activated(lease_id, token, holder, workload).to_dict(reveal=True)


def activated(ctl: HeadController, lease_id: str, token: int, holder: str | None = None,
              workload: str | None = None) -> LedgerEntry:
    """:func:`activate`, answering the lease's entry instead of its public view (for the job layer, which reads
    none of it: building the view cost as much as the change)."""
    e = ctl.ledger.get(lease_id)
    ctl._check_token(e, token)
    if workload is not None:
        why = revocation.protected_workload(workload, namespace=ctl.settings.namespace,
                                            head_name=ctl.settings.head_name)
        if why is not None:
            raise InvalidRequestError("workload", workload, "an actor, Ray job or process of the lease's holder",
                                      detail=f"a revocation never stops it: {why}")
    if e.lease.state is LeaseState.ACTIVE:
        if (holder and e.holder != holder) or (workload and e.workload != workload):
            ctl.ledger.commit([replace(e, holder=holder or e.holder, workload=workload or e.workload)])
        return ctl.ledger.get(lease_id)
    now = ctl.clock()
    cls = e.lease.priority_class
    if e.spec.resume_from is not None:  # a resumed attempt: granted -> active is what resuming cost it
        granted = next((t.at for t in reversed(e.lease.history) if t.state is LeaseState.GRANTED), None)
        if granted is not None:
            note_restore(ctl.restore_seen, cls, max(0.0, now - granted))
    new = replace(e, lease=e.lease.transition(LeaseState.ACTIVE, now=now,
                                              reason=f"activated by {holder or workload or 'its holder'}",
                                              restore_estimate_s=ctl.restore_seen.get(cls, 0.0)),
                  holder=holder, workload=workload or e.workload)
    ctl.ledger.commit([new])
    return new


#: Weight of the newest resume in a class's running estimate (an exponential moving average).
RESTORE_EWMA = 0.5


def note_restore(seen: dict[str, float], priority_class: str, seconds: float) -> None:
    """Fold one measured resume (grant to activation of a resumed attempt) into its class's estimate, which every
    lease of that class then carries as ``restore_estimate_s`` from its activation on: what preempting it would
    cost besides the work since its checkpoint (the victim order counts both)."""
    old = seen.get(priority_class)
    seen[priority_class] = seconds if old is None else RESTORE_EWMA * seconds + (1 - RESTORE_EWMA) * old


def release(ctl: HeadController, lease_id: str, token: int | None = None,
            reason: str = "released by its holder", when_gone: bool = False) -> dict[str, Any]:
    """End the lease as RELEASED and free its devices (idempotent: an ended lease is answered as it is); its
    public view, the token shown only to a caller that sent it.

    ``when_gone``: not yet -- an ACTIVE lease whose holder is being stopped (a Serve replica draining) stays
    ACTIVE, its devices its, until the head sees the holder dead; then it is RELEASED with ``reason``
    (:func:`release_dead_holders`), not LOST. One write, so no watcher of the holder races the head's probe. A
    lease with no holder, or not active, is released now."""
    e = ctl.ledger.get(lease_id)
    if e.lease.terminal:
        return e.to_dict()
    if when_gone and e.lease.state is LeaseState.ACTIVE and e.holder:
        ctl._check_token(e, token)
        if e.release_when_gone != reason:
            e = replace(e, release_when_gone=reason)
            ctl.ledger.commit([e])
        return e.to_dict(reveal=token is not None)
    return ctl.released(lease_id, token, reason).to_dict(reveal=token is not None)


def released(ctl: HeadController, lease_id: str, token: int | None = None,
             reason: str = "released by its holder", *, fence: bool = False) -> LedgerEntry:
    """:func:`release`, answering the lease's entry instead of its public view (for the job layer).

    ``fence``: the lease's workload may still run (a job cancelled by its user, not ended by itself): like a
    preemption's victim, the lease ends but keeps its devices, revoking, until the node's agent has stopped
    the workload and confirmed (:func:`.revocation.must_confirm`); a card is never handed on under it."""
    e = ctl.ledger.get(lease_id)
    if e.lease.terminal:
        return e
    if e.lease.state is not LeaseState.PENDING:
        ctl._check_token(e, token)
    new = ctl._end(e, LeaseState.RELEASED, reason)
    node = e.lease.allocation.node_name if e.lease.allocation else ""
    fenced = fence and revocation.must_confirm(e, node in ctl.registered_nodes())
    if fenced:
        new = replace(new, revoking=True)
    ctl.ledger.commit([new])
    if fenced:
        ctl._dirty = True
    else:
        ctl._free(e)
    return new


# ---- the cycle's lease steps, and the loss its other steps share ------------------------------------
def lose(ctl: HeadController, entries: list[LedgerEntry], reason: str, report: ReconcileReport, *,
         requeue: bool = True, fence: bool = False) -> None:
    """End ``entries`` as LOST (a retry for those asked with ``requeue_on_loss``). ``fence``: one whose
    workload may still run keeps its devices, revoking, until an agent confirms it stopped."""
    if not entries:
        return
    now = ctl.clock()
    out: list[LedgerEntry] = []
    fenced: set[str] = set()
    for e in entries:
        new_id = None
        if requeue and e.spec.requeue_on_loss:
            retry = preempting.retry_of(e, reason, now)
            new_id = retry.lease_id
            out.append(retry)
            report.requeued.append(new_id)
        lost = replace(ctl._end(e, LeaseState.LOST, reason), requeued_as=new_id)
        if fence and e.workload and e.lease.state in (LeaseState.ACTIVE, LeaseState.CHECKPOINTING):
            lost = replace(lost, revoking=True)
            fenced.add(e.lease_id)
        out.append(lost)
        report.lost_leases.append(e.lease_id)
    ctl.ledger.commit(out)  # the retry is written before the lost lease that points to it
    for e in entries:
        if e.lease_id not in fenced:
            ctl._free(e)
    ctl._dirty = True


def release_dead_holders(ctl: HeadController, report: ReconcileReport) -> None:
    """Step 2: end the ACTIVE leases whose holder the probe says is dead: RELEASED with its reason where the holder
    asked for that (``release(when_gone=True)``), else LOST (never requeued)."""
    active = [e for e in ctl.ledger.in_state_any_order(LeaseState.ACTIVE) if e.holder]
    if not active:
        return
    alive = ctl.holder_probe([e.holder for e in active if e.holder])
    dead = ctl.ledger.in_order([e.lease_id for e in active if alive.get(e.holder or "", True) is False])
    for e in dead:
        if e.release_when_gone:
            ctl.released(e.lease_id, e.lease.fencing_token, e.release_when_gone)
    # A dead holder is not requeued: what to do about a crashed workload is the job layer's call.
    ctl._lose([e for e in dead if not e.release_when_gone], "holder died", report, requeue=False)


def expire_grants(ctl: HeadController, now: float, report: ReconcileReport) -> None:
    """Step 3: end as EXPIRED the grants not activated within ``grant_ttl_s``, and free their devices."""
    ttl = ctl.settings.grant_ttl_s
    for e in ctl.ledger.in_state(LeaseState.GRANTED):
        if now - (e.lease.entered(LeaseState.GRANTED) or now) > ttl:
            ctl.ledger.commit([ctl._end(e, LeaseState.EXPIRED, f"not activated within {ttl:g}s")])
            ctl._free(e)
            report.expired_leases.append(e.lease_id)
