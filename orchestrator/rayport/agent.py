"""The node agent's Ray actor: a loop around :class:`~orchestrator.control.agent.AgentCore`.

Created by :func:`orchestrator.rayport.actors.start_agent`, detached and
pinned to its node with ``NodeAffinitySchedulingStrategy(soft=False)``. It has
``max_restarts=0``: a dead agent is noticed by the head through the TTL, which
then starts a fresh one (a new incarnation). Every call to the head goes
through :class:`~orchestrator.rayport.client.HeadClient`'s wire envelope.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Collection

from orchestrator.control.agent import AgentCore, CheckpointPoll, LocalWorkloads, workload_holds_lease
from orchestrator.control.holds import lease_shape
from orchestrator.core.allocation import Allocation
from orchestrator.control.revocation import parse_workload
from orchestrator.control.discovery import HealthEvent, select_backend
from orchestrator.core import env
from orchestrator.core.config import RuntimeSettings, SimNode, Tuning
from orchestrator.core.credentials import matches
from orchestrator.core.errors import PermissionDeniedError
from orchestrator.rayport import ray_api
from orchestrator.rayport.holds import RayHolds
from orchestrator.rayport.wire import answer, unwrap

log = logging.getLogger(__name__)

#: Seconds between beats while a revocation is in flight (the Ray job API needs a moment to report a stop). The
#: default of ``settings.tuning.urgent_beat_s``, which the agent reads.
URGENT_BEAT_S = Tuning().urgent_beat_s


#: Ray job states after which nothing of the job runs.
_JOB_ENDED = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})


def process_alive(pid: int) -> bool:
    """A process on this node that exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)  # no /proc (not Linux): existence only
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


class RayWorkloads:
    """The agent's :class:`~orchestrator.control.agent.WorkloadPort` on a Ray cluster: ``ray.kill`` of a
    named actor, stop of a Ray job through the job API, SIGKILL of a process."""

    def __init__(self, lease_groups: Callable[[str], Collection[str]] = lambda _lid: (), *,
                 job_api_timeout_s: float = ray_api.JOB_API_TIMEOUT_S) -> None:
        self._local = LocalWorkloads()
        self._lease_groups = lease_groups  # lease id -> the placement groups it has had on this node
        self._job_api_timeout_s = job_api_timeout_s  # each request of the stops of Ray jobs (settings.tuning)
        self._jobs: ray_api.RayJobRunner | None = None
        self._actors: dict[str, Any] = {}  # workload -> the holder actor's handle (see watch)
        self._pids: dict[str, int | None] = {}  # workload being stopped (and found to hold its lease) -> its pid
        self._verified: set[str] = set()  # Ray jobs found to hold the lease they are being stopped for
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reach-holders")

    def stop(self, workload: str, lease_id: str = "") -> bool:
        """Stop what runs on lease ``lease_id`` (True once it is gone). Only a workload that holds the lease's
        devices as Ray records it (:func:`~orchestrator.control.agent.workload_holds_lease`) is stopped; any
        other is left alone and the revocation confirmed: nothing of the lease's runs there."""
        kind, ref = parse_workload(workload)
        if kind == "actor":
            namespace, name = ref.split("/", 1)
            if workload not in self._pids:  # before the kill: afterwards the GCS may not say any more
                rec = ray_api.named_actor_record(name, namespace)
                if rec is None:
                    return not ray_api.named_actor_alive(name, namespace)
                if not self._holds(name, namespace, lease_id, rec):
                    log.warning("actor %s does not hold lease %s (not in its group, not started with its hand-out): "
                                "not stopped", workload, lease_id)
                    return True
                self._pids[workload] = rec["pid"]
            ray_api.kill_named(name, namespace)
            if ray_api.named_actor_alive(name, namespace):
                return False
            # Ray marks the actor dead before its process has exited; a dying process still holds its
            # device (its CUDA context), so confirm only once the process is gone from this node too.
            pid = self._pids[workload]
            if pid is not None and process_alive(pid):
                return False
            self._pids.pop(workload, None)
            return True
        if kind == "job":
            self._jobs = self._jobs or ray_api.RayJobRunner(timeout_s=self._job_api_timeout_s)
            status = self._jobs.status(ref)
            if status is None or status in _JOB_ENDED:
                return True
            if ref not in self._verified:
                try:
                    env = (self._jobs.client.get_job_info(ref).runtime_env or {}).get("env_vars") or {}
                except Exception as e:  # the job API busy: asked again next beat
                    log.info("cannot read Ray job %s: %s", ref, e)
                    return False
                if not workload_holds_lease(lease_id, env_vars=env, placement_group=None, lease_groups=()):
                    log.warning("Ray job %s was not started with lease %s: not stopped", ref, lease_id)
                    return True
                self._verified.add(ref)
            self._jobs.stop(ref)
            return False  # confirmed once the job API says it ended
        return self._local.stop(workload, lease_id)

    def _holds(self, name: str, namespace: str, lease_id: str, rec: dict[str, Any] | None = None) -> bool:
        """Whether the named actor holds lease ``lease_id`` as Ray records it (``workload_holds_lease``)."""
        rec = rec if rec is not None else ray_api.named_actor_record(name, namespace)
        return rec is not None and workload_holds_lease(lease_id, env_vars=rec["env_vars"],
                                                        placement_group=rec["placement_group"],
                                                        lease_groups=self._lease_groups(lease_id))

    def watch(self, workload: str) -> None:
        """Look the holder actor up and send it a no-op, so a later checkpoint request goes over a channel
        that exists (the first call from a process to an actor can take seconds). On a thread of its own:
        looking up an actor that is still being created blocks, and the agent's loop must keep beating."""
        kind, ref = parse_workload(workload)
        if kind == "actor" and workload not in self._actors:
            self._pool.submit(self._reach, workload, *ref.split("/", 1))

    def _reach(self, workload: str, namespace: str, name: str, tries: int = 60) -> None:
        for _ in range(tries):  # registered with the head just before Ray creates it: a moment to appear
            try:
                handle = ray_api.get_actor(name, namespace)
                handle.__ray_ready__.remote()
                break
            except Exception as e:  # not there yet (or any more): asked for directly when needed
                log.debug("cannot reach %s yet: %s", workload, e)
                time.sleep(0.5)
        else:
            return
        self._actors[workload] = handle
        for old in list(self._actors)[:-1024]:
            del self._actors[old]

    def checkpoint(self, workload: str, directory: str, lease_id: str = "") -> CheckpointPoll:
        kind, ref = parse_workload(workload)
        if kind != "actor":
            return self._local.checkpoint(workload, directory, lease_id)
        namespace, name = ref.split("/", 1)
        if not self._holds(name, namespace, lease_id):  # a lease's holder must not get another's actor called
            log.warning("actor %s does not hold lease %s: not asked to checkpoint", workload, lease_id)
            return lambda: None
        handle = self._actors.get(workload) or ray_api.get_actor(name, namespace)
        pending = handle.checkpoint.remote(directory)

        def poll() -> str | None:
            done, path = ray_api.poll_ref(pending)
            return str(path) if done and path else None

        return poll


class AgentActor:
    """The Ray actor around :class:`AgentCore` (async: its loop and its methods share one event loop)."""

    def __init__(self, node_name: str, ray_node_id: str, settings: dict[str, Any], sim_node: dict[str, Any] | None,
                 agent_key: str) -> None:
        self.settings = RuntimeSettings.model_validate(settings)
        self._caller = {"agent": agent_key, "node": node_name}  # what the head made for this agent: never shown
        sim = SimNode.model_validate(sim_node) if sim_node else None
        backend = select_backend(self.settings.discovery, node_name, sim)
        self._groups_seen: dict[str, set[str]] = {}  # lease id -> every placement group it had here (bounded)
        tuning = self.settings.tuning
        self.core = AgentCore(node_name, ray_node_id, backend, self.settings,
                              k8s_node=os.environ.get(env.K8S_NODE_NAME) or None,
                              workloads=RayWorkloads(lambda lid: self._groups_seen.get(lid, ()),
                                                     job_api_timeout_s=tuning.job_api_timeout_s))
        self.holds = RayHolds(node_name, ray_node_id, place_timeout_s=tuning.hold_place_timeout_s,
                              return_wait_s=tuning.hold_return_wait_s, lend_timeout_s=tuning.lend_timeout_s)
        self.heartbeats = 0
        self._wake = asyncio.Event()
        self._task = asyncio.get_event_loop().create_task(self._run())

    async def _run(self) -> None:
        head = None
        registered = False
        while True:
            try:
                if head is None:
                    head = ray_api.get_head(self.settings.namespace, self.settings.head_name)
                if not registered:
                    ack = await head.register_agent.remote(**self.core.registration(), _caller=self._caller)
                    ack = unwrap(ack)
                    self.core.apply_assignments(ack["assignments"], ack.get("revocations"))
                    await self._hold(ack["assignments"])
                    registered = True
                t0 = time.monotonic()
                reply = unwrap(await head.heartbeat.remote(**self.core.heartbeat_payload(), _caller=self._caller))
                took = time.monotonic() - t0
                if took > self.settings.heartbeat_interval_s:  # the head is slow to hear us: say so
                    log.warning("agent %s: heartbeat took %.1fs", self.core.node_name, took)
                self.heartbeats += 1
                if reply.get("reregister"):
                    registered = False
                    continue
                self.core.apply_assignments(reply.get("assignments", {}), reply.get("revocations"),
                                            reply.get("reconfigure"))
                await self._hold(reply.get("assignments", {}))
                changed = self.core.poll_health(0.0)
                if changed is not None:
                    await head.update_inventory.remote(self.core.node_name, self.core.incarnation,
                                                       changed.model_dump(mode="json"), _caller=self._caller)
            except Exception as e:  # the head restarting, or not there yet: try again next beat
                log.warning("agent %s: %s: %s", self.core.node_name, type(e).__name__, e)
                head, registered = None, False
            # a revocation in flight: a preemptor waits for our confirmation, so do not wait out the interval;
            # the head also wakes us (wake) when it has something for this node
            try:
                await asyncio.wait_for(self._wake.wait(),
                                       self.settings.tuning.urgent_beat_s if self.core.urgent
                                       else self.settings.heartbeat_interval_s)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    async def _hold(self, assignments: dict[str, Any]) -> None:
        """Ray's ``GPU`` on this node: a group for each lease held here, every other unit held by the agent
        (:mod:`orchestrator.rayport.holds`). A failure is logged and tried again next beat."""
        try:
            shapes = {lid: lease_shape(Allocation.from_json(want["allocation"]),
                                       timeslice_capacity_milli=self.settings.timeslice_capacity_milli)
                      for lid, want in assignments.items() if lid in self.core.allocated}
            await self.holds.sync([g.index for g in self.core.inventory.gpus], shapes)
            self._remember_groups()
        except Exception as e:
            log.warning("agent %s: holds: %s: %s", self.core.node_name, type(e).__name__, e)

    def _remember_groups(self) -> None:
        """Note each lease's placement group (its own, or the one its holder made and this agent adopted): a
        revocation stops an actor only if it was placed in one of them, and by then the group may be gone."""
        for lid in self.holds.leases:
            pg = self.holds.placed_group(lid)
            if pg is not None:
                self._groups_seen.setdefault(lid, set()).add(pg)
        for old in list(self._groups_seen)[:-4096]:
            del self._groups_seen[old]

    async def lease_group(self, lease_id: str) -> str | None:
        """The id (hex) of lease ``lease_id``'s placement group once it is placed here; None until then (and
        for a lease this node does not hold). Holders look it up here (:func:`orchestrator.rayport.native.lease_group`):
        a group's name is scoped to the namespace of the Ray job that made it, which a holder cannot know."""
        return self.holds.placed_group(lease_id)

    async def lend(self, lease_id: str, token: int) -> bool:
        """The lease's holder is about to make a placement group of its own on this node (Ray Train's, Tune's,
        a Serve replica's) for the lease's capacity: the lease's group is removed for it (:meth:`RayHolds.lend`).
        Only with the lease's fencing token."""
        self.core.check_holder(lease_id, token)
        return await self.holds.lend(lease_id, time.monotonic())

    async def adopt(self, lease_id: str, token: int, pg_hex: str) -> bool:
        """That group now stands for the lease (removed with it)."""
        self.core.check_holder(lease_id, token)
        adopted = self.holds.adopt(lease_id, pg_hex)
        if adopted:  # the holder's own group (Ray Train's, a Serve replica's) now holds the lease's devices
            self._groups_seen.setdefault(lease_id, set()).add(pg_hex)
        self._remember_groups()
        return adopted

    async def give_back(self, lease_id: str, token: int) -> None:
        """The holder removed its group: the lease gets its own again."""
        self.core.check_holder(lease_id, token)
        self.holds.give_back(lease_id)
        self._wake.set()

    async def wake(self) -> None:
        """Beat now: the head has a checkpoint to ask for or a lease to revoke on this node."""
        self._wake.set()

    async def info(self) -> dict[str, Any]:
        return {"node_name": self.core.node_name, "pid": os.getpid(), "incarnation": self.core.incarnation,
                "backend": self.core.backend.name, "heartbeats": self.heartbeats,
                "allocated": sorted(self.core.allocated), "stopped_at": dict(self.core.stopped_at),
                "holds": {"pieces": {n: [p.card, p.units] for n, p in self.holds.pieces.items()},
                          "leases": sorted(self.holds.leases), "unplaced": sorted(self.holds.unplaced),
                          "groups": self.holds.lease_groups(), "adopted": sorted(self.holds.adopted)}}

    async def check_holder(self, lease_id: str, token: int) -> dict[str, Any]:
        """A holder on this node shows its token; answers the wire envelope (a stale one is refused)."""
        return answer(self.core.check_holder, lease_id, token)

    async def inject_health(self, gpu_index: int, healthy: bool, reason: str, admin_key: str | None = None) -> bool:
        """Simulated backend only: report a health change, as an XID would on a real card. Only for an
        administrator (``admin_key``, checked against ``settings.admin_key_sha256``): a card marked failed loses
        its leases, so any driver could otherwise end another's work. ``PermissionDeniedError`` otherwise."""
        if not matches(self.settings.admin_key_sha256, admin_key):
            raise PermissionDeniedError("inject_health", "an administrator", self.core.node_name)
        inject = getattr(self.core.backend, "inject", None)
        if inject is None:
            return False
        inject(HealthEvent(gpu_index, healthy, reason))
        return True
