"""The plan of a local cluster: the ``ray start`` command of each of its raylets, and where their files go.

:func:`plan_local_cluster` turns a cluster file into one ``ray start --block`` per node (the file's first node is
the Ray head node, with the GCS and Ray's job API on free loopback ports), :func:`worker_launch` one worker's
again (``restart_worker``); :func:`ray_root` says where the raylets keep their temp dirs; :func:`with_metrics_port`
gives the head's ``/metrics`` a free port. :mod:`orchestrator.deploy.local` starts what the plan says.

Invariants:

* nothing here starts a process or writes a file: the host is read only to pick free ports (:func:`free_port`)
  and to resolve the state directory's path;
* every raylet's node address is 127.0.0.1, and so is the host of Ray's job API; each raylet
  has a temp dir of its own (``ray`` for the head node, ``r<i>`` for worker ``i``), so a job's working directory
  on one raylet is never another's cache;
* :func:`ray_root` is deterministic (``down`` finds the folder again) and every Unix socket Ray makes below it
  fits in :data:`UNIX_SOCKET_MAX` bytes, or it raises :class:`~orchestrator.core.errors.ConfigError`.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from orchestrator.core.config import ClusterConfig
from orchestrator.core.errors import ConfigError

#: Object store per raylet: small, since nothing large moves through a simulated cluster.
OBJECT_STORE_BYTES = 128 * 1024 * 1024
#: The addresses :func:`with_metrics_port` counts as loopback.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def with_metrics_port(config: ClusterConfig, ports: Callable[[], int] = free_port) -> ClusterConfig:
    """``config`` with the head's ``/metrics`` on a free port (``ports()``) when it would otherwise serve none:
    ``settings.metrics_port`` 0 (``ORCHESTRATOR_METRICS_PORT`` was applied when the config was loaded:
    ``core.config.with_environment``) and a loopback ``metrics_host`` (a port of its own on another address is
    the operator's choice). Else ``config`` as it is."""
    s = config.settings
    if s.metrics_port or s.metrics_host not in LOOPBACK_HOSTS:
        return config
    return config.model_copy(update={"settings": s.model_copy(update={"metrics_port": ports()})})


@dataclass(frozen=True, slots=True)
class NodeLaunch:
    name: str
    head: bool
    argv: tuple[str, ...]
    log: str


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    address: str
    nodes: tuple[NodeLaunch, ...]
    dashboard: str = ""  # Ray's API server (jobs, state), which runs even without the dashboard UI


#: The longest path a Unix socket may have (sun_path, less its NUL).
UNIX_SOCKET_MAX = 107
#: The longest path Ray makes below a raylet's temp dir: its session folder (date, microseconds and a pid of up to
#: 7 digits) and its object store's socket.
RAY_SESSION_TAIL = len("/session_2026-12-07_03-14-35_123456_4194304/sockets/plasma_store")
#: ... and below the folder holding our raylets' temp dirs (``r99``: the longest of their names).
_RAY_SOCKET_TAIL = len("/r99") + RAY_SESSION_TAIL


def ray_root(state_dir: Path) -> Path:
    """Where the raylets of ``state_dir``'s cluster keep their temp dirs (``ray``, ``r<i>``): ``state_dir`` itself
    when Ray's socket paths under it fit in :data:`UNIX_SOCKET_MAX` bytes, else a short folder of our own,
    ``/tmp/rgo-<8 hex of the state dir>`` (a long ``TMPDIR`` or a scenario's nested folders made the raylet
    fail with nothing but "exited during startup"). Deterministic, so ``down`` finds it again. Raises
    :class:`ConfigError` when not even that fits."""
    import hashlib

    resolved = state_dir.resolve()
    if len(str(resolved)) + _RAY_SOCKET_TAIL <= UNIX_SOCKET_MAX:
        return state_dir
    short = Path("/tmp") / f"rgo-{hashlib.sha256(str(resolved).encode()).hexdigest()[:8]}"
    if len(str(short)) + _RAY_SOCKET_TAIL > UNIX_SOCKET_MAX:
        raise ConfigError("state_dir", str(state_dir), f"a path Ray's Unix sockets fit under ({UNIX_SOCKET_MAX} bytes)")
    return short


def plan_local_cluster(config: ClusterConfig, state_dir: Path, ports: Callable[[], int] = free_port,
                       dashboard: bool = True) -> LaunchPlan:
    """The ``ray start`` command of every node; the first node of the file is the Ray head node."""
    if not config.nodes:
        raise ConfigError("nodes", [], "at least one node")
    gcs = ports()
    address = f"127.0.0.1:{gcs}"
    dashboard_url = ""
    out = []
    for i, node in enumerate(config.nodes):
        if i == 0:
            argv = _node_argv(node)
            # The dashboard process serves the job API that Ray jobs are submitted through: a free loopback port.
            api_port = ports()
            dashboard_url = f"http://127.0.0.1:{api_port}"
            argv[1:1] = ["--head", "--port", str(gcs), "--ray-client-server-port", str(ports()),
                         "--temp-dir", str(ray_root(state_dir) / "ray"), "--dashboard-host", "127.0.0.1",
                         "--dashboard-port", str(api_port), "--include-dashboard", "true" if dashboard else "false"]
            out.append(NodeLaunch(node.name, True, tuple(argv), str(state_dir / "logs" / f"{node.name}.log")))
        else:
            out.append(worker_launch(config, i, address, state_dir))
    return LaunchPlan(address, tuple(out), dashboard_url)


def _node_argv(node: Any) -> list[str]:
    """What every node's ``ray start`` says, the Ray head node's and the workers'."""
    return ["start", "--block", "--node-ip-address", "127.0.0.1",
            "--num-cpus", str(node.cpus), "--num-gpus", str(node.ray_num_gpus),  # the agent holds what no lease covers
            "--resources", json.dumps(node.ray_resources(), sort_keys=True),
            "--labels", ",".join(f"{k}={v}" for k, v in sorted(node.ray_labels().items())),
            "--object-store-memory", str(OBJECT_STORE_BYTES),
            # 0: the agent binds a port of its own and writes it to the GCS, where Ray's job API finds it.
            # A port picked here and bound later can be taken meanwhile (by any outgoing connection's local
            # port); the agent then runs without HTTP and every job submission gets "No available agent".
            "--dashboard-agent-listen-port", "0",
            "--min-worker-port", "0", "--max-worker-port", "0",
            "--disable-usage-stats"]


def worker_launch(config: ClusterConfig, i: int, address: str, state_dir: Path) -> NodeLaunch:
    """The ``ray start`` of the file's node ``i`` (not the first) joining the cluster at ``address``."""
    node = config.nodes[i]
    argv = _node_argv(node)
    # A temp dir of its own: Ray keeps runtime-env packages (a job's working_dir) in the session
    # dir, and each raylet's runtime-env agent has its own cache; on a miss an agent unpacks with
    # overwrite, deleting the directory a job on another raylet of this host runs in (its cwd
    # vanishes mid-run). One session dir per raylet, as on separate hosts. "r<i>" is no longer
    # than the head's "ray", so Ray's socket paths fit wherever the head's do.
    argv[1:1] = ["--address", address, "--temp-dir", str(ray_root(state_dir) / f"r{i}")]
    return NodeLaunch(node.name, False, tuple(argv), str(state_dir / "logs" / f"{node.name}.log"))
