"""Signals without Ray: what ``down`` kills (pure), and the watchdog with stand-in raylet sessions.

The real-cluster side (up, demo bring-up and run, SIGINT/SIGTERM/SIGHUP/SIGKILL) is
tests/integration/test_signals.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.core.statefile import Proc, State
from orchestrator.deploy import local as launcher
from orchestrator.deploy.local import ProcInfo, leftovers, session_members

from .standins import default_signals, standin_raylet

REPO = Path(__file__).resolve().parents[2]


def _state(*procs: Proc, run_id: str = "r1", watchdog: Proc | None = None) -> State:
    return State("127.0.0.1:1", "rgo", "rgo-head", attached=False, processes=list(procs), run_id=run_id,
                 watchdog=watchdog)


def test_leftovers_are_the_recorded_sessions_and_the_run_marker_and_nothing_else() -> None:
    state = _state(Proc("head", 100, 100, 7), Proc("w1", 200, 200, 9), watchdog=Proc("watchdog", 90, 90, 5))
    table = [ProcInfo(100, 100, 7), ProcInfo(101, 100, 8),  # the head's ray start and its GCS
             ProcInfo(201, 200, 10),                         # w1's ray start is gone; its raylet is left
             ProcInfo(300, 300, 11, run="r1"),               # a job driver in a session of its own
             ProcInfo(400, 400, 12, run="r2"),               # another run's job driver
             ProcInfo(500, 500, 13),                         # someone else's
             ProcInfo(90, 90, 5),                            # the watchdog (it runs down itself)
             ProcInfo(102, 100, 14, run="r1")]               # the process running down, inside the session
    assert leftovers(state, table, me=102) == [100, 101, 201, 300]


def test_a_reused_session_id_is_not_ours() -> None:
    state = _state(Proc("head", 100, 100, 7))
    table = [ProcInfo(100, 100, 99), ProcInfo(101, 100, 100)]  # pid 100 now leads someone else's session
    assert leftovers(state, table, me=1) == []
    assert leftovers(_state(Proc("head", 100, 100, 7), run_id=""), [ProcInfo(5, 5, 1, run="")], me=1) == []


def test_the_state_file_keeps_the_run_id_and_the_watchdog(tmp_path: Path) -> None:
    s = _state(Proc("a", 1, 1, 2), watchdog=Proc("watchdog", 3, 3, 4))
    s.save(tmp_path)
    assert State.load(tmp_path) == s


def _session(marker: str | None = None) -> Proc:
    return standin_raylet(marker=marker, stops_child_on_sigterm=True)


#: An owner command: starts the watchdog of the state dir, says READY, then detaches or waits to be killed.
_OWNER = """
import sys, time
from pathlib import Path
from orchestrator.deploy import watchdog
sd = Path(sys.argv[1])
dog = watchdog.start(sd, sd / "watchdog.log")
print(dog.pid, flush=True)
if sys.argv[2] == "detach":
    dog.detach()
    sys.exit(0)
time.sleep(300)
"""


def _owner(sd: Path, then: str) -> tuple[subprocess.Popen[str], int]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.Popen([sys.executable, "-c", _OWNER, str(sd), then], stdout=subprocess.PIPE, text=True, env=env,
                         preexec_fn=default_signals)
    assert p.stdout is not None
    return p, int(p.stdout.readline())


def _gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if launcher._stat(pid) is None:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_the_watchdog_stops_the_recorded_processes_when_its_command_dies(tmp_path: Path, sig: int) -> None:
    sd = tmp_path / "state"
    ours = _session()
    driver = _session(marker="run-x")  # a job driver that left the raylet's session, found by its marker
    bystander = _session()
    try:
        _state(ours, run_id="run-x").save(sd)
        owner, dog = _owner(sd, "wait")
        os.kill(owner.pid, sig)
        owner.wait(timeout=10)
        assert _gone(dog, 30), (sd / "watchdog.log").read_text()
        assert session_members(ours.sid) == [] and session_members(driver.sid) == []
        assert len(session_members(bystander.sid)) == 2
        assert not State.path(sd).exists() and "died without stopping it" in (sd / "watchdog.log").read_text()
    finally:
        for p in (ours, driver, bystander):
            for pid in session_members(p.sid):
                os.kill(pid, signal.SIGKILL)


def test_a_detached_watchdog_leaves_the_cluster_running(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    ours = _session()
    try:
        _state(ours).save(sd)
        owner, dog = _owner(sd, "detach")
        assert owner.wait(timeout=10) == 0
        assert _gone(dog, 10)
        assert len(session_members(ours.sid)) == 2 and State.path(sd).exists()
    finally:
        for pid in session_members(ours.sid):
            os.kill(pid, signal.SIGKILL)


def test_down_after_a_sigkilled_up_stops_what_its_dead_ray_start_left(tmp_path: Path) -> None:
    """`up` and its watchdog SIGKILLed (`kill -9` of both): `down` works from the state file alone."""
    sd = tmp_path / "state"
    ours = _session(marker="run-y")
    other = _session()
    try:
        _state(ours, run_id="run-y").save(sd)
        os.kill(ours.pid, signal.SIGKILL)  # the `ray start`, gone; its child stays in the session
        assert _gone(ours.pid, 5) or launcher._stat(ours.pid) is None
        assert len(session_members(ours.sid)) == 1
        report = launcher.down(sd, progress=lambda m: None, grace_s=2.0)
        assert session_members(ours.sid) == [] and len(session_members(other.sid)) == 2
        assert not sd.exists() and report.terminated == []
    finally:
        for p in (ours, other):
            for pid in session_members(p.sid):
                os.kill(pid, signal.SIGKILL)


def test_a_child_started_with_die_with_parent_ends_with_its_sigkilled_parent(tmp_path: Path) -> None:
    """What the bench gives its demo and the demo its comparison: PR_SET_PDEATHSIG."""
    script = ("import subprocess, sys, time\nfrom orchestrator.deploy.watchdog import die_with_parent\n"
              "c = subprocess.Popen(['sleep', '300'], preexec_fn=die_with_parent)\nprint(c.pid, flush=True)\n"
              "time.sleep(300)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env,
                         preexec_fn=default_signals)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        parent.kill()
        parent.wait(timeout=10)
        assert _gone(child, 10)
    finally:
        if launcher._stat(child) is not None:
            os.kill(child, signal.SIGKILL)
