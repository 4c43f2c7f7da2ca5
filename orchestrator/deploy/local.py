"""Starting and stopping the orchestrator: ``orchestrator up`` / ``down``.

``up --config FILE`` starts a local Ray cluster on 127.0.0.1 -- one raylet per
node of the file, each a ``ray start --block`` with ``--num-gpus``,
``--resources`` and ``--labels`` (:func:`plan_local_cluster`) -- then the head
actor, which starts one agent per node; it waits until every agent has
registered and prints the address. ``up --address ADDR`` attaches to a Ray
cluster that already runs and starts only the head (and through it the agents).
A local cluster always serves the head's Prometheus ``/metrics``: on a free
127.0.0.1 port when the config names none (:func:`with_metrics_port`), shown
as ``metrics_url`` by ``status``.

``down`` stops exactly what ``up`` started, never ``ray stop`` (which kills
every Ray process on the host, other people's included):

* every raylet runs in its own session (``setsid``); Ray's processes for that
  node -- GCS, raylet, agents, workers -- stay in it. The state file records
  each ``ray start`` PID, its session id and its start time (so a recycled PID
  is never signalled);
* every process of the cluster carries ``ORCHESTRATOR_RUN=<run id>`` in its
  environment (the run id is in the state file): Ray starts job drivers in
  sessions of their own, and this marker finds them;
* ``down`` sends SIGTERM to each ``ray start`` (Ray drains and stops the
  node's processes; when a ``ray start`` is gone, to what is left of its
  session), waits, then SIGKILLs whatever is left in those sessions or carries
  the marker (:func:`leftovers`); for an attached cluster it kills only the
  head and agent actors. It works from the state file alone, so it cleans up
  after an ``up`` that was SIGKILLed.

Signals (docs/signals.md): before its first raylet, ``up_local`` starts a
watchdog (:mod:`orchestrator.deploy.watchdog`) that runs ``down`` if the
command dies without saying otherwise. ``orchestrator up`` tells it to let the
cluster outlive the command (``outlive=True``); a demo, a scenario or a bench
keeps it armed until its own ``down``.

Everything ``up`` writes -- the state file, raylet logs, Ray's session
directories (``RAY_TMPDIR``), the auth token it had to make -- lives in one
state directory (``--state-dir``, default ``$TMPDIR/rgo-<uid>``), which
``down`` removes.

Auth: Ray 2.60 turns token auth on for local clusters. ``up`` keeps it on: it
uses ``RAY_AUTH_TOKEN``/``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token`` when
one exists, else makes a token inside the state directory (not in ``~/.ray``)
and records where, so ``status`` and ``down`` connect with it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from orchestrator.core.config import ClusterConfig, raylet_native_env
from orchestrator.core.errors import ConfigError, NotConnectedError, OrchestratorError
from orchestrator.core.credentials import admin_key_for, head_secret_for, use_admin_key
from orchestrator.core.statefile import Proc, State, checked_state_dir
from orchestrator.rayport.loopback import LOOPBACK_SITE

#: The folder the running ``orchestrator`` package was imported from -- a checkout, site-packages, a mutation
#: tester's copy -- put first on the cluster's ``PYTHONPATH`` so every process of it runs this same code.
CODE_ROOT = Path(sys.modules["orchestrator"].__path__[0]).resolve().parent
#: Object store per raylet: small, since nothing large moves through a simulated cluster.
OBJECT_STORE_BYTES = 128 * 1024 * 1024
Progress = Callable[[str], None]
#: The environment variable that marks every process of one local cluster (its value: the state's run id).
RUN_MARKER = "ORCHESTRATOR_RUN"
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


# ---- the plan (pure) ---------------------------------------------------------------------------
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


def auth_env(state_dir: Path, environ: dict[str, str] | None = None, home: Path | None = None) -> dict[str, str]:
    """The token-auth environment for our raylets and clients (see the module docstring).

    May write ``<state_dir>/auth_token``; never writes outside ``state_dir``.
    """
    environ = dict(os.environ if environ is None else environ)
    if environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return {"RAY_AUTH_MODE": "disabled"}  # the user's explicit choice
    env = {"RAY_AUTH_MODE": "token"}
    if environ.get("RAY_AUTH_TOKEN") or environ.get("RAY_AUTH_TOKEN_PATH"):
        if environ.get("RAY_AUTH_TOKEN_PATH"):
            env["RAY_AUTH_TOKEN_PATH"] = environ["RAY_AUTH_TOKEN_PATH"]
        return env
    if ((home or Path.home()) / ".ray" / "auth_token").is_file():
        return env
    token = state_dir / "auth_token"
    if not token.exists():
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    env["RAY_AUTH_TOKEN_PATH"] = str(token)
    return env


# ---- /proc -------------------------------------------------------------------------------------
def _stat(pid: int) -> tuple[int, int] | None:
    """(session id, start time in clock ticks) of a live process, None if it is gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    if fields[0] == "Z":
        return None
    return int(fields[3]), int(fields[19])  # session (field 6), starttime (field 22)


def session_members(sid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None and st[0] == sid:
                out.append(int(entry))
    return sorted(out)


def _same_process(p: Proc) -> bool:
    st = _stat(p.pid)
    return st is not None and st[1] == p.start_ticks


@dataclass(frozen=True, slots=True)
class ProcInfo:
    """One live process as ``down`` sees it: its session, start time and run marker (None: none, or unreadable)."""

    pid: int
    sid: int
    start_ticks: int
    run: str | None = None


def _run_marker(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()  # the environment it started with; others' are unreadable
    except OSError:
        return None
    prefix = RUN_MARKER.encode() + b"="
    for entry in raw.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix):].decode(errors="replace")
    return None


def process_table() -> list[ProcInfo]:
    """Every live process of the host, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                out.append(ProcInfo(int(entry), st[0], st[1], _run_marker(int(entry))))
    return out


def leftovers(state: State, table: list[ProcInfo], me: int) -> list[int]:
    """The pids ``down`` SIGKILLs once its SIGTERMs had their grace. Pure.

    A process is ours when it is in the session of a recorded ``ray start`` -- unless that session's leader
    is alive with another start time (the session id, a pid, was reused: someone else's session) -- or
    when it carries this run's marker. Never ``me`` (the process running ``down``) nor the watchdog.
    """
    by_pid = {p.pid: p for p in table}
    sessions = set()
    for p in state.processes:
        leader = by_pid.get(p.sid)
        if leader is None or leader.start_ticks == p.start_ticks:
            sessions.add(p.sid)
    spare = {me} | ({state.watchdog.pid} if state.watchdog is not None else set())
    return sorted(p.pid for p in table if p.pid not in spare
                  and (p.sid in sessions or (state.run_id and p.run == state.run_id)))


# ---- up ----------------------------------------------------------------------------------------
def _spawn(node: NodeLaunch, env: dict[str, str], cwd: Path) -> Proc:
    Path(node.log).parent.mkdir(parents=True, exist_ok=True)
    with open(node.log, "ab") as log:
        p = subprocess.Popen([sys.executable, "-m", "orchestrator.deploy.raylet", *node.argv], env=env,
                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                             start_new_session=True)
    for _ in range(50):
        st = _stat(p.pid)
        if st is not None:
            return Proc(node.name, p.pid, st[0], st[1])
        time.sleep(0.01)
    raise OrchestratorError(f"raylet of {node.name} exited at once; see {node.log}")


def _loopback_env(environ: dict[str, str]) -> dict[str, str]:
    """What keeps a process of ours (a raylet, a job's driver, a user's script) on 127.0.0.1 (rayport/loopback),
    ``environ``'s own ``PYTHONPATH`` kept after ours."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (LOOPBACK_SITE, str(CODE_ROOT), environ.get("PYTHONPATH", ""))
                                          if p),
            "ORCHESTRATOR_KEEP_LOOPBACK": "1"}


def _child_env(state_dir: Path, auth: dict[str, str], run_id: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(auth)
    env["RAY_TMPDIR"] = str(ray_root(state_dir) / "ray")
    env["TMPDIR"] = str(ray_root(state_dir) / "tmp")  # Python's forkserver puts a socket there too
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env[RUN_MARKER] = run_id
    # `down` stops the whole cluster: a SIGTERMed raylet need not wait (30 s by default) for
    # its detached actors to drain away first.
    env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"
    env.update(_loopback_env(env))
    # Job entrypoints say `python ...`: make that the interpreter the orchestrator runs on (its venv).
    env["PATH"] = os.pathsep.join(p for p in (os.path.dirname(sys.executable), env.get("PATH", "")) if p)
    return env


def _apply_env(env: dict[str, str]) -> None:
    """Our client's own environment must match the cluster's (auth, temp dir) before Ray is imported."""
    os.environ.update(env)


#: The armed watchdogs of this process, by state directory: ``down`` disarms the one of the cluster it stopped.
_WATCHDOGS: dict[Path, Any] = {}


def up_local(config: ClusterConfig, state_dir: Path, *, progress: Progress, timeout_s: float = 180.0,
             dashboard: bool = True, outlive: bool = False) -> State:
    """Start a local cluster for ``config`` and the orchestrator on it; see the module docstring.

    ``outlive`` False (a demo, a scenario, a bench): the cluster is stopped when this process ends, by its
    own ``down`` or else by the watchdog. True (``orchestrator up``): once up, it runs until ``down``."""
    from orchestrator.deploy import watchdog

    checked_state_dir(state_dir, create=True)  # 0700, ours, nobody else's token in it
    if ray_root(state_dir) != state_dir:
        checked_state_dir(ray_root(state_dir), create=True)  # the raylets' short temp root: 0700 and ours too
        progress(f"Ray's temp dirs under {ray_root(state_dir)} (its socket paths would not fit under {state_dir})")
    config = with_metrics_port(config)
    if State.load(state_dir) is not None:
        raise ConfigError("state_dir", str(state_dir), "a directory without a running orchestrator",
                          detail="one is already up there: run `orchestrator down` first, or pass --state-dir")
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    (state_dir / "logs").mkdir(parents=True, exist_ok=True)
    for sub in ("ray", "tmp", *(f"r{i}" for i in range(1, len(config.nodes)))):  # where socket paths must fit
        (ray_root(state_dir) / sub).mkdir(parents=True, exist_ok=True)
    auth = auth_env(state_dir)
    run_id = secrets.token_hex(8)
    env = {**_child_env(state_dir, auth, run_id), **raylet_native_env(config.settings)}
    plan = plan_local_cluster(config, state_dir, dashboard=dashboard)
    s = config.settings
    state = State(plan.address, s.namespace, s.head_name, attached=False,
                  env={k: env[k] for k in (*auth, "RAY_TMPDIR")}, started_at=time.time(), dashboard=plan.dashboard,
                  run_id=run_id, driver_env=raylet_native_env(config.settings))
    state.save(state_dir)  # the run id first: a raylet started but not yet recorded still carries it
    try:  # from here on, whatever happens, `down` (ours, the watchdog's or the user's) cleans up
        dog_env = dict(os.environ)
        dog_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(CODE_ROOT), dog_env.get("PYTHONPATH", "")) if p)
        dog = watchdog.start(state_dir, state_dir / "logs" / "watchdog.log", env=dog_env)
        _WATCHDOGS[state_dir.resolve()] = dog
        st = _stat(dog.pid)
        state.watchdog = Proc("watchdog", dog.pid, st[0], st[1]) if st is not None else None
        head = plan.nodes[0]
        progress(f"starting raylet {head.name} (Ray head node) at {plan.address}")
        state.processes.append(_spawn(head, {**env, **config.node(head.name).ray_env()},
                                      ray_root(state_dir) / "tmp"))
        state.save(state_dir)
        _wait_started(state.processes[-1], head, deadline)
        # One at a time: raylets starting together on one host race for ports and log file names.
        for node in plan.nodes[1:]:
            progress(f"starting raylet {node.name}")
            state.processes.append(_spawn(node, {**env, **config.node(node.name).ray_env()},
                                          ray_root(state_dir) / "tmp"))
            state.save(state_dir)
            _wait_started(state.processes[-1], node, deadline)
        _apply_env(state.env)
        _start_orchestrator(config, plan.address, progress, timeout_s - (time.monotonic() - t0),
                            expect_nodes=len(plan.nodes), admin_key=admin_key_for(state_dir),
                            token_secret=head_secret_for(state_dir))
    except BaseException:
        progress("up failed; stopping what it started")
        down(state_dir, progress=progress, keep_logs=True)
        raise
    state.up_seconds = round(time.monotonic() - t0, 2)
    state.save(state_dir)
    if outlive:
        _WATCHDOGS.pop(state_dir.resolve()).detach()
    return state


def restart_worker(config: ClusterConfig, state_dir: Path, node_name: str, *, progress: Progress,
                   timeout_s: float = 120.0) -> Proc:
    """Start the raylet of worker node ``node_name`` of a running local cluster again, after it died (the
    chaos bench kills raylets). It joins as ``up`` started it, with the run's marker, and is recorded in the
    state file, so ``down`` (ours or the watchdog's) stops it too. The head then starts an agent on it."""
    state = State.load(state_dir)
    if state is None or state.attached:
        raise ConfigError("state_dir", str(state_dir), "a local cluster started by `up`")
    names = [n.name for n in config.nodes]
    if node_name not in names[1:]:
        raise ConfigError("node", node_name, names[1:], detail="a worker node of the cluster file")
    launch = worker_launch(config, names.index(node_name), state.address, state_dir)
    offset = Path(launch.log).stat().st_size if Path(launch.log).exists() else 0
    progress(f"starting raylet {node_name} again")
    proc = _spawn(launch, {**_child_env(state_dir, state.env, state.run_id), **raylet_native_env(config.settings),
                           **config.node(node_name).ray_env()}, ray_root(state_dir) / "tmp")
    state.processes.append(proc)
    state.save(state_dir)
    _wait_started(proc, launch, time.monotonic() + timeout_s, offset)
    return proc


def attach(config: ClusterConfig, address: str, state_dir: Path, *, progress: Progress, timeout_s: float = 120.0) -> State:
    """Start the orchestrator on a Ray cluster that already runs."""
    t0 = time.monotonic()
    s = config.settings
    state = State(address, s.namespace, s.head_name, attached=True, started_at=time.time())
    checked_state_dir(state_dir, create=True)
    state.started_head = _start_orchestrator(config, address, progress, timeout_s, expect_nodes=None,
                                             admin_key=admin_key_for(state_dir),
                                             token_secret=head_secret_for(state_dir))
    state.save(state_dir)
    state.up_seconds = round(time.monotonic() - t0, 2)
    state.save(state_dir)
    return state


#: What ``ray start --block`` prints once its node is up.
_STARTED = b"Ray runtime started"


def _wait_started(proc: Proc, node: NodeLaunch, deadline: float, offset: int = 0) -> None:
    """Until the node's log says it started (past ``offset``: a restarted node appends to its old log)."""
    while time.monotonic() < deadline:
        try:
            if _STARTED in Path(node.log).read_bytes()[offset:]:
                return
        except OSError:
            pass
        if not _same_process(proc):
            raise OrchestratorError(f"raylet of {node.name} exited during startup; see {node.log}, which ended:\n"
                                    + _tail(node.log))
        time.sleep(0.2)
    raise NotConnectedError(f"raylet of {node.name} did not start in time; see {node.log}")


def _tail(path: str, lines: int = 12) -> str:
    """The last ``lines`` of a log, in the error itself: a caller that removes its folder afterwards (a demo
    without ``--keep``) would otherwise point at a file that is gone."""
    try:
        text = Path(path).read_text(errors="replace").splitlines()[-lines:]
    except OSError as e:
        return f"  (unreadable: {e})"
    return "\n".join(f"  {x}" for x in text) or "  (empty)"


def _start_orchestrator(config: ClusterConfig, address: str, progress: Progress, timeout_s: float,
                        expect_nodes: int | None, admin_key: str | None = None,
                        token_secret: str | None = None) -> bool:
    """Start the head (unless one runs) and wait for every agent. True if this call started the head. Its
    administrator: who holds ``admin_key`` (``up`` keeps it in the state folder's ``admin.key``, 0600)."""
    from orchestrator.rayport import ray_api  # Ray loads only when a cluster is started (`--help` stays quick)
    from orchestrator.rayport.actors import start_head
    from orchestrator.rayport.client import HeadClient

    s = config.settings
    deadline = time.monotonic() + max(timeout_s, 1.0)
    ray_api.connect(address, s.namespace)
    try:
        seen = -1
        while True:
            nodes = ray_api.alive_nodes_all()
            if len(nodes) != seen:
                progress(f"{len(nodes)}/{expect_nodes or len(nodes)} raylets joined")
                seen = len(nodes)
            if expect_nodes is None or len(nodes) >= expect_nodes:
                break
            if time.monotonic() > deadline:
                raise NotConnectedError(f"only {len(nodes)} of {expect_nodes} raylets joined within {timeout_s:g}s")
            time.sleep(0.25)
        try:
            ray_api.get_head(s.namespace, s.head_name)
            started = False
            progress(f"head {s.head_name!r} already runs in namespace {s.namespace!r}; using it")
        except NotConnectedError:
            started = True
        head = start_head(s, config, node_id=ray_api.head_node_id(), admin_key=admin_key, token_secret=token_secret)
        if admin_key:
            use_admin_key(admin_key)  # this process's clients (a demo's scenario, a bench) administer what it started
        client = HeadClient(handle=head)
        want = {n.name for n in ray_api.alive_nodes()}
        progress(f"head actor {s.head_name!r} in namespace {s.namespace!r}; waiting for {len(want)} agents")
        registered: set[str] = set()
        while True:
            nodes = client.status()["nodes"]
            now_registered = {n["name"] for n in nodes if n["state"] == "registered"}
            if now_registered != registered:
                registered = now_registered
                progress(f"agents registered {len(registered & want)}/{len(want)}: {', '.join(sorted(registered))}")
            if want <= registered:
                return started
            if time.monotonic() > deadline:
                raise NotConnectedError(f"agents of {sorted(want - registered)} did not register within {timeout_s:g}s")
            time.sleep(0.25)
    finally:
        ray_api.disconnect()


# ---- down --------------------------------------------------------------------------------------
@dataclass(slots=True)
class DownReport:
    terminated: list[str] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    actors: list[str] = field(default_factory=list)
    removed: str | None = None


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def interrupt_on_stop_signals() -> None:
    """From now on SIGTERM and SIGHUP raise ``KeyboardInterrupt``, as Ctrl-C does, so every ``finally`` that
    stops what a command started runs (call from the main thread)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)


@contextmanager
def scratch_cluster(config: ClusterConfig, prefix: str, *, progress: Progress) -> Iterator[State]:
    """A local cluster for one run of a bench or a scenario, in a new state directory (under ``$TMPDIR``)
    named ``prefix...``: SIGTERM and SIGHUP end the run as Ctrl-C does, and the cluster is stopped however
    the block ends (and, through the watchdog, if this process is SIGKILLed)."""
    interrupt_on_stop_signals()
    state_dir = Path(tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("TMPDIR") or "/tmp"))
    try:
        yield up_local(config, state_dir, progress=progress)
    finally:
        down(state_dir, progress=progress)


def down(state_dir: Path, *, progress: Progress, keep_logs: bool = False, grace_s: float = 20.0) -> DownReport:
    """Stop what ``up`` started in ``state_dir`` (see the module docstring). Idempotent."""
    report = DownReport()
    state = State.load(state_dir)
    if state is None:
        progress(f"nothing to stop: no state in {state_dir}")
        _disarm(state_dir)
        return report
    if state.attached and state.started_head:
        _apply_env(state.env)
        from orchestrator.rayport import ray_api

        try:
            ray_api.connect(state.address, state.namespace)
            names = [state.head_name] + [ray_api.agent_name(n.name) for n in ray_api.alive_nodes()]
            report.actors = [n for n in names if ray_api.kill_named(n, state.namespace)]
        finally:
            ray_api.disconnect()
        progress(f"killed actors {report.actors}")
    # Workers first, the head node (GCS) last, so raylets do not spin waiting for a dead GCS.
    procs = list(state.processes)
    for group in (procs[1:], procs[:1]):
        signalled = []
        for p in group:
            if _same_process(p):
                _signal(p.pid, signal.SIGTERM)
                report.terminated.append(p.node)
                progress(f"stopping raylet {p.node} (pid {p.pid})")
                signalled.append(p)
            elif _stat(p.sid) is None and session_members(p.sid):
                # Its `ray start` was killed (an `up` SIGKILLed with it): Ray's processes of that node are
                # left in the session without it; give them the SIGTERM it would have given.
                for pid in session_members(p.sid):
                    _signal(pid, signal.SIGTERM)
                progress(f"stopping what is left of raylet {p.node} (session {p.sid})")
                signalled.append(p)
        _wait_gone(signalled, grace_s)
    doomed = leftovers(state, process_table(), os.getpid())
    report.killed = [pid for pid in doomed if _signal(pid, signal.SIGKILL)]
    if report.killed:
        progress(f"killed {len(report.killed)} leftover processes")
        _wait_pids_gone(report.killed, 5.0)
    _disarm(state_dir)
    if ray_root(state_dir) != state_dir:
        shutil.rmtree(ray_root(state_dir), ignore_errors=True)  # Ray's sessions: nothing a user reads after
    if keep_logs:
        State.path(state_dir).unlink(missing_ok=True)
    else:
        shutil.rmtree(state_dir, ignore_errors=True)
        report.removed = str(state_dir)
    return report


def _disarm(state_dir: Path) -> None:
    dog = _WATCHDOGS.pop(state_dir.resolve(), None)
    if dog is not None:
        dog.done()


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def _wait_pids_gone(pids: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_stat(pid) is not None for pid in pids):
        time.sleep(0.1)


def _wait_gone(procs: list[Proc], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(session_members(p.sid) for p in procs):
            return
        time.sleep(0.2)


def load_state(state_dir: Path) -> State | None:
    """The state of a running ``up``, with its environment applied to this process (for clients)."""
    state = State.load(state_dir)
    if state is not None:
        _apply_env(state.env)
    return state


def driver_env(state: State, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that makes a plain ``python script.py`` on this machine a driver of the cluster ``up``
    started, as a job's driver is: Ray's address, auth and temp folder, 127.0.0.1 kept, the head's namespace and
    name and, on a cluster whose raylets ``up`` started, the hook through which the script's ``num_gpus`` tasks,
    actors and placement groups get leases (``docs/ray-native.md``). What ``orchestrator env`` prints."""
    environ = dict(os.environ if environ is None else environ)
    out = {**state.env, "RAY_ADDRESS": state.address, "ORCHESTRATOR_NAMESPACE": state.namespace,
           "ORCHESTRATOR_HEAD_NAME": state.head_name, **state.driver_env}
    if not state.attached:
        out.update(_loopback_env(environ))
    return out


def describe(state: State) -> dict[str, Any]:
    return {"address": state.address, "namespace": state.namespace, "attached": state.attached,
            "dashboard": state.dashboard or None,
            "raylets": [p.node for p in state.processes], "up_seconds": state.up_seconds}


def start_orchestrator(config: ClusterConfig, address: str, progress: Progress, timeout_s: float = 180.0,
                       expect_nodes: int | None = None) -> bool:
    """Start the head of ``config`` (its namespace and name) on a running cluster and wait for every agent.

    What ``up`` does after its raylets are up; a scenario that replays one day under several schemes
    starts one head per replay, each in its own namespace. True if this call started the head."""
    return _start_orchestrator(config, address, progress, timeout_s, expect_nodes)


def stop_orchestrator_actors(address: str, config: ClusterConfig) -> list[str]:
    """Kill the head and agent actors of ``config``'s namespace (nothing else); the names killed."""
    from orchestrator.rayport import ray_api

    s = config.settings
    ray_api.connect(address, s.namespace)
    try:
        names = [s.head_name] + [ray_api.agent_name(n.name) for n in config.nodes]
        return [n for n in names if ray_api.kill_named(n, s.namespace)]
    finally:
        ray_api.disconnect()
