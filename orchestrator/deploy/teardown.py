"""``orchestrator down``: stop exactly what ``up`` started, never ``ray stop`` (which kills every Ray process on
the host, other people's included).

* every raylet runs in its own session (``setsid``); Ray's processes for that node -- GCS, raylet, agents,
  workers -- stay in it. The state file records each ``ray start`` PID, its session id and its start time (so a
  recycled PID is never signalled);
* every process of the cluster carries ``ORCHESTRATOR_RUN=<run id>`` in its environment (the run id is in the
  state file): Ray starts job drivers in sessions of their own, and this marker finds them;
* :func:`down` sends SIGTERM to each ``ray start`` (Ray drains and stops the node's processes; when a ``ray
  start`` is gone, to what is left of its session), waits, then SIGKILLs whatever is left in those sessions or
  carries the marker (:func:`~orchestrator.deploy.processes.leftovers`); for an attached cluster it kills only
  the head and agent actors.

Invariants:

* ``down`` works from the state file alone, so it cleans up after an ``up`` that was SIGKILLed; it is idempotent
  (no state: nothing to stop);
* it signals only processes the state file or the run marker names as the cluster's, never itself nor the
  watchdog, and worker nodes before the head node (raylets do not spin waiting for a dead GCS);
* it disarms the watchdog this process armed for the cluster (``up_local`` arms it in :data:`_WATCHDOGS`): once
  ``down`` has run, the watchdog has nothing left to stop.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from orchestrator.core.config import ClusterConfig
from orchestrator.core.statefile import Proc, State
from orchestrator.deploy.cluster_env import _apply_env
from orchestrator.deploy.launch_plan import ray_root
from orchestrator.deploy.processes import _same_process, _stat, leftovers, process_table, session_members

#: How ``up`` and ``down`` report what they do, a line at a time.
Progress = Callable[[str], None]

#: The armed watchdogs of this process, by state directory: ``down`` disarms the one of the cluster it stopped.
_WATCHDOGS: dict[Path, Any] = {}


@dataclass(slots=True)
class DownReport:
    terminated: list[str] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    actors: list[str] = field(default_factory=list)
    removed: str | None = None


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
        from orchestrator.rayport.actors import stop_orchestrator

        try:
            ray_api.connect(state.address, state.namespace)
            report.actors = stop_orchestrator(state.namespace, state.head_name,
                                              [n.name for n in ray_api.alive_nodes()])
        finally:
            ray_api.disconnect()
        progress(f"removed {report.actors}")
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


def stop_orchestrator_actors(address: str, config: ClusterConfig) -> list[str]:
    """Remove the head and agent actors of ``config``'s namespace and their placement groups (nothing else:
    :func:`~orchestrator.rayport.actors.stop_orchestrator`); the names removed."""
    from orchestrator.rayport import ray_api
    from orchestrator.rayport.actors import stop_orchestrator

    s = config.settings
    ray_api.connect(address, s.namespace)
    try:
        return stop_orchestrator(s.namespace, s.head_name, [n.name for n in config.nodes])
    finally:
        ray_api.disconnect()
