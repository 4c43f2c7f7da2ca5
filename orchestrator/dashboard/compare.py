"""The schemes' comparison for the page, computed by ``orchestrator sim schemes`` in a child process.

A child process, not a thread: the replay is CPU-bound Python and would hold the
GIL against the page and the scenario it runs beside. :class:`ComparisonJob`
starts it, fills a :class:`~orchestrator.dashboard.app.Comparison` when it
prints its JSON, and :meth:`ComparisonJob.stop` ends it (SIGTERM, then SIGKILL).

Which trace (:func:`default_trace`): the one the caller names, else openb's share-heavy ``gpushare60`` list
from the folder ``$ORCHESTRATOR_OPENB_DIR`` names when set (a clone of the openb repository, such as
``../shared/traces/openb`` beside a checkout: ~1 minute), else the small sample the package ships
(:func:`orchestrator.core.datafiles.openb_sample`). Nothing outside the installed package is read unless the
user names it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Mapping

from orchestrator.core import datafiles
from orchestrator.core import env as E
from orchestrator.core.errors import InvalidRequestError
from orchestrator.dashboard.app import Comparison
from orchestrator.deploy.watchdog import die_with_parent

#: The two files of the openb repository the comparison replays: its node list and the share-heavy pod list.
OPENB_FILES = ("openb_node_list_gpu_node.csv", "openb_pod_list_gpushare60.csv")


def openb_trace(folder: str | Path) -> tuple[Path, Path]:
    """(nodes, pods) of the share-heavy list in ``folder``, a clone of the openb repository."""
    files = tuple(Path(folder) / name for name in OPENB_FILES)
    missing = [p.name for p in files if not p.is_file()]
    if missing:
        raise InvalidRequestError(E.OPENB_DIR, str(folder), f"a folder holding {' and '.join(OPENB_FILES)}",
                                  f"missing {', '.join(missing)}")
    return files[0], files[1]


def default_trace(environ: Mapping[str, str] = os.environ) -> tuple[Path, Path]:
    """(nodes, pods) to compare on: ``$ORCHESTRATOR_OPENB_DIR``'s list when set, else the packaged sample."""
    folder = environ.get(E.OPENB_DIR)
    return openb_trace(folder) if folder else datafiles.openb_sample()


class ComparisonJob:
    """``orchestrator sim schemes`` in a child process; see the module docstring."""

    def __init__(self, comparison: Comparison, trace: tuple[Path, Path] | None = None, target_pct: float = 100.0) -> None:
        self.comparison = comparison
        self.error: str | None = None
        try:
            self.trace: tuple[Path, Path] | None = trace if trace is not None else default_trace()
        except InvalidRequestError as e:  # a wrong folder fails the comparison, not the page beside it
            self.trace, self.error = None, str(e)
        self.target_pct = target_pct
        self.proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "ComparisonJob":
        if self.trace is None:
            self.comparison.fail(self.error or "no trace to compare on")
            return self
        nodes, pods = self.trace
        argv = [sys.executable, "-m", "orchestrator.cli.main", "sim", "schemes", "--nodes", str(nodes),
                "--pods", str(pods), "--target-pct", str(self.target_pct)]
        # Its own session (a Ctrl-C is the demo's to handle), yet it dies with the demo, SIGKILL included.
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True, preexec_fn=die_with_parent)
        self._thread = threading.Thread(target=self._wait, name="dashboard-compare", daemon=True)
        self._thread.start()
        return self

    def _wait(self) -> None:
        assert self.proc is not None
        out, err = self.proc.communicate()
        if self.proc.returncode == 0:
            try:
                self.comparison.set(json.loads(out))
                return
            except ValueError as e:
                err = f"unreadable output: {e}"
        if self.proc.returncode not in (-15, -9):
            self.comparison.fail((err or "").strip().splitlines()[-1:][0] if err.strip() else
                                 f"exit status {self.proc.returncode}")

    def stop(self) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        if self._thread is not None:
            self._thread.join(timeout=5)
