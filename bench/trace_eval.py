"""Full trace evaluation: the paper's seven policies x N seeds on openb pod lists, timed.

    .venv/bin/python bench/trace_eval.py                       # default + gpushare100, 10 seeds
    .venv/bin/python bench/trace_eval.py --lists default --seeds 10 --plot docs/img/openb_default.png
    .venv/bin/python bench/trace_eval.py --lists all --compare default fgd    # ours vs FGD on every list
    .venv/bin/python bench/trace_eval.py --lists default /tmp/lists/spec33.csv --compare default fgd --seeds 3 --workers 1
    .venv/bin/python bench/trace_eval.py --lists all --compare default fgd --seeds 3 --seeds-by default=10 gpushare100=10 \
        --compare-plot docs/img/openb_default_vs_fgd.png     # issue #16's table and chart (add the built lists)

Prints, per pod list, the allocation table (mean of the seeds: every 10%
checkpoint from 50% to 130% and the area under the curve over 50-130%, see
``orchestrator/sim/curve.py``) and the wall time of that list's replays on
``--workers`` processes; with ``--compare A B`` (or when both ``fgd`` and
``default`` run) the per-checkpoint table of ``A - B`` (paired by seed: mean,
sd, min, max) for each list, then one summary line per list (the worst
checkpoint, the AUC difference, the difference at 130%); then one JSON line
per list (``{"pod_list", "wall_s", "results": [...], "compare": {...}}``).
A list is a name (``openb_pod_list_NAME.csv`` in ``--trace-dir``, default
``../shared/traces/openb``), ``all``, or a path to a pod-list CSV (such as
those ``bench/make_pod_lists.py`` writes); ``--seeds-by NAME=N`` gives one list
its own seed count, and ``--compare-plot PATH`` draws ``A - B`` along the
curve, one panel per list (mean over seeds, and the seeds' min..max as a
band). A figure-printing benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.sim.arrival import PAPER_POLICIES, run_arrival  # noqa: E402
from orchestrator.cli.sim import PAPER_AT_130, _print_arrival, write_plot  # noqa: E402
from orchestrator.sim.curve import compare, format_comparison  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace-dir", type=Path, default=REPO.parent / "shared" / "traces" / "openb")
    ap.add_argument("--nodes", type=Path, default=None, help="node list (default: TRACE_DIR/openb_node_list_gpu_node.csv)")
    ap.add_argument("--lists", nargs="+", default=["default", "gpushare100"],
                    help="pod list names (openb_pod_list_NAME.csv), or 'all' for every list in the trace dir")
    ap.add_argument("--policies", nargs="+", default=list(PAPER_POLICIES))
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), default=None,
                    help="run only policies A and B and print A - B per checkpoint (default: default fgd, "
                         "when both are among --policies)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--seed-base", type=int, default=0)
    ap.add_argument("--seeds-by", nargs="*", default=[], metavar="LIST=N",
                    help="seed count for a list by name, overriding --seeds (e.g. default=10 gpushare100=10)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--plot", type=Path, default=None, help="chart of the first list")
    ap.add_argument("--compare-plot", type=Path, default=None,
                    help="chart of A - B along the curve, one panel per list (mean and min..max over seeds)")
    args = ap.parse_args()
    nodes = args.nodes or args.trace_dir / "openb_node_list_gpu_node.csv"
    if not nodes.is_file():
        print(f"needs the openb trace in {args.trace_dir}", file=sys.stderr)
        return 2
    lists = args.lists
    if lists == ["all"]:
        lists = sorted(p.stem.removeprefix("openb_pod_list_") for p in args.trace_dir.glob("openb_pod_list_*.csv"))
    policies = list(args.compare) if args.compare else args.policies
    pair = tuple(args.compare) if args.compare else ("default", "fgd")
    n_seeds = {k: int(v) for k, v in (item.split("=", 1) for item in args.seeds_by)}
    lines, versus = [], []
    for k, item in enumerate(lists):
        if item.endswith(".csv"):
            pods, name = Path(item), Path(item).stem.removeprefix("openb_pod_list_")
        else:
            pods, name = args.trace_dir / f"openb_pod_list_{item}.csv", item
        n = n_seeds.get(name, args.seeds)
        seeds = range(args.seed_base, args.seed_base + n)
        t0 = time.perf_counter()
        summaries = run_arrival(str(nodes), str(pods), policies, seeds, workers=args.workers)
        wall = time.perf_counter() - t0
        _print_arrival(summaries, pods, wall, args.plot if k == 0 else None)
        if k == 0 and args.plot:
            write_plot(summaries, args.plot, title=f"openb {name}: {len(policies)} policies, {n} seeds")
        paper = PAPER_AT_130.get(name, {})
        for s in summaries:
            if s.policy in paper:
                print(f"  cross-check {name} {s.policy}: ours {s.allocation_pct[-1]:.2f} vs paper {paper[s.policy]:.2f} "
                      f"({s.allocation_pct[-1] - paper[s.policy]:+.2f})")
        at = {s.policy: s for s in summaries}
        cmp = None
        if pair[0] in at and pair[1] in at:
            cmp = compare(at[pair[0]].runs, at[pair[1]].runs)
            print(format_comparison(cmp, f"{cmp.a} - {cmp.b} on {name}, {len(cmp.seeds)} seed(s), paired "
                                         "(mean, sd, min, max over seeds)"))
            versus.append((name, cmp))
        lines.append(json.dumps({"pod_list": name, "seeds": n, "workers": args.workers,
                                 "wall_s": round(wall, 1), "results": [s.to_dict() for s in summaries],
                                 "compare": cmp.to_dict() if cmp else None}))
    if versus:
        cps = list(versus[0][1].points)
        print(f"\n{pair[0]} - {pair[1]} per checkpoint, mean over the seeds (paired)")
        print(f"{'pod list':<16}" + "".join(f"{str(c) + '%':>7}" for c in cps) + f"{'AUC':>8}  worst  seeds")
        for name, c in versus:
            k, w = c.worst
            area = f"{c.auc.mean:+8.3f}" if c.auc else f"{'':>8}"
            print(f"{name:<16}" + "".join(f"{c.points[p].mean:+7.2f}" for p in cps) + f"{area}  {w:+.2f}@{k}%"
                  f"  {len(c.seeds)}")
        if args.compare_plot:
            write_compare_plot(versus, args.compare_plot)
            print(f"wrote {args.compare_plot}")
    for line in lines:
        print(line)
    return 0


def write_compare_plot(versus: list, path: Path) -> None:
    """One panel per pod list: ``A - B`` (points of allocation) at every curve checkpoint, the mean
    over seeds as a line and the seeds' min..max as a band; the zero line is where A equals B."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 4
    rows = (len(versus) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), dpi=110, sharex=True, squeeze=False)
    lo = min(min(s.lo for s in c.points.values()) for _, c in versus)
    hi = max(max(s.hi for s in c.points.values()) for _, c in versus)
    for ax, (name, c) in zip(axes.flat, versus):
        x = list(c.points)
        ax.axhline(0, color="0.4", lw=0.8)
        ax.fill_between(x, [c.points[k].lo for k in x], [c.points[k].hi for k in x], alpha=0.25, color="C0")
        ax.plot(x, [c.points[k].mean for k in x], marker="o", ms=3, color="C0")
        ax.set_title(f"{name} ({len(c.seeds)} seeds)", fontsize=9)
        ax.set_ylim(min(lo, -0.2) - 0.1, hi + 0.1)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in axes.flat[len(versus):]:
        ax.axis("off")
    a, b = versus[0][1].a, versus[0][1].b
    fig.supxlabel("Arrived GPU request (% of cluster GPU capacity)", fontsize=9)
    fig.supylabel(f"{a} - {b}, allocation (points)", fontsize=9)
    fig.suptitle(f"{a} - {b} along the arrival curve: mean over seeds, band min..max", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
