"""Signals on real processes: a command that started a local cluster leaves no process behind.

``orchestrator up`` (one node) gets SIGINT, SIGTERM or SIGHUP at different
moments of its bring-up, or SIGKILL; a process-bound command (what ``demo``
and the benches do: ``up_local`` without ``outlive``, connected to Ray as a
driver) gets each signal once running; and ``up`` SIGKILLed together with its
watchdog is cleaned up by ``orchestrator down``. After each, no process
carries the run's marker (``ORCHESTRATOR_RUN=<run id>``, which every Ray
process of the cluster inherits) and no recorded session has a member left.
See docs/signals.md; the pure parts are tests/runtime/test_signals.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from orchestrator.deploy.local import RUN_MARKER, _stat, session_members
from runtime.standins import default_signals

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ONE_NODE = """
settings: {namespace: rgo-sig, heartbeat_interval_s: 1.0, agent_ttl_s: 10.0}
scheduler_file: %s
nodes:
  - {name: n0, model: A100-80GB, gpus: 1, cpus: 1, memory: 8GiB}
""" % (REPO / "configs" / "priorities.yaml")

#: A process-bound command, as `orchestrator demo` is: its cluster must not outlive it.
BOUND = """
import signal, sys, time
from pathlib import Path
from orchestrator.core.config import load_config
from orchestrator.deploy import local as launcher
from orchestrator.rayport import ray_api

def interrupt(signum, frame):
    raise KeyboardInterrupt(signum)

for sig in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, interrupt)
sd = Path(sys.argv[2])
try:
    state = launcher.up_local(load_config(sys.argv[1]), sd, progress=lambda m: print(m, file=sys.stderr, flush=True),
                              dashboard=False)
    ray_api.connect(state.address, state.namespace)
    print("RUNNING", file=sys.stderr, flush=True)
    time.sleep(300)
finally:
    ray_api.disconnect()
    launcher.down(sd, progress=lambda m: print(m, file=sys.stderr, flush=True), keep_logs=True)
"""


@pytest.fixture
def work() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="rgo-sig-", dir="/tmp"))  # short: Ray's socket paths stay < 107 bytes
    (d / "one.yaml").write_text(ONE_NODE)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", RUN_MARKER))}
    env.update(TMPDIR=str(work), RAY_USAGE_STATS_ENABLED="0",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    return env


def _marked(run_id: str) -> list[int]:
    out = []
    needle = f"{RUN_MARKER}={run_id}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0") and _stat(int(entry)):
                    out.append(int(entry))
            except OSError:
                pass
    return out


class Run:
    """One command under test: its stderr in a file, the run id and processes read from its state file."""

    def __init__(self, argv: list[str], work: Path, state_dir: Path) -> None:
        self.state_dir, self.log = state_dir, work / "stderr.log"
        self.proc = subprocess.Popen(argv, env=_env(work), cwd=REPO, stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "wb"), preexec_fn=default_signals)
        self.run_id, self.sids, self.watchdog = "", set(), 0

    def _read_state(self) -> None:
        try:
            d = json.loads((self.state_dir / "state.json").read_text())
        except (OSError, ValueError):
            return
        self.run_id = d.get("run_id") or self.run_id
        self.sids |= {p["sid"] for p in d.get("processes", [])}
        self.watchdog = (d.get("watchdog") or {}).get("pid", self.watchdog)

    def wait_for(self, text: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._read_state()
            if text in self.log.read_text(errors="replace"):
                self._read_state()
                return
            assert self.proc.poll() is None, f"exited {self.proc.returncode} before {text!r}:\n{self.log.read_text()}"
            time.sleep(0.05)
        raise AssertionError(f"no {text!r} within {timeout_s}s:\n{self.log.read_text()}")

    def assert_nothing_left(self, timeout_s: float = 60) -> None:
        assert self.run_id, "the state file never named its run"
        deadline = time.monotonic() + timeout_s
        left: list[int] = []
        while time.monotonic() < deadline:
            left = _marked(self.run_id) + [pid for sid in self.sids for pid in session_members(sid)]
            if self.watchdog and _stat(self.watchdog) is not None:
                left.append(self.watchdog)
            if not left:
                return
            time.sleep(0.25)
        cmds = {pid: Path(f"/proc/{pid}/cmdline").read_bytes()[:120] for pid in set(left) if _stat(pid)}
        raise AssertionError(f"left running after {timeout_s}s: {cmds}\n{self.log.read_text()}")

    def kill(self) -> None:
        for pid in _marked(self.run_id) if self.run_id else []:
            os.kill(pid, signal.SIGKILL)


def _up(work: Path) -> Run:
    sd = work / "state"
    return Run([sys.executable, "-m", "orchestrator.cli.cluster", "up", "-c", str(work / "one.yaml"),
                "--state-dir", str(sd), "--no-dashboard"], work, sd)


#: Moments of `up`'s bring-up: a raylet starting, the driver connected to Ray, the head's agents awaited.
MOMENTS = {"raylet": "starting raylet n0", "connected": "raylets joined", "agents": "waiting for 1 agents"}


@pytest.mark.parametrize(("sig", "moment"), [(signal.SIGINT, "raylet"), (signal.SIGTERM, "connected"),
                                             (signal.SIGHUP, "agents"), (signal.SIGKILL, "connected")])
def test_up_interrupted_during_bring_up_leaves_nothing(work: Path, sig: int, moment: str) -> None:
    run = _up(work)
    try:
        run.wait_for(MOMENTS[moment])
        time.sleep(0.3)
        run.proc.send_signal(sig)
        run.proc.wait(timeout=90)
        run.assert_nothing_left()
        assert "SIGTERM received" not in run.log.read_text()  # Ray's C++ handler did not take the signal
    finally:
        run.proc.kill()
        run.kill()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGKILL])
def test_a_process_bound_command_signalled_once_running_leaves_nothing(work: Path, sig: int) -> None:
    sd = work / "state"
    run = Run([sys.executable, "-c", BOUND, str(work / "one.yaml"), str(sd)], work, sd)
    try:
        run.wait_for("RUNNING")
        run.proc.send_signal(sig)
        run.proc.wait(timeout=90)
        run.assert_nothing_left()
        assert "SIGTERM received" not in run.log.read_text()
    finally:
        run.proc.kill()
        run.kill()


def test_down_cleans_up_after_up_and_its_watchdog_were_sigkilled(work: Path) -> None:
    run = _up(work)
    try:
        run.wait_for(MOMENTS["agents"])
        assert run.watchdog
        os.kill(run.watchdog, signal.SIGKILL)  # `kill -9` of everything: nothing but the state file is left
        run.proc.send_signal(signal.SIGKILL)
        run.proc.wait(timeout=10)
        time.sleep(1)
        assert _marked(run.run_id), "the cluster should still run: nothing has stopped it yet"
        down = subprocess.run([sys.executable, "-m", "orchestrator.cli.cluster", "down", "--state-dir",
                               str(run.state_dir)], env=_env(work), cwd=REPO, capture_output=True, text=True,
                              timeout=120)
        assert down.returncode == 0, down.stderr
        run.assert_nothing_left(timeout_s=10)
        assert not run.state_dir.exists()
    finally:
        run.proc.kill()
        run.kill()
