"""Per-call leases: a process that holds no lease gets one of its own for each GPU task, actor or placement group.

What ``ORCHESTRATOR_RAY_AUTO_LEASE=1`` turns on in a driver that holds no lease (``orchestrator up`` sets it on
every raylet, so a ``ray job submit`` or a plain ``python x.py`` driver gets it), and what Serve's controller uses
for its replicas (:mod:`orchestrator.rayport.serve_leases`, which asks without waiting and prepares the
:class:`Ticket` the replica's call then takes). :func:`orchestrator.rayport.native.install` routes the calls here.

Invariants:

* a lease's request is made in one place, :meth:`_AutoLeases.lease_request`: the request the call's (else this
  process's) environment names, else ``core.ray_request.request_for``'s mapping of what it asks Ray for;
* a :class:`Ticket` is taken by one call (``used``), or withdrawn, never both; one that is not granted in time,
  or whose group is never found, is given back before its error reaches the caller;
* every lease asked here has a holder that dies with its work: a task's lease is activated for this process's
  small :class:`_Holder` actor and released when the task ends, an actor's for the actor itself, a placement
  group's for the holder and released when the group is removed (:mod:`orchestrator.rayport.adopted_groups`);
  so all of them end when this process dies.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any, Mapping

import ray

from orchestrator.core import env as E
from orchestrator.core.errors import InvalidRequestError
from orchestrator.rayport.adopted_groups import _ADOPTED, _gpus_in, make_group_in_lease
from orchestrator.rayport.held_lease import LeaseCapacityError, _Lease, _gpus_asked, _quietly
from orchestrator.rayport.lease_groups import advertises_any_gpus, lease_group

log = logging.getLogger(__name__)


class Ticket:
    """One lease asked for without waiting (:meth:`_AutoLeases.ask`): a thread waits for its grant and finds its
    group, then sets :attr:`ready`. ``error`` is why it will not be granted; ``used`` once something holds it."""

    def __init__(self, lease_id: str, key: str, what: str) -> None:
        self.lease_id, self.key, self.what = lease_id, key, what
        self.ready = threading.Event()
        self.token: int | None = None
        self.handout: dict[str, Any] = {}
        self.pg: Any = None
        self.error: BaseException | None = None
        self.used = False
        self.holder: str | None = None  # the actor that activated it
        self.t0 = time.perf_counter()


class _AutoLeases:
    """A process that holds no lease: each task or actor it starts that asks for GPUs, and each placement group
    it makes with GPUs (Ray Train's worker group, a Tune trial, a Serve replica's), gets a lease of its own,
    asked of the head at the config's default priority (``ray_request.request_for`` maps the request; the
    call's ``runtime_env`` may name the request, priority class and queue: :func:`lease_request`), and runs
    inside that lease's group. The call blocks until the head grants it (the queue decides, as for any lease; a
    log line names the lease for ``orchestrator leases``) -- except in Serve's controller, which asks without
    waiting (:mod:`orchestrator.rayport.serve_leases`). A task's lease is released when the task ends, a
    placement group's when it is removed, an actor's when the actor dies; every one of them also when this
    process dies (they are activated by a small holder actor it owns, as ``orchestrator.lease`` does)."""

    def __init__(self, namespace: str, head_name: str, fractional: str, wait_s: float) -> None:
        self.namespace, self.head_name, self.fractional, self.wait_s = namespace, head_name, fractional, wait_s
        self._head: Any = None
        self._holder: tuple[str, Any, str] | None = None  # (job id, actor, actor id)
        self._n = 0
        self._prepared = threading.local()  # .ticket: a granted lease the next call on this thread takes
        self.timings: list[dict[str, float]] = []  # the last leases' legs: grant, then its group found (ms)

    @property
    def head(self) -> Any:
        if self._head is None:
            from orchestrator.rayport.client import HeadClient

            self._head = HeadClient(namespace=self.namespace, name=self.head_name)
        return self._head

    def holder_id(self) -> str:
        job = ray.get_runtime_context().get_job_id()
        if self._holder is None or self._holder[0] != job:
            actor = ray.remote(num_cpus=0, max_restarts=0)(_Holder).remote()
            ray.get(actor.__ray_ready__.remote(), timeout=120)
            self._holder = (job, actor, actor._actor_id.hex())
        return self._holder[2]

    def lease_request(self, gpus: float, options: Mapping[str, Any], lease_id: str) -> dict[str, Any]:
        """The lease request for a call asking Ray for ``gpus``: the request its env names (``ORCHESTRATOR_GPU_REQUEST``,
        the CLI's ``--gpu`` grammar) or ``request_for``'s mapping, and the priority class and queue its env names;
        the call's ``runtime_env`` env vars first, then this process's. Raises a typed error naming the field."""
        from orchestrator.core.ray_request import request_for
        from orchestrator.core.request import GpuRequest

        env = _lease_env(options)
        spec = env.get(E.GPU_REQUEST, "").strip()
        if spec.startswith("{"):  # a GpuRequest as JSON: what the --gpu grammar cannot say (a node, models)
            try:
                req = GpuRequest.model_validate_json(spec)
            except ValueError as e:
                raise InvalidRequestError(E.GPU_REQUEST, spec, "a request in the --gpu grammar or as JSON",
                                          detail=str(e).splitlines()[0]) from None
        elif spec:
            req = GpuRequest.parse(spec)
        else:
            req = request_for(gpus, accelerator_type=options.get("accelerator_type"),
                              memory_bytes=options.get("memory"), fractional=self.fractional)
        ctx = ray.get_runtime_context()
        out: dict[str, Any] = {"lease_id": lease_id, "request": req.model_dump(mode="json"),
                               "owner": f"ray-job:{ctx.get_job_id()}"}
        if env.get(E.PRIORITY_CLASS):
            out["priority_class"] = env[E.PRIORITY_CLASS]
        if env.get(E.QUEUE):
            out["queue"] = env[E.QUEUE]
        return out

    def next_lease_id(self) -> str:
        self._n += 1
        return f"ray-{ray.get_runtime_context().get_job_id()}-{os.getpid()}-{self._n}"

    def ask(self, lease_request: dict[str, Any], what: str, *, wait: bool) -> Ticket:
        """Ask the head for ``lease_request`` (``what`` names the caller in logs). ``wait``: return once it is
        granted and its group found (or raise); else at once, with a thread that does that and sets ``ready``."""
        import secrets

        from orchestrator.core.lease import key_digest

        key = secrets.token_hex(16)
        ticket = Ticket(lease_request["lease_id"], key, what)
        info = self.head.acquire_lease_now({**lease_request, "requester_digest": key_digest(key)}, key, None)
        if wait:
            self._settle(ticket, info)
            if ticket.error is not None:
                raise ticket.error
            return ticket
        threading.Thread(target=self._settle, args=(ticket, info), daemon=True,
                         name=f"rgo-lease-{ticket.lease_id}").start()
        return ticket

    def _settle(self, ticket: Ticket, info: dict[str, Any]) -> None:
        """Wait for ``ticket``'s grant and find its group; on failure withdraw it. Sets ``ready`` either way."""
        lid = ticket.lease_id
        try:
            if info.get("state") == "pending":
                log.warning("orchestrator: %s holds no lease: waiting for lease %s (orchestrator leases, explain)",
                            ticket.what, lid)
                try:
                    info = self.head.wait_lease(lid, self.wait_s, ticket.key)
                except Exception:
                    _quietly(self.head.release, lid, None, "withdrawn: not granted in time", ticket.key)
                    raise
            ticket.token, ticket.handout = int(info["fencing_token"]), info["handout"]
            t1 = time.perf_counter()
            try:
                ticket.pg = lease_group(ticket.handout["node_name"], lid, self.namespace)
            except Exception:
                _quietly(self.head.release, lid, ticket.token, "its placement group was not made", ticket.key)
                raise
            self.timings.append({"grant_ms": (t1 - ticket.t0) * 1000, "group_ms": (time.perf_counter() - t1) * 1000})
            del self.timings[:-256]
        except BaseException as e:  # noqa: BLE001 -- handed to whoever takes the ticket
            ticket.error = e
        finally:
            ticket.ready.set()

    @staticmethod
    def refused(lease_id: str, what: str, error: BaseException) -> Ticket:
        """A ticket never asked for (its request was refused before it reached the head): ready, with ``error``."""
        ticket = Ticket(lease_id, "", what)
        ticket.error, ticket.used = error, True
        ticket.ready.set()
        return ticket

    def withdraw(self, ticket: Ticket, reason: str) -> None:
        """Give back a ticket nothing took: withdrawn while pending, released once granted."""
        if not ticket.used:
            ticket.used = True
            _quietly(self.head.release, ticket.lease_id, ticket.token, reason, ticket.key)

    def release_when_gone(self, ticket: Ticket, reason: str) -> None:
        """Have ``ticket``'s lease released with ``reason`` once the actor holding it is dead: the head keeps the
        card the lease's until its holder probe sees the actor gone, then releases it (``release(when_gone=True)``)
        instead of calling it lost -- one call now, so no watcher of ours races the head's probe. A card goes on
        only after its process."""
        _quietly(self.head.release, ticket.lease_id, ticket.token, reason, ticket.key, True)  # when_gone

    @contextlib.contextmanager
    def prepared(self, ticket: Ticket) -> Any:
        """Within this block, the next lease this thread asks for is ``ticket`` (granted already)."""
        self._prepared.ticket = ticket
        try:
            yield
        finally:
            self._prepared.ticket = None

    def acquire(self, gpus: float, options: Mapping[str, Any], what: str) -> Ticket:
        """A granted lease for a call asking for ``gpus``: the prepared one, else one asked now (blocks)."""
        ticket = getattr(self._prepared, "ticket", None)
        if ticket is not None:
            self._prepared.ticket = None
            if ticket.error is not None:
                raise ticket.error
            return ticket
        return self.ask(self.lease_request(gpus, options, self.next_lease_id()), what, wait=True)

    def lease_for(self, options: dict[str, Any], what: str, *, actor: bool) -> tuple[dict[str, Any], Any]:
        """Options inside a new lease for this call, and what to do once it is submitted (``done(result)``)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        ticket = self.acquire(_gpus_asked(options), options, what)
        lid, token, handout, pg = ticket.lease_id, int(ticket.token or 0), ticket.handout, ticket.pg
        out = dict(options)
        out["scheduling_strategy"] = PlacementGroupSchedulingStrategy(pg, 0, placement_group_capture_child_tasks=True)
        out.pop("accelerator_type", None)  # the lease chose the card; its group has no such resource
        bundle = {k: float(v) for k, v in pg.bundle_specs[0].items()}
        if _lease_env(options).get(E.GPU_REQUEST):
            out["num_gpus"] = bundle.get("GPU", out.get("num_gpus"))  # the request named the share: take all of it
        if "CPU" not in bundle and options.get("num_cpus") is None:
            out["num_cpus"] = 0
        if handout["env_vars"].get(E.SHARE_KIND) != "whole":
            # a share's environment binds it (the MIG slice's UUID, MPS's limits); whole cards need none: Ray
            # hands each its card as for any GPU task (the raylet names the cards), so Ray may reuse a worker
            from ray._private.utils import get_runtime_env_info, parse_runtime_env_for_task_or_actor

            # Ray takes a task's runtime env serialized ahead (``.options()`` does it), an actor's parsed
            out["runtime_env"] = parse_runtime_env_for_task_or_actor(
                _with_env(out.get("runtime_env"), handout["env_vars"]))
            if not actor:
                out["serialized_runtime_env_info"] = get_runtime_env_info(out["runtime_env"], is_job_runtime_env=False,
                                                                          serialize=True)
        if actor and not out.get("name"):
            out["name"], out["namespace"] = f"rgo-lease-{lid}", self.namespace
        head, ns = self.head, out.get("namespace") or ray.get_runtime_context().namespace
        holder = None if actor else self.holder_id()

        def done(result: Any) -> None:
            ticket.used = True
            if actor:  # the actor holds it: dead actor, freed lease; revoked lease, stopped actor
                ticket.holder = result._actor_id.hex()
                head.activate(lid, token, ticket.holder, f"actor:{ns}/{out['name']}", ticket.key)
                return
            head.activate(lid, token, holder, None, ticket.key)
            ref = result[0] if isinstance(result, list) else result
            if isinstance(ref, ray.ObjectRef):
                ref.future().add_done_callback(lambda _f: _quietly(head.release, lid, token, "its task ended", ticket.key))

        return out, done

    def group_for(self, original: Any, bundles: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        """A placement group with GPUs: one lease for all its bundles (whole cards when every bundle asks for
        whole GPUs, on one node; one fractional share for a one-bundle group), lent to the group (the agent
        removes the lease's own group, the new one is pinned to the node and adopted)."""
        if not advertises_any_gpus():
            return original(bundles, *args, **kwargs)
        gpus = _gpus_in(bundles)
        total = sum(gpus)
        if len([g for g in gpus if g > 0]) > 1 and not all(float(g).is_integer() for g in gpus):
            raise LeaseCapacityError("placement_group.bundles", gpus, "whole GPUs per bundle, or one bundle",
                                     detail="a lease is whole cards on one node or one share of one card")
        ticket = self.acquire(total, {}, f"a placement group of {total:g} GPU")
        lid, token = ticket.lease_id, int(ticket.token or 0)
        lease = _Lease(lid, ticket.handout["node_name"], self.namespace, token, ticket.handout["node_id"])
        ticket.used = True
        self.head.activate(lid, token, self.holder_id(), None, ticket.key)
        try:
            group = make_group_in_lease(lease, original, bundles, args, kwargs)
        except Exception:
            _quietly(self.head.release, lid, token, "its placement group could not be made", ticket.key)
            raise
        head = self.head
        _ADOPTED[group.id.hex()] = (lid, token, lambda: head.release(lid, token, "its placement group was removed", ticket.key))
        return group


class _Holder:
    """A tiny actor owned by a process that leases for its calls: it dies with that process (fate sharing)."""


def _with_env(runtime_env: Any, env: Mapping[str, str]) -> Any:
    """``runtime_env`` (a dict, or Ray's ``RuntimeEnv``: Serve passes one) with ``env`` added to its env vars."""
    import copy

    out = copy.deepcopy(runtime_env) if runtime_env else {}
    out["env_vars"] = {**(out.get("env_vars") or {}), **env}
    return out


#: The env vars that shape a call's own lease (:meth:`_AutoLeases.lease_request`).
_LEASE_ENV = (E.GPU_REQUEST, E.PRIORITY_CLASS, E.QUEUE)


def _lease_env(options: Mapping[str, Any]) -> dict[str, str]:
    """The env vars of :data:`_LEASE_ENV` that shape a call's own lease: its ``runtime_env``'s (a dict or Ray's
    ``RuntimeEnv``), else this process's."""
    try:
        own = (options.get("runtime_env") or {}).get("env_vars") or {}
    except AttributeError:
        own = {}
    return {k: str(v) for k, v in {**os.environ, **own}.items() if k in _LEASE_ENV}
