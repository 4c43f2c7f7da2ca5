"""What the live page shows, as JSON: one *frame* per poll of the head, and the curves' history.

:class:`Feed` reads the head through three calls of :class:`~orchestrator.core.api.HeadApi`
-- ``status``, ``job_board`` and ``metric_samples`` -- and turns them into a frame
(:func:`build_frame`, pure). ``job_board`` costs the head what the page shows, not every job it
keeps (``list_jobs`` sent all of them, history and lease included, every poll: at 8,000 jobs kept
~300 ms of the head's loop and a 7 MB reply a second):

* ``pipeline``: the stages submit -> queue -> placement -> lease -> agent -> running ->
  checkpoint/preempt -> resume, each with ``now`` (items in the stage at this moment)
  and ``total`` (items that have passed through it since the head started, where the
  head keeps that count);
* ``decisions``: the latest job transitions, newest first, each with the head's reason;
* ``jobs``: one row per live job and per latest ended one, ``rows`` in all (its id is what the page's
  explain link asks for);
* ``cluster``: nodes, GPUs, MIG slices and shares, each share with its holder (the job);
* ``point``: one point of every curve (below), appended to the history.

Curves (one point per poll; ``t`` is seconds since the feed started):

* ``grants_per_s`` and ``inference_rps``: throughput, the rate of
  ``orchestrator_leases_granted_total`` and ``orchestrator_inference_requests_total``
  over the last ``rate_s`` seconds;
* ``wait_p50_s`` / ``wait_p99_s``: time pending of the leases granted in the last
  ``window_s`` (exact, from the leases' histories); ``inference_p50_s`` /
  ``inference_p99_s``: the inference latency histogram's change over the same window
  (Prometheus' ``histogram_quantile``, so as coarse as its buckets);
* ``util``: mean GPU utilisation per node (``orchestrator_gpu_utilization_ratio``);
* ``queue``: pending leases; ``preemptions``: victims so far.

Invariant: a frame is JSON-safe and self-contained; nothing here calls anything but the
three read methods, and a frame's size grows with the cluster and ``rows``, not with the jobs kept.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from orchestrator.core.stats import quantile

#: The pipeline's stages, in order: (key, label).
STAGES: tuple[tuple[str, str], ...] = (
    ("submit", "submit"), ("queue", "queue"), ("placement", "placement"), ("lease", "lease"),
    ("agent", "agent"), ("running", "running"), ("preempt", "checkpoint / preempt"), ("resume", "resume"),
)
#: The curves of a point, in the page's order.
CURVES: tuple[str, ...] = ("grants_per_s", "inference_rps", "wait_p50_s", "wait_p99_s", "inference_p50_s",
                           "inference_p99_s", "queue", "preemptions")
_PLACING = {"wait.victims", "wait.preempting"}
Samples = Sequence[Sequence[Any]]


class HeadReader(Protocol):
    """The part of :class:`~orchestrator.core.api.HeadApi` the feed reads."""

    def status(self) -> dict[str, Any]: ...

    def job_board(self, limit: int = 200) -> dict[str, Any]: ...

    def metric_samples(self) -> dict[str, Any]: ...


# ---- reading samples ------------------------------------------------------------------------------
def total(samples: Samples, name: str, **match: str) -> float:
    """Sum of every sample named ``name`` whose labels include ``match``."""
    return sum(float(v) for n, labels, v in samples if n == name and _has(labels, match) and _finite(v))


def by_label(samples: Samples, name: str, label: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for n, labels, v in samples:
        if n == name and label in labels and _finite(v):
            out.setdefault(labels[label], []).append(float(v))
    return out


def buckets(samples: Samples, name: str) -> dict[float, float]:
    """A histogram's cumulative bucket counts, summed over its other labels: ``{le: count}``."""
    out: dict[float, float] = {}
    for n, labels, v in samples:
        if n == f"{name}_bucket":
            le = float(labels["le"])
            out[le] = out.get(le, 0.0) + float(v)
    return out


def histogram_quantile(q: float, now: Mapping[float, float], before: Mapping[float, float]) -> float | None:
    """Prometheus' ``histogram_quantile`` over the change of cumulative buckets (linear within a bucket)."""
    delta = sorted((le, now[le] - before.get(le, 0.0)) for le in now)
    if not delta or delta[-1][1] <= 0:
        return None
    rank = q * delta[-1][1]
    lo_le, lo_count = 0.0, 0.0
    for le, count in delta:
        if count >= rank:
            if math.isinf(le):
                return lo_le  # Prometheus answers the highest finite bound
            width = count - lo_count
            return lo_le + (le - lo_le) * ((rank - lo_count) / width if width > 0 else 1.0)
        lo_le, lo_count = le, count
    return None


def _has(labels: Mapping[str, str], match: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in match.items())


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


# ---- one frame ------------------------------------------------------------------------------------
def _entered(history: Iterable[Mapping[str, Any]], state: str) -> float | None:
    at = [h["at"] for h in history if h["state"] == state]
    return at[-1] if at else None


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
                point: Mapping[str, Any]) -> dict[str, Any]:
    """One frame of the page (pure) from ``status``, ``job_board`` and ``metric_samples``; ``point`` is the curves'
    new point (see :class:`Feed`)."""
    samples = metrics.get("samples", [])
    return {"at": metrics.get("at"), "pipeline": pipeline(status, board["counts"], samples),
            "decisions": list(board["decisions"]), "jobs": list(board["jobs"]),
            "cluster": cluster_map(status, board["lease_jobs"]), "point": dict(point),
            "head": status.get("head", {}), "endpoints": status.get("endpoints", {})}


# ---- the feed ---------------------------------------------------------------------------------------
@dataclass
class Feed:
    """Polls a head and keeps the latest frame and the curves' history; see the module docstring.

    Thread-safe: one thread polls (:meth:`poll`), any reads (:meth:`latest`, :meth:`history`).
    """

    head: HeadReader
    window_s: float = 30.0
    max_points: int = 3600
    rows: int = 200  # job rows a frame shows: the live jobs first, then the latest ended ones
    clock: Callable[[], float] = time.monotonic
    _points: deque[dict[str, Any]] = field(default_factory=deque)
    _frame: dict[str, Any] | None = None
    _version: int = 0
    rate_s: float = 5.0
    _counts: deque[tuple[float, float, float]] = field(default_factory=deque)
    _window: deque[tuple[float, dict[float, float]]] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _start: float | None = None

    def poll(self) -> dict[str, Any]:
        """Read the head once; returns the new frame (raises what the head raises)."""
        status, board, metrics = self.head.status(), self.head.job_board(self.rows), self.head.metric_samples()
        now = self.clock()
        if self._start is None:
            self._start = now
        t = round(now - self._start, 3)
        point = self._point(t, metrics.get("at"), status, metrics.get("samples", []))
        frame = build_frame(status, board, metrics, point)
        with self._lock:
            self._points.append(frame["point"])
            while len(self._points) > self.max_points:
                self._points.popleft()
            self._version += 1
            frame["version"] = self._version
            self._frame = frame
        return frame

    def _point(self, t: float, wall: float | None, status: Mapping[str, Any], samples: Samples) -> dict[str, Any]:
        granted = total(samples, "orchestrator_leases_granted_total")
        inference = total(samples, "orchestrator_inference_requests_total")
        inf_b = buckets(samples, "orchestrator_inference_latency_seconds")
        self._counts.append((t, granted, inference))
        while len(self._counts) > 2 and self._counts[1][0] <= t - self.rate_s:
            self._counts.popleft()  # keep one point at or before the rate window's start
        t0, granted0, inference0 = self._counts[0]
        dt = t - t0
        self._window.append((t, inf_b))
        while self._window and self._window[0][0] < t - self.window_s:
            self._window.popleft()
        before = self._window[0][1] if len(self._window) > 1 else {}
        waits = _recent_waits(status, self.window_s, wall)
        util = {node: round(sum(v) / len(v), 4)
                for node, v in by_label(samples, "orchestrator_gpu_utilization_ratio", "node").items()}
        point = {
            "t": t,
            "grants_per_s": round((granted - granted0) / dt, 4) if dt > 0 else 0.0,
            "inference_rps": round((inference - inference0) / dt, 3) if dt > 0 else 0.0,
            "wait_p50_s": _r(quantile(waits, 0.5)), "wait_p99_s": _r(quantile(waits, 0.99)),
            "inference_p50_s": _r(histogram_quantile(0.5, inf_b, before)),
            "inference_p99_s": _r(histogram_quantile(0.99, inf_b, before)),
            "util": util,
            "queue": len(status["queue"]),
            "preemptions": int(total(samples, "orchestrator_preemptions_total")),
        }
        return point

    def latest(self) -> dict[str, Any] | None:
        with self._lock:
            return self._frame

    def version(self) -> int:
        with self._lock:
            return self._version

    def history(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._points)


def _recent_waits(status: Mapping[str, Any], window_s: float, now: float | None) -> list[float]:
    """Time pending (request to grant) of every lease granted within the window before ``now``."""
    waits = []
    grants: list[tuple[float, float]] = []
    for le in list(status["leases"]) + list(status.get("ended_leases", [])):
        hist = le.get("history") or []
        granted = _entered(hist, "granted")
        if granted is not None and hist:
            grants.append((granted, granted - hist[0]["at"]))
    if not grants:
        return waits
    latest = now if now is not None else max(g for g, _ in grants)
    return [w for g, w in grants if g >= latest - window_s]


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 4)
