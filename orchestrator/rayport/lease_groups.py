"""Where a lease's placement group is found, and whether a node advertises Ray's ``GPU``: the lowest layer of
the Ray-native path (``rayport/native.py`` above it, ``ray_api.actor_options`` beside it). Imports no other
``rayport`` module, so both may import it.

* :func:`lease_group` -- the group of a lease on a node, asked of that node's agent (it makes and places it);
* :func:`native_actor_options` -- actor options that run a holder inside that group, asking for its whole share;
* :func:`advertises_gpus` / :func:`advertises_any_gpus` -- whether a node (the cluster) advertises Ray's ``GPU``
  (a cluster the orchestrator manages does), cached;
* :func:`agent_name` -- the node agent's actor name.
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping

import ray

from orchestrator.control.holds import lease_group_name
from orchestrator.control.revocation import AGENT_ACTOR_PREFIX
from orchestrator.core import env as E
from orchestrator.core.backoff import backoff_s


def agent_name(node_name: str) -> str:
    """The Ray actor name of ``node_name``'s agent (in the head's namespace)."""
    return f"{AGENT_ACTOR_PREFIX}{node_name}"


#: How long a holder waits for its lease's group (the agent makes it at its next beat after the grant).
GROUP_WAIT_S = 60.0
#: Where the agents make their groups when the hand-out does not say (the head's namespace).
DEFAULT_NAMESPACE = "rgo"

_GPUS_ADVERTISED: dict[str, bool] = {}


def advertises_gpus(node_id: str) -> bool:
    """Whether Ray node ``node_id`` advertises Ray's ``GPU`` (our nodes do; the answer is cached)."""
    if node_id not in _GPUS_ADVERTISED:
        if not ray.is_initialized():
            return False
        node = next((n for n in ray.nodes() if n.get("NodeID") == node_id), None)
        if node is None:
            return False
        _GPUS_ADVERTISED[node_id] = bool((node.get("Resources") or {}).get("GPU"))
    return _GPUS_ADVERTISED[node_id]


def lease_group(node_name: str, lease_id: str, namespace: str | None = None, *,
                timeout_s: float = GROUP_WAIT_S) -> Any:
    """The placement group of lease ``lease_id`` on ``node_name``, once that node's agent has made and placed
    it (asked of the agent: a group's name is scoped to the namespace of the Ray job that made it). Raises
    ``TimeoutError`` naming the group when it is not there within ``timeout_s``."""
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup

    ns = namespace or os.environ.get(E.NAMESPACE) or DEFAULT_NAMESPACE
    deadline = time.monotonic() + timeout_s
    waits = 0
    agent = None
    woken = False
    while True:
        try:
            agent = agent or ray.get_actor(agent_name(node_name), namespace=ns)
            if not woken:  # beat now: the group is made from the heartbeat's assignments
                agent.wake.remote()
                woken = True
            pg_id = ray.get(agent.lease_group.remote(lease_id), timeout=max(1.0, deadline - time.monotonic()))
        except (ValueError, ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            agent, pg_id = None, None  # not there yet, or restarting
        if pg_id:
            return PlacementGroup(PlacementGroupID(bytes.fromhex(pg_id)))
        if time.monotonic() >= deadline:
            holds: Any = "unknown"
            try:
                holds = ray.get(agent.info.remote(), timeout=5)["holds"] if agent is not None else "no agent"
            except Exception as e:  # noqa: BLE001 -- only for the message
                holds = repr(e)
            raise TimeoutError(f"lease {lease_id}: its placement group {lease_group_name(node_name, lease_id)} is not "
                               f"placed after {timeout_s:g}s; the agent of {node_name} (namespace {ns}) makes it; "
                               f"its holds: {holds}")
        time.sleep(backoff_s(waits, 0.02, 0.05))  # the agent makes it at once when woken: look often
        waits += 1


def native_actor_options(handout: Mapping[str, Any], env: Mapping[str, str], *,
                         timeout_s: float = GROUP_WAIT_S) -> dict[str, Any]:
    """Actor options that run a holder inside its lease's group, asking for the lease's whole share."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    lease_id = handout["env_vars"][E.LEASE_ID]
    pg = lease_group(handout["node_name"], lease_id, handout["env_vars"].get(E.NAMESPACE), timeout_s=timeout_s)
    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(pg, 0, placement_group_capture_child_tasks=True),
            "num_gpus": float(handout["num_gpus"]), "num_cpus": float(handout.get("num_cpus", 0.0)),
            "runtime_env": {"env_vars": dict(env)}}



_ANY_GPUS: list[bool] = []


def advertises_any_gpus() -> bool:
    """Whether the cluster has Ray ``GPU`` at all (a cluster the orchestrator manages does); asked once."""
    if not _ANY_GPUS:
        _ANY_GPUS.append(bool(ray.cluster_resources().get("GPU")))
    return _ANY_GPUS[0]
