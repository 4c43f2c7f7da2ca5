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
from typing import Any

from orchestrator.control.agent import AgentCore
from orchestrator.control.discovery import HealthEvent, select_backend
from orchestrator.core import env
from orchestrator.core.config import RuntimeSettings, SimNode
from orchestrator.rayport import ray_api
from orchestrator.rayport.wire import unwrap

log = logging.getLogger(__name__)


class AgentActor:
    """The Ray actor around :class:`AgentCore` (async: its loop and its methods share one event loop)."""

    def __init__(self, node_name: str, ray_node_id: str, settings: dict[str, Any], sim_node: dict[str, Any] | None) -> None:
        self.settings = RuntimeSettings.model_validate(settings)
        sim = SimNode.model_validate(sim_node) if sim_node else None
        backend = select_backend(self.settings.discovery, node_name, sim)
        self.core = AgentCore(node_name, ray_node_id, backend, self.settings,
                              k8s_node=os.environ.get(env.K8S_NODE_NAME) or None)
        self.heartbeats = 0
        self._task = asyncio.get_event_loop().create_task(self._run())

    async def _run(self) -> None:
        head = None
        registered = False
        while True:
            try:
                if head is None:
                    head = ray_api.get_head(self.settings.namespace, self.settings.head_name)
                if not registered:
                    ack = await head.register_agent.remote(**self.core.registration())
                    self.core.apply_assignments(unwrap(ack)["assignments"])
                    registered = True
                reply = unwrap(await head.heartbeat.remote(**self.core.heartbeat_payload()))
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
