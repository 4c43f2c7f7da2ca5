"""An open-loop load generator: replays a request-rate curve over HTTP on 127.0.0.1 and records every request.

Importable (``run``, ``start``, ``parse_curve``) and a command line::

    python jobs/loadgen.py --url http://127.0.0.1:8000/ --load-curve jobs/curves/spike.csv --slo-ms 200 --json
    python jobs/loadgen.py --url ... --curve spike:base=4,peak=40,at=20,for=30,duration=80

**The curve** is ``seconds,requests_per_s`` points (a CSV with that header, or
one of ``steady``, ``spike``, ``diurnal`` built here). The rate between two
points is interpolated linearly; the replay ends at the last point. Time is
compressed by ``compress``: curve second ``s`` is replayed at wall second
``s / compress`` (a day's curve, 86,400 s, in 120 s with ``compress=720``),
while the rate stays what the service sees per wall second -- so a compressed
day sends what the curve says at each moment, not 720 times as much.

**Arrivals** are a non-homogeneous Poisson process (thinning against the
curve's peak rate, seeded: the same seed gives the same send times). The
generator is **open-loop**: each request is sent at its time whether or not
earlier ones have answered, as users do, so a slow service shows up as
latency, not as a lower offered load.

**Records**: every request's send time (wall seconds since the replay
started), latency (seconds, until the whole body came back) and status (the
HTTP status, or the exception's class name when none came back). A request
misses the SLO when its latency exceeds it or it did not succeed (status 200).

Curve errors are :class:`CurveError`, an ``InvalidRequestError`` naming the
field (``line 3: requests_per_s``) and what is allowed.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

try:
    from orchestrator.core.errors import InvalidRequestError
except ImportError:  # run from a checkout without the package on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from orchestrator.core.errors import InvalidRequestError

INPUT_WIDTH = 32
CURVES = ("steady", "spike", "diurnal")


class CurveError(InvalidRequestError):
    """A rate curve that cannot be replayed; ``field`` names where (``line 3: seconds``, ``spike.peak``)."""


@dataclass(frozen=True)
class RateCurve:
    """Piecewise-linear requests per (wall) second over curve seconds.

    Invariants: at least one point; times start at 0 and strictly increase; rates are finite and >= 0."""

    points: tuple[tuple[float, float], ...]
    name: str = "curve"

    def __post_init__(self) -> None:
        if not self.points:
            raise CurveError("points", "[]", "at least one (seconds, requests_per_s) point")
        if self.points[0][0] != 0:
            raise CurveError("points[0].seconds", self.points[0][0], "0: a curve starts at second 0")
        for i, (t, r) in enumerate(self.points):
            if not (math.isfinite(t) and math.isfinite(r)) or r < 0:
                raise CurveError(f"points[{i}]", (t, r), "finite seconds and a rate >= 0")
            if i and t <= self.points[i - 1][0]:
                raise CurveError(f"points[{i}].seconds", t, f"greater than the previous point's {self.points[i - 1][0]:g}")

    @property
    def duration_s(self) -> float:
        return self.points[-1][0]

    @property
    def peak(self) -> float:
        return max(r for _, r in self.points)

    def rate(self, s: float) -> float:
        """Requests per second at curve second ``s`` (0 outside the curve)."""
        pts = self.points
        if s < 0 or s > pts[-1][0]:
            return 0.0
        for (t0, r0), (t1, r1) in zip(pts, pts[1:]):
            if t0 <= s <= t1:
                return r0 + (r1 - r0) * (s - t0) / (t1 - t0)
        return pts[-1][1]

    def expected_requests(self, compress: float = 1.0) -> float:
        """The mean number of requests a replay sends (trapezoids over wall time)."""
        return sum((r0 + r1) / 2 * (t1 - t0) for (t0, r0), (t1, r1) in zip(self.points, self.points[1:])) / compress


def steady(rps: float, duration_s: float) -> RateCurve:
    return RateCurve(((0.0, float(rps)), (float(duration_s), float(rps))), "steady")


def spike(base: float, peak: float, at_s: float, for_s: float, duration_s: float, ramp_s: float = 1.0) -> RateCurve:
    """``base`` rps, rising to ``peak`` at ``at_s`` (over ``ramp_s``), back to ``base`` after ``for_s``."""
    if not (0 < at_s and at_s + ramp_s + for_s + ramp_s < duration_s):
        raise CurveError("spike", f"at={at_s:g},for={for_s:g},duration={duration_s:g}",
                         "0 < at and at + for + 2 x ramp < duration")
    pts = [(0.0, base), (at_s, base), (at_s + ramp_s, peak), (at_s + ramp_s + for_s, peak),
           (at_s + 2 * ramp_s + for_s, base), (duration_s, base)]
    return RateCurve(tuple((float(t), float(r)) for t, r in pts), "spike")


def diurnal(low: float, high: float, duration_s: float = 86_400.0, peak_at_s: float | None = None,
            points: int = 48) -> RateCurve:
    """A day: a cosine from ``low`` (at ``peak_at_s`` + half a day) to ``high`` (at ``peak_at_s``, default
    14:00 of the day), sampled at ``points`` + 1 points."""
    peak_at = duration_s * 14 / 24 if peak_at_s is None else peak_at_s
    pts = []
    for i in range(points + 1):
        t = duration_s * i / points
        pts.append((t, low + (high - low) * (1 + math.cos(2 * math.pi * (t - peak_at) / duration_s)) / 2))
    return RateCurve(tuple(pts), "diurnal")


def read_csv(path: str | Path) -> RateCurve:
    """A ``seconds,requests_per_s`` CSV (header required; ``#`` lines are comments)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise CurveError("load_curve", str(p), "a readable CSV file", str(e)) from None
    rows = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip() and not line.lstrip().startswith("#")]
    if not rows:
        raise CurveError(f"{p.name}: header", "", "a header 'seconds,requests_per_s' and at least one row")
    head = [c.strip() for c in next(csv.reader([rows[0][1]]))]
    if head != ["seconds", "requests_per_s"]:
        raise CurveError(f"{p.name} line {rows[0][0]}: header", ",".join(head), "seconds,requests_per_s")
    pts: list[tuple[float, float]] = []
    for n, line in rows[1:]:
        cells = [c.strip() for c in next(csv.reader([line]))]
        if len(cells) != 2:
            raise CurveError(f"{p.name} line {n}", line, "two columns: seconds,requests_per_s")
        vals = []
        for name, cell in zip(("seconds", "requests_per_s"), cells):
            try:
                v = float(cell)
            except ValueError:
                v = float("nan")
            if not math.isfinite(v) or v < 0:
                raise CurveError(f"{p.name} line {n}: {name}", cell, "a finite number >= 0")
            vals.append(v)
        if pts and vals[0] <= pts[-1][0]:
            raise CurveError(f"{p.name} line {n}: seconds", cells[0], f"greater than the previous row's {pts[-1][0]:g}")
        if not pts and vals[0] != 0:
            raise CurveError(f"{p.name} line {n}: seconds", cells[0], "0: the first row is second 0")
        pts.append((vals[0], vals[1]))
    if not pts:
        raise CurveError(f"{p.name}: rows", "", "at least one row after the header")
    return RateCurve(tuple(pts), p.stem)


def parse_curve(spec: str) -> RateCurve:
    """A CSV path, or ``steady:rps=R,duration=S``, ``spike:base=B,peak=P,at=A,for=F,duration=S[,ramp=R]``,
    ``diurnal:low=L,high=H[,duration=S,peak_at=T]``."""
    name, _, args = spec.partition(":")
    if name not in CURVES:
        if spec.endswith(".csv") or Path(spec).exists():
            return read_csv(spec)
        raise CurveError("curve", spec, [f"{c}:key=value,..." for c in CURVES] + ["a path to a .csv"])
    kw: dict[str, float] = {}
    for part in filter(None, (a.strip() for a in args.split(","))):
        k, eq, v = part.partition("=")
        try:
            kw[k.strip()] = float(v)
        except ValueError:
            raise CurveError(f"{name}.{k.strip()}", v, "a number") from None
        if not eq:
            raise CurveError(f"{name}", part, "key=value")
    need = {"steady": ({"rps", "duration"}, set()), "spike": ({"base", "peak", "at", "for", "duration"}, {"ramp"}),
            "diurnal": ({"low", "high"}, {"duration", "peak_at", "points"})}[name]
    missing, unknown = need[0] - kw.keys(), kw.keys() - need[0] - need[1]
    if missing or unknown:
        raise CurveError(f"{name}.{sorted(missing or unknown)[0]}", args, sorted(need[0]) + [f"[{o}]" for o in sorted(need[1])])
    if name == "steady":
        return steady(kw["rps"], kw["duration"])
    if name == "spike":
        return spike(kw["base"], kw["peak"], kw["at"], kw["for"], kw["duration"], kw.get("ramp", 1.0))
    return diurnal(kw["low"], kw["high"], kw.get("duration", 86_400.0), kw.get("peak_at"), int(kw.get("points", 48)))


def arrivals(curve: RateCurve, *, compress: float = 1.0, seed: int = 0) -> list[float]:
    """Send times, in wall seconds from the start, of a Poisson process whose rate follows ``curve``."""
    if not compress > 0:
        raise CurveError("compress", compress, "a factor > 0")
    rng = random.Random(seed)
    peak, end = curve.peak, curve.duration_s / compress
    out: list[float] = []
    if peak <= 0:
        return out
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= end:
            return out
        if rng.random() * peak < curve.rate(t * compress):
            out.append(t)


@dataclass(frozen=True, slots=True)
class Record:
    sent_s: float  # wall seconds since the replay started
    latency_s: float
    status: int | str  # the HTTP status, or the exception's class name

    @property
    def ok(self) -> bool:
        return self.status == 200


def percentile(xs: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100), as every figure of the project is computed (``orchestrator.core.stats``:
    linear between the two closest ranks, numpy's default); None for no values."""
    from orchestrator.core.stats import quantile

    return quantile(xs, q / 100)


def summarize(records: Iterable[Record], slo_ms: float | None = None) -> dict[str, Any]:
    """Sent, ok, errors, p50/p99 latency (ms, of successful requests) and SLO attainment (%, of all sent)."""
    recs = list(records)
    ok = [r.latency_s * 1000 for r in recs if r.ok]
    out: dict[str, Any] = {"sent": len(recs), "ok": len(ok), "errors": len(recs) - len(ok),
                           "p50_ms": _round(percentile(ok, 50)), "p99_ms": _round(percentile(ok, 99))}
    if slo_ms is not None:
        met = sum(1 for r in recs if r.ok and r.latency_s * 1000 <= slo_ms)
        out["slo_ms"] = slo_ms
        out["slo_attainment_pct"] = round(100.0 * met / len(recs), 2) if recs else None
    return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def payload(i: int) -> dict[str, Any]:
    """One request's body: one row of ``INPUT_WIDTH`` numbers (what ``orchestrator.serve`` models take)."""
    rng = random.Random(i)
    return {"inputs": [[rng.uniform(-1, 1) for _ in range(INPUT_WIDTH)]]}


@dataclass
class Replay:
    """A replay running on its own thread (:func:`start`); ``records`` grows as requests finish."""

    url: str
    curve: RateCurve
    compress: float = 1.0
    seed: int = 0
    timeout_s: float = 30.0
    records: list[Record] = field(default_factory=list)
    started_at: float | None = None  # time.monotonic() at the replay's second 0
    error: BaseException | None = None
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def elapsed_s(self) -> float:
        return 0.0 if self.started_at is None else time.monotonic() - self.started_at

    def recent(self, window_s: float) -> list[Record]:
        """Records of requests sent in the last ``window_s`` wall seconds that have finished."""
        since = self.elapsed_s() - window_s
        return [r for r in list(self.records) if r.sent_s >= since]

    def stop(self) -> None:
        """Send nothing more (requests in flight are still awaited)."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> list[Record]:
        if self._thread is not None:
            self._thread.join(timeout)
        if self.error is not None:
            raise self.error
        return self.records

    async def run_async(self) -> list[Record]:
        import aiohttp

        times = arrivals(self.curve, compress=self.compress, seed=self.seed)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        conn = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            self.started_at = time.monotonic()

            async def one(i: int, at: float) -> None:
                sent = loop.time()
                try:
                    async with session.post(self.url, json=payload(i)) as resp:
                        await resp.read()
                        status: int | str = resp.status
                except Exception as e:  # the record says what went wrong; the replay goes on
                    status = type(e).__name__
                self.records.append(Record(round(sent - t0, 6), loop.time() - sent, status))

            tasks = []
            for i, at in enumerate(times):
                if self._stop.is_set():
                    break
                delay = t0 + at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(one(i, at)))
            if tasks:
                await asyncio.gather(*tasks)
        return self.records


def run(url: str, curve: RateCurve, *, compress: float = 1.0, seed: int = 0, timeout_s: float = 30.0) -> list[Record]:
    """Replay ``curve`` against ``url`` (POST, JSON) and return every request's record, in completion order."""
    return asyncio.run(Replay(url, curve, compress, seed, timeout_s).run_async())


def start(url: str, curve: RateCurve, *, compress: float = 1.0, seed: int = 0, timeout_s: float = 30.0) -> Replay:
    """Replay on a background thread; read ``replay.records`` live, ``replay.join()`` for the end."""
    rp = Replay(url, curve, compress, seed, timeout_s)

    def body() -> None:
        try:
            asyncio.run(rp.run_async())
        except BaseException as e:  # handed to join()
            rp.error = e

    rp._thread = threading.Thread(target=body, name="loadgen", daemon=True)
    rp._thread.start()
    return rp


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="Where to POST (http://127.0.0.1:PORT/...)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--load-curve", help="A CSV of seconds,requests_per_s")
    g.add_argument("--curve", help="steady:rps=..,duration=.. | spike:base=..,peak=..,at=..,for=..,duration=.. | "
                                   "diurnal:low=..,high=..[,duration=..]")
    p.add_argument("--compress", type=float, default=1.0, help="Curve seconds per wall second (720: a day in 120 s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo-ms", type=float, default=None)
    p.add_argument("--timeout", type=float, default=30.0, help="Seconds before a request counts as failed")
    p.add_argument("--records", help="Write every request's record here (CSV: sent_s,latency_s,status)")
    p.add_argument("--json", action="store_true", help="Print one JSON object")
    a = p.parse_args(argv)
    try:
        curve = read_csv(a.load_curve) if a.load_curve else parse_curve(a.curve)
    except CurveError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    recs = run(a.url, curve, compress=a.compress, seed=a.seed, timeout_s=a.timeout)
    if a.records:
        with open(a.records, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["sent_s", "latency_s", "status"])
            w.writerows((r.sent_s, round(r.latency_s, 6), r.status) for r in sorted(recs, key=lambda r: r.sent_s))
    s = {"curve": curve.name, "duration_s": round(curve.duration_s / a.compress, 3), **summarize(recs, a.slo_ms)}
    print(json.dumps(s) if a.json else "  ".join(f"{k}={v}" for k, v in s.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
