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

**Finding the cluster** is bounded (``ORCHESTRATOR_CONNECT_TIMEOUT_S``, default
10 s) and says why it failed. Left to itself, ``ray.init`` retries a refused
token or a dead address for 20 s or more, printing a C++ error line each
second, and then reports "no Ray cluster". :func:`connect` resolves the address
as Ray would, then makes one TCP connect and one GCS call (``GetClusterId``,
over Ray's own gRPC channel, with the token Ray would send) within the budget,
and only then calls ``ray.init``. Each failure is its own typed error:
nothing there (:class:`ClusterNotFoundError`), token refused or missing
(:class:`ClusterAuthError`, naming where the token was looked for, never the
token); a cluster without our head is found by the SDK (``HeadNotFoundError``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import ray

from orchestrator.control.nodes import RayNodeInfo
from orchestrator.core.config import CARD_RESOURCE_PREFIX, NODE_LABEL
from orchestrator.core import env as E
from orchestrator.core.errors import (ClusterAuthError, ClusterNotFoundError, InvalidRequestError, JobApiUnavailableError,
                                      NotConnectedError)
from orchestrator.rayport.lease_groups import advertises_gpus, agent_name, native_actor_options  # noqa: F401
from orchestrator.rayport.wire import unwrap

log = logging.getLogger(__name__)

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


def connect(address: str | None, namespace: str, *, timeout_s: float | None = None, source: str | None = None) -> str:
    """Connect this process as a driver (no-op when already connected); returns the cluster's GCS address.

    Finding the cluster takes at most ``timeout_s`` (default :func:`connect_timeout_s`) and fails with its
    own one-line error: :class:`ClusterNotFoundError` (nothing there, not a Ray GCS, no answer in time) or
    :class:`ClusterAuthError` (our token refused, or none to send). ``source`` says how ``address`` was
    found, for those messages. See "Finding the cluster" in the module docstring.
    """
    if ray.is_initialized():
        return str(ray.get_runtime_context().gcs_address)
    keep_loopback()
    budget = connect_timeout_s() if timeout_s is None else timeout_s
    deadline = time.monotonic() + budget
    given = address or "auto"
    source = source or given
    _refresh_auth()
    gcs, source = _resolve_address(given, source)
    _probe_gcs(gcs, source, deadline, budget)
    # ray.init replaces the driver's SIGTERM handler (with sys.exit) and Ray's core installs a C handler
    # that prints a stack: a command that turns SIGTERM into its own clean-up gets it back afterwards.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main_thread else None
    try:
        # the setup hook is a no-op but in a Serve controller the inference service starts (core.env.SERVE_LEASES)
        ray.init(address=gcs, namespace=namespace, logging_level="ERROR", log_to_driver=False,
                 configure_logging=False, runtime_env={"worker_process_setup_hook": E.SERVE_SETUP_HOOK})
    except ray.exceptions.AuthenticationError:
        raise ClusterAuthError(gcs, source, token_sources(), sent=False) from None
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ClusterNotFoundError(gcs, source, _one_line(e)) from None
    finally:
        if callable(previous):
            signal.signal(signal.SIGTERM, previous)
    return gcs


def _refresh_auth() -> None:
    """Make Ray see the auth settings the environment has now (the CLI reads them from the state file after
    Ray was imported; a process that connects twice may have turned them on or off in between)."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def disconnect() -> None:
    if ray.is_initialized():
        ray.shutdown()


#: Seconds finding the cluster may take when neither the caller nor ORCHESTRATOR_CONNECT_TIMEOUT_S says.
DEFAULT_CONNECT_TIMEOUT_S = 10.0


def connect_timeout_s(environ: Mapping[str, str] | None = None) -> float:
    """The connect budget: ``ORCHESTRATOR_CONNECT_TIMEOUT_S`` (seconds > 0), else 10 s."""
    raw = (os.environ if environ is None else environ).get(E.CONNECT_TIMEOUT_S, "").strip()
    if not raw:
        return DEFAULT_CONNECT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise InvalidRequestError(E.CONNECT_TIMEOUT_S, raw, "seconds > 0, for example 10")
    return value


def token_sources(environ: Mapping[str, str] | None = None, home: Path | None = None) -> str:
    """Where Ray looks for the auth token, in its order, what is there and which one it uses: never the token.

    Ray (2.60) takes ``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH`` names, else
    ``~/.ray/auth_token``, and sends it only when ``RAY_AUTH_MODE`` is ``token``."""
    e = os.environ if environ is None else environ
    path = e.get(E.RAY_AUTH_TOKEN_PATH)
    default = (home or Path.home()) / ".ray" / "auth_token"
    places = [("RAY_AUTH_TOKEN", bool(e.get(E.RAY_AUTH_TOKEN, "").strip()), "set", "unset"),
              (f"RAY_AUTH_TOKEN_PATH={path}" if path else "RAY_AUTH_TOKEN_PATH",
               bool(path) and _readable_token_file(Path(str(path))), "a token file",
               "no token file there" if path else "unset"),
              (str(default), _readable_token_file(default), "a token file", "absent")]
    used = next((i for i, (_, present, _, _) in enumerate(places) if present), None)
    out = [f"{name} ({(yes + ', used') if i == used else yes if present else no})"
           for i, (name, present, yes, no) in enumerate(places)]
    return "; ".join(out) + f"; RAY_AUTH_MODE={e.get(E.RAY_AUTH_MODE) or 'unset'}"


def _readable_token_file(path: Path) -> bool:
    try:
        return bool(path.read_text().strip())
    except (OSError, UnicodeDecodeError):
        return False


def _resolve_address(given: str, source: str) -> tuple[str, str]:
    """The GCS address ``given`` stands for, as ``ray.init`` would pick it (``RAY_ADDRESS`` first; ``auto``:
    the last cluster started here, else any GCS running on this machine), and ``source`` saying so when
    ``auto`` chose among several (Ray's own warning about it would be a second line). For ``auto``, token
    auth is turned on when a token exists, as ``ray.init("auto")`` does (we pass Ray the resolved address,
    for which it would not)."""
    from ray._private import services

    quiet = logging.getLogger(services.__name__)
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        gcs = str(services.get_ray_address_from_environment(given, None))
        running = len(services.find_gcs_addresses()) if given == "auto" else 0
    except ConnectionError:
        raise ClusterNotFoundError(given, source, "no Ray cluster runs on this machine; start one with "
                                                  "`orchestrator up`, or give --address HOST:PORT") from None
    finally:
        quiet.setLevel(level)
    if running > 1:
        source = f"{source}; one of {running} Ray clusters running here"
    if given == "auto" and not os.environ.get(E.RAY_AUTH_MODE):
        from ray._raylet import AuthenticationTokenLoader

        if AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
            os.environ[E.RAY_AUTH_MODE] = "token"
            _refresh_auth()
    return gcs, source


def _probe_gcs(address: str, source: str, deadline: float, budget: float) -> None:
    """Fail fast, and say why, before ``ray.init`` (whose client retries a dead address, or a refused
    token, for 20 s or more, printing a C++ error each second): one TCP connect, then one GCS call
    (``GetClusterId``) on Ray's own channel -- TLS and auth token as Ray would send them -- both within
    ``deadline``. Addresses with a scheme (``ray://``, ``http://``) are left to Ray."""
    if "://" in address:
        return
    import grpc
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=_left(deadline)).close()
    except ValueError:
        raise ClusterNotFoundError(address, source, "not a HOST:PORT address") from None
    except socket.timeout:
        raise ClusterNotFoundError(address, source, f"nothing answered within {budget:g}s") from None
    except OSError as e:
        raise ClusterNotFoundError(address, source, f"nothing listens there ({e.strerror or e})") from None
    try:
        channel = init_grpc_channel(address)
    except ray.exceptions.AuthenticationError:  # token auth is on here and no token was found to send
        raise ClusterAuthError(address, source, token_sources(), sent=False) from None
    try:
        gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
            gcs_service_pb2.GetClusterIdRequest(), timeout=_left(deadline))
    except ray.exceptions.AuthenticationError:
        raise ClusterAuthError(address, source, token_sources(), sent=False) from None
    except grpc.RpcError as e:
        code = e.code()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            from ray._private.authentication.authentication_utils import is_token_auth_enabled
            from ray._raylet import AuthenticationTokenLoader

            sent = is_token_auth_enabled() and AuthenticationTokenLoader.instance().has_token()
            raise ClusterAuthError(address, source, token_sources(), sent=sent) from None
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            detail = f"something listens there but no Ray GCS answered within {budget:g}s"
        elif code == grpc.StatusCode.UNIMPLEMENTED:
            detail = "something listens there, but not a Ray GCS"
        else:
            detail = f"the GCS call failed: {code.name} {_one_line(e.details() or '')}".strip()
        raise ClusterNotFoundError(address, source, detail) from None
    finally:
        channel.close()


def _left(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.05)


def _one_line(e: object, limit: int = 300) -> str:
    """A message that stays one line (Ray's errors carry tracebacks and help paragraphs)."""
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class GcsKv:
    """Ray's GCS internal key-value store, in one KV namespace."""

    def __init__(self, namespace: str) -> None:
        from ray.experimental import internal_kv

        self._kv = internal_kv
        self._ns = namespace

    def get(self, key: str) -> bytes | None:
        return self._kv._internal_kv_get(key, namespace=self._ns)

    def multi_get(self, keys: list[str], timeout_s: float | None = None) -> dict[str, bytes]:
        """The values of those of ``keys`` that exist, in one round trip (``timeout_s``: else Ray's own)."""
        if not keys:
            return {}
        got = self._kv.global_gcs_client.internal_kv_multi_get([k.encode() for k in keys], self._ns.encode(),
                                                               timeout=timeout_s)
        return {k.decode(): v for k, v in got.items()}

    def put(self, key: str, value: bytes) -> None:
        self._kv._internal_kv_put(key, value, overwrite=True, namespace=self._ns)

    async def aput(self, key: str, value: bytes, timeout_s: float = 10.0) -> None:
        """``put`` through Ray's asynchronous GCS client, awaited on the calling event loop (no thread: a
        thread waiting for the GIL behind a busy loop waits out Python's switch interval on every write)."""
        await self._kv.global_gcs_client.async_internal_kv_put(key.encode(), value, True, self._ns.encode(),
                                                               timeout=timeout_s)

    def delete(self, key: str) -> None:
        self._kv._internal_kv_del(key, namespace=self._ns)

    def keys(self, prefix: str) -> list[str]:
        return [k.decode() for k in self._kv._internal_kv_list(prefix, namespace=self._ns)]

    def delete_prefix(self, prefix: str) -> int:
        return int(self._kv._internal_kv_del(prefix, del_by_prefix=True, namespace=self._ns))


# ---- actors -------------------------------------------------------------------------------------
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
    if handout.get("node_id") and advertises_gpus(handout["node_id"]):
        # the lease's placement group holds its share of Ray's GPU and of each card's resource (control/holds.py):
        # a holder that does not run inside it (a job's driver, a gang's worker, a Serve replica) asks for neither
        return {"num_gpus": 0}
    cards = handout.get("resources") or {}
    if cards and handout.get("node_id") and declares_cards(handout["node_id"]):
        return {"num_gpus": 0, "resources": dict(cards)}
    return {"num_gpus": handout["num_gpus"]}


def actor_options(handout: Mapping[str, Any], *, extra_env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Ray actor options that run a holder on exactly its lease's devices (see :mod:`.handout`): inside its
    lease's placement group, asking for its share of Ray's ``GPU``, where the node advertises Ray's ``GPU``
    (:mod:`.native`; waits for the node's agent to have made the group); else its share of each card's own
    resource, pinned to the node."""
    env = dict(handout["env_vars"])
    env.update(extra_env or {})
    if E.LEASE_ID in handout["env_vars"] and advertises_gpus(handout["node_id"]):
        return native_actor_options(handout, env)
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


#: The longest one HTTP request to Ray's job API may take (Ray's client sets none: a dashboard that hangs
#: would hold the head's loop for ever). A submission that timed out is sent again under the same id.
JOB_API_TIMEOUT_S = 30.0


def job_submission_client(address: str, timeout_s: float | None = JOB_API_TIMEOUT_S) -> Any:
    """Ray's ``JobSubmissionClient`` for the job API at ``address`` (``http://host:port``), each of its HTTP
    requests bounded by ``timeout_s`` (None: Ray's own, unbounded)."""
    from ray.job_submission import JobSubmissionClient

    if timeout_s is None:
        return JobSubmissionClient(address)

    class _Bounded(JobSubmissionClient):  # type: ignore[misc]
        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", timeout_s)  # forwarded to requests.request() (Ray's documented seam)
            return super()._do_request(method, endpoint, **kwargs)

    return _Bounded(address)


def _transient(e: BaseException) -> bool:
    """Whether a job API failure may pass by itself: no answer (refused, reset, timed out), no job API
    address in the GCS yet, or an HTTP 5xx (Ray's "no available agent ... try again later"). A 4xx (a bad
    runtime_env, an invalid label selector) is not, nor an id that exists: Ray 2.60's job head relays its
    agent's 400 "already exists" as a 500, which read as "try again" had a submission that landed retried until
    its job failed."""
    import requests

    if isinstance(e, (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError, NotConnectedError)):
        return True  # (Ray's client turns a refused version check into the builtin ConnectionError)
    if isinstance(e, requests.HTTPError):
        return e.response is not None and e.response.status_code >= 500
    return (isinstance(e, RuntimeError) and str(e).startswith("Request failed with status code 5")
            and _EXISTS not in str(e))


#: Ray's only word for a submission id it has (in its job manager's ValueError, relayed in the HTTP error's text).
_EXISTS = "already exists"


@contextlib.contextmanager
def _unavailable_if_transient(submission_id: str) -> Iterator[None]:
    """A job API failure that may pass (:func:`_transient`) raised as :class:`JobApiUnavailableError`; others as they are."""
    try:
        yield
    except Exception as e:
        if _transient(e):
            raise JobApiUnavailableError(submission_id, f"{type(e).__name__}: {e}") from e
        raise


#: How long after an earlier job of a submission id ended Ray's job API may take the id again. Ray's job manager
#: watches each job's supervisor actor until it has died (a ping each second); a job put under the id before that
#: watcher has seen its old supervisor die is marked FAILED by it ("Job supervisor actor died"), and the new job's
#: own watcher is never started (one per id). Measured on a loaded 2-core machine: a reuse right after the end failed
#: every time. A job the head dropped ended ``ended_retention_s`` (>= 60 s) ago, so this waits only on a reuse
#: sooner than any retention allows.
ID_REUSE_QUIET_S = 10.0

#: The longest the head's loop waits for one status read (a GCS that is away: the last answers stand).
STATUS_READ_TIMEOUT_S = 5.0


class RayJobRunner:
    """:class:`orchestrator.control.jobs.JobRunner` over Ray's ``JobSubmissionClient``."""

    def __init__(self, address: str | None = None, timeout_s: float = JOB_API_TIMEOUT_S) -> None:
        self._address = address
        self._timeout_s = timeout_s
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = job_submission_client(self._address or api_server_url(), self._timeout_s)
        return self._client

    def submit(self, submission_id: str, entrypoint: str, runtime_env: dict[str, Any],
               label_selector: dict[str, str], handout: Mapping[str, Any], metadata: dict[str, str]) -> None:
        """:meth:`orchestrator.control.jobs.JobRunner.submit`: Ray's "already exists" for the id returns as
        taken when Ray's record of it carries our ``metadata`` (an earlier try of this submission landed);
        a record of another job under the id (one that had the same job id, dropped by the head before its
        record left Ray's table) is deleted and the submission made again, or refused while that job still
        runs, or put off (:class:`JobApiUnavailableError`) while it ended under :data:`ID_REUSE_QUIET_S` ago.
        :class:`JobApiUnavailableError` where the failure may pass (see :func:`_transient`); anything else Ray
        raised is a refusal."""
        demand = gpu_demand(handout)

        def put() -> None:
            with _unavailable_if_transient(submission_id):
                self.client.submit_job(entrypoint=entrypoint, submission_id=submission_id, runtime_env=runtime_env,
                                       entrypoint_label_selector=label_selector or None,
                                       entrypoint_num_gpus=demand["num_gpus"] or None,
                                       entrypoint_resources=demand.get("resources") or None, metadata=metadata)

        try:
            put()
            return
        except RuntimeError as e:
            if f"{submission_id} {_EXISTS}" not in str(e):
                raise
        record = self._record(submission_id)
        if record is not None:
            if all((record.metadata or {}).get(k) == v for k, v in metadata.items()):
                return  # an earlier try of ours landed
            self._clear_earlier(submission_id, record)
        put()  # once: an "already exists" now is a refusal

    def _clear_earlier(self, submission_id: str, record: Any) -> None:
        """Delete ``record``, Ray's record of an earlier job under ``submission_id``, so the id can be taken again:
        put off (:class:`JobApiUnavailableError`) while that job ended under :data:`ID_REUSE_QUIET_S` ago; a
        refusal (``RuntimeError``) where Ray will not delete it (that job still runs)."""
        if record.end_time and time.time() - record.end_time / 1000 < ID_REUSE_QUIET_S:
            raise JobApiUnavailableError(submission_id, f"Ray's job manager may still watch the earlier job under "
                                         f"this id (it ended under {ID_REUSE_QUIET_S:.0f} s ago)")
        try:
            self.delete(submission_id)  # refused while that job is not over
        except JobApiUnavailableError:
            raise
        except Exception as d:
            raise RuntimeError(f"Ray holds a job of an earlier job with this id under {submission_id} and could "
                               f"not delete it: {d}") from d

    def status(self, submission_id: str) -> str | None:
        try:
            return str(self.client.get_job_status(submission_id).value)
        except RuntimeError:
            return None

    def status_many(self, submission_ids: Sequence[str]) -> dict[str, str | None]:
        """The Ray status of each of ``submission_ids`` (None: unknown to Ray) in one read of Ray's own job
        table in the GCS, for those ids only (:func:`_job_records`).

        ``list_jobs`` reads that table whole, through the dashboard's HTTP API: a key listing and one read per
        job the cluster ever ran, every status read, on the head's loop. This is one multi-get of the jobs the
        head is waiting on."""
        records = _job_records(submission_ids, timeout_s=STATUS_READ_TIMEOUT_S)
        return {s: str(records[s].status.value) if s in records else None for s in submission_ids}

    def stop(self, submission_id: str) -> None:
        """:meth:`orchestrator.control.jobs.JobRunner.stop`: :class:`JobApiUnavailableError` where the failure may
        pass (see :func:`_transient`); Ray's refusal otherwise (no such job). A job that has ended already is
        no error (Ray answers that it did not stop it)."""
        with _unavailable_if_transient(submission_id):
            self.client.stop_job(submission_id)

    def _record(self, submission_id: str) -> Any:
        """Ray's ``JobDetails`` of ``submission_id`` through the job API (None: Ray does not have it)."""
        with _unavailable_if_transient(submission_id):
            try:
                return self.client.get_job_info(submission_id)
            except RuntimeError as e:
                if "does not exist" in str(e) or "status code 404" in str(e):
                    return None
                raise

    def delete(self, submission_id: str) -> None:
        """:meth:`orchestrator.control.jobs.JobRunner.delete`: :class:`JobApiUnavailableError` where the failure
        may pass; Ray's refusal otherwise (no such job, or not ended)."""
        with _unavailable_if_transient(submission_id):
            self.client.delete_job(submission_id)

    def logs(self, submission_id: str) -> str:
        """The job's driver log, read on the node its driver runs on; Ray's job API's answer when that node is not
        known (yet) or cannot be reached.

        Ray's job API reads the log in the session folder its agents take from the GCS: the head node's. On a
        real cluster every host has that folder path, and the driver wrote there. On one host with a session
        folder per raylet (``orchestrator up``'s local clusters; deploy/local.py) the driver of a job on any
        node but the head's wrote in its own raylet's folder, and Ray's API answered only the job manager's
        first line. So the log is read by a task on the driver's node (Ray's job record names the node), in
        that node's own folder: the file the driver wrote, on either kind of cluster."""
        node = self._driver_node(submission_id)
        if node:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            try:
                text = ray.get(_node_job_log.options(
                    num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                    submission_id), timeout=JOB_API_TIMEOUT_S)
            except Exception as e:  # the node is gone, or no worker started in time: Ray's own answer
                log.debug("could not read the log of %s on its node: %s", submission_id, e)
                text = None
            if text is not None:
                return str(text)
        return str(self.client.get_job_logs(submission_id))

    @staticmethod
    def _driver_node(submission_id: str) -> str | None:
        """The id of the node the job's driver runs (or ran) on, from Ray's job record; None before it has one."""
        record = _job_records([submission_id]).get(submission_id)
        return (record.driver_node_id or None) if record is not None else None


def _job_records(submission_ids: Sequence[str], timeout_s: float | None = None) -> dict[str, Any]:
    """Ray's record (``JobInfo``) of each of ``submission_ids`` that Ray knows, in one multi-get of Ray's job
    table in the GCS KV: the key format and the decoding are Ray's job manager's (``JobInfoStorageClient``),
    imported, not copied."""
    from ray._private import ray_constants
    from ray.dashboard.modules.job.common import JobInfo, JobInfoStorageClient

    key = JobInfoStorageClient.JOB_DATA_KEY
    got = GcsKv(ray_constants.KV_NAMESPACE_JOB.decode()).multi_get([key.format(job_id=s) for s in submission_ids],
                                                                   timeout_s=timeout_s)
    return {s: JobInfo.from_json(json.loads(got[key.format(job_id=s)])) for s in submission_ids
            if key.format(job_id=s) in got}


@ray.remote(num_cpus=0, max_retries=0)
def _node_job_log(submission_id: str) -> str | None:
    """On a job's driver node: the driver's log file in this node's session folder (None: not here)."""
    from ray.dashboard.modules.job.common import JOB_LOGS_PATH_TEMPLATE

    folder = ray._private.worker.global_worker.node.get_logs_dir_path()
    try:
        return (Path(folder) / JOB_LOGS_PATH_TEMPLATE.format(submission_id=submission_id)).read_text(errors="replace")
    except FileNotFoundError:
        return None


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


def ray_cli(argv: list[str]) -> None:
    """Run Ray's own command line (``ray start ...``) in this process, loopback kept loopback."""
    import sys

    keep_loopback()
    from ray.scripts.scripts import main

    sys.argv = ["ray", *argv]
    main()


# ---- gangs: a placement group over a gang's leases -----------------------------------------------
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
