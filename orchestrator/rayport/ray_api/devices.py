"""A lease's hand-out as what Ray is asked for: the devices' resources and the actor options of a holder.

Invariant: a holder asks Ray for exactly its lease's devices: inside its lease's placement group where the
node advertises Ray's ``GPU``, else its share of each card's own resource (``rgo-gpu-<i>``), else of ``GPU``.
"""

from __future__ import annotations

from typing import Any, Mapping

import ray

from orchestrator.core import env as E
from orchestrator.core.config import CARD_RESOURCE_PREFIX
from orchestrator.rayport.lease_groups import advertises_gpus, native_actor_options
from orchestrator.rayport.ray_api.actors import pin

_CARDS_DECLARED: dict[str, bool] = {}


def declares_cards(node_id: str) -> bool:
    """Whether the Ray node declares one ``rgo-gpu-<i>`` resource per card (what ``orchestrator up`` and our
    KubeRay manifests start). A node's resources are fixed for its life, so the answer is cached. Without a
    Ray connection nothing can be placed anyway: the answer is then no."""
    if node_id not in _CARDS_DECLARED:
        if not ray.is_initialized():
            return False
        node = next((n for n in ray.nodes() if n.get("NodeID") == node_id), None)
        if node is None:
            return False  # not cached: the node may not have registered yet
        _CARDS_DECLARED[node_id] = any(k.startswith(CARD_RESOURCE_PREFIX) for k in node.get("Resources") or {})
    return _CARDS_DECLARED[node_id]


def gpu_demand(handout: Mapping[str, Any]) -> dict[str, Any]:
    """What a lease's holder asks Ray for its devices: its share of each card's own resource where the node
    declares them (exact: whatever the ledger granted, Ray can place), else the share of Ray's ``GPU``."""
    if handout.get("node_id") and advertises_gpus(handout["node_id"]):
        # the lease's placement group holds its share of Ray's GPU and of each card's resource (control/holds.py):
        # a holder that does not run inside it (a job's driver, a gang's worker, a Serve replica) asks for neither
        return {"num_gpus": 0}
    cards = handout.get("resources") or {}
    if cards and handout.get("node_id") and declares_cards(handout["node_id"]):
        return {"num_gpus": 0, "resources": dict(cards)}
    return {"num_gpus": handout["num_gpus"]}


def actor_options(handout: Mapping[str, Any], *, extra_env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Ray actor options that run a holder on exactly its lease's devices (see :mod:`.handout`): inside its
    lease's placement group, asking for its share of Ray's ``GPU``, where the node advertises Ray's ``GPU``
    (:mod:`.native`; waits for the node's agent to have made the group); else its share of each card's own
    resource, pinned to the node."""
    env = dict(handout["env_vars"])
    env.update(extra_env or {})
    if E.LEASE_ID in handout["env_vars"] and advertises_gpus(handout["node_id"]):
        return native_actor_options(handout, env)
    return {"scheduling_strategy": pin(handout["node_id"], soft=False), **gpu_demand(handout),
            "num_cpus": handout.get("num_cpus", 0.0), "runtime_env": {"env_vars": env}}
