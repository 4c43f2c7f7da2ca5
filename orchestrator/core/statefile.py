"""The state file of a local orchestrator: where ``orchestrator up`` recorded what it started.

``up`` (:mod:`orchestrator.deploy.local`) writes ``<state dir>/state.json``;
the SDK and every command read it to find the cluster (address, namespace,
head name, the auth and temp-dir environment) and ``down`` reads it to stop
exactly the processes it lists. The state directory is ``--state-dir``, else
``$ORCHESTRATOR_STATE_DIR``, else ``$TMPDIR/rgo-<uid>``.

Invariant: the file is replaced atomically (write to a temporary name, then
rename), so a reader sees the old state or the new one, never half of one.

The folder holds the cluster's auth token and the list of processes ``down``
stops, and its default name is predictable, so it is used only when it is a
directory of this user's that nobody else may write to (:func:`checked_state_dir`):
``up`` makes it 0700, and a folder someone else made (or opened up) is refused,
never adopted with whatever token it holds (docs/security.md).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping

from orchestrator.core.errors import ConfigError


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    base = environ.get("ORCHESTRATOR_STATE_DIR")
    if base:
        return Path(base)
    return Path(environ.get("TMPDIR") or "/tmp") / f"rgo-{os.getuid()}"


def checked_state_dir(state_dir: Path, *, create: bool = False) -> Path:
    """``state_dir``, made 0700 when ``create`` and it is missing. Refused (:class:`ConfigError` naming
    ``state_dir``) when it is a symbolic link or not a directory, belongs to another user, or others may write
    to it. A missing folder is fine when not ``create`` (nothing to read in it)."""
    if create and not os.path.lexists(state_dir):
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        st = state_dir.lstat()
    except FileNotFoundError:
        return state_dir
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ConfigError("state_dir", str(state_dir), "a directory of yours (not a symbolic link or a file)")
    if st.st_uid != os.getuid():
        raise ConfigError("state_dir", str(state_dir), "a directory you own",
                          detail=f"it belongs to uid {st.st_uid}, not to you (uid {os.getuid()}): someone else made "
                                 "it, maybe to hand you their auth token; pass --state-dir or ORCHESTRATOR_STATE_DIR")
    if st.st_mode & 0o022:
        raise ConfigError("state_dir", str(state_dir), "a directory only you may write to",
                          detail=f"its mode is {stat.S_IMODE(st.st_mode):04o}: chmod 700 it, or pass another "
                                 "--state-dir")
    return state_dir


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
        checked_state_dir(state_dir, create=True)
        tmp = state_dir / "state.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(self.path(state_dir))

    @classmethod
    def load(cls, state_dir: Path) -> "State | None":
        """The state ``up`` recorded in ``state_dir`` (None: none); a folder others may have written is refused."""
        checked_state_dir(state_dir)
        p = cls.path(state_dir)
        if not p.is_file():
            return None
        d = json.loads(p.read_text())
        d["processes"] = [Proc(**x) for x in d.get("processes", [])]
        if d.get("watchdog"):
            d["watchdog"] = Proc(**d["watchdog"])
        return cls(**d)
