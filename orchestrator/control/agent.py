"""The node agent: our device plugin, one per GPU node.

Like a Kubernetes device plugin it does three things:

* **Register** the node's inventory with the head (``register_agent``);
* **ListAndWatch**: heartbeat every ``heartbeat_interval_s`` and push the
  inventory again when a GPU's health changes (``update_inventory``);
* **Allocate**: hand devices to a lease -- check they exist on this node,
  make the MIG instance if the card takes them on demand, and produce the
  environment that binds a process to them.

The head's heartbeat reply carries the node's *desired* assignments; the agent
allocates what is new, forgets what is gone and reports back what it holds and
what it refused. :class:`AgentCore` is that logic without Ray; the Ray actor
(:class:`orchestrator.rayport.agent.AgentActor`) only runs its loop.

Invariant: the head builds a lease's device environment, once
(:mod:`orchestrator.control.handout`); the agent checks the devices are its
own, creates an on-demand MIG instance and reports its UUID, and keeps the
environment the head sent -- it never builds one of its own.

It also **holds** the node's leases (:mod:`orchestrator.control.revocation`):

* it prepares MPS shares: a control daemon runs for every GPU with an MPS
  lease, and only for those (:class:`~orchestrator.control.mps.MpsDaemons`);
* it asks a checkpointing lease's actor to ``checkpoint(dir)`` and reports the
  path it answers (``checkpointed``);
* it carries out revocations: stops the lease's workload through its
  :class:`WorkloadPort` (``ray.kill`` of the actor, stop of the Ray job, kill
  of the process), then confirms (``revoked``);
* it knows each held lease's token and refuses any other
  (:meth:`AgentCore.check_holder`): a revoked or stale holder cannot come back.

And it **repartitions** MIG cards (:mod:`orchestrator.control.repartition`): a
heartbeat reply's ``reconfigure`` names a GPU and its new layout once the head
has drained the instances that go; the agent refuses if it still holds a lease
on one of those (a lease on an instance the new layout keeps does not block it),
else has its backend destroy the removed instances and create the added ones,
leaving kept ones and their holders running (``reconfigure_mig``), and pushes
the new inventory (its next :meth:`AgentCore.poll_health` returns it); a
failure is reported once per request (``reconfigure_failed``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
import uuid
from typing import Any, Callable, Collection, Mapping, Protocol

from orchestrator.control.discovery.base import DiscoveryBackend, apply_events, measured_utilization
from orchestrator.control.mps import MpsDaemons, RecordingPort, SubprocessPort
from orchestrator.control.revocation import parse_workload, protected_workload
from orchestrator.core import env as E
from orchestrator.core.allocation import Allocation
from orchestrator.core.config import RuntimeSettings
from orchestrator.core.errors import InvalidRequestError, StaleFencingTokenError
from orchestrator.core.inventory import K8S_NODE_LABEL, NodeInventory
from orchestrator.core.request import ShareKind

log = logging.getLogger(__name__)

#: A pending checkpoint: returns the path once written, None meanwhile; raises when the holder failed.
CheckpointPoll = Callable[[], "str | None"]


class WorkloadPort(Protocol):
    """How an agent reaches what runs on its leases (``rayport.agent.RayWorkloads`` is the real one)."""

    def stop(self, workload: str, lease_id: str = "") -> bool:
        """Stop ``workload`` of lease ``lease_id`` (idempotent); True once nothing of it runs any more."""
        ...

    def checkpoint(self, workload: str, directory: str, lease_id: str = "") -> CheckpointPoll:
        """Ask a preemptible actor holding lease ``lease_id`` to ``checkpoint(directory)``; a poll for the path it
        writes (one that never answers when the actor does not hold the lease: it is not asked)."""
        ...

    def watch(self, workload: str) -> None:
        """A holder was registered on this node: get ready to reach it (no answer awaited)."""
        ...


def process_names_lease(pid: int, lease_id: str) -> bool:
    """Whether process ``pid`` was started with lease ``lease_id``'s hand-out (``ORCHESTRATOR_LEASE_ID`` in the
    environment it started with). False when its environment cannot be read (another user's) or it is gone."""
    if not lease_id:
        return False
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read().split(b"\0")
    except OSError:
        return False
    return f"{E.LEASE_ID}={lease_id}".encode() in environ


def workload_holds_lease(lease_id: str, *, env_vars: Mapping[str, str] | None, placement_group: str | None,
                         lease_groups: Collection[str]) -> bool:
    """Whether a workload (a Ray actor or a Ray job, as Ray records it) runs on lease ``lease_id``'s devices: it
    was started with the lease's hand-out (``ORCHESTRATOR_LEASE_ID`` in its runtime env's ``env_vars``, or the
    lease among a gang job's hand-outs in ``ORCHESTRATOR_GANG``), or it was placed in the lease's placement group
    (``lease_groups``: the lease's own group and the one its holder made and the agent adopted). The agent stops
    a workload only when this holds: a lease's holder names its workload itself, and must not be able to have
    another user's actor or job stopped by getting its own lease preempted. Pure."""
    env = env_vars or {}
    if env.get(E.LEASE_ID) == lease_id:
        return True
    gang = env.get(E.GANG)
    if gang:
        try:
            if any((h.get("env_vars") or {}).get(E.LEASE_ID) == lease_id for h in json.loads(gang)):
                return True
        except (ValueError, TypeError, AttributeError):
            pass
    return bool(placement_group) and placement_group in lease_groups


class LocalWorkloads:
    """The port without Ray: processes (``pid:``) are killed; actors and Ray jobs, which only exist on a
    Ray cluster, are recorded as stopped. What a simulated node and the unit tests use."""

    def __init__(self) -> None:
        self.stopped: list[str] = []

    def stop(self, workload: str, lease_id: str = "") -> bool:
        kind, ref = parse_workload(workload)
        self.stopped.append(workload)
        if kind != "pid":
            return True
        if not process_names_lease(int(ref), lease_id):
            # A holder names its process itself: only one started with the lease's hand-out is stopped, never
            # any other process of the node (a raylet, the GCS, the head). Nothing of the lease's to stop.
            log.warning("process %s does not carry lease %s in its environment: not stopped", ref, lease_id)
            return True
        try:
            os.kill(int(ref), signal.SIGKILL)
        except ProcessLookupError:
            return True
        return False  # confirmed on a later beat, once the process is gone

    def checkpoint(self, workload: str, directory: str, lease_id: str = "") -> CheckpointPoll:
        raise InvalidRequestError("workload", workload, "a Ray actor (checkpoints are asked through Ray)")

    def watch(self, workload: str) -> None:
        parse_workload(workload)


class AgentCore:
    """An agent's state and decisions; no Ray."""

    def __init__(self, node_name: str, ray_node_id: str, backend: DiscoveryBackend, settings: RuntimeSettings, *,
                 k8s_node: str | None = None, workloads: WorkloadPort | None = None,
                 mps: MpsDaemons | None = None) -> None:
        self.node_name = node_name
        self.ray_node_id = ray_node_id
        self.backend = backend
        self.settings = settings
        self.incarnation = uuid.uuid4().hex[:12]
        self.inventory: NodeInventory = backend.inventory()
        if k8s_node:  # the Kubernetes node it runs on: what the cross-check matches Node objects by
            self.inventory = self.inventory.model_copy(
                update={"labels": {**self.inventory.labels, K8S_NODE_LABEL: k8s_node}})
        self.allocated: dict[str, dict[str, str]] = {}  # lease id -> the env the head built for it
        self.rejected: dict[str, str] = {}
        self.mig_uuids: dict[str, str] = {}
        self.workloads: WorkloadPort = workloads or LocalWorkloads()
        port = RecordingPort() if backend.name == "simulated" else SubprocessPort()
        self.mps = mps or MpsDaemons(settings.mps_pipe_root, port)
        self.tokens: dict[str, int] = {}  # lease id -> the token of the lease this agent holds
        self.revoked: set[str] = set()  # stopped and confirmed; reported until the head stops asking
        self.urgent = False  # revocations in flight: beat without waiting out the interval
        self.checkpointed: dict[str, str] = {}  # lease id -> the path its actor wrote
        self._reported: set[str] = set()  # checkpointed leases whose path a heartbeat has carried
        self.holders: dict[str, str] = {}  # lease id -> its registered workload (actor:, job:, pid:)
        #: lease id -> wall time its revoked workload was found stopped (the confirmation); the last 256
        self.stopped_at: dict[str, float] = {}
        self._checkpoints: dict[str, CheckpointPoll] = {}
        self.reconfigure_failed: dict[str, str] = {}  # GPU index -> why its requested layout was not applied
        self._unpushed = False  # the inventory changed here (a new MIG layout): push it to the head

    def registration(self) -> dict[str, Any]:
        return {"node_name": self.node_name, "ray_node_id": self.ray_node_id, "incarnation": self.incarnation,
                "inventory": self.inventory.model_dump(mode="json")}

    def heartbeat_payload(self) -> dict[str, Any]:
        payload = {"node_name": self.node_name, "incarnation": self.incarnation, "allocated": sorted(self.allocated),
                   "rejected": dict(self.rejected), "mig_uuids": dict(self.mig_uuids), "revoked": sorted(self.revoked),
                   "checkpointed": dict(self.checkpointed)}
        if self.reconfigure_failed:
            payload["reconfigure_failed"] = dict(self.reconfigure_failed)
        self._reported = set(self.checkpointed)
        util = measured_utilization(self.backend)
        if util:
            payload["utilization"] = {str(i): u for i, u in util.items()}
        return payload

    def check_holder(self, lease_id: str, token: int) -> None:
        """A holder on this node presents its token: refused unless it is the token of a lease held here."""
        if self.tokens.get(lease_id) != int(token):
            raise StaleFencingTokenError(lease_id, int(token))

    def allocate(self, lease_id: str, allocation: Allocation) -> str | None:
        """Allocate: check the devices are here; make the MIG instance on demand. Returns the UUID it made, if any."""
        by_uuid = {g.uuid for g in self.inventory.gpus}
        missing = [u for u in allocation.gpu_uuids if u not in by_uuid]
        if allocation.node_name != self.node_name or missing:
            raise InvalidRequestError("allocation.gpu_uuids", missing or allocation.node_name,
                                      [g.uuid for g in self.inventory.gpus],
                                      detail=f"not devices of node {self.node_name}")
        if allocation.kind is ShareKind.MIG and not allocation.mig_uuid:
            made = self.backend.create_mig(allocation.gpu_indices[0], allocation.mig_profile or "",
                                           allocation.mig_start or 0)
            self.mig_uuids[lease_id] = made
            return made
        return None

    def apply_assignments(self, assignments: Mapping[str, Mapping[str, Any]],
                          revocations: Mapping[str, Mapping[str, Any]] | None = None,
                          reconfigure: Mapping[str, Any] | None = None) -> None:
        """Make what this agent holds equal the head's desired set, and stop what it revokes (idempotent).

        Each assignment is ``{"allocation": <Allocation JSON>, "fencing_token": n, "env": {...} | None,
        "state": ..., "workload": ..., "checkpoint_dir": ...}``; ``env`` is None while the head waits for
        the UUID of a MIG instance made here. Each revocation is ``{"fencing_token", "workload", "reason"}``;
        ``reconfigure`` maps a GPU index (a string) to its new MIG layout (``[{"profile", "start"}, ...]``)."""
        revocations = revocations or {}
        for lease_id in [k for k in self.allocated if k not in assignments]:
            del self.allocated[lease_id]
            self.mig_uuids.pop(lease_id, None)
        for lease_id in [k for k in self.rejected if k not in assignments]:
            del self.rejected[lease_id]
        self.tokens = {k: int(v["fencing_token"]) for k, v in assignments.items()}
        for lease_id, want in assignments.items():
            if lease_id in self.rejected:
                continue
            if lease_id not in self.allocated:
                try:
                    self.allocate(lease_id, Allocation.from_json(want["allocation"]))
                except InvalidRequestError as e:
                    self.rejected[lease_id] = str(e)
                    continue
            self.allocated[lease_id] = dict(want.get("env") or {})
        self._sync_mps(assignments)
        self._watch(assignments)
        self._ask_checkpoints(assignments)
        self._revoke(revocations)
        self._reconfigure(reconfigure or {}, assignments)

    def _reconfigure(self, work: Mapping[str, Any], assignments: Mapping[str, Mapping[str, Any]]) -> None:
        """Apply each requested MIG layout not applied yet; refuse a GPU that still holds a lease here."""
        self.reconfigure_failed = {k: v for k, v in self.reconfigure_failed.items() if k in work}
        for idx_text, layout in work.items():
            idx = int(idx_text)
            want = sorted((str(s["profile"]), int(s["start"])) for s in layout)
            gpu = next((g for g in self.inventory.gpus if g.index == idx), None)
            if gpu is not None and sorted((d.profile, d.start) for d in gpu.mig_devices) == want:
                continue  # applied already (the head has yet to see the pushed inventory)
            if idx_text in self.reconfigure_failed:
                continue  # reported once; the head ends the request
            keep = {(d.profile, d.start) for d in (gpu.mig_devices if gpu is not None else ())} & set(want)
            held = sorted(k for k, v in assignments.items() if _blocks_relayout(Allocation.from_json(v["allocation"]),
                                                                                idx, keep))
            try:
                if gpu is None:
                    raise InvalidRequestError("gpu_index", idx, [g.index for g in self.inventory.gpus],
                                              detail=f"no such GPU on node {self.node_name}")
                if held:
                    raise InvalidRequestError("gpu_index", idx, "a GPU whose leases hold only kept instances",
                                              detail=f"it still holds {', '.join(held)} on instances the layout removes")
                devices = self.backend.reconfigure_mig(idx, want)
            except Exception as e:  # typed errors and NVML's: the head fails the repartition and uncordons
                log.warning("agent %s: MIG layout of GPU %s not applied: %s", self.node_name, idx, e)
                self.reconfigure_failed[idx_text] = f"{type(e).__name__}: {e}"
                if gpu is not None and not held:  # the card may have changed half-way: report what it has now
                    self._set_mig_devices(idx, self._backend_mig_devices(idx, gpu.mig_devices))
                continue
            self._set_mig_devices(idx, devices)
            log.info("agent %s: GPU %s now has MIG layout %s", self.node_name, idx,
                     ", ".join(f"{d.profile}@{d.start}" for d in devices))

    def _sync_mps(self, assignments: Mapping[str, Mapping[str, Any]]) -> None:
        """A control daemon on exactly the GPUs that hold MPS leases; a lease whose daemon failed is refused."""
        wanted: dict[int, list[str]] = {}
        for lease_id, want in assignments.items():
            a = Allocation.from_json(want["allocation"])
            if a.kind is ShareKind.MPS and lease_id in self.allocated:
                wanted.setdefault(a.gpu_indices[0], []).append(lease_id)
        uuids = {g.index: g.uuid for g in self.inventory.gpus}
        for idx, why in self.mps.sync((i, uuids[i]) for i in wanted).items():
            for lease_id in wanted[idx]:
                self.rejected[lease_id] = why
                self.allocated.pop(lease_id, None)

    def _watch(self, assignments: Mapping[str, Mapping[str, Any]]) -> None:
        """Record each lease's holder once it is registered, and let the port get ready to reach it: the
        first call from this process to an actor can take seconds, which a checkpoint request must not."""
        for lease_id, want in assignments.items():
            workload = want.get("workload")
            if workload and self.holders.get(lease_id) != workload:
                try:
                    self.workloads.watch(workload)
                except Exception as e:  # registered before it exists (activate, then create): next beat
                    log.debug("agent %s: cannot reach %s of %s yet: %s", self.node_name, workload, lease_id, e)
                    continue
                self.holders[lease_id] = workload
        for lease_id in [k for k in self.holders if k not in assignments]:
            del self.holders[lease_id]

    def _ask_checkpoints(self, assignments: Mapping[str, Mapping[str, Any]]) -> None:
        """Ask each checkpointing actor once; report the path it writes."""
        for lease_id in [k for k in self._checkpoints if k not in assignments]:
            del self._checkpoints[lease_id]
        self.checkpointed = {k: v for k, v in self.checkpointed.items() if k in assignments}
        for lease_id, want in assignments.items():
            workload = want.get("workload") or ""
            if want.get("state") != "checkpointing" or not workload.startswith("actor:") or lease_id in self.checkpointed:
                continue
            try:
                if lease_id not in self._checkpoints:
                    directory = want.get("checkpoint_dir") or os.path.join(self.settings.mps_pipe_root, "checkpoints")
                    self._checkpoints[lease_id] = self.workloads.checkpoint(workload, os.path.join(directory, lease_id),
                                                                            lease_id)
                path = self._checkpoints[lease_id]()
            except Exception as e:  # the holder failed or ignores us: its grace deadline decides
                log.warning("agent %s: checkpoint of %s failed: %s", self.node_name, lease_id, e)
                self._checkpoints[lease_id] = lambda: None
                continue
            if path:
                self.checkpointed[lease_id] = str(path)

    def _revoke(self, revocations: Mapping[str, Mapping[str, Any]]) -> None:
        """Stop each revoked lease's workload; confirm once it is gone. Its token is refused from now on.

        While the head lists revocations for this node, or a checkpoint is awaited, ``urgent`` is set: the
        agent's loop then beats at once instead of every heartbeat interval, because a preemptor waits."""
        # ... and while an actor's checkpoint is awaited or its path is not yet reported: a preemptor waits on it
        self.urgent = bool(revocations) or any(k not in self.checkpointed for k in self._checkpoints) or bool(
            set(self.checkpointed) - self._reported)
        self.revoked &= set(revocations)
        for lease_id, r in revocations.items():
            self.tokens.pop(lease_id, None)
            self.allocated.pop(lease_id, None)
            if lease_id in self.revoked:
                continue
            workload = r.get("workload")
            why = workload and protected_workload(workload, namespace=self.settings.namespace,
                                                  head_name=self.settings.head_name)
            if why:  # recorded before the head refused such names, or a head that does not: never stopped
                log.warning("agent %s: lease %s names %s as its workload; not stopped: %s", self.node_name,
                            lease_id, workload, why)
                workload = None
            try:
                gone = True if not workload else self.workloads.stop(workload, lease_id)
            except Exception as e:  # not confirmed: the next beat tries again
                log.warning("agent %s: could not stop %s of %s: %s", self.node_name, workload, lease_id, e)
                gone = False
            if gone:
                self.revoked.add(lease_id)
                self.stopped_at[lease_id] = time.time()
                for old in list(self.stopped_at)[:-256]:
                    del self.stopped_at[old]

    def _set_mig_devices(self, idx: int, devices: tuple[Any, ...]) -> None:
        """The inventory with GPU ``idx``'s MIG devices replaced (a higher generation, to push); no change: as is."""
        if next(g for g in self.inventory.gpus if g.index == idx).mig_devices == devices:
            return
        gpus = tuple(g.model_copy(update={"mig_devices": devices}) if g.index == idx else g for g in self.inventory.gpus)
        self.inventory = self.inventory.model_copy(update={"gpus": gpus, "generation": self.inventory.generation + 1})
        self._unpushed = True

    def _backend_mig_devices(self, idx: int, known: tuple[Any, ...]) -> tuple[Any, ...]:
        """GPU ``idx``'s MIG devices as the backend reports them now (``known`` if it cannot say)."""
        try:
            g = next((g for g in self.backend.inventory().gpus if g.index == idx), None)
        except Exception as e:  # NVML unreadable now: the next change of inventory will tell
            log.warning("agent %s: cannot re-read GPU %s: %s", self.node_name, idx, e)
            return known
        return known if g is None else g.mig_devices

    def poll_health(self, timeout_s: float = 0.0) -> NodeInventory | None:
        """Apply pending health events; the new inventory if any GPU changed (or a new MIG layout was
        applied since the last call), else None."""
        events = self.backend.poll_events(timeout_s)
        new = apply_events(self.inventory, events) if events else self.inventory
        if new is self.inventory and not self._unpushed:
            return None
        self.inventory, self._unpushed = new, False
        return new


def _blocks_relayout(a: Allocation, gpu_index: int, keep: set[tuple[str, int]]) -> bool:
    """Whether a lease held here stops GPU ``gpu_index`` being relaid: it is on that GPU and holds anything but
    one of the ``keep`` instances (profile, start) the new layout keeps."""
    if gpu_index not in a.gpu_indices:
        return False
    return not (a.mig_profile and a.mig_start is not None and (a.mig_profile, int(a.mig_start)) in keep)
