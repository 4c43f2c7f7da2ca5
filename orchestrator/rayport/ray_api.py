"""Every Ray call of the runtime, in one thin layer.

Nothing else under :mod:`orchestrator.runtime` imports ``ray``: the
controller, the agent core, discovery, handout and the launcher's command
building are plain code, unit-tested without Ray. What lives here:

* connecting a driver (:func:`connect`), keeping loopback addresses loopback
  (:func:`keep_loopback`, see below);
* the GCS key-value store (:class:`GcsKv`);
* creating, finding and killing the head and agent actors
  (:func:`start_head`, :func:`get_head`, :func:`start_agent`, :func:`kill_named`);
* reading the GCS node and actor tables (:func:`alive_nodes`, :func:`actors_alive`);
* turning a lease's handout into actor options (:func:`actor_options`);
* :class:`HeadClient`, which calls the head and raises its typed errors again.

**Loopback.** Ray 2.60 rewrites ``127.0.0.1`` given as a node or bootstrap
address to the host's outward IP (``services.resolve_ip_for_localhost``;
ray-project/ray#59110), so a cluster asked to stay on loopback would not.
:func:`keep_loopback` makes loopback addresses resolve to themselves; the
launcher's raylets (:mod:`orchestrator.deploy.raylet`) and our drivers call
it before Ray does anything.
"""

from __future__ import annotations

import os
import time
from typing import Any, Iterable, Mapping

import ray

from orchestrator.core.errors import NotConnectedError
from orchestrator.core.config import NODE_LABEL, ClusterConfig, RuntimeSettings
from orchestrator.control.controller import RayNodeInfo
from orchestrator.rayport.wire import unwrap

__all__ = [
    "keep_loopback", "connect", "disconnect", "GcsKv", "start_head", "get_head", "start_agent", "kill_named",
    "alive_nodes", "actors_alive", "actor_options", "HeadClient", "unwrap", "agent_name",
]


def keep_loopback() -> None:
    """Make Ray resolve loopback addresses to themselves (idempotent); see the module docstring."""
    from ray._private import services

    # The same patch the cluster's own processes get from rayport/loopback/sitecustomize.py.
    from orchestrator.rayport.loopback.sitecustomize import patch_services

    patch_services(services)


def connect(address: str | None, namespace: str) -> None:
    """Connect this process as a driver (no-op when already connected). Raises :class:`NotConnectedError`."""
    if ray.is_initialized():
        return
    keep_loopback()
    if address and address != "auto" and ":" in address:
        import socket

        host, _, port = address.rpartition(":")
        try:  # fail fast: ray.init retries a dead address for a minute
            socket.create_connection((host, int(port)), timeout=2.0).close()
        except (OSError, ValueError) as e:
            raise NotConnectedError(f"no Ray cluster at {address}: {e}") from None
    _refresh_auth()
    try:
        ray.init(address=address or "auto", namespace=namespace, logging_level="ERROR", log_to_driver=False,
                 configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise NotConnectedError(f"no Ray cluster at {address or 'auto'}: {e}") from None


def _refresh_auth() -> None:
    """Make Ray see auth settings put in the environment after it was imported (the CLI reads them from the state file)."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        return
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def disconnect() -> None:
    if ray.is_initialized():
        ray.shutdown()


class GcsKv:
    """Ray's GCS internal key-value store, in one KV namespace."""

    def __init__(self, namespace: str) -> None:
        from ray.experimental import internal_kv

        self._kv = internal_kv
        self._ns = namespace

    def get(self, key: str) -> bytes | None:
        return self._kv._internal_kv_get(key, namespace=self._ns)

    def put(self, key: str, value: bytes) -> None:
        self._kv._internal_kv_put(key, value, overwrite=True, namespace=self._ns)

    def delete(self, key: str) -> None:
        self._kv._internal_kv_del(key, namespace=self._ns)

    def keys(self, prefix: str) -> list[str]:
        return [k.decode() for k in self._kv._internal_kv_list(prefix, namespace=self._ns)]

    def delete_prefix(self, prefix: str) -> int:
        return int(self._kv._internal_kv_del(prefix, del_by_prefix=True, namespace=self._ns))


# ---- actors -------------------------------------------------------------------------------------
def agent_name(node_name: str) -> str:
    return f"rgo-agent-{node_name}"


def _pin(node_id: str, soft: bool = False) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=soft)


def start_head(settings: RuntimeSettings, cluster: ClusterConfig, *, node_id: str | None = None) -> Any:
    """Create the detached head actor (or return the running one: ``get_if_exists``).

    ``max_restarts=-1``: Ray restarts a head that dies, and it resumes from the GCS
    store; ``max_task_retries=-1``: calls in flight across a restart are retried,
    which is safe because every state-changing method is idempotent.
    """
    from orchestrator.rayport.head import HeadActor

    opts: dict[str, Any] = dict(name=settings.head_name, namespace=settings.namespace, lifetime="detached",
                                get_if_exists=True, max_restarts=-1, max_task_retries=-1, num_cpus=0,
                                max_concurrency=1000)
    if node_id:
        opts["scheduling_strategy"] = _pin(node_id, soft=True)  # the Ray head node, while it stands
    return ray.remote(HeadActor).options(**opts).remote(settings.model_dump(mode="json"), cluster.model_dump(mode="json"))


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


def start_agent(node_name: str, ray_node_id: str, settings: RuntimeSettings, sim_node: Mapping[str, Any] | None) -> Any:
    """Create the detached agent of one node, pinned there (``soft=False``).

    An older agent of the node that is still alive but silent is killed first;
    Ray frees the name once the old actor is dead, so creation is retried briefly.
    """
    from orchestrator.control.agent import AgentActor

    name = agent_name(node_name)
    kill_named(name, settings.namespace)
    opts = dict(name=name, namespace=settings.namespace, lifetime="detached", max_restarts=0, num_cpus=0,
                scheduling_strategy=_pin(ray_node_id, soft=False))
    cls = ray.remote(AgentActor).options(**opts)
    deadline = time.monotonic() + 5.0
    while True:
        try:
            return cls.remote(node_name, ray_node_id, settings.model_dump(mode="json"), dict(sim_node) if sim_node else None)
        except ValueError:  # the name is still held by the actor just killed
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# ---- the GCS tables -----------------------------------------------------------------------------
def alive_nodes() -> list[RayNodeInfo]:
    """Live Ray nodes that should have an agent: those labelled with our node label, or with GPUs."""
    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        labels = n.get("Labels") or {}
        name = labels.get(NODE_LABEL)
        if name is None:
            if not n.get("Resources", {}).get("GPU"):
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


def current_actor_id() -> str | None:
    ctx = ray.get_runtime_context()
    return ctx.get_actor_id()


def current_node_id() -> str:
    return ray.get_runtime_context().get_node_id()


# ---- lease -> actor options ---------------------------------------------------------------------
def actor_options(handout: Mapping[str, Any], *, extra_env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Ray actor options that run a holder on exactly its lease's devices (see :mod:`.handout`)."""
    env = dict(handout["env_vars"])
    env.update(extra_env or {})
    return {"scheduling_strategy": _pin(handout["node_id"], soft=False), "num_gpus": handout["num_gpus"],
            "num_cpus": handout.get("num_cpus", 0.0), "runtime_env": {"env_vars": env}}


# ---- Ray jobs (the job layer's JobRunner) -------------------------------------------------------
def api_server_url() -> str:
    """The cluster's job API (dashboard) URL, as Ray itself records it in the GCS."""
    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(ray_constants.DASHBOARD_ADDRESS, namespace=ray_constants.KV_NAMESPACE_DASHBOARD)
    if not raw:
        raise NotConnectedError("the cluster's job API address is not in the GCS (is the dashboard/API server up?)")
    return "http://" + (raw.decode() if isinstance(raw, bytes) else str(raw))


class RayJobRunner:
    """:class:`orchestrator.control.jobs.JobRunner` over Ray's ``JobSubmissionClient``."""

    def __init__(self, address: str | None = None) -> None:
        self._address = address
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            self._client = JobSubmissionClient(self._address or api_server_url())
        return self._client

    def submit(self, submission_id: str, entrypoint: str, runtime_env: dict[str, Any],
               entrypoint_resources: dict[str, float], entrypoint_num_gpus: float, metadata: dict[str, str]) -> None:
        self.client.submit_job(entrypoint=entrypoint, submission_id=submission_id, runtime_env=runtime_env,
                               entrypoint_resources=entrypoint_resources or None,
                               entrypoint_num_gpus=entrypoint_num_gpus or None, metadata=metadata)

    def status(self, submission_id: str) -> str | None:
        try:
            return str(self.client.get_job_status(submission_id).value)
        except RuntimeError:
            return None

    def stop(self, submission_id: str) -> None:
        self.client.stop_job(submission_id)

    def logs(self, submission_id: str) -> str:
        return str(self.client.get_job_logs(submission_id))


def checkpoint_actor(name: str, namespace: str, directory: str) -> Any:
    """Ask a named holder actor implementing ``checkpoint(dir) -> path`` to checkpoint; returns the ref."""
    return ray.get_actor(name, namespace=namespace).checkpoint.remote(directory)


# ---- the head, as a client sees it --------------------------------------------------------------
class HeadClient:
    """Calls the head actor and raises its typed errors (never ``RayTaskError``) again."""

    def __init__(self, namespace: str = "rgo", name: str = "rgo-head", handle: Any = None) -> None:
        self.handle = handle if handle is not None else get_head(namespace, name)

    def call(self, method: str, *args: Any, timeout: float | None = 60.0, **kwargs: Any) -> Any:
        ref = getattr(self.handle, method).remote(*args, **kwargs)
        try:
            reply = ray.get(ref, timeout=timeout)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
            raise NotConnectedError(f"orchestrator head did not answer {method}: {type(e).__name__}") from None
        return unwrap(reply)

    def request_lease(self, lease_request: Mapping[str, Any]) -> str:
        return self.call("request_lease", dict(lease_request))

    def get_lease(self, lease_id: str) -> dict[str, Any]:
        return self.call("get_lease", lease_id)

    def wait_lease(self, lease_id: str, timeout: float) -> dict[str, Any]:
        return self.call("wait_lease", lease_id, timeout, timeout=timeout + 30)

    def activate(self, lease_id: str, token: int, holder: str | None = None) -> dict[str, Any]:
        return self.call("activate", lease_id, token, holder)

    def release(self, lease_id: str, token: int | None, reason: str = "released by its holder") -> dict[str, Any]:
        return self.call("release", lease_id, token, reason)

    def status(self) -> dict[str, Any]:
        return self.call("status")

    # jobs
    def submit_job(self, spec: Mapping[str, Any], job_id: str | None = None) -> dict[str, Any]:
        return self.call("submit_job", dict(spec), job_id)

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self.call("get_job", job_id)

    def list_jobs(self) -> list[dict[str, Any]]:
        return self.call("list_jobs")

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        return self.call("cancel_job", job_id)

    def job_logs(self, job_id: str) -> str:
        return self.call("job_logs", job_id)

    def explain_job(self, job_id: str) -> dict[str, Any]:
        return self.call("explain_job", job_id)

    def job_preemption_requested(self, job_id: str) -> dict[str, Any]:
        return self.call("job_preemption_requested", job_id)

    def job_ack_checkpoint(self, job_id: str, path: str, step: int | None = None) -> dict[str, Any]:
        return self.call("job_ack_checkpoint", job_id, path, step)


def ray_cli(argv: list[str]) -> None:
    """Run Ray's own command line (``ray start ...``) in this process, loopback kept loopback."""
    import sys

    keep_loopback()
    from ray.scripts.scripts import main

    sys.argv = ["ray", *argv]
    main()
