"""The static report of a run: one HTML file with the page's charts (Plotly, inlined), plus a PNG of each.

:func:`chart_specs` turns the curves' history (and the schemes' comparison) into
plain chart specs -- title, axis labels, series -- and two renderers draw the same
specs: Plotly for the HTML (its JavaScript inlined once, so the file opens
offline) and matplotlib for the PNGs (no browser needed). :func:`write_report`
writes ``report.html``, ``<chart>.png`` for each chart and ``report.json`` (the
history, the last frame and the comparison) into the folder it is given.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from orchestrator.core.extras import require


@dataclass(frozen=True)
class Series:
    name: str
    x: list[Any]
    y: list[float | None]


@dataclass(frozen=True)
class ChartSpec:
    key: str
    title: str
    y_label: str
    series: list[Series] = field(default_factory=list)
    kind: str = "line"  # line | step | bar
    log_y: bool = False
    x_label: str = "seconds since the page started"


def chart_specs(history: Sequence[Mapping[str, Any]], comparison: Mapping[str, Any] | None = None) -> list[ChartSpec]:
    """The page's charts as specs (the same series the live page draws)."""
    t = [p["t"] for p in history]

    def s(key: str, name: str) -> Series:
        return Series(name, t, [p.get(key) for p in history])

    nodes = sorted({n for p in history for n in (p.get("util") or {})})
    out = [
        ChartSpec("throughput", "Throughput", "per second",
                  [s("grants_per_s", "leases granted / s"), s("inference_rps", "inference requests / s")]),
        ChartSpec("latency", "Latency (log scale)", "seconds",
                  [s("wait_p50_s", "time pending p50"), s("wait_p99_s", "time pending p99"),
                   s("inference_p50_s", "inference p50"), s("inference_p99_s", "inference p99")], log_y=True),
        ChartSpec("utilisation", "GPU utilisation per node", "busy fraction",
                  [Series(n, t, [(p.get("util") or {}).get(n) for p in history]) for n in nodes]),
        ChartSpec("queue", "Queue depth", "pending leases", [s("queue", "pending leases")]),
        ChartSpec("preemptions", "Preemptions (cumulative)", "victims", [s("preemptions", "preemptions")], kind="step"),
    ]
    rows = (comparison or {}).get("schemes") or []
    if rows:
        labels = [r["label"] for r in rows]
        out.append(ChartSpec("schemes", (comparison or {}).get("title", "Sharing schemes"), "%", [
            Series("GPU demand served (% of capacity)", labels, [r["served_pct"] for r in rows]),
            Series("GPU capacity occupied (%)", labels, [r["occupied_pct"] for r in rows]),
            Series("pods placed (%)", labels, [r["placed_pct"] for r in rows])], kind="bar", x_label="scheme"))
    return out


def plotly_figure(spec: ChartSpec) -> Any:
    go = require("plotly.graph_objects", "dashboard")

    fig = go.Figure()
    for s in spec.series:
        if spec.kind == "bar":
            fig.add_trace(go.Bar(x=s.x, y=s.y, name=s.name))
        else:
            fig.add_trace(go.Scatter(x=s.x, y=s.y, name=s.name, mode="lines",
                                     line={"shape": "hv"} if spec.kind == "step" else {}))
    fig.update_layout(title=spec.title, xaxis_title=spec.x_label, yaxis_title=spec.y_label, height=360,
                      margin={"l": 60, "r": 20, "t": 50, "b": 50}, barmode="group", template="plotly_white")
    if spec.log_y:
        fig.update_yaxes(type="log")
    return fig


def write_png(spec: ChartSpec, path: Path) -> None:
    require("matplotlib", "dashboard").use("Agg")
    plt = require("matplotlib.pyplot", "dashboard")

    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=110)
    try:
        if spec.kind == "bar":
            n = max(1, len(spec.series))
            width = 0.8 / n
            for i, s in enumerate(spec.series):
                xs = [j + (i - (n - 1) / 2) * width for j in range(len(s.x))]
                ax.bar(xs, [v or 0 for v in s.y], width, label=s.name)
            ax.set_xticks(range(len(spec.series[0].x)), spec.series[0].x if spec.series else [])
        else:
            for s in spec.series:
                pts = [(x, y) for x, y in zip(s.x, s.y) if y is not None]
                if pts:
                    ax.plot(*zip(*pts), label=s.name, drawstyle="steps-post" if spec.kind == "step" else "default")
        if spec.log_y and any(y for s in spec.series for y in s.y if y):
            ax.set_yscale("log")
        ax.set_title(spec.title)
        ax.set_xlabel(spec.x_label)
        ax.set_ylabel(spec.y_label)
        ax.grid(alpha=0.3)
        if any(s.y for s in spec.series):
            ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)


def write_report(out_dir: Path, history: Sequence[Mapping[str, Any]], frame: Mapping[str, Any] | None,
                 comparison: Mapping[str, Any] | None, *, title: str = "ray-gpu-orchestrator: run report") -> list[Path]:
    """Write report.html, one PNG per chart and report.json into ``out_dir``; returns the files written."""
    pio = require("plotly.io", "dashboard")

    out_dir.mkdir(parents=True, exist_ok=True)
    specs = chart_specs(history, comparison)
    written = []
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
             f"<body style='font-family:system-ui,sans-serif;max-width:1000px;margin:auto'><h1>{html.escape(title)}</h1>"]
    if frame:
        stages = frame.get("pipeline", {})
        parts.append("<p>Pipeline at the end: " + html.escape(", ".join(
            f"{k} {v['now']}" + (f" ({v['total']} through)" if v.get("total") is not None else "")
            for k, v in stages.items())) + "</p>")
    for i, spec in enumerate(specs):
        fig = plotly_figure(spec)
        parts.append(pio.to_html(fig, full_html=False, include_plotlyjs="inline" if i == 0 else False,
                                 div_id=f"chart-{spec.key}"))
        png = out_dir / f"{spec.key}.png"
        write_png(spec, png)
        written.append(png)
    if comparison and comparison.get("notes"):
        parts.append("<p>" + html.escape(" ".join(comparison["notes"])) + "</p>")
    if frame and frame.get("decisions"):
        parts.append("<h2>Latest decisions</h2><table>" + "".join(
            f"<tr><td>{html.escape(d['job_id'])}</td><td>{html.escape(d['state'])}</td>"
            f"<td>{html.escape(d['reason'])}</td></tr>" for d in frame["decisions"]) + "</table>")
    parts.append("</body></html>")
    page = out_dir / "report.html"
    page.write_text("\n".join(parts))
    data = out_dir / "report.json"
    data.write_text(json.dumps({"history": list(history), "frame": frame, "comparison": comparison}))
    return [page, *written, data]
