"""Reading the GCS node and actor tables: the nodes that should have an agent, and which actors are dead.

Invariants: read-only; an actor the GCS does not know counts as alive (the head never frees a lease on
a read that failed).
"""

from __future__ import annotations

from typing import Iterable

import ray

from orchestrator.control.nodes import RayNodeInfo
from orchestrator.core.config import CARD_RESOURCE_PREFIX, NODE_LABEL


def alive_nodes() -> list[RayNodeInfo]:
    """Live Ray nodes that should have an agent: those labelled with our node label, or with GPUs."""
    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        labels = n.get("Labels") or {}
        name = labels.get(NODE_LABEL)
        if name is None:
            res = n.get("Resources") or {}
            if not res.get("GPU") and not any(k.startswith(CARD_RESOURCE_PREFIX) for k in res):
                continue
            name = f"{n.get('NodeManagerHostname', 'node')}-{n['NodeID'][:8]}".lower()
        is_head = "node:__internal_head__" in (n.get("Resources") or {})
        out.append(RayNodeInfo(ray_node_id=n["NodeID"], name=name, is_head=is_head))
    return out


def head_node_id() -> str | None:
    return next((n.ray_node_id for n in alive_nodes_all() if n.is_head), None)


def alive_nodes_all() -> list[RayNodeInfo]:
    out = []
    for n in ray.nodes():
        if n.get("Alive"):
            labels = n.get("Labels") or {}
            out.append(RayNodeInfo(n["NodeID"], labels.get(NODE_LABEL, n["NodeID"][:8]),
                                   "node:__internal_head__" in (n.get("Resources") or {})))
    return out


def actors_alive(actor_ids: Iterable[str]) -> dict[str, bool]:
    """Actor id (hex) -> False when the GCS says it is dead; unknown ids count as alive."""
    from ray._private.state import state

    out = {}
    for aid in actor_ids:
        try:
            info = state.actor_table(aid)
        except Exception:
            out[aid] = True
            continue
        out[aid] = (info or {}).get("State") != "DEAD" if info else True
    return out
