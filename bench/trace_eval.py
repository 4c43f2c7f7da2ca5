"""Full trace evaluation: the paper's seven policies x N seeds on openb pod lists, timed.

    .venv/bin/python bench/trace_eval.py                       # default + gpushare100, 10 seeds
    .venv/bin/python bench/trace_eval.py --lists default --seeds 10 --plot docs/img/openb_default.png
    .venv/bin/python bench/trace_eval.py --lists all --policies fgd default   # ours vs FGD on every list

Prints, per pod list, the allocation table (mean of the seeds) and the wall
time of that list's 7 x N replays on ``--workers`` processes; with both
``fgd`` and ``default`` run, a last table of ``default - fgd`` at 130% per
list (the issue's "at least FGD's figure on every pod list"); then one JSON
line per list (``{"pod_list", "wall_s", "results": [...]}``). Needs
``../shared/traces/openb`` (or ``--trace-dir``). A figure-printing benchmark,
not a test.
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace-dir", type=Path, default=REPO.parent / "shared" / "traces" / "openb")
    ap.add_argument("--lists", nargs="+", default=["default", "gpushare100"],
                    help="pod list names (openb_pod_list_NAME.csv), or 'all' for every list in the trace dir")
    ap.add_argument("--policies", nargs="+", default=list(PAPER_POLICIES))
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--plot", type=Path, default=None, help="chart of the first list")
    args = ap.parse_args()
    nodes = args.trace_dir / "openb_node_list_gpu_node.csv"
    if not nodes.is_file():
        print(f"needs the openb trace in {args.trace_dir}", file=sys.stderr)
        return 2
    lists = args.lists
    if lists == ["all"]:
        lists = sorted(p.stem.removeprefix("openb_pod_list_") for p in args.trace_dir.glob("openb_pod_list_*.csv"))
    lines, versus = [], []
    for k, name in enumerate(lists):
        pods = args.trace_dir / f"openb_pod_list_{name}.csv"
        t0 = time.perf_counter()
        summaries = run_arrival(str(nodes), str(pods), args.policies, range(args.seeds), workers=args.workers)
        wall = time.perf_counter() - t0
        _print_arrival(summaries, pods, wall, args.plot if k == 0 else None)
        if k == 0 and args.plot:
            write_plot(summaries, args.plot, title=f"openb {name}: {len(args.policies)} policies, {args.seeds} seeds")
        paper = PAPER_AT_130.get(name, {})
        for s in summaries:
            if s.policy in paper:
                print(f"  cross-check {name} {s.policy}: ours {s.allocation_pct[-1]:.2f} vs paper {paper[s.policy]:.2f} "
                      f"({s.allocation_pct[-1] - paper[s.policy]:+.2f})")
        at = {s.policy: s for s in summaries}
        if "fgd" in at and "default" in at:
            versus.append((name, at["fgd"], at["default"]))
        lines.append(json.dumps({"pod_list": name, "seeds": args.seeds, "workers": args.workers,
                                 "wall_s": round(wall, 1), "results": [s.to_dict() for s in summaries]}))
    if versus:
        print(f"\ndefault vs fgd at {versus[0][1].checkpoints[-1]}% arrival ({args.seeds} seeds; sd over seeds)")
        print(f"{'pod list':<14} {'fgd':>14} {'default':>14} {'diff':>7}")
        for name, f, d in versus:
            fa, da = f.allocation_pct[-1], d.allocation_pct[-1]
            print(f"{name:<14} {fa:8.2f} +-{f.allocation_std[-1]:.2f} {da:8.2f} +-{d.allocation_std[-1]:.2f} {da - fa:+7.2f}")
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
