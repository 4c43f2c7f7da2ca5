"""The live page's curves, kept by the head: a bounded ring of points, one every ``every_s`` (``HeadApi.metric_history``).

A dashboard that only polled kept its curves in its own memory: restarted, it began empty. The head keeps
them instead, so every page -- the first one, one opened later, one whose server restarted -- draws the
same points, read from the same place (docs/dashboard.md, *History*).

One point (:meth:`CurveHistory.record`, pure given its inputs):

* ``grants_per_s`` and ``inference_rps``: the rate of ``orchestrator_leases_granted_total`` and
  ``orchestrator_inference_requests_total`` over the last ``rate_s`` (from the earliest point kept at or
  before the window's start);
* ``wait_p50_s`` / ``wait_p99_s``: time pending (request to grant) of the leases granted in the last
  ``window_s``, exact, from each grant the head counted (:meth:`CurveHistory.granted`);
* ``inference_p50_s`` / ``inference_p99_s``: the inference latency histogram's change over ``window_s``,
  computed as Prometheus' ``histogram_quantile`` (as coarse as its buckets);
* ``util``: mean GPU utilisation per node (``orchestrator_gpu_utilization_ratio``'s value, averaged over
  the node's cards); above ``max_nodes`` nodes one mean over them all, ``"all nodes"``;
* ``queue``: pending leases; ``preemptions``: victims so far (``orchestrator_preemptions_total``);
* ``t``: seconds since the history began (the head's start), ``at``: the head's wall clock.

Bounds (memory): at most ``max_points`` points (default 3,600: an hour at one a second), each a dozen numbers
and at most ``max_nodes`` (64) utilisations -- 3.4 MB at the bound (1.9 MB for three nodes); the grants of the last ``window_s``,
at most ``max_waits`` (10,000) of them (beyond that the oldest drop out of the quantiles); the inference
buckets of the last ``window_s``. Nothing grows with the jobs or leases the head keeps.

Soft state: a restarted head starts a new history (its ``origin`` changes, which tells a reader to start
again). Imports nothing of the head's: :class:`~orchestrator.control.metrics.HeadMetrics` feeds it.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from orchestrator.core.config import Tuning
from orchestrator.core.stats import quantile

#: One point every this many seconds of the head's clock. It, RATE_S and WINDOW_S are the defaults of
#: ``settings.tuning.curves_every_s``, ``curves_rate_s`` and ``curves_window_s``, which the head's service passes.
EVERY_S = Tuning().curves_every_s
#: Points kept (an hour at one a second).
MAX_POINTS = 3600
#: Throughput is a rate over this long.
RATE_S = Tuning().curves_rate_s
#: Latency quantiles are over what happened in this long.
WINDOW_S = Tuning().curves_window_s
#: Utilisation per node up to this many nodes; beyond, one mean over all of them.
MAX_NODES = 64
ALL_NODES = "all nodes"
#: Grants kept for the time-pending quantiles (the latest ``window_s`` of them, at most this many).
MAX_WAITS = 10_000
#: The point's fields, in the page's order (``util`` is a mapping, the others numbers or None).
FIELDS: tuple[str, ...] = ("grants_per_s", "inference_rps", "wait_p50_s", "wait_p99_s", "inference_p50_s",
                           "inference_p99_s", "queue", "preemptions")


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


@dataclass(frozen=True, slots=True)
class Reading:
    """The head's counters at ``at``: what one point is made of (besides the grants' waits)."""

    at: float
    granted: float  # orchestrator_leases_granted_total, summed
    inference: float  # orchestrator_inference_requests_total, summed
    inference_buckets: Mapping[float, float]  # orchestrator_inference_latency_seconds' cumulative buckets, summed
    preemptions: float
    queue: int
    util: Mapping[str, float]  # node -> mean busy fraction of its cards


class CurveHistory:
    """The ring of points and the short windows a new point is computed from; see the module docstring.
    ``origin``: where ``t`` counts from (None: the first reading's time).

    Changed only by the head's thread (:meth:`granted`, :meth:`record`); :meth:`since` copies what it returns."""

    def __init__(self, origin: float | None, *, every_s: float = EVERY_S, max_points: int = MAX_POINTS,
                 rate_s: float = RATE_S, window_s: float = WINDOW_S, max_nodes: int = MAX_NODES,
                 max_waits: int = MAX_WAITS) -> None:
        self.origin = origin
        self.every_s, self.rate_s, self.window_s, self.max_nodes = every_s, rate_s, window_s, max_nodes
        #: each point as (t, at, the FIELDS' values, node names, their utilisations): tuples and a shared names
        #: tuple with an array of doubles, not dicts (an hour of 64 nodes was 26 MB as dicts, ~4 MB this way)
        self.points: deque[tuple[float, float, tuple[Any, ...], tuple[str, ...], array[float]]] = \
            deque(maxlen=max_points)
        self._names: tuple[str, ...] = ()
        self._waits: deque[tuple[float, float]] = deque(maxlen=max_waits)  # (granted at, time pending)
        self._counts: deque[tuple[float, float, float]] = deque()  # (at, granted, inference) over rate_s
        self._buckets: deque[tuple[float, Mapping[float, float]]] = deque()  # (at, buckets) over window_s
        self._last = float("-inf")

    @property
    def max_points(self) -> int:
        return self.points.maxlen or 0

    def granted(self, at: float, waited_s: float) -> None:
        """A lease was granted at ``at`` after ``waited_s`` pending (each grant once)."""
        self._waits.append((at, max(0.0, waited_s)))

    def due(self, now: float) -> bool:
        return now - self._last >= self.every_s

    def record(self, r: Reading) -> dict[str, Any]:
        """Append the point of reading ``r`` (taken after the previous one) and return it."""
        self._last = r.at
        if self.origin is None:
            self.origin = r.at
        self._counts.append((r.at, r.granted, r.inference))
        while len(self._counts) > 2 and self._counts[1][0] <= r.at - self.rate_s:
            self._counts.popleft()  # keep one reading at or before the rate window's start
        at0, granted0, inference0 = self._counts[0]
        dt = r.at - at0
        self._buckets.append((r.at, dict(r.inference_buckets)))
        while self._buckets and self._buckets[0][0] < r.at - self.window_s:
            self._buckets.popleft()
        before = self._buckets[0][1] if len(self._buckets) > 1 else {}
        while self._waits and self._waits[0][0] < r.at - self.window_s:
            self._waits.popleft()
        waits = [w for at, w in self._waits if at <= r.at]
        util = dict(sorted(r.util.items()))
        if len(util) > self.max_nodes:
            util = {ALL_NODES: round(sum(util.values()) / len(util), 4)}
        point = {
            "t": round(r.at - self.origin, 3), "at": r.at,
            "grants_per_s": round((r.granted - granted0) / dt, 4) if dt > 0 else 0.0,
            "inference_rps": round((r.inference - inference0) / dt, 3) if dt > 0 else 0.0,
            "wait_p50_s": _r(quantile(waits, 0.5)), "wait_p99_s": _r(quantile(waits, 0.99)),
            "inference_p50_s": _r(histogram_quantile(0.5, r.inference_buckets, before)),
            "inference_p99_s": _r(histogram_quantile(0.99, r.inference_buckets, before)),
            "util": {k: round(v, 4) for k, v in util.items()},
            "queue": int(r.queue), "preemptions": int(r.preemptions),
        }
        names = tuple(point["util"])
        if names != self._names:
            self._names = names  # shared by every point until the nodes change
        self.points.append((point["t"], point["at"], tuple(point[f] for f in FIELDS), self._names,
                            array("d", point["util"].values())))
        return point

    def since(self, since: float | None, now: float) -> dict[str, Any]:
        """The reply of ``HeadApi.metric_history``: the points taken after ``since`` (head wall clock; None: all
        kept), oldest first, with the history's ``origin``, cadence and bound."""
        points: Sequence[tuple[Any, ...]] = list(self.points)
        if since is not None:
            lo, hi = 0, len(points)  # points are in time order: bisect on "at"
            while lo < hi:
                mid = (lo + hi) // 2
                if points[mid][1] <= since:
                    lo = mid + 1
                else:
                    hi = mid
            points = points[lo:]
        return {"at": now, "origin": now if self.origin is None else self.origin, "every_s": self.every_s,
                "max_points": self.max_points, "rate_s": self.rate_s, "window_s": self.window_s,
                "points": [{"t": t, "at": at, **dict(zip(FIELDS, values)), "util": dict(zip(names, util))}
                           for t, at, values, names, util in points]}


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 4)
