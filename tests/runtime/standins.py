"""Stand-ins for the processes ``up`` starts, for the tests of ``down`` and the watchdog (no Ray)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from orchestrator.core.statefile import Proc
from orchestrator.deploy import local as launcher
from orchestrator.deploy.local import session_members


def standin_raylet(name: str = "n", *, marker: str | None = None, stops_child_on_sigterm: bool = False) -> Proc:
    """A stand-in raylet: a session leader with a child, as `ray start --block` and its processes are.

    ``stops_child_on_sigterm``: it kills its child and exits on SIGTERM, as `ray start --block` does (else
    SIGTERM leaves the child in the session); ``marker``: the run marker in its environment."""
    if stops_child_on_sigterm:
        script = ("import signal, subprocess, sys, time; c = subprocess.Popen(['sleep', '300']); "
                  "signal.signal(signal.SIGTERM, lambda *a: (c.kill(), c.wait(), sys.exit(0))); time.sleep(300)")
    else:
        script = "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"
    return session_leader(name, script, dict(os.environ, **({launcher.RUN_MARKER: marker} if marker else {})))


def session_leader(name: str, script: str, env: dict[str, str]) -> Proc:
    """``python -c script`` as the leader of a new session, once it has made its one child (as the stand-ins'
    scripts do first)."""
    p = subprocess.Popen([sys.executable, "-c", script], start_new_session=True, env=env, stdin=subprocess.DEVNULL)
    for _ in range(100):
        if len(session_members(p.pid)) == 2:
            break
        time.sleep(0.05)
    st = launcher._stat(p.pid)
    assert st is not None
    return Proc(name, p.pid, st[0], st[1])


def default_signals() -> None:
    """``preexec_fn`` for a child a test signals: SIGINT, SIGTERM and SIGHUP at their defaults. A suite run
    from a non-interactive shell's background job inherits SIGINT ignored, and Python then installs no
    KeyboardInterrupt handler, so a test sending SIGINT would wait on a child that never heard it."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
