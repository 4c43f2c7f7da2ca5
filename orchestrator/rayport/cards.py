"""Who holds which card, as Ray and the agents can verify it: the reads behind ``orchestrator.bench.native``'s
checker, and the timing of an actor's start."""

from __future__ import annotations

import time
from typing import Any, Callable

import ray

from orchestrator.rayport import ray_api


def running_gpu_holders() -> list[tuple[int | None, str | None, str]]:
    """Every running Ray task and live actor that asked Ray for ``GPU``: (worker pid, placement group id, kind)."""
    from ray.util.state import list_actors, list_tasks

    def wants_gpu(need: dict[str, Any] | None) -> bool:
        return any(v for k, v in (need or {}).items() if k == "GPU" or k.startswith("GPU_group_"))

    out = [(t.get("worker_pid"), t.get("placement_group_id"), "task")
           for t in list_tasks(filters=[("state", "=", "RUNNING")], detail=True, limit=10_000,
                               raise_on_missing_output=False) if wants_gpu(t.get("required_resources"))]
    out += [(a.get("pid"), a.get("placement_group_id"), "actor")
            for a in list_actors(filters=[("state", "=", "ALIVE")], detail=True, limit=10_000,
                                 raise_on_missing_output=False) if wants_gpu(a.get("required_resources"))]
    return out


def agent_groups(namespace: str, nodes: list[str]) -> dict[str, str]:
    """Placement group id (hex) -> the lease it stands for, as each node's agent knows it (``holds.groups``)."""
    out: dict[str, str] = {}
    for node in nodes:
        try:
            info = ray.get(ray_api.get_actor(ray_api.agent_name(node), namespace).info.remote(), timeout=10)
        except Exception:  # no agent there now: its leases' groups are not known this time
            continue
        for lease_id, pg in (info.get("holds") or {}).get("groups", {}).items():
            out[pg] = lease_id
    return out


def group_state(pg_hex: str | None) -> str | None:
    """Ray's state of placement group ``pg_hex`` (``CREATED``, ``REMOVED``...); None when Ray does not know it."""
    if not pg_hex:
        return None
    from ray.util.placement_group import placement_group_table

    row = placement_group_table().get(pg_hex)
    return row.get("state") if row else None


def actor_start_ms(make: Callable[[], Any], n: int, *, seen: list[str] | None = None) -> list[float]:
    """Milliseconds from ``.remote()`` of an actor to its first answer, ``n`` times (each killed after); with
    ``seen``, each actor's node id (its ``node()``) is appended to it."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        a = make()
        ray.get(a.__ray_ready__.remote(), timeout=120)
        out.append((time.perf_counter() - t0) * 1000)
        if seen is not None:
            seen.append(ray.get(a.node.remote(), timeout=60))
        ray.kill(a)
    return out
