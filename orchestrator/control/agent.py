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
(:class:`AgentActor`, created by :func:`orchestrator.rayport.ray_api.start_agent`,
detached and pinned to its node with ``NodeAffinitySchedulingStrategy(soft=False)``)
only runs its loop. It has ``max_restarts=0``: a dead agent is noticed by the
head through the TTL, which then starts a fresh one (a new incarnation).
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from typing import Any, Mapping

from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.inventory import NodeInventory
from orchestrator.core.request import ShareKind
from orchestrator.core.config import RuntimeSettings, SimNode
from orchestrator.control.discovery.base import DiscoveryBackend, HealthEvent, apply_events, select_backend
from orchestrator.control.handout import device_env
from orchestrator.core.allocation import Allocation

log = logging.getLogger(__name__)


class AgentCore:
    """An agent's state and decisions; no Ray."""

    def __init__(self, node_name: str, ray_node_id: str, backend: DiscoveryBackend, settings: RuntimeSettings) -> None:
        self.node_name = node_name
        self.ray_node_id = ray_node_id
        self.backend = backend
        self.settings = settings
        self.incarnation = uuid.uuid4().hex[:12]
        self.inventory: NodeInventory = backend.inventory()
        self.allocated: dict[str, dict[str, str]] = {}  # lease id -> env it was handed
        self.rejected: dict[str, str] = {}
        self.mig_uuids: dict[str, str] = {}

    def registration(self) -> dict[str, Any]:
        return {"node_name": self.node_name, "ray_node_id": self.ray_node_id, "incarnation": self.incarnation,
                "inventory": self.inventory.model_dump(mode="json")}

    def heartbeat_payload(self) -> dict[str, Any]:
        return {"node_name": self.node_name, "incarnation": self.incarnation, "allocated": sorted(self.allocated),
                "rejected": dict(self.rejected), "mig_uuids": dict(self.mig_uuids)}

    def allocate(self, lease_id: str, allocation: Mapping[str, Any], fencing_token: int = 0) -> dict[str, str]:
        """Allocate: check the devices are here and return the environment that binds a process to them."""
        by_uuid = {g.uuid: g for g in self.inventory.gpus}
        missing = [u for u in allocation["gpu_uuids"] if u not in by_uuid]
        if allocation["node"] != self.node_name or missing:
            raise InvalidRequestError("allocation.gpu_uuids", missing or allocation["node"],
                                      [g.uuid for g in self.inventory.gpus],
                                      detail=f"not devices of node {self.node_name}")
        mig_uuid = allocation.get("mig_uuid")
        if allocation["kind"] == ShareKind.MIG.value and not mig_uuid:
            mig_uuid = self.backend.create_mig(allocation["gpu_indices"][0], allocation["mig_profile"],
                                               allocation["mig_start"])
            self.mig_uuids[lease_id] = mig_uuid
        a = Allocation.from_json({**allocation, "mig_uuid": mig_uuid})
        env = device_env(a, lease_id=lease_id, fencing_token=fencing_token, mps_pipe_root=self.settings.mps_pipe_root)
        self.allocated[lease_id] = env
        return env

    def apply_assignments(self, assignments: Mapping[str, Mapping[str, Any]]) -> None:
        """Make what this agent holds equal the head's desired set (idempotent)."""
        for lease_id in [k for k in self.allocated if k not in assignments]:
            del self.allocated[lease_id]
            self.mig_uuids.pop(lease_id, None)
        for lease_id in [k for k in self.rejected if k not in assignments]:
            del self.rejected[lease_id]
        for lease_id, want in assignments.items():
            if lease_id in self.allocated or lease_id in self.rejected:
                continue
            try:
                self.allocate(lease_id, want["allocation"], int(want.get("fencing_token", 0)))
            except InvalidRequestError as e:
                self.rejected[lease_id] = str(e)

    def poll_health(self, timeout_s: float = 0.0) -> NodeInventory | None:
        """Apply pending health events; the new inventory if any GPU changed, else None."""
        events = self.backend.poll_events(timeout_s)
        if not events:
            return None
        new = apply_events(self.inventory, events)
        if new is self.inventory:
            return None
        self.inventory = new
        return new


class AgentActor:
    """The Ray actor around :class:`AgentCore` (async: its loop and its methods share one event loop)."""

    def __init__(self, node_name: str, ray_node_id: str, settings: dict[str, Any], sim_node: dict[str, Any] | None) -> None:
        self.settings = RuntimeSettings.model_validate(settings)
        sim = SimNode.model_validate(sim_node) if sim_node else None
        backend = select_backend(self.settings.discovery, node_name, sim)
        self.core = AgentCore(node_name, ray_node_id, backend, self.settings)
        self.heartbeats = 0
        self._task = asyncio.get_event_loop().create_task(self._run())

    async def _run(self) -> None:
        from orchestrator.rayport import ray_api

        head = None
        registered = False
        while True:
            try:
                if head is None:
                    head = ray_api.get_head(self.settings.namespace, self.settings.head_name)
                if not registered:
                    ack = await head.register_agent.remote(**self.core.registration())
                    self.core.apply_assignments(ray_api.unwrap(ack)["assignments"])
                    registered = True
                reply = ray_api.unwrap(await head.heartbeat.remote(**self.core.heartbeat_payload()))
                self.heartbeats += 1
                if reply.get("reregister"):
                    registered = False
                    continue
                self.core.apply_assignments(reply.get("assignments", {}))
                changed = self.core.poll_health(0.0)
                if changed is not None:
                    await head.update_inventory.remote(self.core.node_name, self.core.incarnation,
                                                       changed.model_dump(mode="json"))
            except Exception as e:  # the head restarting, or not there yet: try again next beat
                log.warning("agent %s: %s: %s", self.core.node_name, type(e).__name__, e)
                head, registered = None, False
            await asyncio.sleep(self.settings.heartbeat_interval_s)

    async def allocate(self, lease_id: str, allocation: dict[str, Any], fencing_token: int = 0) -> dict[str, str]:
        return self.core.allocate(lease_id, allocation, fencing_token)

    async def info(self) -> dict[str, Any]:
        return {"node_name": self.core.node_name, "pid": os.getpid(), "incarnation": self.core.incarnation,
                "backend": self.core.backend.name, "heartbeats": self.heartbeats,
                "allocated": sorted(self.core.allocated)}

    async def inject_health(self, gpu_index: int, healthy: bool, reason: str) -> bool:
        """Simulated backend only: report a health change, as an XID would on a real card."""
        inject = getattr(self.core.backend, "inject", None)
        if inject is None:
            return False
        inject(HealthEvent(gpu_index, healthy, reason))
        return True
