"""The state file of a local orchestrator: where ``orchestrator up`` recorded what it started.

``up`` (:mod:`orchestrator.deploy.local`) writes ``<state dir>/state.json``;
the SDK and every command read it to find the cluster (address, namespace,
head name, the auth and temp-dir environment) and ``down`` reads it to stop
exactly the processes it lists. The state directory is ``--state-dir``, else
``$ORCHESTRATOR_STATE_DIR``, else ``$TMPDIR/rgo-<uid>``.

Invariant: the file is replaced atomically (write to a temporary name, then
rename), so a reader sees the old state or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path


def default_state_dir() -> Path:
    base = os.environ.get("ORCHESTRATOR_STATE_DIR")
    if base:
        return Path(base)
    return Path(os.environ.get("TMPDIR") or "/tmp") / f"rgo-{os.getuid()}"


@dataclass(slots=True)
class Proc:
    node: str
    pid: int
    sid: int
    start_ticks: int


@dataclass(slots=True)
class State:
    """What ``up`` started, for ``status`` and ``down``."""

    address: str
    namespace: str
    head_name: str
    attached: bool
    env: dict[str, str] = field(default_factory=dict)
    processes: list[Proc] = field(default_factory=list)
    started_at: float = 0.0
    up_seconds: float | None = None
    started_head: bool = True  # False when `up --address` found a head already running: down leaves it
    dashboard: str = ""  # Ray's API server (job submission), local clusters only
    #: Every process of a local cluster carries ``ORCHESTRATOR_RUN=<run_id>`` in its environment (a job driver
    #: too, though Ray starts it in a session of its own): how ``down`` finds what the sessions miss.
    run_id: str = ""
    watchdog: Proc | None = None  # stops the cluster if the command that owns it dies (deploy/watchdog.py)
    #: What a driver of this cluster needs for Ray's own GPU API to reach the orchestrator (the hook its raylets
    #: run in every job's driver; ``orchestrator env``): empty for a cluster ``up`` attached to.
    driver_env: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def path(state_dir: Path) -> Path:
        return state_dir / "state.json"

    def save(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp = state_dir / "state.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(self.path(state_dir))

    @classmethod
    def load(cls, state_dir: Path) -> "State | None":
        p = cls.path(state_dir)
        if not p.is_file():
            return None
        d = json.loads(p.read_text())
        d["processes"] = [Proc(**x) for x in d.get("processes", [])]
        if d.get("watchdog"):
            d["watchdog"] = Proc(**d["watchdog"])
        return cls(**d)
