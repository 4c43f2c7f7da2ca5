"""Gangs: a placement group over a granted gang's leases, and its workers' actor options.

Invariant: a bundle holds exactly its lease's devices on its lease's node (a per-bundle label selector),
so Ray keeps the ledger's devices for the gang.
"""

from __future__ import annotations

from typing import Any, Mapping

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
