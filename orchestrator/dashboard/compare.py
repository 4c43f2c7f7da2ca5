"""The schemes' comparison for the page, computed by ``orchestrator sim schemes`` in a child process.

A child process, not a thread: the replay is CPU-bound Python and would hold the
GIL against the page and the scenario it runs beside. :class:`ComparisonJob`
starts it, fills a :class:`~orchestrator.dashboard.app.Comparison` when it
prints its JSON, and :meth:`ComparisonJob.stop` ends it (SIGTERM, then SIGKILL).

Which trace (:func:`default_trace`): openb's ``gpushare60`` list from
``../shared/traces/openb`` beside the checkout when present (the share-heavy list,
~1 minute), else the hand-made ``tests/data/openb_tiny`` of every checkout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

from orchestrator.dashboard.app import Comparison
from orchestrator.deploy.watchdog import die_with_parent

REPO = Path(__file__).resolve().parents[2]
SHARED_OPENB = REPO.parent / "shared" / "traces" / "openb"
TINY = REPO / "tests" / "data" / "openb_tiny"


def default_trace() -> tuple[Path, Path] | None:
    """(nodes, pods) of the trace to compare on; None when neither is on this machine."""
    full = (SHARED_OPENB / "openb_node_list_gpu_node.csv", SHARED_OPENB / "openb_pod_list_gpushare60.csv")
    if all(p.is_file() for p in full):
        return full
    tiny = (TINY / "nodes.csv", TINY / "pods.csv")
    return tiny if all(p.is_file() for p in tiny) else None


class ComparisonJob:
    """``orchestrator sim schemes`` in a child process; see the module docstring."""

    def __init__(self, comparison: Comparison, trace: tuple[Path, Path] | None = None, target_pct: float = 100.0) -> None:
        self.comparison = comparison
        self.trace = trace if trace is not None else default_trace()
        self.target_pct = target_pct
        self.proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "ComparisonJob":
        if self.trace is None:
            self.comparison.fail("no openb trace on this machine (tests/data/openb_tiny is missing)")
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
