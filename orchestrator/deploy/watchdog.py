"""The watchdog of a command that starts a local cluster: it stops the cluster when the command dies.

A clean-up that runs only if the process survives its signal is not a clean-up
(issue #18): a SIGKILL, a second signal during ``finally``, or Ray's own
SIGTERM handler ending the process inside its core would leave raylets, the
GCS and job drivers running. So :func:`orchestrator.deploy.local.up_local`
starts this small process *before* its first raylet:

* it runs in its own session (a terminal's SIGINT/SIGHUP and ``timeout``'s
  process-group SIGTERM do not reach it) and ignores SIGINT and SIGHUP;
* its stdin is the read end of a pipe whose only write end the command holds
  (non-inheritable, so no raylet or job keeps it open). The kernel closes that
  end when the command exits *by any means*, SIGKILL included;
* the command writes one word before closing: ``detach`` (``orchestrator up``
  succeeded; the cluster lives until ``orchestrator down``) or ``done`` (the
  command stopped the cluster itself). End of file without a word means the
  command died: the watchdog runs :func:`orchestrator.deploy.local.down` on the
  state directory, which stops exactly the processes the state file records.

Invariant: the watchdog never stops anything while its command lives, and
stops nothing that the state file (or the run marker it names) does not.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: The words the command may write before closing the pipe.
DETACH, DONE = b"detach", b"done"


@dataclass(slots=True)
class Watchdog:
    """The command's end of the pipe, and the watchdog's pid."""

    pid: int
    _fd: int | None

    def detach(self) -> None:
        """The cluster outlives this command (``orchestrator up``): the watchdog exits and stops nothing."""
        self._say(DETACH)

    def done(self) -> None:
        """This command stopped the cluster itself: the watchdog exits."""
        self._say(DONE)

    def _say(self, word: bytes) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.write(fd, word + b"\n")
        except OSError:  # the watchdog is gone (killed by hand): nothing to tell
            pass
        finally:
            os.close(fd)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """A ``preexec_fn``: the child gets ``sig`` when the thread that started it ends (Linux; elsewhere nothing).

    For plain children of a process-bound command (a bench's demo, the demo's comparison), started from the
    main thread, whose end is the process's. Not for raylets: ``orchestrator up`` leaves those running."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start(state_dir: Path, log: Path, env: dict[str, str] | None = None) -> Watchdog:
    """Start the watchdog of ``state_dir``; its output goes to ``log``."""
    read_end, write_end = os.pipe()  # both non-inheritable: only the watchdog gets read_end, as its stdin
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(log, "ab") as out:
            p = subprocess.Popen([sys.executable, "-m", "orchestrator.deploy.guard", str(state_dir)],
                                 stdin=read_end, stdout=out, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True)
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return Watchdog(p.pid, write_end)
