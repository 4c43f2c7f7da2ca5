"""Ray's own GPU API inside a lease: the holder's side of ``control/holds.py``.

A lease on a node that advertises Ray's ``GPU`` is a placement group the node's agent made
(``rgo-lease/<node>/<lease id>``, one bundle ``{"GPU": share, "CPU": cpus}``). The Ray-native path (this
module and the ones it names below)

* finds it (:func:`lease_group`: by name, in the agent's namespace, waiting until the agent has made and
  placed it);
* starts a holder actor inside it (:func:`native_actor_options`): the actor asks for the lease's share of
  ``GPU``, so ``ray.get_gpu_ids()`` names the leased card(s), and its own GPU tasks and actors are captured
  into the same group;
* makes a *driver* that holds a lease behave as one (:func:`runtime_env_hook`, which Ray calls from
  ``ray.init`` when ``RAY_RUNTIME_ENV_HOOK`` names it; the job layer sets it on every job it starts): each
  task or actor the driver (or any worker of its job) starts that asks for ``num_gpus`` and names no
  placement of its own goes into the lease's group; one that asks for more than the lease holds fails at
  once with :class:`LeaseCapacityError`, naming the lease and what it holds.

Only GPU work is steered: a task that asks for no GPU is Ray's as usual, so a driver's CPU work is not
squeezed into the lease's CPUs. ``docs/ray-native.md`` says why Ray's own capture cannot do this for a driver,
and what the orchestrator does for each Ray API that asks for GPUs.

The parts, one module each (every name importable from here, as before):

* :mod:`.held_lease` -- the lease a process holds (:class:`_Lease`), steering a call into its group
  (:func:`steer`), :class:`LeaseCapacityError`;
* :mod:`.adopted_groups` -- placement groups made on a lease's capacity, lent and adopted by the node's agent
  (:func:`make_group_in_lease`, a gang's: :class:`_GangLeases`), and Ray's placement group functions wrapped;
* :mod:`.auto_leases` -- a lease of its own for each GPU call of a process that holds none (:class:`_AutoLeases`);
* this module -- what Ray calls (:func:`runtime_env_hook`, :func:`worker_setup`, :func:`serve_controller_setup`),
  what a process steers into (:func:`lease_from_env`) and the wrapping of Ray's submit calls (:func:`install`).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Mapping

import ray

from orchestrator.core import env as E
from orchestrator.rayport.adopted_groups import _GangLeases, _wrap_groups, make_group_in_lease
from orchestrator.rayport.auto_leases import Ticket, _AutoLeases
from orchestrator.rayport.held_lease import LeaseCapacityError, _Lease, _steerable, steer
from orchestrator.rayport.lease_groups import DEFAULT_NAMESPACE, advertises_any_gpus, advertises_gpus, lease_group

__all__ = ["DEFAULT_NAMESPACE", "LeaseCapacityError", "Ticket", "_AutoLeases", "_GangLeases", "_Lease",
           "advertises_any_gpus", "advertises_gpus", "install", "lease_from_env", "lease_group",
           "make_group_in_lease", "runtime_env_hook", "serve_controller_setup", "steer", "worker_setup"]

log = logging.getLogger(__name__)


_INSTALLED = False


def install(lease: "_Lease | _AutoLeases | _GangLeases") -> None:
    """Steer this process's GPU tasks and actors into ``lease``, or into a lease of their own each
    (:class:`_AutoLeases`); idempotent. Ray's remote functions and actor classes submit through
    ``_remote(args, kwargs, **options)``; both are wrapped once. A call that names its own placement
    (a scheduling strategy, a placement group) is left as it is."""
    global _INSTALLED
    if _INSTALLED:
        return
    from ray import actor, remote_function

    def wrap(cls: Any, is_actor: bool) -> None:
        original = cls._remote

        @functools.wraps(original)
        def _remote(self: Any, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
            if not _steerable(options):
                return original(self, args, kwargs, **options)
            what = ("actor " if is_actor else "task ") + _describe(self)
            if isinstance(lease, _GangLeases):  # a gang's GPU work goes through its placement group
                return original(self, args, kwargs, **options)
            if isinstance(lease, _AutoLeases):
                if not advertises_any_gpus():
                    return original(self, args, kwargs, **options)
                options, done = lease.lease_for(options, what, actor=is_actor)
                result = original(self, args, kwargs, **options)
                done(result)
                return result
            return original(self, args, kwargs, **steer(lease, options, what))

        cls._remote = _remote

    wrap(remote_function.RemoteFunction, False)
    wrap(actor.ActorClass, True)
    if isinstance(lease, _AutoLeases):
        from orchestrator.rayport import serve_leases

        serve_leases.install(lease)  # in Serve's controller: replicas ask without stopping its loop
    if isinstance(lease, (_AutoLeases, _GangLeases)):
        _wrap_groups(lambda original, bundles, args, kwargs: lease.group_for(original, bundles, args, kwargs))
    else:
        _wrap_groups(lambda original, bundles, args, kwargs: make_group_in_lease(lease, original, bundles, args, kwargs))
    _INSTALLED = True


def _describe(obj: Any) -> str:
    fd = getattr(obj, "_function_descriptor", None) or getattr(getattr(obj, "__ray_metadata__", None),
                                                                "class_name", None)
    return str(getattr(fd, "repr", fd) or type(obj).__name__)


def lease_from_env(environ: Mapping[str, str] | None = None) -> "_Lease | _AutoLeases | _GangLeases | None":
    """What this process steers its GPU work into: the lease its environment names (a job or holder the
    orchestrator started), per-call leases (a driver with no lease, where ``ORCHESTRATOR_RAY_AUTO_LEASE`` is on,
    as ``orchestrator up`` sets it on every raylet), a gang job's leases (its driver and workers), or nothing."""
    environ = os.environ if environ is None else environ
    if environ.get(E.GANG):
        import json

        try:
            handouts = json.loads(environ[E.GANG])
        except ValueError:
            return None
        return _GangLeases(handouts, environ.get(E.NAMESPACE))
    lease_id, node = environ.get(E.LEASE_ID), environ.get(E.NODE)
    if lease_id and node:
        token = environ.get(E.FENCING_TOKEN, "")
        return _Lease(lease_id, node, environ.get(E.NAMESPACE), int(token) if token.isdigit() else None)
    if environ.get(E.RAY_AUTO_LEASE, "") in ("1", "true"):
        return _auto_leases(environ)
    return None


def _auto_leases(environ: Mapping[str, str]) -> "_AutoLeases":
    """Per-call leases asked of the head ``environ`` names (its namespace and name), with its fractional mapping
    and wait."""
    return _AutoLeases(environ.get(E.NAMESPACE) or DEFAULT_NAMESPACE, environ.get(E.HEAD_NAME) or "rgo-head",
                       environ.get(E.FRACTIONAL_GPU) or "mps", float(environ.get(E.AUTO_LEASE_WAIT_S) or 3600))


def runtime_env_hook(runtime_env: dict[str, Any] | None) -> dict[str, Any] | None:
    """``RAY_RUNTIME_ENV_HOOK``: Ray calls it from ``ray.init`` in a driver, with the job's runtime env. It
    installs :func:`install` for what :func:`lease_from_env` finds, and for a held lease asks Ray to do the same
    in every worker of the job (``worker_process_setup_hook``) so nested GPU work stays in the lease too.
    Returns the runtime env; never fails the driver's ``ray.init`` (a failure is logged)."""
    try:
        lease = lease_from_env()
        if lease is None:
            return runtime_env
        install(lease)
        out = dict(runtime_env or {})
        out.setdefault("worker_process_setup_hook", E.NATIVE_WORKER_SETUP)
        return out
    except Exception as e:  # noqa: BLE001 -- the user's driver must start whatever we could not do
        log.warning("orchestrator: could not steer this driver's GPU work into its lease: %s", e)
        return runtime_env


def worker_setup() -> None:
    """``worker_process_setup_hook`` of a job whose driver steers: the same in each of its workers (a worker
    started inside a lease finds that lease in its environment; Train's and Serve's controllers do not)."""
    if os.environ.get(E.SERVE_LEASES, "") == "1":
        serve_controller_setup()
        return
    lease = lease_from_env()
    if lease is None:
        return
    install(lease)
    if isinstance(lease, _Lease) and os.environ.get(E.SHARE_KIND) == "whole" and "," in os.environ.get(E.CUDA_VISIBLE_DEVICES, ""):
        _narrow_per_task(lease)


def serve_controller_setup() -> None:
    """``worker_process_setup_hook`` of the orchestrator's own drivers (``ray_api.connect``): a no-op in every
    worker but a Serve controller started with ``ORCHESTRATOR_SERVE_LEASES=1`` in its environment (the inference
    service starts it so), where Serve's replicas then ask the head named there for leases
    (:mod:`orchestrator.rayport.serve_leases`). Never in the head's or the agents' processes: their GPU
    placement groups are the holds themselves."""
    if os.environ.get(E.SERVE_LEASES, "") != "1":
        return
    install(_auto_leases(os.environ))


def _narrow_per_task(lease: _Lease) -> None:
    """In a worker inside a multi-card lease: each task or actor sees only the card(s) Ray gave it, as plain Ray
    does. Ray maps its instance ids through the ids the process started with; the holds make instance ``i`` card
    ``i`` (control/holds.py), so the node's UUIDs by index (the hand-out's ``ORCHESTRATOR_NODE_GPU_UUIDS``) are
    that list, and Ray may set ``CUDA_VISIBLE_DEVICES`` per task again (the lease's environment told it not to,
    for its holder). No Ray call here: Ray runs this hook before the worker may submit anything."""
    uuids = [u for u in os.environ.get(E.NODE_GPU_UUIDS, "").split(",") if u]
    if not uuids:
        return
    ray._private.worker.global_worker.original_visible_accelerator_ids["GPU"] = uuids
    os.environ.pop(E.RAY_NOSET_CUDA_VISIBLE_DEVICES, None)
