"""A head actor on an integration module's cluster: what each module's ``head`` fixture starts and removes."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from orchestrator.core.config import ClusterConfig, RuntimeSettings


@contextmanager
def running_head(settings: RuntimeSettings, config: ClusterConfig, timeout: float = 120) -> Iterator[Any]:
    """A head actor (and through it one agent per node) on the module's cluster, once every agent has
    registered; afterwards all it made is removed (:func:`remove_head`). Yields the actor handle."""
    import ray

    from orchestrator.rayport import ray_api
    from orchestrator.rayport.actors import start_head

    handle = start_head(settings, config, node_id=ray_api.head_node_id())
    want = sorted(n.name for n in config.nodes)
    deadline = time.monotonic() + timeout
    try:
        while ray_api.unwrap(ray.get(handle.ping.remote()))["registered_nodes"] != want:
            assert time.monotonic() < deadline, f"agents did not register within {timeout:g}s"
            time.sleep(0.25)
        yield handle
    finally:
        remove_head(settings, config)


def remove_head(settings: RuntimeSettings, config: ClusterConfig) -> None:
    """Remove all a module's head made on the shared cluster: the head, its agents, their placement groups
    (``rayport.actors.stop_orchestrator``, as ``down`` does) and its GCS keys."""
    from orchestrator.rayport import ray_api
    from orchestrator.rayport.actors import stop_orchestrator

    stop_orchestrator(settings.namespace, settings.head_name, [n.name for n in config.nodes])
    ray_api.GcsKv(f"rgo.{settings.namespace}").delete_prefix("")


def with_class(config: ClusterConfig, name: str, **update: Any) -> ClusterConfig:
    """``config`` with priority class ``name``'s fields replaced (``min_runtime_s=0.0``: preemptible at once)."""
    classes = config.scheduler.classes
    return config.model_copy(update={"scheduler": config.scheduler.model_copy(
        update={"classes": {**classes, name: classes[name].model_copy(update=update)}})})


def until(what: str, cond: Callable[[], Any], timeout: float = 60, *, step: Callable[[], Any] | None = None,
          every_s: float = 0.1) -> Any:
    """``cond()``'s first truthy value, polled every ``every_s`` (calling ``step()`` before each look); an
    AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if step is not None:
            step()
        v = cond()
        if v:
            return v
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
