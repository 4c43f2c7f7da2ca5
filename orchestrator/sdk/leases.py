"""Leases from inside any Ray driver: ``with orchestrator.lease(GpuRequest.mig("1g.10gb")) as l:``.

:func:`lease` blocks until the head grants the devices and yields a
:class:`LeaseHandle`; ``l.actor_options()`` starts an actor on exactly those
devices; leaving the block releases them. It works in a notebook, a script
started with plain ``ray job submit``, or a job the head started.

**Who may touch it.** The requester makes a random key and sends only its
digest with the request; ``wait_lease`` and ``get_lease`` with the key return
the fencing token, which release, activate and acknowledge need. Any other
driver (``orchestrator leases --json``, ``status``) sees the token redacted.

**Preemptible actors.** ``l.actor_options()`` names the actor
``rgo-lease-<lease id>`` and tells the head (``activate(..., workload=)``),
so the node's agent can reach it. The protocol an actor holding a lease may
implement:

* ``checkpoint(directory) -> path``: write everything needed to resume under
  ``directory`` and return the path. The agent calls it when the lease is
  preempted; once the path comes back (or the class's grace period ends) the
  agent kills the actor with ``ray.kill`` and only then are its devices
  handed on. An actor without the method is simply killed at the deadline.
* ``lease(..., requeue=True, checkpoint_dir=...)``: a preempted lease is
  queued again; :meth:`LeaseHandle.wait_resumed` blocks until it is granted
  and returns the new handle, whose ``resume_from`` is the checkpoint path:
  start the actor again from it (its ``__init__`` can take the path).

**Fate sharing.** A lease is activated with the calling driver's holder, a
small actor owned by the driver and shared by all its leases
(:meth:`orchestrator.sdk.connect.Connection.holder_id`); when the driver dies
without leaving the block, Ray kills that actor and the head's dead-holder
check frees the devices.

**One call to get the devices.** :func:`lease` asks with
``HeadApi.acquire_lease_now``: the head queues the request, grants it at once
when nothing else waits and it fits, and activates it with the driver's holder
before answering. Only a request that must wait is waited on
(``HeadApi.wait_lease``: the head answers when the cycle that grants it has run;
no polling on either side) and then activated. A lease's life is that call and
the release; both are quick calls, which go over the head's channel and are
carried out together with whatever reached the head meanwhile (:mod:`orchestrator.rayport.channel`).

Why one module over 500 lines: a gang is leases of this kind (one :class:`LeaseHandle` per worker, the same
key, withdraw and release path), and :func:`lease` is defined here by contract (``orchestrator.lease``'s
module); a separate gang module would import the handle from here while this one re-exported
:func:`gang_lease` back -- an import circle (``tests/unit/test_import_cycles.py`` counts lazy imports too).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

from orchestrator.core import env as E
from orchestrator.core.api import HeadApi
from orchestrator.core.errors import InvalidRequestError, LeaseTimeoutError, OrchestratorError
from orchestrator.core.ids import gang_worker_id
from orchestrator.core.lease import key_digest
from orchestrator.core.request import GpuRequest
from orchestrator.core.gang_request import GangMember, GangRequest
from orchestrator.sdk.connect import Connection, open_connection
from orchestrator.sdk.context import Poll
from orchestrator.sdk.inputs import as_request, new_lease_id

__all__ = ["GangHandle", "LeaseHandle", "gang_lease", "lease", "worker_env"]

_LIVE_LEASE = {"pending", "granted", "active", "checkpointing"}


class LeaseHandle:
    """A granted lease, inside a ``with orchestrator.lease(...)`` block.

    ``env`` is what the devices need in a process's environment
    (``CUDA_VISIBLE_DEVICES`` = GPU or MIG UUIDs, ``CUDA_MPS_*``...);
    :meth:`actor_options` gives Ray actor options that start one holder on
    exactly these devices, on the lease's node. One actor per lease: its
    ``num_gpus`` is the lease's share, so a second one would count twice in
    Ray's accounting.
    """

    def __init__(self, head: HeadApi, info: dict[str, Any], *, poll_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, key: str | None = None, namespace: str = "rgo") -> None:
        self.head = head
        self.info = info
        self._key = key
        self.namespace = namespace
        self.released = False
        self._poll = Poll(self._checkpoint_asked, poll_s, what=f"lease {self.lease_id}", clock=clock)

    def __repr__(self) -> str:
        return f"LeaseHandle({self.lease_id!r}, state={self.info.get('state')!r}, node={self.node!r})"

    @property
    def lease_id(self) -> str:
        return self.info["lease_id"]

    @property
    def fencing_token(self) -> int:
        return int(self.info["fencing_token"])

    @property
    def handout(self) -> dict[str, Any]:
        return self.info["handout"]

    @property
    def node(self) -> str | None:
        return (self.info.get("allocation") or {}).get("node")

    @property
    def allocation(self) -> dict[str, Any]:
        return dict(self.info.get("allocation") or {})

    @property
    def env(self) -> dict[str, str]:
        return dict(self.handout["env_vars"])

    @property
    def cuda_visible_devices(self) -> str:
        return self.handout["env_vars"].get("CUDA_VISIBLE_DEVICES", "")

    @property
    def resume_from(self) -> str | None:
        """The checkpoint this attempt starts from (a requeued lease), else None."""
        return self.info.get("resume_from")

    @property
    def actor_name(self) -> str:
        """The name :meth:`actor_options` gives the holder actor: how the node's agent reaches it."""
        return f"rgo-lease-{self.lease_id}"

    def actor_options(self, *, extra_env: Mapping[str, str] | None = None, **options: Any) -> dict[str, Any]:
        """Ray actor options for one holder of this lease; ``options`` (``num_cpus``...) are added.

        The actor is named :attr:`actor_name` in the head's namespace and registered as the lease's
        workload, so it can be asked to checkpoint and is stopped when the lease is revoked."""
        from orchestrator.rayport import ray_api  # Ray only when actors are started (see sdk.connect)

        out = ray_api.actor_options(self.handout, extra_env=extra_env)
        out.update(name=self.actor_name, namespace=self.namespace)
        out.update(options)
        self.head.activate(self.lease_id, self.fencing_token, None, f"actor:{out['namespace']}/{out['name']}",
                           self._key)
        return out

    def wait_resumed(self, timeout: float = 300.0) -> "LeaseHandle":
        """After a preemption of a lease asked with ``requeue=True``: block until its next attempt is
        granted and return that attempt's handle (``resume_from`` = the checkpoint)."""
        info = self.head.wait_lease(self.lease_id, timeout, self._key)
        if info.get("state") not in ("granted", "active") or info["lease_id"] == self.lease_id:
            raise OrchestratorError(f"lease {self.lease_id} was not requeued: {info.get('state')}")
        info = {**info, **self.head.activate(info["lease_id"], int(info["fencing_token"]), None, None, self._key)}
        return LeaseHandle(self.head, info, poll_s=self._poll.interval_s, key=self._key, namespace=self.namespace)

    def refresh(self) -> dict[str, Any]:
        token = self.info.get("fencing_token")
        self.info = self.head.get_lease(self.lease_id, self._key)
        if self.info.get("fencing_token") is None and token is not None:
            self.info["fencing_token"] = token  # ours, whatever the view shows
        return self.info

    def preemption_requested(self) -> bool:
        """True once the head wants these devices back (the lease is checkpointing, or ended). Rate-limited."""
        return self._poll.ask()

    def _checkpoint_asked(self) -> bool:
        return self.refresh()["state"] not in ("granted", "active")

    def release(self, reason: str = "released by its holder") -> dict[str, Any]:
        """Give the devices back (idempotent). Leaving the ``with`` block does this."""
        d = self.head.release(self.lease_id, self.fencing_token, reason, self._key)
        self.info, self.released = d, True
        return d


@contextmanager
def lease(request: GpuRequest | str | int | Mapping[str, Any], *, priority: str | None = None,
          queue: str = "default", timeout: float = 300.0, owner: str | None = None, lease_id: str | None = None,
          address: str | None = None, namespace: str | None = None, head_name: str | None = None,
          state_dir: str | os.PathLike[str] | None = None, head: HeadApi | None = None,
          fate_share: bool = True, poll_s: float = 1.0, requeue: bool = False,
          checkpoint_dir: str | None = None) -> Iterator[LeaseHandle]:
    """Block until the head grants ``request``; yield the :class:`LeaseHandle`; release it when the block ends.

    ``priority`` is a priority class (``inference``, ``training``, ``batch`` or
    one from the config; None = the config's default). Raises
    ``InvalidRequestError`` (naming the field) for a request that can never be
    granted, ``LeaseTimeoutError`` (with the scheduler's reason) when it is not
    granted within ``timeout`` -- the pending request is withdrawn then.
    ``requeue=True`` queues a preempted lease again to resume from its checkpoint (written under
    ``checkpoint_dir``); see "Preemptible actors" in the module docstring.
    """
    req = as_request(request)  # local refusals before any call
    conn: Connection | None = None
    if head is None:
        conn = open_connection(address, namespace=namespace, head_name=head_name, state_dir=state_dir)
        head = conn.head
    lid = lease_id or new_lease_id()
    key = secrets.token_hex(16)  # stays here: the head keeps only its digest
    handle: LeaseHandle | None = None
    requested = failed = False
    why = "holder left the lease block"
    try:
        holder_id = conn.holder_id() if fate_share and conn is not None else None
        requested = True  # from here a request may be queued: the block's end withdraws it
        info = head.acquire_lease_now({"lease_id": lid, "request": req.model_dump(mode="json"),
                                       "owner": owner or _default_owner(), "priority_class": priority or "",
                                       "queue": queue, "requeue_on_loss": False, "requester_digest": key_digest(key),
                                       "requeue_on_preempt": requeue, "checkpoint_dir": checkpoint_dir},
                                      key, holder_id)
        if info.get("state") == "pending":  # it must wait: LeaseTimeoutError after `timeout` (withdrawn below)
            info = head.wait_lease(lid, timeout, key)
        if info.get("state") not in ("granted", "active") or not info.get("handout"):
            last = (info.get("history") or [{}])[-1].get("reason", "")
            raise OrchestratorError(f"lease {lid} ended before it was handed out: {info.get('state')} ({last})")
        if info.get("state") == "granted":  # waited for, or no holder to activate it with (fate_share=False)
            info = {**info, **head.activate(lid, int(info["fencing_token"]), holder_id, None, key)}
        handle = LeaseHandle(head, info, poll_s=poll_s, key=key,
                             namespace=conn.target.namespace if conn is not None else (namespace or "rgo"))
        yield handle
    except LeaseTimeoutError:
        why, failed = f"not granted within {timeout:g}s; withdrawn by its requester", True
        raise
    except BaseException as e:
        why, failed = f"holder left the lease block with {type(e).__name__}", True
        raise
    finally:
        try:
            if handle is not None:
                if not handle.released:
                    handle.release(why)
            elif requested:
                _withdraw(head, lid, why, key)
        except OrchestratorError:
            if not failed:
                raise  # otherwise the error that ended the block matters more
        finally:
            if conn is not None:
                conn.close()


def _withdraw(head: HeadApi, lease_id: str, reason: str, key: str) -> None:
    """Release a lease in whatever live state it is (pending needs no token); ended ones are left alone."""
    d = head.get_lease(lease_id, key)
    if d["state"] in _LIVE_LEASE:
        head.release(lease_id, d.get("fencing_token") if d["state"] != "pending" else None, reason, key)


def _default_owner() -> str:
    job = os.environ.get(E.JOB_ID)
    if job:
        return f"job:{job}"
    return f"driver:{socket.gethostname()}:{os.getpid()}"


# ---- gangs ---------------------------------------------------------------------------------------
class GangHandle:
    """A granted gang, inside a ``with orchestrator.gang_lease(...)`` block: one :class:`LeaseHandle` per
    worker (``members``, in worker order) and the gang's Ray placement group (``placement_group``), one
    bundle per worker, pinned to that worker's node and cards.

    **Ray Train.** Ray Train (2.60, v2) builds its own placement group from identical bundles and takes no
    external one, so :meth:`scaling_config` pins Train's worker ``i`` to worker ``i``'s node with a label
    selector while this gang's placement group keeps the cards in Ray's books; each Train worker binds to
    its own lease's devices with :func:`worker_env` (by node and local rank) before it touches CUDA.
    See ``docs/gang.md``.

    **Preemption.** When the head takes the gang (every worker at once), :meth:`preemption_requested`
    turns true; the requester stops its run with a checkpoint and calls :meth:`ack_preempted` with its
    path, which hands every worker's cards on; with ``requeue=True`` the gang is queued again and
    :meth:`wait_resumed` returns the next attempt's handle (``resume_from`` = that path), possibly on
    other nodes.
    """

    def __init__(self, gang_id: str, members: list[LeaseHandle], pg: Any) -> None:
        self.gang_id = gang_id
        self.members = members
        self.placement_group = pg

    def __repr__(self) -> str:
        return f"GangHandle({self.gang_id!r}, workers={len(self.members)}, nodes={self.nodes!r})"

    @property
    def lease_ids(self) -> list[str]:
        return [m.lease_id for m in self.members]

    @property
    def nodes(self) -> list[str | None]:
        """Each worker's node, in worker order."""
        return [m.node for m in self.members]

    @property
    def handouts(self) -> list[dict[str, Any]]:
        """Each worker's hand-out (node id, card resources, env), in worker order."""
        return [m.handout for m in self.members]

    @property
    def resume_from(self) -> str | None:
        return self.members[0].resume_from

    def scaling_config(self, *, cpus_per_worker: float = 1.0) -> dict[str, Any]:
        """Keyword arguments of Ray Train's ``ScalingConfig`` for this gang: one Train worker per gang worker,
        each on its worker's node (``label_selector``), no Ray ``GPU`` (the cards are ours; see the class
        docstring)."""
        return train_scaling(self.handouts, cpus_per_worker=cpus_per_worker)

    def actor_options(self, index: int, **options: Any) -> dict[str, Any]:
        """Ray actor options that run worker ``index`` inside its bundle with its devices' environment."""
        from orchestrator.rayport import ray_api

        out = ray_api.bundle_actor_options(self.placement_group, index, self.handouts[index])
        out.update(options)
        return out

    def preemption_requested(self) -> bool:
        """True once the head wants the gang's cards back (any worker's lease checkpointing or ended)."""
        return any(m.preemption_requested() for m in self.members)

    def ack_preempted(self, checkpoint_path: str | None) -> None:
        """The run stopped with ``checkpoint_path`` (None: without one): every worker's lease ends preempted,
        the placement group goes, and the cards are handed on."""
        self._drop_pg()
        for m in self.members:
            state = m.refresh()["state"]
            if state == "checkpointing":
                m.info = m.head.ack_preemption(m.lease_id, m.fencing_token, checkpoint_path, m._key)
            elif state in ("granted", "active"):
                m.release("its gang was preempted")
            m.released = True

    def wait_resumed(self, timeout: float = 300.0) -> "GangHandle":
        """After :meth:`ack_preempted` of a gang asked with ``requeue=True``: block until every worker's next
        attempt is granted; returns the new gang's handle, its placement group created."""
        deadline = time.monotonic() + timeout
        members = [m.wait_resumed(max(1.0, deadline - time.monotonic())) for m in self.members]
        return GangHandle(self.gang_id, members, _gang_pg(self.gang_id, members, deadline))

    def release(self, reason: str = "released by its holder") -> None:
        self._drop_pg()
        for m in self.members:
            if not m.released:
                m.release(reason)

    def _drop_pg(self) -> None:
        if self.placement_group is not None:
            from orchestrator.rayport import ray_api

            ray_api.remove_gang_placement_group(self.placement_group)
            self.placement_group = None


def train_scaling(handouts: list[dict[str, Any]], *, cpus_per_worker: float = 1.0,
                  use_gpu: bool = False) -> dict[str, Any]:
    """Ray Train's ``ScalingConfig`` keyword arguments for a gang with these hand-outs (worker order): one Train
    worker per gang worker, on its worker's node. With ``use_gpu`` each asks Ray for its lease's share of
    ``GPU`` (a gang job's driver and workers put Train's placement group on the gang's leases:
    ``rayport/native.py``); without, it asks for none (the gang's placement group holds the cards). Either
    way each Train worker binds to its own lease's devices with :func:`worker_env`."""
    from orchestrator.control.handout import gang_bundle_pin

    per_worker: dict[str, float] = {"CPU": cpus_per_worker}
    if use_gpu:
        per_worker["GPU"] = max(float(h.get("num_gpus") or 0) for h in handouts)
    return {"num_workers": len(handouts), "use_gpu": use_gpu, "resources_per_worker": per_worker,
            "label_selector": [gang_bundle_pin(h) for h in handouts]}


class JobGang:
    """Inside the driver of a gang *job* (``orchestrator submit --gpu 2x2 -- python jobs/train_gang.py``): the
    gang the head granted it, from ``ORCHESTRATOR_GANG`` (every worker's hand-out, in worker order).

    The head submits the driver on worker 0's node holding no card; :meth:`hold` creates the gang's placement
    group (each bundle pinned to its worker's node and cards, as :class:`GangHandle` does), so Ray keeps the
    cards for the gang's workers and nothing else; :meth:`drop` removes it (the driver's exit does too: the
    group is not detached). Preemption goes through the job's context
    (:meth:`~orchestrator.sdk.context.JobContext.preemption_requested`, ``acknowledge_checkpoint``), which
    ends every worker's lease at once.
    """

    def __init__(self, gang_id: str, handouts: list[dict[str, Any]]) -> None:
        self.gang_id = gang_id
        self.handouts = handouts
        self.placement_group: Any = None

    def __repr__(self) -> str:
        return f"JobGang({self.gang_id!r}, workers={len(self.handouts)}, nodes={self.nodes!r})"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "JobGang | None":
        """The running job's gang, or None when this process is not a gang job's driver."""
        env = os.environ if environ is None else environ
        raw = env.get(E.GANG)
        if not raw:
            return None
        import json

        try:
            handouts = json.loads(raw)
        except ValueError:
            raise OrchestratorError(f"{E.GANG} is not JSON: {raw[:80]!r}") from None
        if not isinstance(handouts, list) or not all(isinstance(h, dict) and "node_id" in h for h in handouts):
            raise OrchestratorError(f"{E.GANG} must list one hand-out (with node_id) per worker")
        return cls(env.get(E.LEASE_ID, "gang").removesuffix("-w0"), handouts)

    @property
    def nodes(self) -> list[str]:
        return [h.get("node_name", h["node_id"]) for h in self.handouts]

    def scaling_config(self, *, cpus_per_worker: float = 1.0) -> dict[str, Any]:
        """See :func:`train_scaling`: ``use_gpu=True`` where the gang's nodes advertise Ray's ``GPU`` (Train's
        worker group then takes the gang's leases, docs/ray-native.md)."""
        from orchestrator.rayport.native import advertises_gpus

        return train_scaling(self.handouts, cpus_per_worker=cpus_per_worker,
                             use_gpu=all(advertises_gpus(h["node_id"]) for h in self.handouts))

    def hold(self, timeout: float = 120.0) -> Any:
        """Create the gang's placement group (idempotent) and return it."""
        if self.placement_group is None:
            from orchestrator.rayport import ray_api

            self.placement_group = ray_api.gang_placement_group(self.handouts, f"rgo-gang-{self.gang_id}", timeout)
        return self.placement_group

    def drop(self) -> None:
        if self.placement_group is not None:
            from orchestrator.rayport import ray_api

            ray_api.remove_gang_placement_group(self.placement_group)
            self.placement_group = None

    def __enter__(self) -> "JobGang":
        self.hold()
        return self

    def __exit__(self, *exc: object) -> None:
        self.drop()


def _gang_pg(gang_id: str, members: list[LeaseHandle], deadline: float) -> Any:
    from orchestrator.rayport import ray_api

    name = f"rgo-gang-{gang_id}-{members[0].lease_id}"
    return ray_api.gang_placement_group([m.handout for m in members], name, max(1.0, deadline - time.monotonic()))


def worker_env(handouts: list[Mapping[str, Any]], node_id: str, local_rank: int) -> dict[str, str]:
    """Inside a gang's worker (a Ray Train worker): the device environment of its own lease, found by its
    node and its rank among the gang's workers on that node. Set it before anything touches CUDA."""
    from orchestrator.control.handout import gang_worker_env

    return gang_worker_env(handouts, node_id, local_rank)


@contextmanager
def gang_lease(gang: GangRequest | str, *, priority: str | None = None, queue: str = "default",
               timeout: float = 300.0, owner: str | None = None, gang_id: str | None = None,
               address: str | None = None, namespace: str | None = None, head_name: str | None = None,
               head: HeadApi | None = None, fate_share: bool = True, poll_s: float = 1.0,
               requeue: bool = False, checkpoint_dir: str | None = None) -> Iterator[GangHandle]:
    """Block until the head grants every worker of ``gang`` (``"2x4"`` or a :class:`GangRequest`); yield the
    :class:`GangHandle` with its placement group; release everything when the block ends.

    One lease per worker (``<gang id>-w<i>``) is queued; the head grants all of them in one cycle or none.
    ``LeaseTimeoutError`` when the gang is not granted within ``timeout`` (every pending worker is withdrawn).
    """
    spec = gang if isinstance(gang, GangRequest) else GangRequest.parse(gang)
    if spec.elastic:
        raise InvalidRequestError("gang.min_workers", spec.min_workers, "unset: a gang lease is fixed",
                                  detail="an elastic gang resizes through new attempts: submit it as a job")
    conn: Connection | None = None
    if head is None:
        conn = open_connection(address, namespace=namespace, head_name=head_name)
        head = conn.head
    gid = gang_id or new_lease_id().replace("lease-", "gang-")
    key = secrets.token_hex(16)
    ids = [gang_worker_id(gid, i) for i in range(spec.workers)]
    members: list[LeaseHandle] = []
    handle: GangHandle | None = None
    why, failed = "holder left the gang block", False
    deadline = time.monotonic() + timeout
    try:
        for i, lid in enumerate(ids):
            head.request_lease({"lease_id": lid, "request": spec.worker.model_dump(mode="json"),
                                "owner": owner or _default_owner(), "priority_class": priority or "", "queue": queue,
                                "requeue_on_loss": False, "requester_digest": key_digest(key),
                                "requeue_on_preempt": requeue, "checkpoint_dir": checkpoint_dir,
                                "gang": GangMember.of(spec, gid, i).model_dump(mode="json")})
        infos = [head.wait_lease(lid, max(0.1, deadline - time.monotonic()), key) for lid in ids]
        bad = [d for d in infos if d.get("state") not in ("granted", "active") or not d.get("handout")]
        if bad:
            raise OrchestratorError(f"gang {gid}: worker lease {bad[0]['lease_id']} ended before it was handed out: "
                                    f"{bad[0].get('state')}")
        holder_id = conn.holder_id() if fate_share and conn is not None else None
        ns = conn.target.namespace if conn is not None else (namespace or "rgo")
        for d in infos:
            d = {**d, **head.activate(d["lease_id"], int(d["fencing_token"]), holder_id, None, key)}
            members.append(LeaseHandle(head, d, poll_s=poll_s, key=key, namespace=ns))
        handle = GangHandle(gid, members, None)
        handle.placement_group = _gang_pg(gid, members, deadline)
        yield handle
    except LeaseTimeoutError:
        why, failed = f"gang not granted within {timeout:g}s; withdrawn by its requester", True
        raise
    except BaseException as e:
        why, failed = f"holder left the gang block with {type(e).__name__}", True
        raise
    finally:
        try:
            if handle is not None:
                handle.release(why)
            else:
                for m in members:
                    m.release(why)
                for lid in ids[len(members):]:
                    _withdraw(head, lid, why, key)
        except OrchestratorError:
            if not failed:
                raise
        finally:
            if conn is not None:
                conn.close()
