"""A head actor on an integration module's cluster: what each module's ``head`` fixture starts and removes."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

from orchestrator.core.config import ClusterConfig, RuntimeSettings


@contextmanager
def running_head(settings: RuntimeSettings, config: ClusterConfig, timeout: float = 120) -> Iterator[Any]:
    """A head actor (and through it one agent per node) on the module's cluster, once every agent has
    registered; afterwards the head, its agents and its GCS keys are removed. Yields the actor handle."""
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
        for node in config.nodes:
            ray_api.kill_named(ray_api.agent_name(node.name), settings.namespace)
        ray_api.kill_named(settings.head_name, settings.namespace)
        ray_api.GcsKv(f"rgo.{settings.namespace}").delete_prefix("")
