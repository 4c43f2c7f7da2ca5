"""The whole allocation curve of an arrival replay, and one policy against another along it.

A policy is judged on the curve a user sees, not only on its last point: a
cluster at 100% of demand is the everyday case. Names:

* **curve** -- the allocation ratio (%) at every ``CURVE_STEP`` checkpoint of
  arrival from ``CURVE_FROM`` to ``CURVE_TO`` (50, 60, ..., 130);
* **AUC** -- the area under the allocation curve over ``CURVE_FROM..CURVE_TO``
  (trapezoids over every recorded checkpoint in that range, so the 1%
  checkpoints of a default replay count), divided by the width (80 points of
  arrival): the curve's mean height, in %. A policy that allocates everything
  that arrives up to 100% and stays flat after scores
  ``(75 x 50 + 100 x 30) / 80 = 84.375``;
* **compare(A, B)** -- per checkpoint, ``A - B`` on each seed both ran (paired:
  same arrivals, same node order), then the mean, standard deviation, min and
  max of those differences over the seeds; the same for the AUC.

Pure functions of :class:`~orchestrator.sim.arrival.ArrivalResult` tuples; no I/O.
Invariant: a checkpoint past the replay's last one (``--target-pct`` below
130) is left out, never extrapolated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

CURVE_FROM, CURVE_TO, CURVE_STEP = 50, 130, 10


def curve_checkpoints(checkpoints: Sequence[int]) -> list[int]:
    """The curve's checkpoints (50, 60, ..., 130) that a replay recorded."""
    have = set(checkpoints)
    return [k for k in range(CURVE_FROM, CURVE_TO + 1, CURVE_STEP) if k in have]


def curve_of(checkpoints: Sequence[int], allocation_pct: Sequence[float]) -> dict[int, float]:
    """Allocation at each of :func:`curve_checkpoints`."""
    at = dict(zip(checkpoints, allocation_pct))
    return {k: float(at[k]) for k in curve_checkpoints(checkpoints)}


def auc(checkpoints: Sequence[int], allocation_pct: Sequence[float],
        lo: int = CURVE_FROM, hi: int = CURVE_TO) -> float | None:
    """Mean height (%) of the allocation curve over ``lo..hi`` (trapezoids); None when the
    replay recorded fewer than two checkpoints in that range."""
    pts = [(k, v) for k, v in zip(checkpoints, allocation_pct) if lo <= k <= hi]
    if len(pts) < 2:
        return None
    x = np.array([p[0] for p in pts], dtype=float)
    y = np.array([p[1] for p in pts], dtype=float)
    return float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2 / (x[-1] - x[0]))


@dataclass(frozen=True)
class Spread:
    """Mean, standard deviation (population, as the tables' ``sd``), min and max over seeds."""

    mean: float
    sd: float
    lo: float
    hi: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "Spread":
        a = np.asarray(values, dtype=float)
        return cls(float(a.mean()), float(a.std()), float(a.min()), float(a.max()))

    def to_dict(self) -> dict[str, float]:
        return {"mean": round(self.mean, 4), "sd": round(self.sd, 4), "min": round(self.lo, 4),
                "max": round(self.hi, 4)}


@dataclass(frozen=True)
class CurveStats:
    """One policy's curve over its seeds: per checkpoint and for the AUC."""

    policy: str
    seeds: tuple[int, ...]
    points: dict[int, Spread]
    auc: Spread | None

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "seeds": list(self.seeds),
                "curve": {str(k): s.to_dict() for k, s in self.points.items()},
                "auc_50_130": self.auc.to_dict() if self.auc else None}


def curve_stats(policy: str, runs: Sequence[Any]) -> CurveStats:
    """:class:`CurveStats` of one policy's runs (``ArrivalResult``-like: ``seed``,
    ``checkpoints``, ``allocation_pct``)."""
    if not runs:
        raise ValueError("no runs")
    cps = curve_checkpoints(runs[0].checkpoints)
    curves = [curve_of(r.checkpoints, r.allocation_pct) for r in runs]
    areas = [auc(r.checkpoints, r.allocation_pct) for r in runs]
    return CurveStats(policy, tuple(r.seed for r in runs), {k: Spread.of([c[k] for c in curves]) for k in cps},
                      Spread.of(areas) if all(a is not None for a in areas) else None)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Comparison:
    """``a - b`` per checkpoint and for the AUC, over the seeds both policies ran."""

    a: str
    b: str
    seeds: tuple[int, ...]
    points: dict[int, Spread]
    auc: Spread | None

    @property
    def worst(self) -> tuple[int, float]:
        """The checkpoint where ``a`` is furthest below ``b`` (mean), and that difference."""
        k = min(self.points, key=lambda c: (self.points[c].mean, c))
        return k, self.points[k].mean

    def dominates(self, tolerance: float = 0.0) -> bool:
        """Whether ``a``'s mean is at least ``b``'s (minus ``tolerance``) at every checkpoint."""
        return all(s.mean >= -tolerance for s in self.points.values())

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "seeds": list(self.seeds),
                "diff": {str(k): s.to_dict() for k, s in self.points.items()},
                "auc_diff": self.auc.to_dict() if self.auc else None}


def compare(a_runs: Sequence[Any], b_runs: Sequence[Any]) -> Comparison:
    """Paired difference ``a - b`` of two policies' runs; only seeds present in both count.

    Raises ``ValueError`` when they share no seed or recorded different checkpoints.
    """
    if not a_runs or not b_runs:
        raise ValueError("compare needs runs of both policies")
    by_a = {r.seed: r for r in a_runs}
    by_b = {r.seed: r for r in b_runs}
    seeds = tuple(sorted(set(by_a) & set(by_b)))
    if not seeds:
        raise ValueError(f"{a_runs[0].policy} and {b_runs[0].policy} share no seed")
    if tuple(by_a[seeds[0]].checkpoints) != tuple(by_b[seeds[0]].checkpoints):
        raise ValueError("the two policies' replays recorded different checkpoints")
    cps = curve_checkpoints(by_a[seeds[0]].checkpoints)
    diffs = {k: [] for k in cps}  # type: dict[int, list[float]]
    areas: list[float] = []
    for s in seeds:
        ca = curve_of(by_a[s].checkpoints, by_a[s].allocation_pct)
        cb = curve_of(by_b[s].checkpoints, by_b[s].allocation_pct)
        for k in cps:
            diffs[k].append(ca[k] - cb[k])
        aa, ab = auc(by_a[s].checkpoints, by_a[s].allocation_pct), auc(by_b[s].checkpoints, by_b[s].allocation_pct)
        if aa is not None and ab is not None:
            areas.append(aa - ab)
    return Comparison(a_runs[0].policy, b_runs[0].policy, seeds, {k: Spread.of(v) for k, v in diffs.items()},
                      Spread.of(areas) if len(areas) == len(seeds) else None)


def format_comparison(c: Comparison, title: str = "") -> str:
    """A plain-text table: one row per checkpoint, ``mean +- sd [min, max]`` of ``a - b``."""
    head = title or f"{c.a} - {c.b}, {len(c.seeds)} seed(s), paired"
    lines = [head, f"{'arrival':>8} {'mean':>8} {'sd':>6} {'min':>7} {'max':>7}"]
    for k, s in c.points.items():
        lines.append(f"{str(k) + '%':>8} {s.mean:+8.2f} {s.sd:6.2f} {s.lo:+7.2f} {s.hi:+7.2f}")
    if c.auc is not None:
        s = c.auc
        lines.append(f"{'AUC':>8} {s.mean:+8.3f} {s.sd:6.3f} {s.lo:+7.3f} {s.hi:+7.3f}")
    k, worst = c.worst
    lines.append(f"worst checkpoint {k}%: {worst:+.2f}; {c.a} >= {c.b} at every checkpoint: "
                 f"{'yes' if c.dominates() else 'no'}")
    return "\n".join(lines)
