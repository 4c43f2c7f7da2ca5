"""Ray actors as the orchestrator uses them: finding, pinning, killing named actors; this process' own actor
and node; the workload actors scenarios and examples start.

Invariants: creating our own actors (head, agents) is :mod:`orchestrator.rayport.actors`; here a named actor
that is not there is an answer (False, None), never an error, except :func:`get_head` (``NotConnectedError``).
"""

from __future__ import annotations

from typing import Any

import ray

from orchestrator.core.errors import NotConnectedError


def pin(node_id: str, soft: bool = False) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=soft)


def get_head(namespace: str, name: str = "rgo-head") -> Any:
    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        raise NotConnectedError(f"no orchestrator head {name!r} in Ray namespace {namespace!r}") from None


def kill_named(name: str, namespace: str) -> bool:
    """Kill a named actor if it exists (no restart). True if one was killed."""
    try:
        handle = ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    ray.kill(handle, no_restart=True)
    return True


def named_actor_pid(name: str, namespace: str) -> int | None:
    """The process id of a named actor as the GCS records it (None: no such actor, or not started yet)."""
    from ray._private.state import state

    try:
        aid = ray.get_actor(name, namespace=namespace)._actor_id.hex()
        pid = (state.actor_table(aid) or {}).get("Pid")
    except Exception:
        return None
    return int(pid) if pid else None


def named_actor_record(name: str, namespace: str) -> dict[str, Any] | None:
    """What the GCS records of a named actor that may hold a lease: ``pid``, ``placement_group`` (hex, or None)
    and ``env_vars`` (its runtime env's); None when there is no such actor."""
    import json

    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    try:
        aid = ray.get_actor(name, namespace=namespace)._actor_id
        raw = state._connect_and_get_accessor().get_actor_info(aid)
    except Exception:
        return None
    if raw is None:
        return None
    rec = gcs_pb2.ActorTableData.FromString(raw)
    try:
        env = (json.loads(rec.serialized_runtime_env or "{}") or {}).get("env_vars") or {}
    except ValueError:
        env = {}
    pg = rec.placement_group_id.hex() if rec.placement_group_id and any(rec.placement_group_id) else None
    return {"pid": int(rec.pid) if rec.pid else None, "placement_group": pg, "env_vars": dict(env)}


def named_actor_alive(name: str, namespace: str) -> bool:
    """Whether a named actor exists and is not dead."""
    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    return True


def poll_ref(ref: Any) -> tuple[bool, Any]:
    """``(done, value)`` of an object ref without waiting; raises the task's error when it failed."""
    ready, _ = ray.wait([ref], timeout=0)
    return (True, ray.get(ref)) if ready else (False, None)


def current_actor_id() -> str | None:
    ctx = ray.get_runtime_context()
    return ctx.get_actor_id()


def node_ip() -> str:
    """This process' node address as Ray knows it (what other nodes reach it at)."""
    return str(ray.util.get_node_ip_address())


def current_node_id() -> str:
    return ray.get_runtime_context().get_node_id()


# ---- workload actors (scenarios and examples that start holders) ---------------------------------
def remote_class(cls: type, *, by_value: Any = None) -> Any:
    """``ray.remote(cls)``; ``by_value`` (a module) is shipped to the workers by value, for example
    modules loaded from a file path (``jobs/train.py``) that workers cannot import."""
    if by_value is not None:
        ship_by_value(by_value)
    return ray.remote(cls)


def ship_by_value(module: Any) -> None:
    """Ship ``module`` to Ray's workers by value (cloudpickle), for modules loaded from a file path that the
    workers cannot import (the examples under ``jobs/``)."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(module)


def get_actor(name: str, namespace: str) -> Any:
    return ray.get_actor(name, namespace=namespace)


def get(ref: Any, timeout: float | None = None) -> Any:
    return ray.get(ref, timeout=timeout)


def kill(actor: Any) -> None:
    ray.kill(actor, no_restart=True)


def actor_states(namespace: str, prefix: str = "") -> list[dict[str, Any]]:
    """Ray's view of the named actors in ``namespace`` (name, state, pid, and why it waits, when it does):
    what a scenario reports when an actor does not come up."""
    from ray.util.state import list_actors

    out = []
    for a in list_actors(filters=[("ray_namespace", "=", namespace)], detail=True, limit=1000):
        name = getattr(a, "name", "") or ""
        if name.startswith(prefix):
            out.append({"name": name, "state": a.state, "pid": getattr(a, "pid", None),
                        "death_cause": str(getattr(a, "death_cause", "") or "")[:200]})
    return out


def actor_gone_errors() -> tuple[type[BaseException], ...]:
    """What a call to an actor raises once the actor is dead (killed, or its node lost), or when it
    did not answer in time."""
    from ray import exceptions

    return (exceptions.RayActorError, exceptions.GetTimeoutError)
