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
"""

from __future__ import annotations

import uuid
from typing import Any, Mapping

from orchestrator.control.discovery.base import DiscoveryBackend, apply_events, measured_utilization
from orchestrator.core.allocation import Allocation
from orchestrator.core.config import RuntimeSettings
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.inventory import K8S_NODE_LABEL, NodeInventory
from orchestrator.core.request import ShareKind


class AgentCore:
    """An agent's state and decisions; no Ray."""

    def __init__(self, node_name: str, ray_node_id: str, backend: DiscoveryBackend, settings: RuntimeSettings,
                 *, k8s_node: str | None = None) -> None:
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

    def registration(self) -> dict[str, Any]:
        return {"node_name": self.node_name, "ray_node_id": self.ray_node_id, "incarnation": self.incarnation,
                "inventory": self.inventory.model_dump(mode="json")}

    def heartbeat_payload(self) -> dict[str, Any]:
        payload = {"node_name": self.node_name, "incarnation": self.incarnation, "allocated": sorted(self.allocated),
                   "rejected": dict(self.rejected), "mig_uuids": dict(self.mig_uuids)}
        util = measured_utilization(self.backend)
        if util:
            payload["utilization"] = {str(i): u for i, u in util.items()}
        return payload

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

    def apply_assignments(self, assignments: Mapping[str, Mapping[str, Any]]) -> None:
        """Make what this agent holds equal the head's desired set (idempotent).

        Each assignment is ``{"allocation": <Allocation JSON>, "fencing_token": n, "env": {...} | None}``;
        ``env`` is None while the head waits for the UUID of a MIG instance made here."""
        for lease_id in [k for k in self.allocated if k not in assignments]:
            del self.allocated[lease_id]
            self.mig_uuids.pop(lease_id, None)
        for lease_id in [k for k in self.rejected if k not in assignments]:
            del self.rejected[lease_id]
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
