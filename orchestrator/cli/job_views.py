"""How the job commands (:mod:`orchestrator.cli.jobs`) show what the head answered: the tables of ``jobs``,
``leases``, ``queue`` and ``nodes`` (rich, plain text in every cell: brackets in a reason are not markup),
``explain``'s text, and ``jobs --watch`` -- the first table, then a line (or a document) per change of a
job, every :data:`WATCH_POLL_S`, until Ctrl-C, SIGTERM or SIGHUP.

The tables and lines are pure functions of the head's answer (and ``now``); only the watch loop reads the
head again, through the ``fetch`` it is given, and writes through ``out``.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import typer

from orchestrator.cli.options import render


def _console() -> Any:
    from rich.console import Console

    # Piped output is not cut to 80 columns; COLUMNS, when set, still wins (rich reads it).
    return Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160, highlight=False)


#: How often ``jobs --watch`` reads the head.
WATCH_POLL_S = 1.0


def watch_jobs(fetch: Callable[[], list[dict[str, Any]]], states: frozenset[str], fmt: str,
               out: Callable[[str], None], *, sleep: Callable[[float], None] = time.sleep,
               now: Callable[[], float] = time.time) -> None:
    """``jobs --watch``: the jobs (in ``states``, if any) as a table (``fmt`` table) or one document each, then,
    every :data:`WATCH_POLL_S`, each job whose state, message, attempt or place changed, one line (or document)
    each. A job that leaves ``states`` is shown once more, in its new state, then no longer followed. Returns
    only by an exception: ``KeyboardInterrupt`` ends it."""
    shown: dict[str, tuple[Any, ...]] = {}
    first = True
    while True:
        changed = []
        for j in fetch():
            key = (j["state"], j.get("message"), j.get("attempt"), _where(j.get("lease")))
            matches = not states or j["state"] in states
            if matches or j["job_id"] in shown:  # leaving the filter: shown once more, then no longer followed
                if shown.get(j["job_id"]) != key:
                    changed.append(j)
                if matches:
                    shown[j["job_id"]] = key
                else:
                    shown.pop(j["job_id"], None)
        if fmt == "table" and first:
            _console().print(jobs_table(changed, now=now()))
        elif fmt == "table":
            for j in changed:
                out(watch_line(j, now=now()))
        else:
            for j in changed:
                out(render(j, "json") if fmt == "json" else "---\n" + render(j, fmt))
        first = False
        sleep(WATCH_POLL_S)


def _sleep_between_reads(seconds: float) -> None:
    time.sleep(seconds)


def watch_line(j: dict[str, Any], *, now: float) -> str:
    """One change of a job, as ``jobs --watch`` prints it. Pure."""
    msg = j.get("message") or ((j.get("history") or [{}])[-1].get("reason") or "")
    return (f"{time.strftime('%H:%M:%S', time.localtime(now))}  {j['job_id']}  {j['state']}  "
            f"{_where(j.get('lease'))}  try {j.get('attempt') or '-'}" + (f"  {msg}" if msg else ""))


@contextmanager
def _real_stdout() -> Iterator[Callable[[str], None]]:
    """A line writer to stdout as it is now, which stays stdout while :func:`stdout_to_stderr` points file
    descriptor 1 at stderr (a watch prints while connected). Where stdout is no file (a test's runner), echo."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        yield typer.echo
        return
    sys.stdout.flush()
    f = os.fdopen(os.dup(fd), "w", buffering=1)

    def write(line: str) -> None:
        f.write(line + "\n")
        f.flush()
    try:
        yield write
    finally:
        f.close()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextmanager
def _stop_signals_interrupt() -> Iterator[None]:
    """While open, SIGTERM and SIGHUP raise ``KeyboardInterrupt`` as Ctrl-C does (main thread only); the earlier
    handlers come back after."""
    old = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


_STATE_STYLE = {"queued": "yellow", "admitted": "cyan", "running": "green", "preempting": "magenta",
                "succeeded": "bold green", "failed": "bold red", "cancelled": "dim", "pending": "yellow",
                "granted": "cyan", "active": "green", "checkpointing": "magenta"}


def _styled(state: str) -> Any:
    from rich.text import Text

    return Text(state, style=_STATE_STYLE.get(state, ""))


def _age(now: float, then: float | None) -> str:
    if not then:
        return "-"
    s = max(0.0, now - then)
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h"


def _where(lease: dict[str, Any] | None) -> str:
    a = (lease or {}).get("allocation")
    if not a:
        return "-"
    s = f"{a['node']} gpu {','.join(str(i) for i in a['gpu_indices'])}"
    if a.get("mig_profile"):
        s += f" {a['mig_profile']}"
    elif a.get("kind") in ("mps", "timeslice"):
        s += f" ({a['kind']} {a.get('milli', 0) / 10:g}%)"
    return s


def _table(title: str, *columns: str) -> Any:
    from rich import box
    from rich.table import Table

    t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    for i, c in enumerate(columns):  # the first column is an id, copied from here: never cut or folded
        t.add_column(c, no_wrap=i == 0, overflow="fold")
    return t


def _row(t: Any, *cells: Any) -> None:
    """Add a row of plain text: brackets in reasons ("[mig:1g.20gb]") are not rich markup."""
    from rich.text import Text

    t.add_row(*(c if isinstance(c, Text) else Text(str(c)) for c in cells))


def jobs_table(jobs: list[dict[str, Any]], *, now: float) -> Any:
    t = _table(f"jobs ({len(jobs)})", "JOB", "STATE", "CLASS", "GPU", "QUEUE", "WHERE", "TRY", "AGE", "MESSAGE")
    for j in jobs:
        msg = j.get("message") or ((j.get("history") or [{}])[-1].get("reason") or "")
        _row(t, j["job_id"], _styled(j["state"]), j.get("priority_class") or "-", j.get("gpu") or "-",
                  j.get("queue") or "-", _where(j.get("lease")), str(j.get("attempt") or "-"),
                  _age(now, j.get("submitted_at")), msg)
    return t


def leases_table(leases: list[dict[str, Any]], *, now: float) -> Any:
    t = _table(f"leases ({len(leases)})", "LEASE", "STATE", "OWNER", "CLASS", "PRIO", "REQUEST", "WHERE", "TOKEN", "AGE")
    for le in leases:
        hist = le.get("history") or []
        _row(t, le["lease_id"], _styled(le["state"]), le.get("owner") or "-", le.get("priority_class") or "-",
                  str(le.get("priority", "-")), le.get("request") or "-", _where(le),
                  str(le.get("fencing_token") or "-"), _age(now, hist[0]["at"] if hist else None))
    return t


def queue_table(queue: list[dict[str, Any]]) -> Any:
    t = _table(f"queue ({len(queue)})", "#", "LEASE", "OWNER", "REQUEST", "PRIO", "WHY PENDING")
    for i, q in enumerate(queue, 1):
        _row(t, str(i), q["lease_id"], q.get("owner") or "-", q.get("request") or "-", str(q.get("priority", "-")),
                  q.get("why_pending") or "(not considered yet)")
    return t


def queues_table(queues: list[dict[str, Any]]) -> Any:
    """The queue tree, indented by depth: guarantee, weight, limit, used, asked, fair share and why. Pure."""
    t = _table(f"queues ({len(queues)})", "QUEUE", "GUARANTEE", "WEIGHT", "LIMIT", "USED", "ASKED", "FAIR SHARE",
               "WHY")
    for q in queues:
        limit = q.get("limit_gpus")
        _row(t, "  " * int(q.get("depth", 0)) + q["queue"], f"{q.get('guarantee_gpus', 0):g}", f"{q.get('weight', 1):g}",
             "-" if limit is None else f"{limit:g}", f"{q.get('used_gpus', 0):g}", f"{q.get('asked_gpus', 0):g}",
             f"{q.get('fair_share_gpus', 0):.3g}", q.get("reason") or "")
    return t


def nodes_table(nodes: list[dict[str, Any]]) -> Any:
    """One row per GPU; a "K8S LABELS" column when the head has a Kubernetes cross-check ('' where a node agrees)."""
    from rich.text import Text

    k8s = any("k8s_inventory" in n for n in nodes)
    cols = ["NODE", "STATE", "GPU", "MODEL", "MEMORY", "HEALTH", "MIG", "LEASES"] + (["K8S LABELS"] if k8s else [])
    t = _table(f"nodes ({len(nodes)})", *cols)
    for n in nodes:
        state = Text(n["state"], style="green" if n["state"] == "registered" else "bold red")
        extra = [n.get("k8s_inventory") or "agrees"] if k8s else []
        if not n.get("gpus"):
            _row(t, n["name"], state, "-", n.get("model") or "-", "-", "-", "-", "-", *extra)
        for i, g in enumerate(n.get("gpus") or []):
            mig = ", ".join(f"{m['profile']}" + (f"={m['lease']}" if m.get("lease") else "") for m in g.get("mig") or [])
            health = "ok" if g.get("healthy", True) else (g.get("health_reason") or "unhealthy")
            _row(t, n["name"] if i == 0 else "", state if i == 0 else "", str(g["index"]), g.get("model") or "-",
                 f"{g.get('memory_mib', 0) / 1024:g}GiB", health, mig or "-", ", ".join(g.get("leases") or []) or "-",
                 *(extra if i == 0 else [""] * len(extra)))
    return t


def render_explain(d: dict[str, Any]) -> str:
    """``explain``'s answer as text: summary first, then the details behind it. Pure."""
    lines = [f"job {d['job_id']} ({d.get('name', '')}): {d['state']}", f"  {d.get('summary') or ''}".rstrip()]
    p = d.get("pending")
    if p:
        lines.append(f"  queue position: {p['position'] + 1}")
        if p.get("reasons"):
            lines.append("  why no node fits:")
            for r in p["reasons"]:
                lines.append(f"    {r['nodes']} node{'s' if r['nodes'] != 1 else ''}: {r['reason']}  [{r['alternative']}]")
        if p.get("being_preempted"):
            lines.append("  waiting for these to checkpoint and yield:")
            lines += [f"    {v['owner']} (lease {v['lease_id']})" for v in p["being_preempted"]]
        if p.get("would_preempt"):
            lines.append("  preempting these would admit it:")
            lines += [f"    {v['owner']} (lease {v['lease_id']})" for v in p["would_preempt"]]
        elif p.get("preemption_blocked"):
            lines.append(f"  no preemption: {p['preemption_blocked']}")
    pl = d.get("placement")
    if pl:
        lines.append(f"  placed on: {pl['node']} GPU {','.join(str(i) for i in pl['gpu_indices'])} ({pl['kind']})")
    if d.get("workers"):
        lines.append(f"  gang of {len(d['workers'])} workers, granted all or none:")
        lines += [f"    worker {w['worker']} ({w['lease_id']}): {w['state']}" + (f" on {w['node']}" if w.get("node") else "")
                  + (f" -- {w['reason']}" if w.get("reason") else "") for w in d["workers"]]
    for i, pr in enumerate(d.get("preemptions") or [], 1):
        at = time.strftime("%H:%M:%S", time.localtime(pr["at"])) if pr.get("at") else "?"
        lines.append(f"  preempted #{i} at {at} by {pr['by']}: {pr['reason']}; checkpoint {pr.get('checkpoint_path') or '(none)'}")
    return "\n".join(lines)
