"""Ray Serve as the leased inference service uses it: start, deploy and delete applications, call them.

The service manager (:mod:`orchestrator.serve.manager`) talks to Serve only
through here, as the rest of the orchestrator talks to Ray through
:mod:`.ray_api`. What lives here:

* :func:`start` -- Serve's controller and one HTTP proxy on the Ray head node,
  listening on ``host:port`` (127.0.0.1 by default);
  and, with ``controller_env``, the controller's environment (the orchestrator's hook reads it there: which
  head its replicas' leases are asked of);
* :func:`run` / :func:`delete` -- one application, waiting until it is
  running / gone;
* :func:`scale` -- a deployment's replica count, set from outside (Serve's external scaler API, what
  ``POST /api/v1/applications/<app>/deployments/<name>/scale`` does);
* :func:`replicas` -- a deployment's replicas with their state, id, pid and start time (what Ray's
  ``/api/serve/applications/`` shows);
* :func:`call` -- a method of an application's ingress deployment, with a timeout.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping

import ray
from ray import serve

from orchestrator.core import env as E
from orchestrator.core.errors import OrchestratorError

__all__ = ["start", "run", "delete", "call", "shutdown", "scale", "replicas"]


def start(host: str = "127.0.0.1", port: int = 8000, controller_env: Mapping[str, str] | None = None) -> str:
    """Start Serve (idempotent while it runs) with its HTTP proxy on ``host:port``; returns the base URL."""
    extra = {"controller_options": {"runtime_env": {"env_vars": dict(controller_env)}}} if controller_env else {}
    if controller_env and E.SERVE_LEASES in controller_env:
        hook = (ray.get_runtime_context().runtime_env or {}).get("worker_process_setup_hook")
        if hook not in (E.SERVE_SETUP_HOOK, E.NATIVE_WORKER_SETUP):  # the native hook's does the same there
            raise OrchestratorError(
                f"Serve's controller would not ask the orchestrator for its replicas' leases: this driver's job has "
                f"worker_process_setup_hook={hook!r}; connect with orchestrator.rayport.ray_api.connect() (or "
                f"ray.init(runtime_env={{'worker_process_setup_hook': '{E.SERVE_SETUP_HOOK}'}}))")
    serve.start(proxy_location="HeadOnly", http_options={"host": host, "port": port}, **extra)
    return f"http://{host}:{port}"


def scale(app: str, deployment: str, replicas: int) -> None:
    """Set ``app``'s ``deployment`` to ``replicas`` replicas (the application runs with ``external_scaler_enabled``)."""
    from ray.serve._private.common import DeploymentID
    from ray.serve.context import _get_global_client

    controller = _get_global_client()._controller
    ray.get(controller.update_deployment_replicas.remote(DeploymentID(name=deployment, app_name=app), int(replicas)),
            timeout=30)


def replicas(app: str, deployment: str) -> list[dict[str, Any]]:
    """``app``'s ``deployment``'s replicas: ``replica_id``, ``state`` (STARTING, RUNNING, STOPPING...), ``pid``,
    ``actor_name``, ``node_id``, ``start_time_s``; [] when there is no such application."""
    from ray.serve.context import _get_global_client

    details = _get_global_client().get_serve_details()
    dep = ((details.get("applications") or {}).get(app) or {}).get("deployments", {}).get(deployment) or {}
    return [dict(r) for r in dep.get("replicas") or []]


_DEPLOY = threading.Lock()


def run(app: Any, name: str, *, route_prefix: str | None = None, wait: bool = True,
        external_scaler: bool = False) -> Any:
    """Deploy ``app`` as application ``name``; returns its handle. ``wait``: until it runs. ``wait=False``
    only submits the deployment (Serve's internal ``_run(_blocking=False)``; the public ``serve.run`` always
    waits) so that several replicas can start together: a call through the handle then waits for it.
    Submissions are serialised (one deploy request to the controller at a time); the waiting is not."""
    if wait:
        with _DEPLOY:
            return serve.run(app, name=name, route_prefix=route_prefix, blocking=False,
                             external_scaler_enabled=external_scaler)
    from ray.serve.api import _run

    with _DEPLOY:
        return _run(app, _blocking=False, name=name, route_prefix=route_prefix, external_scaler_enabled=external_scaler)


def delete(name: str) -> None:
    """Delete application ``name`` and wait until its replicas are gone (idempotent)."""
    serve.delete(name, _blocking=True)


def call(handle: Any, method: str, *args: Any, timeout_s: float = 30.0) -> Any:
    """``handle.<method>.remote(*args)`` and its result within ``timeout_s``."""
    return getattr(handle, method).remote(*args).result(timeout_s=timeout_s)


def shutdown() -> None:
    serve.shutdown()
