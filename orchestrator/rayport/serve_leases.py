"""Serve's replicas on leases without stopping Serve's controller while a lease waits in the queue.

Serve's controller starts a replica from its control loop: ``DeploymentScheduler._schedule_replica`` calls the
replica actor's ``.remote()`` (and ``placement_group()`` for ``placement_group_bundles``). Under
:class:`~orchestrator.rayport.native._AutoLeases` those calls block until the replica's lease is granted -- in the
controller that stops every application's control loop (health checks, autoscaling, routing updates) for as
long as a preemption takes, and leases come one at a time.

So in the controller the scheduler is wrapped (:func:`install`):

* the first time a replica that asks for GPUs is scheduled, its lease is *asked* (``acquire_lease_now``, never
  a wait; the lease id names the replica: ``serve-<app>-<deployment>-<replica>``, so ``orchestrator leases`` and
  ``explain`` show whose it is) and ``_schedule_replica`` returns ``False`` leaving the request pending: Serve
  tries it again at its next loop (every ~0.1 s), as it does for any replica that cannot be placed yet. A thread
  waits for the grant and finds the lease's group;
* once granted, the next try runs Serve's own ``_schedule_replica`` with that lease prepared: the actor (or the
  replica's placement group) goes into the lease's group exactly as :mod:`orchestrator.rayport.native` places
  any GPU actor; a lease that will not be granted (a request the head refuses) fails the try as a creation
  failure, which Serve reports with the error;
* a replica stopped while it waits (a downscale, a deleted application) withdraws its lease
  (``on_replica_stopping``); one stopped once running releases its lease as soon as its actor is dead (so
  ``explain`` says "its Serve replica stopped", not "holder died").

N replicas asked together are N lease requests in the queue at once, granted in one scheduling cycle when they
fit, and started in parallel. The priority class, queue and exact request of the replicas' leases come from
``ray_actor_options["runtime_env"]["env_vars"]`` (``ORCHESTRATOR_PRIORITY_CLASS``, ``ORCHESTRATOR_QUEUE``,
``ORCHESTRATOR_GPU_REQUEST``: :meth:`~orchestrator.rayport.native._AutoLeases.lease_request`).

Invariant: a ticket is used once (the actor made in it activates it) or withdrawn; never both, never neither
once its replica has left Serve's books.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import re
import sys
from typing import Any, Callable

log = logging.getLogger(__name__)

SCHEDULER_MODULE = "ray.serve._private.deployment_scheduler"


def lease_prefix(app: str, deployment: str) -> str:
    """What the lease ids of ``app``'s ``deployment``'s replicas start with (``serve-<app>-<deployment>-``), in the
    id pattern's characters; cut so that a replica's 8-character id still fits its 128."""
    return re.sub(r"[^A-Za-z0-9_.:-]", "_", f"serve-{app}-{deployment}")[:128 - 9] + "-"


def lease_id_of(app: str, deployment: str, unique_id: str) -> str:
    """The lease id of the replica ``unique_id`` of ``app``'s ``deployment``."""
    return lease_prefix(app, deployment) + unique_id


def replica_lease_id(replica_id: Any) -> str:
    """The lease id of Serve's ``ReplicaID`` (:func:`lease_id_of`)."""
    dep = replica_id.deployment_id
    return lease_id_of(dep.app_name, dep.name, replica_id.unique_id)


def replica_gpus(request: Any) -> float:
    """What a Serve scheduling request asks of Ray's ``GPU``: its actor's, or its placement group bundles'."""
    bundles = getattr(request, "placement_group_bundles", None)
    if bundles:
        return float(sum(float((b or {}).get("GPU", 0.0)) for b in bundles))
    return float((request.actor_options or {}).get("num_gpus") or 0.0)


def patch_scheduler(cls: Any, leases: Any) -> None:
    """Wrap ``cls`` (Serve's ``DeploymentScheduler``) as the module docstring says; idempotent."""
    if getattr(cls, "_rgo_patched", False):
        return
    from orchestrator.rayport.lease_groups import advertises_any_gpus

    original_schedule, original_stopping = cls._schedule_replica, cls.on_replica_stopping
    tickets: dict[Any, Any] = {}  # replica id -> Ticket, while its replica waits to be made
    held: dict[Any, Any] = {}  # replica id -> Ticket, while its replica's actor holds the lease

    def _schedule_replica(self: Any, scheduling_request: Any, *args: Any, **kwargs: Any) -> bool:
        gpus = replica_gpus(scheduling_request)
        rid = scheduling_request.replica_id
        if gpus <= 0 or scheduling_request.gang_placement_group is not None or not advertises_any_gpus():
            return original_schedule(self, scheduling_request, *args, **kwargs)
        ticket = tickets.get(rid)
        if ticket is None:
            what = f"Serve replica {rid.deployment_id.app_name}/{rid.deployment_id.name}#{rid.unique_id}"
            try:
                lease_request = leases.lease_request(gpus, scheduling_request.actor_options, replica_lease_id(rid))
                ticket = tickets[rid] = leases.ask(lease_request, what, wait=False)
            except Exception as e:  # noqa: BLE001 -- a request the head refuses: Serve's creation failure says why
                ticket = tickets[rid] = leases.refused(replica_lease_id(rid), what, e)
        if not ticket.ready.is_set():
            return False  # stays pending: Serve tries again at its next loop
        with leases.prepared(ticket):
            ok = original_schedule(self, scheduling_request, *args, **kwargs)
        if ok or scheduling_request.status != type(scheduling_request.status).IN_PROGRESS:
            tickets.pop(rid, None)  # settled: made in the lease (its actor activated it) or failed
            if ok and ticket.holder:
                held[rid] = ticket
            if not ticket.used:  # failed, or placed by a strategy of Serve's own that took no lease
                leases.withdraw(ticket, "its Serve replica was created without it" if ok else
                                "its Serve replica could not be created")
        return ok

    def on_replica_stopping(self: Any, replica_id: Any) -> None:
        original_stopping(self, replica_id)
        ticket = tickets.pop(replica_id, None)
        if ticket is not None:
            leases.withdraw(ticket, "its Serve replica stopped before it started")
        ticket = held.pop(replica_id, None)
        if ticket is not None:  # Serve stops it (a downscale, an update, a deletion): released once it is gone
            leases.release_when_gone(ticket, "its Serve replica stopped")

    cls._schedule_replica, cls.on_replica_stopping = _schedule_replica, on_replica_stopping
    cls._rgo_patched = True


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` once right after ``name`` is imported (Serve's scheduler is imported in the
    controller's worker only when the controller actor is created, after this process's setup hook ran)."""

    def __init__(self, name: str, then: Callable[[Any], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader, then = spec.loader, self.then
        exec_module = loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            try:
                then(module)
            except Exception as e:  # noqa: BLE001 -- Serve must start whatever we could not do
                log.warning("orchestrator: Serve's replicas will wait for leases in line: %s", e)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def install(leases: Any) -> None:
    """Patch Serve's scheduler in this process now if it is imported, else right after it is."""
    def then(module: Any) -> None:
        patch_scheduler(module.DeploymentScheduler, leases)

    module = sys.modules.get(SCHEDULER_MODULE)
    if module is not None:
        then(module)
    elif not any(isinstance(f, _AfterImport) and f.name == SCHEDULER_MODULE for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(SCHEDULER_MODULE, then))
