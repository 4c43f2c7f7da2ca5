"""The chart of the co-location day: chart specs of one replay's timeline (load, leases by kind,
utilisation, p99 latency; x: hour of the day) and their PNGs. Draws with the dashboard's report
(:mod:`orchestrator.dashboard.report`, the ``dashboard`` extra), imported only when a chart is made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

def replica_cards(replica: Any) -> float:
    """The cards one leased replica holds (its share's ``card_share``: a 1g slice 1/7, a quarter time-slice
    0.25); one card when its hand-out is unknown."""
    return float(getattr(replica, "card_share", 1.0))


def rolling_mean(values: list[Any], n: int) -> list[float | None]:
    """The mean of each value and the ``n - 1`` before it (None values skipped): a tick's useful GPU-time
    arrives in whole steps, so one tick reads above 100 % and the next below; the chart shows the trend."""
    out: list[float | None] = []
    for i in range(len(values)):
        window = [v for v in values[max(0, i - n + 1): i + 1] if v is not None]
        out.append(round(sum(window) / len(window), 2) if window else None)
    return out


def day_charts(timeline: list[dict[str, Any]], label: str) -> list[Any]:
    """Chart specs of one replay's day: load, leases by kind, utilisation, p99 latency (x: hour of the day)."""
    from orchestrator.dashboard.report import ChartSpec, Series

    hours = [p["hour"] for p in timeline]
    kinds = sorted({k for p in timeline for k in p.get("inference_kinds", {})})

    def s(key: str, name: str) -> Series:
        return Series(name, hours, [p.get(key) for p in timeline])

    x = "hour of the (compressed) day"
    return [
        ChartSpec("colocation_load", f"Load and replicas: {label}", "per second / replicas",
                  [s("offered_rps", "offered requests/s"), s("served_rps", "answered requests/s"),
                   s("replicas", "inference replicas")], x_label=x),
        ChartSpec("colocation_leases", f"Cards held, by kind: {label}", "cards (a 1g MIG slice = 1/7)",
                  [s("training_cards", "training")] + [
                      Series(f"inference ({k})", hours, [p.get("inference_kinds", {}).get(k, 0.0) for p in timeline])
                      for k in kinds], kind="step", x_label=x),
        ChartSpec("colocation_utilisation", f"GPU utilisation: {label}", "% of the cluster's GPU-time",
                  [Series("useful GPU-time / available (2 s mean)", hours,
                          rolling_mean([p.get("utilization_pct") for p in timeline], 4))], x_label=x),
        ChartSpec("colocation_latency", f"Inference p99 latency: {label}", "ms",
                  [s("p99_ms", "p99 (last few seconds)"), s("slo_ms", "SLO")], x_label=x),
    ]


def write_day_charts(out_dir: Path, timeline: list[dict[str, Any]], label: str) -> list[Path]:
    """PNG of each chart of the day into ``out_dir`` (matplotlib; no browser needed)."""
    from orchestrator.dashboard.report import write_png

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for spec in day_charts(timeline, label):
        p = out_dir / f"{spec.key}.png"
        write_png(spec, p)
        paths.append(p)
    return paths
