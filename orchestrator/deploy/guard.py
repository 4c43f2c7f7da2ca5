"""The watchdog process (``python -m orchestrator.deploy.guard <state dir>``), started by
:func:`orchestrator.deploy.watchdog.start`: it reads its stdin (the command's end of a pipe) until the end of
file, which comes when the command that started the cluster exits, however it did. If the command said
``detach`` (the cluster outlives it) or ``done`` (it stopped the cluster itself), nothing happens; otherwise it
runs ``down`` on the state folder. Its own module so that the launcher (``deploy/local.py``) and the watchdog's
client side (``deploy/watchdog.py``) import no module that imports them back."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from orchestrator.deploy.local import down
from orchestrator.deploy.watchdog import DETACH, DONE


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    state_dir = Path(args[0])
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    words = sys.stdin.buffer.read()  # returns at end of file: when the command has exited, however it did
    if DETACH in words or DONE in words:
        return 0
    t0 = time.monotonic()

    def say(msg: str) -> None:
        print(f"[watchdog {os.getpid()} +{time.monotonic() - t0:.1f}s] {msg}", flush=True)

    say(f"the command that started {state_dir} died without stopping it; stopping what it started")
    report = down(state_dir, progress=say, keep_logs=True, grace_s=10.0)
    say(f"done: stopped raylets {report.terminated}, killed {len(report.killed)} leftover processes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
