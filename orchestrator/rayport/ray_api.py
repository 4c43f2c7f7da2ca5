"""Ray's primitives as the orchestrator uses them, in one thin module.

Nothing outside :mod:`orchestrator.rayport` (bar the SDK's ``connect`` and
the Serve app) imports ``ray``: the controller, the agent core, discovery,
handout and the launcher's command building are plain code, unit-tested
without Ray. What lives here:

* connecting a driver (:func:`connect`), keeping loopback addresses loopback
  (:func:`keep_loopback`, see below);
* the GCS key-value store (:class:`GcsKv`);
* finding and killing named actors (:func:`get_head`, :func:`kill_named`;
  creating them is :mod:`.actors`);
* reading the GCS node and actor tables (:func:`alive_nodes`, :func:`actors_alive`);
* turning a lease's handout into actor options (:func:`actor_options`);
* Ray's job API (:class:`RayJobRunner`, :func:`job_submission_client`).

**Loopback.** Ray 2.60 rewrites ``127.0.0.1`` given as a node or bootstrap
address to the host's outward IP (``services.resolve_ip_for_localhost``;
ray-project/ray#59110), so a cluster asked to stay on loopback would not.
:func:`keep_loopback` makes loopback addresses resolve to themselves; the
launcher's raylets (:mod:`orchestrator.deploy.raylet`) and our drivers call
it before Ray does anything.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

import ray

from orchestrator.control.nodes import RayNodeInfo
from orchestrator.core.config import CARD_RESOURCE_PREFIX, NODE_LABEL
from orchestrator.core.errors import NotConnectedError
from orchestrator.rayport.wire import unwrap

__all__ = [
    "keep_loopback", "connect", "disconnect", "GcsKv", "get_head", "kill_named", "pin",
    "alive_nodes", "actors_alive", "actor_options", "unwrap", "agent_name", "RayJobRunner", "job_submission_client",
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
            res = n.get("Resources") or {}
            if not res.get("GPU") and not any(k.startswith(CARD_RESOURCE_PREFIX) for k in res):
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


def node_ip() -> str:
    """This process' node address as Ray knows it (what other nodes reach it at)."""
    return str(ray.util.get_node_ip_address())


def current_node_id() -> str:
    return ray.get_runtime_context().get_node_id()


# ---- lease -> actor options ---------------------------------------------------------------------
_CARDS_DECLARED: dict[str, bool] = {}


def declares_cards(node_id: str) -> bool:
    """Whether the Ray node declares one ``rgo-gpu-<i>`` resource per card (what ``orchestrator up`` and our
    KubeRay manifests start). A node's resources are fixed for its life, so the answer is cached. Without a
    Ray connection nothing can be placed anyway: the answer is then no."""
    if node_id not in _CARDS_DECLARED:
        if not ray.is_initialized():
            return False
        node = next((n for n in ray.nodes() if n.get("NodeID") == node_id), None)
        if node is None:
            return False  # not cached: the node may not have registered yet
        _CARDS_DECLARED[node_id] = any(k.startswith(CARD_RESOURCE_PREFIX) for k in node.get("Resources") or {})
    return _CARDS_DECLARED[node_id]


def gpu_demand(handout: Mapping[str, Any]) -> dict[str, Any]:
    """What a lease's holder asks Ray for its devices: its share of each card's own resource where the node
    declares them (exact: whatever the ledger granted, Ray can place), else the share of Ray's ``GPU``."""
    cards = handout.get("resources") or {}
    if cards and declares_cards(handout["node_id"]):
        return {"num_gpus": 0, "resources": dict(cards)}
    return {"num_gpus": handout["num_gpus"]}


def actor_options(handout: Mapping[str, Any], *, extra_env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Ray actor options that run a holder on exactly its lease's devices (see :mod:`.handout`)."""
    env = dict(handout["env_vars"])
    env.update(extra_env or {})
    return {"scheduling_strategy": pin(handout["node_id"], soft=False), **gpu_demand(handout),
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


def job_submission_client(address: str) -> Any:
    """Ray's ``JobSubmissionClient`` for the job API at ``address`` (``http://host:port``)."""
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(address)


class RayJobRunner:
    """:class:`orchestrator.control.jobs.JobRunner` over Ray's ``JobSubmissionClient``."""

    def __init__(self, address: str | None = None) -> None:
        self._address = address
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = job_submission_client(self._address or api_server_url())
        return self._client

    def submit(self, submission_id: str, entrypoint: str, runtime_env: dict[str, Any],
               label_selector: dict[str, str], handout: Mapping[str, Any], metadata: dict[str, str]) -> None:
        demand = gpu_demand(handout)
        self.client.submit_job(entrypoint=entrypoint, submission_id=submission_id, runtime_env=runtime_env,
                               entrypoint_label_selector=label_selector or None,
                               entrypoint_num_gpus=demand["num_gpus"] or None,
                               entrypoint_resources=demand.get("resources") or None, metadata=metadata)

    def status(self, submission_id: str) -> str | None:
        try:
            return str(self.client.get_job_status(submission_id).value)
        except RuntimeError:
            return None

    def stop(self, submission_id: str) -> None:
        self.client.stop_job(submission_id)

    def logs(self, submission_id: str) -> str:
        return str(self.client.get_job_logs(submission_id))


# ---- workload actors (scenarios and examples that start holders) ---------------------------------
def remote_class(cls: type, *, by_value: Any = None) -> Any:
    """``ray.remote(cls)``; ``by_value`` (a module) is shipped to the workers by value, for example
    modules loaded from a file path (``jobs/train.py``) that workers cannot import."""
    if by_value is not None:
        from ray import cloudpickle

        cloudpickle.register_pickle_by_value(by_value)
    return ray.remote(cls)


def get_actor(name: str, namespace: str) -> Any:
    return ray.get_actor(name, namespace=namespace)


def get(ref: Any, timeout: float | None = None) -> Any:
    return ray.get(ref, timeout=timeout)


def kill(actor: Any) -> None:
    ray.kill(actor, no_restart=True)


def actor_gone_errors() -> tuple[type[BaseException], ...]:
    """What a call to an actor raises once the actor is dead (killed, or its node lost), or when it
    did not answer in time."""
    from ray import exceptions

    return (exceptions.RayActorError, exceptions.GetTimeoutError)


def ray_cli(argv: list[str]) -> None:
    """Run Ray's own command line (``ray start ...``) in this process, loopback kept loopback."""
    import sys

    keep_loopback()
    from ray.scripts.scripts import main

    sys.argv = ["ray", *argv]
    main()
