"""Ray Serve as the leased inference service uses it: start, deploy and delete applications, call them.

The service manager (:mod:`orchestrator.serve.manager`) talks to Serve only
through here, as the rest of the orchestrator talks to Ray through
:mod:`.ray_api`. What lives here:

* :func:`start` -- Serve's controller and one HTTP proxy on the Ray head node,
  listening on ``host:port`` (127.0.0.1 by default);
* :func:`replica_options` -- a lease's hand-out as Serve ``ray_actor_options``:
  Serve refuses ``scheduling_strategy`` and ``name`` (which
  :func:`.ray_api.actor_options` sets), so the replica is pinned to the
  lease's node with a ``label_selector`` on the node's name label instead;
  its card through the same share of ``rgo-gpu-<i>`` as any holder;
* :func:`run` / :func:`delete` -- one application, waiting until it is
  running / gone;
* :func:`call` -- a method of an application's ingress deployment, with a timeout.
"""

from __future__ import annotations

import threading

from typing import Any, Mapping

from ray import serve

from orchestrator.core.config import NODE_LABEL
from orchestrator.rayport.ray_api import gpu_demand

__all__ = ["start", "replica_options", "run", "delete", "call", "app_handle", "shutdown", "status"]


def start(host: str = "127.0.0.1", port: int = 8000) -> str:
    """Start Serve (idempotent while it runs) with its HTTP proxy on ``host:port``; returns the base URL."""
    serve.start(proxy_location="HeadOnly", http_options={"host": host, "port": port})
    return f"http://{host}:{port}"


def replica_options(handout: Mapping[str, Any], node_name: str, *, num_cpus: float = 0.0,
                    extra_env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Serve ``ray_actor_options`` that run one replica on exactly the lease's devices, on its node."""
    env = {**dict(handout["env_vars"]), **dict(extra_env or {})}
    return {**gpu_demand(handout), "num_cpus": num_cpus, "label_selector": {NODE_LABEL: node_name},
            "runtime_env": {"env_vars": env}}


_DEPLOY = threading.Lock()


def run(app: Any, name: str, *, route_prefix: str | None = None, wait: bool = True) -> Any:
    """Deploy ``app`` as application ``name``; returns its handle. ``wait``: until it runs. ``wait=False``
    only submits the deployment (Serve's internal ``_run(_blocking=False)``; the public ``serve.run`` always
    waits) so that several replicas can start together: a call through the handle then waits for it.
    Submissions are serialised (one deploy request to the controller at a time); the waiting is not."""
    if wait:
        with _DEPLOY:
            return serve.run(app, name=name, route_prefix=route_prefix, blocking=False)
    from ray.serve.api import _run

    with _DEPLOY:
        return _run(app, _blocking=False, name=name, route_prefix=route_prefix)


def delete(name: str) -> None:
    """Delete application ``name`` and wait until its replicas are gone (idempotent)."""
    serve.delete(name, _blocking=True)


def app_handle(name: str) -> Any:
    return serve.get_app_handle(name)


def call(handle: Any, method: str, *args: Any, timeout_s: float = 30.0) -> Any:
    """``handle.<method>.remote(*args)`` and its result within ``timeout_s``."""
    return getattr(handle, method).remote(*args).result(timeout_s=timeout_s)


def status() -> dict[str, str]:
    """Each application's Serve status (RUNNING, DEPLOYING, ...)."""
    return {name: str(app.status) for name, app in serve.status().applications.items()}


def shutdown() -> None:
    serve.shutdown()
