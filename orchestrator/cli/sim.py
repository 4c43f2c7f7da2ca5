"""``orchestrator sim``: trace-driven evaluation of the placement policies.

Exit codes: 0 ok; 2 bad input (a trace cell that cannot be read names its
file, line and column; an unknown policy names the allowed ones).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence, Tuple

import typer

from orchestrator.cli.options import Output, emit, output_format
from orchestrator.core.errors import InvalidRequestError

app = typer.Typer(name="sim", help="Trace-driven evaluation (the FGD paper's openb experiments).",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)

# The paper's columns at 130% arrival, for the table's reference line.
PAPER_AT_130 = {
    "default": {"random": 87.47, "dotproduct": 90.85, "clustering": 91.88, "packing": 92.00, "bestfit": 93.08,
                "fgd": 95.39},
    "gpushare100": {"bestfit": 85.01, "fgd": 86.90},
}


@app.callback()
def _group() -> None:
    """Trace-driven evaluation (the FGD paper's openb experiments)."""


def _fail(err: Exception) -> None:
    typer.echo(f"error: {err}", err=True)
    raise typer.Exit(2)


@app.command("openb")
def openb(
    nodes: Path = typer.Option(..., "--nodes", help="Node list CSV (sn,cpu_milli,memory_mib,gpu,model)"),
    pods: Path = typer.Option(..., "--pods", help="Pod list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli,...)"),
    policy: str = typer.Option("default", "--policy", help="A policy name, or 'all' for the paper's seven"),
    seeds: int = typer.Option(10, "--seeds", min=1, help="Runs per policy, seeds seed_base..seed_base+N-1"),
    seed_base: int = typer.Option(0, "--seed-base", help="First seed"),
    json_out: bool = typer.Option(False, "--json", help="Print JSON (one object, or a list for --policy all; as -o json)"),
    output: Output = None,
    plot: Path | None = typer.Option(None, "--plot", help="Write the allocation-vs-arrival chart (PNG/PDF/SVG)"),
    mode: str = typer.Option("arrival", "--mode", help="arrival (the paper's) | timeline (the trace's own clock)"),
    order: str = typer.Option("shuffled", "--order", help="arrival mode: shuffled (the paper's artifact) | trace"),
    target_pct: float = typer.Option(130.0, "--target-pct", min=1.0, help="arrival mode: resample up to this % of GPU capacity"),
    load: float = typer.Option(1.0, "--load", min=1e-9, help="timeline mode: compress arrival times by this factor"),
    workers: int = typer.Option(2, "--workers", min=1, help="Processes running seeds in parallel"),
    per_seed: bool = typer.Option(False, "--per-seed", help="--json: include every seed's run"),
    compare: Optional[Tuple[str, str]] = typer.Option(
        None, "--compare", help="arrival mode: run policies A and B (instead of --policy) and print A - B at every "
                                "10% checkpoint from 50% to 130% and for the AUC, mean and spread over seeds"),
) -> None:
    """Replay an openb pod list against the node list under one or all policies."""
    from orchestrator.core.priorities import POLICY_NAMES
    from orchestrator.sim.arrival import ORDERS, PAPER_POLICIES

    try:
        fmt = output_format(output, json_out)
    except InvalidRequestError as e:
        _fail(e)
    json_out = fmt != "table"  # json or yaml
    names = list(PAPER_POLICIES) if policy == "all" else [policy]
    if compare:
        if mode != "arrival":
            _fail(InvalidRequestError("compare", " ".join(compare), "two policies, in --mode arrival"))
        if compare[0] == compare[1]:
            _fail(InvalidRequestError("compare", " ".join(compare), "two different policies"))
        names = list(compare)
    for n in names:
        if n not in POLICY_NAMES:
            _fail(InvalidRequestError("policy", n, ("all",) + POLICY_NAMES))
    if mode not in ("arrival", "timeline"):
        _fail(InvalidRequestError("mode", mode, ("arrival", "timeline")))
    if order not in ORDERS:
        _fail(InvalidRequestError("order", order, ORDERS))
    seed_list = list(range(seed_base, seed_base + seeds))
    t0 = time.perf_counter()
    try:
        if mode == "timeline":
            from orchestrator.sim.timeline import run_timeline

            out = run_timeline(str(nodes), str(pods), names, seed_list, workers=workers, load=load)
            wall = time.perf_counter() - t0
            for d in out:
                d.update(nodes=str(nodes), pods=str(pods), load=load, wall_s=round(wall, 2))
            if json_out:
                emit(out if policy == "all" else out[0], fmt, indent=2, sort_keys=False)
            else:
                _print_timeline(out, pods, wall)
            return
        from orchestrator.sim.arrival import run_arrival

        summaries = run_arrival(str(nodes), str(pods), names, seed_list, workers=workers,
                                target_pct=target_pct, order=order)
    except InvalidRequestError as e:
        _fail(e)
        return
    wall = time.perf_counter() - t0
    dicts = []
    for s in summaries:
        d = s.to_dict(per_seed=per_seed)
        d.update(mode="arrival", order=order, nodes=str(nodes), pods=str(pods), wall_s=round(wall, 2))
        dicts.append(d)
    if plot is not None:
        write_plot(summaries, plot, title=f"{pods.stem} on {nodes.stem} ({len(seed_list)} seeds)")
    cmp = None
    if compare:
        from orchestrator.sim.curve import compare as compare_runs

        cmp = compare_runs(summaries[0].runs, summaries[1].runs)
    if json_out:
        if cmp is not None:
            emit({"results": dicts, "compare": cmp.to_dict()}, fmt, indent=2, sort_keys=False)
        else:
            emit(dicts if policy == "all" else dicts[0], fmt, indent=2, sort_keys=False)
    else:
        _print_arrival(summaries, pods, wall, plot)
        if cmp is not None:
            from orchestrator.sim.curve import format_comparison

            typer.echo(format_comparison(cmp, f"{cmp.a} - {cmp.b} on {pods.name}, {len(cmp.seeds)} seed(s), "
                                              "paired (mean, sd, min, max over seeds)"))


def _paper_key(pods: Path) -> str | None:
    stem = pods.stem
    for k in PAPER_AT_130:
        if stem.endswith("_" + k) or stem == k:
            return k
    return None


def _print_arrival(summaries: list[Any], pods: Path, wall: float, plot: Path | None) -> None:
    from rich.console import Console
    from rich.table import Table

    from orchestrator.sim.curve import CURVE_FROM

    last = summaries[0].checkpoints[-1]
    cols = [i for i in summaries[0].at(10) if summaries[0].checkpoints[i] >= CURVE_FROM] or summaries[0].at(10)
    table = Table(title=f"Allocation ratio (% of GPU capacity) vs arrived GPU request -- {pods.name}, "
                        f"mean of {len(summaries[0].seeds)} seed(s)")
    table.add_column("policy")
    for i in cols:
        table.add_column(f"{summaries[0].checkpoints[i]}%", justify="right")
    table.add_column("AUC 50-130", justify="right")
    table.add_column(f"±sd@{last}", justify="right")
    table.add_column(f"frag@{last}", justify="right")
    table.add_column(f"unalloc GPUs@{last}", justify="right")
    table.add_column("failed pods", justify="right")
    paper = PAPER_AT_130.get(_paper_key(pods) or "", {})
    if paper and last == 130:
        table.add_column("paper@130", justify="right")
    for s in summaries:
        row = [s.policy] + [f"{s.allocation_pct[i]:.2f}" for i in cols]
        area = s.auc
        row += ["" if area is None else f"{area:.3f}", f"{s.allocation_std[-1]:.2f}",
                f"{s.fragmentation_pct[-1]:.1f}", f"{s.unallocated_gpus:.1f}", f"{s.failed:.0f}"]
        if paper and last == 130:
            row.append(f"{paper[s.policy]:.2f}" if s.policy in paper else "")
        table.add_row(*row)
    console = Console(width=max(120, 12 * (len(cols) + 7)))
    console.print(table)
    cpu = sum(s.wall_s for s in summaries)
    console.print(f"wall {wall:.1f}s, {cpu:.1f} CPU-s in replays" + (f"; chart: {plot}" if plot else ""))


def _print_timeline(out: list[dict[str, Any]], pods: Path, wall: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Timeline replay -- {pods.name} (load x{out[0]['load']:g}), mean of {out[0]['seeds']} seed(s)")
    for c in ("policy", "GPU-time util %", "demanded %", "waited", "delay p50 s", "p90 s", "p99 s", "max s",
              "LS waited", "never placed"):
        table.add_column(c, justify="left" if c == "policy" else "right")
    for d in out:
        q = d["queueing_delay_s"]
        table.add_row(d["policy"], f"{d['gpu_time_utilisation_pct']:.3f}", f"{d['demanded_gpu_time_pct']:.3f}",
                      f"{d['waited']:.0f}", f"{q['p50']:.0f}", f"{q['p90']:.0f}", f"{q['p99']:.0f}", f"{q['max']:.0f}",
                      f"{d['ls_waited']:.0f}/{d['ls_pods']}", f"{d['never_placed']:.0f}")
    Console(width=140).print(table)
    Console().print(f"wall {wall:.1f}s")


def write_plot(summaries: list[Any], path: Path, title: str = "") -> None:
    """The paper's Fig. 9(a) style: GPU allocation ratio vs arrived GPU request, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=130)
    x_max = summaries[0].checkpoints[-1]
    ax.plot([0, 100, x_max], [0, 100, 100], color="0.75", ls="--", lw=1, label="ideal")
    markers = "osD^v<>px*"
    for k, s in enumerate(summaries):
        ax.plot(s.checkpoints, s.allocation_pct, lw=1.6, marker=markers[k % len(markers)],
                markevery=max(1, len(s.checkpoints) // 13), ms=4,
                label=f"{s.policy} ({s.allocation_pct[-1]:.2f}%)")
    ax.set_xlabel("Arrived GPU request (% of cluster GPU capacity)")
    ax.set_ylabel("GPU allocation ratio (%)")
    ax.set_xlim(0, x_max)
    lo = min(min(s.allocation_pct[len(s.allocation_pct) * 2 // 3:]) for s in summaries)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    # Inset: the tail, where the policies differ.
    ins = ax.inset_axes([0.07, 0.52, 0.36, 0.4])
    for k, s in enumerate(summaries):
        ins.plot(s.checkpoints, s.allocation_pct, lw=1.2, marker=markers[k % len(markers)],
                 markevery=max(1, len(s.checkpoints) // 13), ms=3)
    ins.set_xlim(85, x_max)
    ins.set_ylim(max(0.0, lo - 1), 100)
    ins.tick_params(labelsize=7)
    ins.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


@app.command("schemes")
def schemes(
    nodes: Path = typer.Option(..., "--nodes", help="Node list CSV"),
    pods: Path = typer.Option(..., "--pods", help="Pod list CSV"),
    seed: int = typer.Option(0, "--seed", help="Pod and node order"),
    target_pct: float = typer.Option(100.0, "--target-pct", min=1.0, help="Resample arrivals up to this % of GPU capacity"),
    policy: str = typer.Option("default", "--policy", help="Placement policy for every scheme"),
) -> None:
    """Compare the sharing schemes (whole cards, time-slicing, MPS, MIG, ours) on one arrival replay; prints JSON."""
    from orchestrator.core.priorities import POLICY_NAMES
    from orchestrator.sim.schemes import compare_schemes

    if policy not in POLICY_NAMES:
        _fail(InvalidRequestError("policy", policy, POLICY_NAMES))
    try:
        out = compare_schemes(nodes, pods, seed=seed, target_pct=target_pct, policy=policy)
    except InvalidRequestError as e:
        _fail(e)
    typer.echo(json.dumps(out))


@app.command("colocation")
def colocation(
    cluster_gpus: int = typer.Option(64, "--cluster-gpus", min=1, help="Cards of the generated cluster (8-card "
                                     "nodes: 3 in 4 A100-80GB with MIG, the rest H100-80GB)"),
    curves: list[str] = typer.Option(["standard"], "--curves", help="A family (standard), a kind (diurnal, spike, "
                                     "ramp, bursty) or a seconds,requests_per_s CSV; repeat or comma-separate"),
    seeds: int = typer.Option(1, "--seeds", min=1, help="Seeds per generated curve: seed_base..seed_base+K-1"),
    seed_base: int = typer.Option(0, "--seed-base", help="First seed"),
    scheme_list: Optional[str] = typer.Option(None, "--schemes", help="Comma-separated schemes (default: every "
                                               "scheme of configs/colocation.schemes.yaml)"),
    tick: float = typer.Option(10.0, "--tick", min=0.5, max=60.0, help="Simulated seconds per step while nothing "
                               "moves (the scaling loop's interval while anything does)"),
    colocation_config: Optional[Path] = typer.Option(None, "--colocation-config", help="The service's config "
                                                     "(default: configs/colocation.yaml)"),
    json_out: bool = typer.Option(False, "--json", help="Print JSON (as -o json)"),
    output: Output = None,
) -> None:
    """Every co-location scheme's 24 h on each curve, in simulated time on the real head code (no Ray); the
    figures per curve and the worst case per scheme (docs/colocation-sim.md)."""
    from orchestrator.core.colocation import DEFAULT_COLOCATION, load_colocation
    from orchestrator.core.config import DEMO_CONFIG, load_config
    from orchestrator.core.errors import ConfigError
    from orchestrator.scenarios.colocation.schemes import MIG_TARGETS, SCHEMES, WINDOWS
    from orchestrator.sim import colocation as sim
    from orchestrator.sim.curves import resolve
    from orchestrator.sim.dayrun import SimParams

    try:
        fmt = output_format(output, json_out)
        names = [s.strip() for s in (scheme_list or ",".join(SCHEMES)).split(",") if s.strip()]
        for n in names:
            if n not in SCHEMES:
                raise InvalidRequestError("schemes", n, list(SCHEMES))
        cfg = load_colocation(colocation_config or DEFAULT_COLOCATION)
        params = SimParams(tick_s=tick)
        services = sim.services_for(cluster_gpus)
        rps = sim.card_rps(sim.service_for(cfg.service, cluster_gpus, services), params)
        specs = [c.strip() for spec in curves for c in spec.split(",") if c.strip()]
        chosen = resolve(specs, range(seed_base, seed_base + seeds), cluster_gpus, rps)
    except (InvalidRequestError, ConfigError) as e:
        _fail(e)
    say = (lambda s: typer.echo(s, err=True)) if fmt != "table" else typer.echo
    out = sim.evaluate(cluster_gpus, chosen, SCHEMES, WINDOWS, MIG_TARGETS, service=cfg.service,
                       scheduler=load_config(DEMO_CONFIG).scheduler, control_s=cfg.control_interval_s,
                       params=params, scheme_names=names, say=say)
    if fmt != "table":
        emit(out, fmt, indent=2, sort_keys=False)
        return
    cols = ("utilisation_pct", "slo_attainment_pct", "p99_latency_ms", "peak_replicas", "preemptions", "steps_lost",
            "absorb_max_s")
    typer.echo(f"{'curve':<14} {'scheme':<11} " + " ".join(f"{c:>20}" for c in cols))
    for name, c in out["curves"].items():
        for scheme, row in c["schemes"].items():
            typer.echo(f"{name:<14} {scheme:<11} " + " ".join(f"{str(row[k]):>20}" for k in cols))
    for scheme, w in out["worst_case"].items():
        typer.echo(f"worst case {scheme}: " + ", ".join(f"{k} {v['value'] if isinstance(v, dict) else v}"
                                                         for k, v in w.items()))


@app.command("fairness")
def fairness(
    seeds: int = typer.Option(3, "--seeds", min=1, help="Workloads (one per seed): seed_base..seed_base+N-1"),
    seed_base: int = typer.Option(0, "--seed-base", help="First seed"),
    cluster_gpus: int = typer.Option(128, "--cluster-gpus", min=1, help="Cards of the simulated cluster (8-card "
                                     "openb G3 nodes: 128 cores, 768 GiB)"),
    hours: float = typer.Option(3.0, "--hours", help="Simulated hours per run (0 < hours <= 48)"),
    pods: Optional[Path] = typer.Option(None, "--pods", help="An openb pod list to draw jobs and teams from "
                                        "(default: the packaged mix, openb default's typical pods)"),
    config: Optional[Path] = typer.Option(None, "--config", help="The queue tree with fairness on (default: "
                                          "configs/fairness.yaml)"),
    scheme_list: Optional[str] = typer.Option(None, "--schemes", help="Comma-separated: ours, flat_quota, fifo "
                                              "(default: all three)"),
    workers: int = typer.Option(2, "--workers", min=1, help="Processes running (scheme, seed) pairs in parallel"),
    chart: Optional[Path] = typer.Option(None, "--chart", help="Write each team's share over time (first seed, "
                                         "one panel per scheme) as SVG"),
    json_out: bool = typer.Option(False, "--json", help="Print the JSON object (as -o json)"),
    output: Output = None,
) -> None:
    """Hierarchical fair share against flat quotas and FIFO: a multi-team workload through the real scheduling
    cycle in simulated time (no Ray); fairness index, waits, allocation, preemptions and work lost per scheme,
    worst case over seeds (docs/fairness.md)."""
    from orchestrator.core.errors import ConfigError
    from orchestrator.sim import fairness as sim
    from orchestrator.sim.tenants import TenantParams, load_pool

    try:
        fmt = output_format(output, json_out)
        names = [s.strip() for s in (scheme_list or ",".join(sim.SCHEMES)).split(",") if s.strip()]
        tenant = TenantParams(hours=hours)
        tenant.check()
        cfg = sim.load_config(config)
        pool, source = load_pool(pods)
        out, by, workloads = sim.run_evaluation(cfg, pool, source, range(seed_base, seed_base + seeds), cluster_gpus,
                                                tenant, names=names, workers=workers)
    except (InvalidRequestError, ConfigError) as e:
        _fail(e)
        return
    if chart is not None:
        first = [by[n][0] for n in names]
        chart.parent.mkdir(parents=True, exist_ok=True)
        w = workloads[0]
        chart.write_text(fairness_svg(first, w.teams, w.changes, w.horizon_s, float(cluster_gpus),
                                       f"Share of {cluster_gpus} GPUs per team (solid) and fair share (dashed), "
                                       f"seed {w.seed}, {source}"))
    if fmt != "table":
        emit(out, fmt, indent=2, sort_keys=False)
        return
    cols = ("fairness_index", "fairness_index_min_settled", "max_gang_wait_s", "max_wait_s", "waits_over_bound",
            "allocation_pct", "useful_pct", "preemptions", "work_lost_gpu_s", "jobs_done")
    typer.echo(f"{len(workloads)} seed(s), {cluster_gpus} GPUs, {hours:g} h, {source}; worst case over seeds")
    typer.echo(f"{'scheme':<11} " + " ".join(f"{c:>26}" for c in cols))
    for n in names:
        typer.echo(f"{n:<11} " + " ".join(f"{str(out['worst'][n].get(c)):>26}" for c in cols))
    for name, t in out.get("targets", {}).items():
        typer.echo(f"target {name}: {'met' if t['met'] else 'MISSED'} "
                   f"({', '.join(f'{k} {v}' for k, v in t.items() if k != 'met')})")
    if chart is not None:
        typer.echo(f"chart: {chart}")


_TEAM_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def fairness_svg(figs: Sequence[Any], teams: Sequence[str], changes: Sequence[float], horizon_s: float,
                 capacity_gpus: float, title: str = "") -> str:
    """``sim fairness --chart``: one panel per scheme (its :class:`~orchestrator.sim.fairness.Figures`), each
    team's share of the cluster's GPUs (solid) and its fair share (dashed) over simulated time, demand changes
    as grey verticals. Plain SVG, no dependency (as :func:`write_plot` draws the openb curves, here)."""
    w, ph, left, top, gap = 900, 190, 60, 40, 40
    height = top + len(figs) * (ph + gap) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" font-family="sans-serif" '
           f'font-size="11"><rect width="100%" height="100%" fill="white"/>',
           f'<text x="{left}" y="20" font-size="13">{_svg_text(title)}</text>']
    pw = w - left - 150
    for k, f in enumerate(figs):
        y0 = top + k * (ph + gap)
        x = lambda t: left + pw * t / horizon_s  # noqa: E731
        y = lambda v: y0 + ph - ph * min(v, 1.0)  # noqa: E731
        out.append(f'<rect x="{left}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>')
        out.append(f'<text x="{left}" y="{y0 - 6}">{_svg_text(f.scheme)}: fairness index {f.fairness_index or 0:.3f} '
                   f'(settled), allocation {f.allocation_pct:.1f}%</text>')
        for c in changes:
            out.append(f'<line x1="{x(c):.1f}" y1="{y0}" x2="{x(c):.1f}" y2="{y0 + ph}" stroke="#ccc"/>')
        for v in (0.25, 0.5, 0.75, 1.0):
            out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.0%}</text>')
        for i, team in enumerate(teams):
            col = _TEAM_COLOURS[i % len(_TEAM_COLOURS)]
            used = " ".join(f"{x(t):.1f},{y(row[i][0] / capacity_gpus):.1f}" for t, row in f.series)
            fair = " ".join(f"{x(t):.1f},{y(row[i][1] / capacity_gpus):.1f}" for t, row in f.series)
            out.append(f'<polyline fill="none" stroke="{col}" stroke-width="1.4" points="{used}"/>')
            out.append(f'<polyline fill="none" stroke="{col}" stroke-width="1" stroke-dasharray="4,3" '
                       f'points="{fair}"/>')
            if k == 0:
                out.append(f'<text x="{left + pw + 12}" y="{y0 + 14 + 14 * i}" fill="{col}">{_svg_text(team)}</text>')
        for h in range(int(horizon_s // 3600) + 1):
            out.append(f'<text x="{x(h * 3600):.1f}" y="{y0 + ph + 14}" text-anchor="middle">{h} h</text>')
    out.append(f'<text x="{left + pw + 12}" y="{top + 14 * (len(teams) + 2)}">solid: share held</text>')
    out.append(f'<text x="{left + pw + 12}" y="{top + 14 * (len(teams) + 3)}">dashed: fair share</text>')
    out.append("</svg>")
    return "\n".join(out)


def _svg_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
