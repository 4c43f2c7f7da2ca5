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

``down`` stops exactly what ``up`` started, never ``ray stop``, from the state file alone
(:mod:`orchestrator.deploy.teardown`).

Signals (docs/signals.md): before its first raylet, ``up_local`` starts a
watchdog (:mod:`orchestrator.deploy.watchdog`) that runs ``down`` if the
command dies without saying otherwise. ``orchestrator up`` tells it to let the
cluster outlive the command (``outlive=True``); a demo, a scenario or a bench
keeps it armed until its own ``down``.

Everything ``up`` writes -- the state file, raylet logs, Ray's session
directories (``RAY_TMPDIR``), the auth token it had to make -- lives in one
state directory (``--state-dir``, default ``$TMPDIR/rgo-<uid>``), which
``down`` removes.

The parts, one module each (every name importable from here, as before):

* :mod:`.launch_plan` -- the ``ray start`` command of every raylet, and where their files go (pure);
* :mod:`.cluster_env` -- the environment the cluster's processes and its clients run with (auth, loopback, the
  run marker);
* :mod:`.processes` -- the cluster's processes as ``/proc`` shows them, and which ``down`` kills (:func:`leftovers`);
* :mod:`.teardown` -- ``down``;
* this module -- ``up``: starting the raylets one at a time, then the head and its agents (:func:`up_local`,
  :func:`attach`, :func:`restart_worker`), and a cluster for one run (:func:`scratch_cluster`).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from orchestrator.core.config import ClusterConfig, raylet_native_env
from orchestrator.core.errors import ConfigError, NotConnectedError, OrchestratorError
from orchestrator.core.credentials import admin_key_for, head_secret_for, use_admin_key
from orchestrator.core.statefile import Proc, State, checked_state_dir
from orchestrator.deploy.cluster_env import CODE_ROOT, _apply_env, _child_env, auth_env, driver_env, load_state
from orchestrator.deploy.launch_plan import (LOOPBACK_HOSTS, OBJECT_STORE_BYTES, RAY_SESSION_TAIL, UNIX_SOCKET_MAX,
                                             LaunchPlan, NodeLaunch, free_port, plan_local_cluster, ray_root,
                                             with_metrics_port, worker_launch)
from orchestrator.deploy.processes import (RUN_MARKER, ProcInfo, _same_process, _stat, leftovers, process_table,
                                           session_members)
from orchestrator.deploy.teardown import _WATCHDOGS, DownReport, Progress, down, stop_orchestrator_actors
from orchestrator.rayport.loopback import LOOPBACK_SITE

__all__ = ["CODE_ROOT", "DownReport", "LOOPBACK_HOSTS", "LOOPBACK_SITE", "LaunchPlan", "NodeLaunch",
           "OBJECT_STORE_BYTES", "ProcInfo", "Progress", "RAY_SESSION_TAIL", "RUN_MARKER", "UNIX_SOCKET_MAX",
           "_stat", "attach", "auth_env", "describe", "down", "driver_env", "free_port",
           "interrupt_on_stop_signals", "leftovers", "load_state", "plan_local_cluster", "process_table",
           "ray_root", "restart_worker", "scratch_cluster", "session_members", "start_orchestrator",
           "stop_orchestrator_actors", "up_local", "with_metrics_port", "worker_launch"]


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
        # One at a time, the head first: raylets starting together on one host race for ports and log file names.
        for i, node in enumerate(plan.nodes):
            for attempt in range(1 + REGISTER_RETRIES):
                progress(f"starting raylet {node.name}" + (f" (Ray head node) at {plan.address}" if i == 0 else "")
                         + (" again" if attempt else ""))
                offset = Path(node.log).stat().st_size if Path(node.log).exists() else 0
                state.processes.append(_spawn(node, {**env, **config.node(node.name).ray_env()},
                                              ray_root(state_dir) / "tmp"))
                state.save(state_dir)
                try:
                    _wait_started(state.processes[-1], node, deadline, offset)
                    break
                except OrchestratorError as e:
                    if attempt == REGISTER_RETRIES or _REGISTER_TIMEOUT not in str(e):
                        raise
                    progress(f"raylet {node.name} did not register with the GCS within Ray's fixed 30 s (a busy "
                             "host); stopping what its `ray start` left and starting it again")
                    _stop_session(state.processes.pop())
                    state.save(state_dir)
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
#: What ``ray start`` of a node says when its raylet did not register with the GCS within the 30 s Ray waits
#: (a constant in ``ray._private.node``, not a setting): on a busy host a transient failure, so ``up`` starts that
#: node again, at most :data:`REGISTER_RETRIES` times, within its own deadline.
_REGISTER_TIMEOUT = "The current node timed out during startup"
REGISTER_RETRIES = 1


def _stop_session(proc: Proc, grace_s: float = 5.0) -> None:
    """Stop whatever the failed ``ray start`` ``proc`` left in its session (its raylet may still be registering):
    SIGTERM, then SIGKILL what is left after ``grace_s``; only that session's processes."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in session_members(proc.sid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while session_members(proc.sid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not session_members(proc.sid):
            return


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
