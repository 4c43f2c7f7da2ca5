"""What the live page shows, as JSON: one *frame* per poll of the head, and the curves' history.

:class:`Feed` reads the head through four calls of :class:`~orchestrator.core.api.HeadApi`
-- ``status``, ``job_board``, ``metric_samples`` and ``metric_history`` -- and turns them into a frame
(:func:`build_frame`, pure). ``job_board`` costs the head what the page shows, not every job it
keeps (``list_jobs`` sent all of them, history and lease included, every poll: at 8,000 jobs kept
~300 ms of the head's loop and a 7 MB reply a second):

* ``pipeline``: the stages submit -> queue -> placement -> lease -> agent -> running ->
  checkpoint/preempt -> resume, each with ``now`` (items in the stage at this moment)
  and ``total`` (items that have passed through it since the head started, where the
  head keeps that count);
* ``decisions``: the latest job transitions, newest first, each with the head's reason;
* ``jobs``: one row per live job and per latest ended one, ``rows`` in all (its id is what the page's
  explain and logs links ask for);
* ``cluster``: nodes, GPUs, MIG slices and shares, each share with its holder (the job);
* ``points``: the curves' points the head took since the last frame (``point``: the latest one).

Curves: the head keeps them (:mod:`orchestrator.control.curves`: one point a second for the last hour,
throughput, latency quantiles, utilisation per node, queue depth, preemptions; ``t`` is seconds since the
head started). The feed asks for the whole ring once, then for the points after the latest it has, so
a page whose server restarted draws the same curves as one that ran all along; a new ``origin`` (a
restarted head) starts them again.

Invariant: a frame is JSON-safe and self-contained; nothing here calls anything but the
four read methods, and a frame's size grows with the cluster and ``rows``, not with the jobs kept.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from orchestrator.control.curves import FIELDS, histogram_quantile
from orchestrator.core.stats import quantile

__all__ = ["CURVES", "STAGES", "Feed", "HeadReader", "build_frame", "histogram_quantile", "quantile"]

#: The pipeline's stages, in order: (key, label).
STAGES: tuple[tuple[str, str], ...] = (
    ("submit", "submit"), ("queue", "queue"), ("placement", "placement"), ("lease", "lease"),
    ("agent", "agent"), ("running", "running"), ("preempt", "checkpoint / preempt"), ("resume", "resume"),
)
#: The curves of a point, in the page's order.
CURVES: tuple[str, ...] = FIELDS
_PLACING = {"wait.victims", "wait.preempting"}
Samples = Sequence[Sequence[Any]]


class HeadReader(Protocol):
    """The part of :class:`~orchestrator.core.api.HeadApi` the feed reads."""

    def status(self) -> dict[str, Any]: ...

    def job_board(self, limit: int = 200) -> dict[str, Any]: ...

    def metric_samples(self) -> dict[str, Any]: ...

    def metric_history(self, since: float | None = None) -> dict[str, Any]: ...


# ---- reading samples ------------------------------------------------------------------------------
def total(samples: Samples, name: str, **match: str) -> float:
    """Sum of every sample named ``name`` whose labels include ``match``."""
    return sum(float(v) for n, labels, v in samples if n == name and _has(labels, match) and _finite(v))


def _has(labels: Mapping[str, str], match: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in match.items())


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


# ---- one frame ------------------------------------------------------------------------------------
def pipeline(status: Mapping[str, Any], counts: Mapping[str, int], samples: Samples) -> dict[str, dict[str, Any]]:
    """Per stage: ``now`` (in it at this moment) and ``total`` (through it so far, or None where not counted);
    ``counts`` is ``job_board``'s, over every job the head keeps."""
    leases = status["leases"]
    handed = {lid for n in status["nodes"] for lid in n.get("handed_out", [])}
    pending = [q for q in status["queue"]]
    placing = [q for q in pending if q.get("cause") in _PLACING]
    granted = [le for le in leases if le["state"] == "granted"]
    at_agent = [le for le in granted if le["lease_id"] in handed]
    preempts = total(samples, "orchestrator_preemptions_total")
    return {
        "submit": {"now": counts["waiting_for_lease"], "total": counts["jobs"]},
        "queue": {"now": len(pending) - len(placing), "total": None},
        "placement": {"now": len(placing), "total": None},
        "lease": {"now": len(granted) - len(at_agent),
                  "total": int(total(samples, "orchestrator_leases_granted_total"))},
        "agent": {"now": len(at_agent), "total": None},
        "running": {"now": sum(1 for le in leases if le["state"] == "active"),
                    "total": counts["ever_ran"]},
        "preempt": {"now": sum(1 for le in leases if le["state"] == "checkpointing"), "total": int(preempts)},
        "resume": {"now": counts["resumed_live"], "total": counts["resumptions"]},
    }


def cluster_map(status: Mapping[str, Any], job_of: Mapping[str, str]) -> list[dict[str, Any]]:
    """Nodes -> GPUs -> shares (MIG slices, MPS and time-slice shares, whole cards), each with its holder: the job
    holding the lease (``job_of``: live lease id -> job id), else the lease's owner."""
    leases = {le["lease_id"]: le for le in status["leases"]}
    out = []
    for n in status["nodes"]:
        gpus = []
        for g in n["gpus"]:
            shares = []
            for lid in g["leases"]:
                le = leases.get(lid, {})
                a = le.get("allocation") or {}
                shares.append({"lease_id": lid, "holder": job_of.get(lid) or le.get("owner") or lid,
                               "kind": a.get("kind"), "state": le.get("state"),
                               "share": _share(a), "profile": a.get("mig_profile")})
            slices = [{"profile": m["profile"], "start": m["start"], "lease_id": m.get("lease"),
                       "holder": job_of.get(m.get("lease") or "") or m.get("lease")} for m in g["mig"]]
            gpus.append({"index": g["index"], "model": g["model"], "healthy": g["healthy"],
                         "mig_enabled": g["mig_enabled"], "mig": slices, "shares": shares})
        out.append({"name": n["name"], "state": n["state"], "model": n["model"], "gpus": gpus,
                    "heartbeat_age_s": n["heartbeat_age_s"]})
    return out


def _share(a: Mapping[str, Any]) -> float:
    kind = a.get("kind")
    if kind == "whole":
        return 1.0
    if kind == "mig":
        return 0.0  # drawn as its slice instead
    return float(a.get("milli") or 0) / 1000.0


def build_frame(status: Mapping[str, Any], board: Mapping[str, Any], metrics: Mapping[str, Any],
                points: Sequence[Mapping[str, Any]], latest: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One frame of the page (pure) from ``status``, ``job_board`` and ``metric_samples``; ``points`` are the
    curves' points new since the last frame, ``latest`` the newest point known (see :class:`Feed`)."""
    samples = metrics.get("samples", [])
    last = points[-1] if points else latest
    return {"at": metrics.get("at"), "pipeline": pipeline(status, board["counts"], samples),
            "decisions": list(board["decisions"]), "jobs": list(board["jobs"]),
            "cluster": cluster_map(status, board["lease_jobs"]), "points": [dict(p) for p in points],
            "point": None if last is None else dict(last),
            "head": status.get("head", {}), "endpoints": status.get("endpoints", {})}


# ---- the feed ---------------------------------------------------------------------------------------
@dataclass
class Feed:
    """Polls a head and keeps the latest frame and the curves' history; see the module docstring.

    Thread-safe: one thread polls (:meth:`poll`), any reads (:meth:`latest`, :meth:`history`).
    """

    head: HeadReader
    rows: int = 200  # job rows a frame shows: the live jobs first, then the latest ended ones
    _points: deque[dict[str, Any]] = field(default_factory=deque)
    _frame: dict[str, Any] | None = None
    _version: int = 0
    _origin: float | None = None  # the head's history's origin: another one is a restarted head
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def poll(self) -> dict[str, Any]:
        """Read the head once; returns the new frame (raises what the head raises)."""
        status, board, metrics = self.head.status(), self.head.job_board(self.rows), self.head.metric_samples()
        with self._lock:
            since = self._points[-1]["at"] if self._points and self._origin is not None else None
        hist = self.head.metric_history(since)
        restarted = hist["origin"] != self._origin
        if restarted and since is not None:  # a new head: its history is all new
            hist = self.head.metric_history(None)
        new = list(hist["points"])
        with self._lock:
            if restarted:
                self._origin = hist["origin"]
                self._points = deque(maxlen=max(1, int(hist.get("max_points") or 3600)))
            self._points.extend(new)
            frame = build_frame(status, board, metrics, new, self._points[-1] if self._points else None)
            frame["restarted"] = restarted
            self._version += 1
            frame["version"] = self._version
            self._frame = frame
        return frame

    def latest(self) -> dict[str, Any] | None:
        with self._lock:
            return self._frame

    def version(self) -> int:
        with self._lock:
            return self._version

    def history(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._points)

    def origin(self) -> float | None:
        """The head's history's origin (where ``t`` counts from); another one after a poll: a restarted head."""
        with self._lock:
            return self._origin

    def points_after(self, t: float) -> list[dict[str, Any]]:
        """The points kept whose ``t`` is after ``t``, oldest first (what a page that has up to ``t`` lacks)."""
        with self._lock:
            out = []
            for p in reversed(self._points):
                if p["t"] <= t:
                    break
                out.append(p)
        return out[::-1]
