"""Families of inference load curves for the co-location day (``orchestrator sim colocation``): pure, seeded.

A **curve** is ``jobs/loadgen.py``'s ``RateCurve``: ``(seconds, requests_per_s)`` points, piecewise linear,
the format of ``--load-curve CSV`` (``seconds,requests_per_s``, read by its ``read_csv``, whose errors name
the line and field). This module makes curves of a 24 h day, sized to a cluster:

* **need** -- how much of the cluster a rate asks for: ``rate / (cards x card_rps)``, where ``card_rps`` is
  what one card serves at the autoscaler's target (seven 1g replicas, each at the rate that keeps its
  ongoing requests at ``target_ongoing_per_replica``: :func:`orchestrator.sim.queueing.rate_at_target`).
  A peak of need 0.5 is a peak at which the service, scaled as configured, holds half the cards;
* the **kinds** (each peaks at a need in ``[0.3, 0.7]``, drawn from the seed):

  - ``diurnal`` -- a cosine day, trough 5-20 % of the peak, peak between 11:00 and 17:00;
  - ``spike`` -- a steady level (a third of the peak) that triples within 5 s, three times a day
    (each lasting 2-20 min) and falls back as fast;
  - ``ramp`` -- a low night level, a linear climb of 2-6 h to the peak, a plateau, a linear fall;
  - ``bursty`` -- a Poisson-modulated level: the rate jumps to a new level (log-uniform) at exponential
    intervals (mean 20 min), with bursts of 2-3x lasting 30-300 s arriving as a Poisson process
    (about one an hour); the whole scaled so its peak has the drawn need;

* a **family** is a named list of ``(name, curve)`` for given seeds and a cluster (:func:`family`);
  ``standard`` is every kind for each seed.

A **spike** (:func:`spikes`) is any rise of at least ``factor`` (2) within ``within_s`` (5 s); the evaluation
measures how long the service takes to absorb each one. The same detector runs on every curve, generated or
read from a CSV.

Invariants: the same (kind, seed, cluster) gives the same points; every curve covers ``[0, 86400]``;
rates are finite and >= 0; a generated curve's peak need is within ``[0.3, 0.7]``.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from orchestrator.core import datafiles
from orchestrator.core.errors import InvalidRequestError

DAY_S = 86_400.0
#: The range of peak need the generated curves draw from (the issue's "peaks that need 30-70 % of the cluster").
NEED_RANGE = (0.3, 0.7)
KINDS = ("diurnal", "spike", "ramp", "bursty")
FAMILIES = ("standard",)
#: Module name of ``jobs/loadgen.py`` once loaded (the scenario's loader uses the same name, so one copy).
_LOADGEN_MODULE = "rgo_example_loadgen"


def loadgen() -> Any:
    """``jobs/loadgen.py`` as a module: its ``RateCurve``, ``read_csv`` and ``CurveError`` are the curve format."""
    import importlib.util
    import sys

    if _LOADGEN_MODULE not in sys.modules:
        spec = importlib.util.spec_from_file_location(_LOADGEN_MODULE, datafiles.job_script("loadgen.py"))
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[_LOADGEN_MODULE] = mod
        spec.loader.exec_module(mod)
    return sys.modules[_LOADGEN_MODULE]


def make_curve(points: Sequence[tuple[float, float]], name: str) -> Any:
    """A ``RateCurve`` of ``points`` (validated by it: times from 0, strictly increasing; rates >= 0)."""
    return loadgen().RateCurve(tuple((float(t), float(r)) for t, r in points), name)


def read_csv(path: str | Path) -> Any:
    """A curve from a ``seconds,requests_per_s`` CSV (``jobs/loadgen.read_csv``)."""
    return loadgen().read_csv(path)


class FastCurve:
    """A curve's rate at any second by bisection (``RateCurve.rate`` scans every point), and its extremes
    over an interval. 0 outside the curve, as ``RateCurve.rate``."""

    def __init__(self, curve: Any) -> None:
        self.curve = curve
        self.t = [p[0] for p in curve.points]
        self.r = [p[1] for p in curve.points]

    @property
    def end_s(self) -> float:
        return self.t[-1]

    def rate(self, s: float) -> float:
        t, r = self.t, self.r
        if s < 0 or s > t[-1]:
            return 0.0
        i = bisect.bisect_right(t, s)
        if i >= len(t):
            return r[-1]
        t0, t1 = t[i - 1], t[i]
        return r[i - 1] + (r[i] - r[i - 1]) * (s - t0) / (t1 - t0)

    def span(self, a: float, b: float) -> tuple[float, float]:
        """``(min, max)`` of the rate over ``[a, b]`` (the ends and every point between)."""
        vals = [self.rate(a), self.rate(b)]
        i, j = bisect.bisect_right(self.t, a), bisect.bisect_left(self.t, b)
        vals.extend(self.r[i:j])
        return min(vals), max(vals)

    def mean(self, a: float, b: float) -> float:
        """The mean rate over ``[a, b]`` (exact for a piecewise-linear curve)."""
        if b <= a:
            return self.rate(a)
        xs = [a] + [x for x in self.t[bisect.bisect_right(self.t, a):bisect.bisect_left(self.t, b)]] + [b]
        area = sum((self.rate(x0) + self.rate(x1)) / 2 * (x1 - x0) for x0, x1 in zip(xs, xs[1:]))
        return area / (b - a)

    def integral(self) -> float:
        """Requests over the whole curve."""
        return sum((r0 + r1) / 2 * (t1 - t0) for t0, r0, t1, r1 in zip(self.t, self.r, self.t[1:], self.r[1:]))


def spikes(curve: Any, *, factor: float = 2.0, within_s: float = 5.0) -> list[float]:
    """Where the rate rises at least ``factor``-fold within ``within_s`` seconds: the start of each such rise
    (the last point before it), one per rise (a rise that continues is one spike)."""
    pts = list(curve.points)
    out: list[float] = []
    for i, (t0, r0) in enumerate(pts):
        for t1, r1 in pts[i + 1:]:
            if t1 - t0 > within_s:
                break
            if r1 >= factor * max(r0, 1e-9) and r1 > 0:
                if not out or t0 - out[-1] > within_s:
                    out.append(t0)
                break
    return out


def peak_need(curve: Any, cards: int, card_rps: float) -> float:
    """The curve's peak as a share of the cluster (see the module docstring)."""
    return max(r for _, r in curve.points) / (cards * card_rps)


# ---- the kinds ------------------------------------------------------------------------------------------
def diurnal(rng: random.Random, peak: float) -> list[tuple[float, float]]:
    trough = peak * rng.uniform(0.05, 0.2)
    peak_at = 3600.0 * rng.uniform(11.0, 17.0)
    pts = []
    for i in range(97):  # every 15 min
        t = DAY_S * i / 96
        pts.append((t, trough + (peak - trough) * (1 + math.cos(2 * math.pi * (t - peak_at) / DAY_S)) / 2))
    return pts


def step_spikes(rng: random.Random, peak: float, count: int = 3, rise_s: float = 5.0) -> list[tuple[float, float]]:
    """A steady third of ``peak`` that triples within ``rise_s``, ``count`` times between 06:00 and 22:00."""
    base = peak / 3.0
    starts: list[tuple[float, float]] = []
    while len(starts) < count:
        at = round(rng.uniform(6 * 3600.0, 22 * 3600.0))
        length = round(rng.uniform(120.0, 1200.0))
        if all(at + length + 600 < s or s + d + 600 < at for s, d in starts):
            starts.append((at, length))
    pts = [(0.0, base)]
    for at, length in sorted(starts):
        pts += [(at, base), (at + rise_s, peak), (at + rise_s + length, peak), (at + 2 * rise_s + length, base)]
    return pts + [(DAY_S, base)]


def ramp(rng: random.Random, peak: float) -> list[tuple[float, float]]:
    low = peak * rng.uniform(0.05, 0.15)
    start = 3600.0 * rng.uniform(5.0, 9.0)
    climb = 3600.0 * rng.uniform(2.0, 6.0)
    hold = 3600.0 * rng.uniform(1.0, 4.0)
    fall = 3600.0 * rng.uniform(2.0, 5.0)
    end = min(start + climb + hold + fall, DAY_S - 60)
    return [(0.0, low), (start, low), (start + climb, peak), (start + climb + hold, peak), (end, low), (DAY_S, low)]


def bursty(rng: random.Random, peak: float, edge_s: float = 2.0) -> list[tuple[float, float]]:
    """Levels that change at exponential intervals, bursts on top; scaled to ``peak`` afterwards."""
    level_at: list[tuple[float, float]] = []
    t = 0.0
    while t < DAY_S:
        level_at.append((t, math.exp(rng.uniform(math.log(0.2), 0.0))))
        t += rng.expovariate(1 / 1200.0) + edge_s * 2
    bursts: list[tuple[float, float, float]] = []
    t = rng.expovariate(1 / 3600.0)
    while t < DAY_S - 400:
        bursts.append((t, rng.uniform(30.0, 300.0), rng.uniform(2.0, 3.0)))
        t += bursts[-1][1] + rng.expovariate(1 / 3600.0) + 2 * edge_s

    def level(s: float) -> float:
        i = bisect.bisect_right([a for a, _ in level_at], s) - 1
        return level_at[max(0, i)][1]

    def factor(s: float) -> float:  # a burst rises over (a, a + edge], holds d seconds, falls over edge_s
        return next((f for a, d, f in bursts if a < s <= a + edge_s + d), 1.0)

    edges = {0.0, DAY_S}
    for a, _ in level_at[1:]:
        edges.update((a - edge_s, a))
    for a, d, _ in bursts:
        edges.update((a, a + edge_s, a + edge_s + d, a + 2 * edge_s + d))
    times = sorted(x for x in edges if 0 <= x <= DAY_S)
    raw = []
    for x in times:  # a level change or a burst's edge takes edge_s seconds
        raw.append((x, level(x) * factor(x)))
    top = max(r for _, r in raw)
    return [(x, peak * r / top) for x, r in raw]


_KIND: dict[str, Callable[[random.Random, float], list[tuple[float, float]]]] = {
    "diurnal": diurnal, "spike": step_spikes, "ramp": ramp, "bursty": bursty}


def generate(kind: str, seed: int, cards: int, card_rps: float) -> Any:
    """One curve of ``kind`` for ``seed`` on a cluster of ``cards``: its peak need drawn from :data:`NEED_RANGE`."""
    if kind not in _KIND:
        raise InvalidRequestError("curve", kind, KINDS)
    rng = random.Random(f"{kind}:{seed}")
    need = rng.uniform(*NEED_RANGE)
    pts = _KIND[kind](rng, need * cards * card_rps)
    return make_curve(_strictly_increasing(pts), f"{kind}-s{seed}")


@dataclass(frozen=True)
class NamedCurve:
    name: str
    curve: Any
    source: str  # "generated" or the CSV's path


def family(name: str, seeds: Sequence[int], cards: int, card_rps: float) -> list[NamedCurve]:
    """The curves of family ``name`` (``standard``: every kind, for each seed)."""
    if name not in FAMILIES:
        raise InvalidRequestError("curves", name, list(FAMILIES) + ["a path to a seconds,requests_per_s CSV"])
    return [NamedCurve(f"{k}-s{s}", generate(k, s, cards, card_rps), "generated") for s in seeds for k in KINDS]


def resolve(specs: Sequence[str], seeds: Sequence[int], cards: int, card_rps: float) -> list[NamedCurve]:
    """Family names and CSV paths, in order, as curves (a CSV's name is its file's stem)."""
    out: list[NamedCurve] = []
    for spec in specs:
        if spec in FAMILIES:
            out.extend(family(spec, seeds, cards, card_rps))
        elif spec in KINDS:
            out.extend(NamedCurve(f"{spec}-s{s}", generate(spec, s, cards, card_rps), "generated") for s in seeds)
        else:
            c = read_csv(spec)
            out.append(NamedCurve(c.name, c, str(spec)))
    return out


def _strictly_increasing(pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points sorted, a repeated second kept once (the later value), ending at :data:`DAY_S`."""
    out: list[tuple[float, float]] = []
    for t, r in sorted(pts, key=lambda p: p[0]):
        t = min(max(0.0, t), DAY_S)
        if out and t <= out[-1][0]:
            out[-1] = (out[-1][0], r)
            continue
        out.append((t, max(0.0, r)))
    if out[-1][0] < DAY_S:
        out.append((DAY_S, out[-1][1]))
    return out
