"""Ray's own GPU API inside a lease: the holder's side of ``control/holds.py``.

A lease on a node that advertises Ray's ``GPU`` is a placement group the node's agent made
(``rgo-lease/<node>/<lease id>``, one bundle ``{"GPU": share, "CPU": cpus}``). This module

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
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from typing import Any, Mapping

import ray

from orchestrator.rayport.lease_groups import DEFAULT_NAMESPACE, advertises_any_gpus, advertises_gpus, lease_group
from orchestrator.core import env as E
from orchestrator.core.config import RAY_NODE_ID_LABEL
from orchestrator.core.errors import InvalidRequestError

log = logging.getLogger(__name__)

class LeaseCapacityError(InvalidRequestError):
    """A task or actor inside a lease asked for more GPU than the lease holds."""


# ---- a driver (or a job's worker) that holds a lease --------------------------------------------
class _Lease:
    """The lease this process holds, read from its environment; its group looked up on first use."""

    def __init__(self, lease_id: str, node_name: str, namespace: str | None, token: int | None = None,
                 ray_node_id: str | None = None) -> None:
        self.lease_id, self.node_name, self.namespace, self.token = lease_id, node_name, namespace, token
        self._node_id = ray_node_id  # None: this process's node (a lease's holder runs on its node)
        self._group: Any = None
        self._bundle: dict[str, float] | None = None

    def group(self) -> tuple[Any, dict[str, float]] | None:
        """The group and its bundle; None where the node advertises no Ray ``GPU`` (no groups there)."""
        if self._group is None:
            if not advertises_gpus(self.ray_node_id):
                return None
            self._group = lease_group(self.node_name, self.lease_id, self.namespace)
            self._bundle = {k: float(v) for k, v in self._group.bundle_specs[0].items()}
        assert self._bundle is not None
        return self._group, self._bundle

    @property
    def ray_node_id(self) -> str:
        return self._node_id or ray.get_runtime_context().get_node_id()

    def forget_group(self) -> None:
        """The group changed (lent to a placement group made here, or given back): look it up again."""
        self._group = None

    def agent(self) -> Any:
        from orchestrator.rayport import ray_api

        return ray.get_actor(ray_api.agent_name(self.node_name), namespace=self.namespace or DEFAULT_NAMESPACE)


def _gpus_asked(options: Mapping[str, Any]) -> float:
    return float(options.get("num_gpus") or 0.0)


def steer(lease: _Lease, options: dict[str, Any], what: str) -> dict[str, Any]:
    """``options`` of a task or actor about to be submitted, put inside ``lease``'s group when it asks for GPUs
    and names no placement of its own. Raises :class:`LeaseCapacityError` when it asks for more than the lease
    holds. Pure but for the group's lookup."""
    asked = _gpus_asked(options)
    if not _steerable(options):
        return options
    found = lease.group()
    if found is None:
        return options
    pg, bundle = found
    holds = bundle.get("GPU", 0.0)
    if asked > holds + 1e-9:
        raise LeaseCapacityError(
            "num_gpus", asked, f"at most {holds:g}",
            detail=f"{what} asks for {asked:g} GPU but lease {lease.lease_id} on {lease.node_name} holds {holds:g}; "
                   f"ask for a bigger lease (orchestrator submit --gpu N) or fewer GPUs")
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    out = dict(options)
    out["scheduling_strategy"] = PlacementGroupSchedulingStrategy(pg, 0, placement_group_capture_child_tasks=True)
    if "CPU" not in bundle and options.get("num_cpus") is None:
        out["num_cpus"] = 0  # the lease holds no CPUs: Ray's default of 1 could not fit in its group
    return out


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

    def release_when_gone(self, ticket: Ticket, reason: str, timeout_s: float = 120.0) -> None:
        """Release ``ticket``'s lease once the actor holding it is dead (a thread; the head would otherwise see
        the holder gone at its next check and call the lease lost): a card goes on only after its process."""
        from orchestrator.rayport import ray_api

        def watch() -> None:
            deadline = time.monotonic() + timeout_s
            while ticket.holder and time.monotonic() < deadline:
                if not ray_api.actors_alive([ticket.holder]).get(ticket.holder, True):
                    break
                time.sleep(0.1)
            else:
                return  # still alive: it holds the lease as long as it lives
            _quietly(self.head.release, ticket.lease_id, ticket.token, reason, ticket.key)

        threading.Thread(target=watch, daemon=True, name=f"rgo-release-{ticket.lease_id}").start()

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


class _GangLeases:
    """The driver of a gang job (``orchestrator submit --gpu 2x1``) and its job's workers (Ray Train's controller):
    a placement group with one GPU bundle per gang worker, in worker order, takes every worker's lease (each
    node's agent lends it and adopts the group; bundle ``i`` is pinned to worker ``i``'s node). So
    ``ScalingConfig(num_workers=N, use_gpu=True)`` runs each Train worker on its own lease."""

    def __init__(self, handouts: list[dict[str, Any]], namespace: str | None) -> None:
        self.handouts, self.namespace = handouts, namespace

    def members(self) -> list[_Lease]:
        out = []
        for h in self.handouts:
            env = h.get("env_vars") or {}
            token = str(env.get(E.FENCING_TOKEN, ""))
            out.append(_Lease(env[E.LEASE_ID], h["node_name"], self.namespace,
                              int(token) if token.isdigit() else None, h["node_id"]))
        return out

    def group_for(self, original: Any, bundles: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        members = self.members()
        if not members or not advertises_gpus(members[0].ray_node_id):
            return original(bundles, *args, **kwargs)
        gpus = _gpus_in(bundles)
        if len(bundles) != len(members):
            raise LeaseCapacityError("placement_group.bundles", len(bundles), f"{len(members)}: one per gang worker",
                                     detail="a gang's placement group has one bundle per worker, in worker order")
        for i, (m, g, h) in enumerate(zip(members, gpus, self.handouts)):
            if g > float(h.get("num_gpus") or 0) + 1e-9:
                raise LeaseCapacityError(f"placement_group.bundles[{i}].GPU", g, f"at most {h.get('num_gpus')}",
                                         detail=f"gang worker {i}'s lease {m.lease_id} holds {h.get('num_gpus')}")
        lent: list[_Lease] = []
        try:
            for m in members:
                if not ray.get(m.agent().lend.remote(m.lease_id, int(m.token or 0)), timeout=30):
                    raise LeaseCapacityError("placement_group", "a second group", "one placement group per lease",
                                             detail=f"gang lease {m.lease_id} is already another group's")
                lent.append(m)
            sel = list(kwargs.get("bundle_label_selector") or [{} for _ in bundles])
            kwargs = {**kwargs, "bundle_label_selector": [
                {**(s or {}), RAY_NODE_ID_LABEL: m.ray_node_id} for s, m in zip(sel, members)]}
            group = original(bundles, *args, **kwargs)
        except Exception:
            for m in lent:
                _quietly(_give_back, m.agent(), m, int(m.token or 0))
            raise
        for m in members:
            ray.get(m.agent().adopt.remote(m.lease_id, int(m.token or 0), group.id.hex()), timeout=30)
        _ADOPTED[group.id.hex()] = ("gang", 0, lambda: [_give_back(m.agent(), m, int(m.token or 0)) for m in members])
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


def _quietly(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except Exception as e:  # the head will expire or reclaim it
        log.info("orchestrator: %s", e)


# ---- placement groups made by a leased process (Ray Train's workers, Tune's trials, Serve's replicas) ----
#: group id (hex) -> (lease, token, how to end it): the groups this process made on a lease's capacity
_ADOPTED: dict[str, tuple[str, int, Any]] = {}


def _gpus_in(bundles: Any) -> list[float]:
    return [float((b or {}).get("GPU", 0.0)) for b in bundles]


def _pinned(bundles: Any, selectors: Any, node_id: str) -> list[dict[str, str]]:
    sel = list(selectors or [{} for _ in bundles])
    return [{**(s or {}), RAY_NODE_ID_LABEL: node_id} for s in sel]


def make_group_in_lease(lease: "_Lease", original: Any, bundles: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    """A placement group the holder of ``lease`` makes for GPU work (Train's worker group): the lease's own group is
    removed by the node's agent, the holder's group is made pinned to the node (so it lands on exactly that
    capacity) and adopted by the agent: removed with the lease. Asking for more GPU than the lease holds fails
    with :class:`LeaseCapacityError`."""
    found = lease.group()
    if found is None:
        return original(bundles, *args, **kwargs)
    pg, bundle = found
    asked, holds = sum(_gpus_in(bundles)), bundle.get("GPU", 0.0)
    if asked > holds + 1e-9:
        raise LeaseCapacityError("placement_group.bundles", asked, f"at most {holds:g} GPU in all",
                                 detail=f"a placement group asks for {asked:g} GPU but lease {lease.lease_id} on "
                                        f"{lease.node_name} holds {holds:g}")
    node_id = lease.ray_node_id
    token = int(lease.token or 0)
    agent = lease.agent()
    if not ray.get(agent.lend.remote(lease.lease_id, token), timeout=30):
        raise LeaseCapacityError("placement_group", "a second group", "one placement group per lease",
                                 detail=f"lease {lease.lease_id}'s capacity is already another placement group's; "
                                        f"remove that one first, or make GPU work that needs several groups from a "
                                        f"driver without a lease (each group then gets a lease of its own)")
    lease.forget_group()
    kwargs = {**kwargs, "bundle_label_selector": _pinned(bundles, kwargs.get("bundle_label_selector"), node_id)}
    group = original(bundles, *args, **kwargs)
    ray.get(agent.adopt.remote(lease.lease_id, token, group.id.hex()), timeout=30)
    _ADOPTED[group.id.hex()] = (lease.lease_id, token, lambda: _give_back(agent, lease, token))
    return group


def _give_back(agent: Any, lease: "_Lease", token: int) -> None:
    lease.forget_group()
    ray.get(agent.give_back.remote(lease.lease_id, token), timeout=30)


def _wrap_groups(make: Any) -> None:
    """Route ``ray.util.placement_group`` (and its removal) through ``make(original, bundles, args, kwargs)``,
    in ``ray.util`` and in every Ray module that imported them by name already."""
    import sys

    mod = sys.modules["ray.util.placement_group"]
    original_make, original_remove = mod.placement_group, mod.remove_placement_group

    @functools.wraps(original_make)
    def placement_group(bundles: Any, *args: Any, **kwargs: Any) -> Any:
        if sum(_gpus_in(bundles)) <= 0:
            return original_make(bundles, *args, **kwargs)
        return make(original_make, bundles, args, kwargs)

    @functools.wraps(original_remove)
    def remove_placement_group(group: Any) -> None:
        original_remove(group)
        entry = _ADOPTED.pop(group.id.hex(), None)
        if entry is not None:
            _quietly(entry[2])

    for m in list(sys.modules.values()):
        name = getattr(m, "__name__", "") or ""
        if not (name == "ray" or name.startswith("ray.")):
            continue
        for attr, old, new in (("placement_group", original_make, placement_group),
                               ("remove_placement_group", original_remove, remove_placement_group)):
            if getattr(m, attr, None) is old:
                setattr(m, attr, new)


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


def _steerable(options: Mapping[str, Any]) -> bool:
    """A call that asks for GPUs and names no placement of its own: no strategy, a string one (``"DEFAULT"``,
    ``"SPREAD"``: where Ray likes, which Serve's replicas say), or a soft node affinity (Serve's compaction)."""
    if _gpus_asked(options) <= 0 or options.get("placement_group") not in (None, "default"):
        return False
    strategy = options.get("scheduling_strategy")
    return strategy is None or isinstance(strategy, str) or getattr(strategy, "soft", False) is True


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
