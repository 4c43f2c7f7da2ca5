"""The processes of a local cluster, as ``down`` finds them in ``/proc``.

``up`` starts every raylet in a session of its own (``setsid``) and records the session id and start time of each
``ray start`` in the state file; every process of the cluster also carries :data:`RUN_MARKER` in the environment it
started with (job drivers, which Ray starts in sessions of their own, are found by it).

Invariants:

* this module reads ``/proc`` and signals nothing (``down`` does: :mod:`orchestrator.deploy.teardown`);
* a recorded process is the same process only if its start time matches too, so a recycled pid is never taken
  for ours (:func:`_same_process`; :func:`leftovers` does the same for a reused session id);
* :func:`leftovers` is pure: from the state file and a table of live processes, the pids that are the cluster's --
  never the process that asks, nor the watchdog;
* a zombie, or a process gone while it is read, counts as gone; another user's unreadable environment carries no
  marker.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.statefile import Proc, State

#: The environment variable that marks every process of one local cluster (its value: the state's run id).
RUN_MARKER = "ORCHESTRATOR_RUN"


def _stat(pid: int) -> tuple[int, int] | None:
    """(session id, start time in clock ticks) of a live process, None if it is gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    if fields[0] == "Z":
        return None
    return int(fields[3]), int(fields[19])  # session (field 6), starttime (field 22)


def session_members(sid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None and st[0] == sid:
                out.append(int(entry))
    return sorted(out)


def _same_process(p: Proc) -> bool:
    st = _stat(p.pid)
    return st is not None and st[1] == p.start_ticks


@dataclass(frozen=True, slots=True)
class ProcInfo:
    """One live process as ``down`` sees it: its session, start time and run marker (None: none, or unreadable)."""

    pid: int
    sid: int
    start_ticks: int
    run: str | None = None


def _run_marker(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()  # the environment it started with; others' are unreadable
    except OSError:
        return None
    prefix = RUN_MARKER.encode() + b"="
    for entry in raw.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix):].decode(errors="replace")
    return None


def process_table() -> list[ProcInfo]:
    """Every live process of the host, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                out.append(ProcInfo(int(entry), st[0], st[1], _run_marker(int(entry))))
    return out


def leftovers(state: State, table: list[ProcInfo], me: int) -> list[int]:
    """The pids ``down`` SIGKILLs once its SIGTERMs had their grace. Pure.

    A process is ours when it is in the session of a recorded ``ray start`` -- unless that session's leader
    is alive with another start time (the session id, a pid, was reused: someone else's session) -- or
    when it carries this run's marker. Never ``me`` (the process running ``down``) nor the watchdog.
    """
    by_pid = {p.pid: p for p in table}
    sessions = set()
    for p in state.processes:
        leader = by_pid.get(p.sid)
        if leader is None or leader.start_ticks == p.start_ticks:
            sessions.add(p.sid)
    spare = {me} | ({state.watchdog.pid} if state.watchdog is not None else set())
    return sorted(p.pid for p in table if p.pid not in spare
                  and (p.sid in sessions or (state.run_id and p.run == state.run_id)))
