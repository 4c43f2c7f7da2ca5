"""Placement groups: a gang's over its granted leases and its workers' actor options; removing an orchestrator's.

Invariants: a gang bundle holds exactly its lease's devices on its lease's node (a per-bundle label selector),
so Ray keeps the ledger's devices for the gang; :func:`remove_named_groups` removes only groups whose names
start with the prefixes it is given (an orchestrator's are named by their node), never a user's own.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import ray

from orchestrator.rayport.lease_groups import advertises_gpus


def gang_placement_group(handouts: list[Mapping[str, Any]], name: str, timeout: float = 120.0) -> Any:
    """A placement group with one bundle per worker of a granted gang, in worker order: each bundle holds
    its lease's cards (``rgo-gpu-<i>``) and CPUs on its lease's node (a per-bundle label selector on Ray's
    node id), so Ray keeps exactly the ledger's devices for the gang. Waits until it is placed; raises
    ``TimeoutError`` (after removing it) when Ray cannot place it within ``timeout``."""
    from ray.util.placement_group import placement_group, remove_placement_group

    from orchestrator.control.handout import gang_bundle_pin

    pg = placement_group([_gang_bundle(h) for h in handouts], strategy="PACK", name=name,
                         bundle_label_selector=[gang_bundle_pin(h) for h in handouts])
    try:
        ray.get(pg.ready(), timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        raise TimeoutError(f"placement group {name} not placed within {timeout:g}s") from None
    return pg


def _gang_bundle(h: Mapping[str, Any]) -> dict[str, float]:
    """A gang worker's bundle: on a node whose agent holds Ray's GPU, its lease's group holds the devices already
    (control/holds.py), so the bundle keeps the worker's CPUs only (and its node, by label)."""
    from orchestrator.control.handout import gang_bundle
    if advertises_gpus(h["node_id"]):
        return gang_bundle({**h, "resources": {}, "num_gpus": 0})
    return gang_bundle(h)


def remove_gang_placement_group(pg: Any) -> None:
    from ray.util.placement_group import remove_placement_group

    remove_placement_group(pg)


def bundle_actor_options(pg: Any, index: int, handout: Mapping[str, Any], *,
                         extra_env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Ray actor options that run worker ``index`` of a gang inside its bundle, with its lease's device
    environment (``CUDA_VISIBLE_DEVICES``...) and the bundle's resources."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundle = _gang_bundle(handout)
    env = dict(handout["env_vars"])
    env.update(extra_env or {})
    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index),
            "num_cpus": bundle.pop("CPU", 0.0), "num_gpus": bundle.pop("GPU", 0.0), "resources": bundle,
            "runtime_env": {"env_vars": env}}


def remove_named_groups(prefixes: Sequence[str]) -> list[str]:
    """Remove every live placement group whose name starts with one of ``prefixes``; the names removed.

    Group names are the cluster's, not a namespace's: an agent's holds and lease groups are named by its node
    (``control/holds.py``) and its successor adopts whatever it finds for that node, whoever made it (one
    orchestrator per node, as one device plugin per node), so its groups are found the way it finds them."""
    from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

    wanted = tuple(prefixes)
    removed: list[str] = []
    for pg_id, row in placement_group_table().items():
        name = row.get("name") or ""
        if row.get("state") == "REMOVED" or not name.startswith(wanted):
            continue
        remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))
        removed.append(name)
    return sorted(removed)
