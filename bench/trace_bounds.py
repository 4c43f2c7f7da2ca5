"""How high can any scheduler go on an openb pod list? Two relaxed replays as yardsticks.

    .venv/bin/python bench/trace_bounds.py                      # default list, seeds 0-9
    .venv/bin/python bench/trace_bounds.py --list gpushare100 --seeds 3

Both replay the same arrivals as ``orchestrator sim openb`` (same seed, same
resampling to 130%) on a *fluid* cluster: the node list's GPUs pooled, with no
node boundaries, no CPU, no host memory, no GPU models -- so each is an
optimistic yardstick, not a policy:

* ``fluid best-fit``: every share goes to the fullest GPU it fits (a new GPU
  only when none fits), whole-GPU pods to any free GPUs. What online
  placement without migration reaches when only GPU packing matters.
* ``fluid + ideal migration``: as above, and when a pod fits nowhere every
  share is re-packed best-fit-decreasing from scratch (unlimited free
  migrations) before giving up. Close to a ceiling for any placement that
  takes pods in arrival order and drops only those that cannot fit.

Prints the allocation ratio at 130% of each per seed and the means; compare
with ``bench/trace_eval.py``. A figure-printing benchmark, not a test.
"""

from __future__ import annotations

import argparse
import bisect
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.sim.arrival import arrival_sequence, seed_streams  # noqa: E402
from orchestrator.sim.openb import MILLI, load_nodes, load_pods  # noqa: E402


def _best_fit_decreasing(shares: list[int]) -> list[int]:
    """Sorted free milli of the GPUs that best-fit-decreasing packs ``shares`` into."""
    free: list[int] = []
    for x in sorted(shares, reverse=True):
        i = bisect.bisect_left(free, x)
        if i < len(free):
            bisect.insort(free, free.pop(i) - x)
        else:
            bisect.insort(free, MILLI - x)
    return free


def fluid(gpus: int, seq: np.ndarray, num_gpu: np.ndarray, gpu_milli: np.ndarray, migrate: bool) -> int:
    """Allocated GPU-milli after the arrivals ``seq`` on ``gpus`` pooled GPUs.

    Invariant: ``free`` holds the free milli of every GPU with a share, sorted;
    ``whole`` GPUs are taken by whole-GPU pods; the rest are idle."""
    free: list[int] = []
    shares: list[int] = []
    whole = allocated = 0
    for j in seq:
        k, m = int(num_gpu[j]), int(gpu_milli[j])
        if k == 0:
            continue
        if m >= MILLI:
            if migrate and gpus - whole - len(free) < k:
                free = _best_fit_decreasing(shares)
            if gpus - whole - len(free) >= k:
                whole += k
                allocated += k * MILLI
            continue
        i = bisect.bisect_left(free, m)
        if i < len(free):
            bisect.insort(free, free.pop(i) - m)
        elif gpus - whole - len(free) >= 1:
            bisect.insort(free, MILLI - m)
        elif migrate and len(repacked := _best_fit_decreasing(shares + [m])) <= gpus - whole:
            free = repacked
        else:
            continue
        shares.append(m)
        allocated += m
    return allocated


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace-dir", type=Path, default=REPO.parent / "shared" / "traces" / "openb")
    ap.add_argument("--list", default="default", help="pod list name (openb_pod_list_NAME.csv)")
    ap.add_argument("--seeds", type=int, default=10)
    args = ap.parse_args()
    nodes_csv, pods_csv = args.trace_dir / "openb_node_list_gpu_node.csv", args.trace_dir / f"openb_pod_list_{args.list}.csv"
    if not (nodes_csv.is_file() and pods_csv.is_file()):
        print(f"needs the openb trace in {args.trace_dir}", file=sys.stderr)
        return 2
    nodes, pods = load_nodes(str(nodes_csv)), load_pods(str(pods_csv))
    capacity, gpus = nodes.total_gpu_milli, int(np.asarray(nodes.gpus).sum())
    rows = []
    for seed in range(args.seeds):
        seq = arrival_sequence(pods, capacity, seed_streams(seed)[0])  # the replay's own arrival order
        rows.append([100.0 * fluid(gpus, seq, pods.num_gpu, pods.gpu_milli, m) / capacity for m in (False, True)])
        print(f"seed {seed}: fluid best-fit {rows[-1][0]:.2f}  fluid + ideal migration {rows[-1][1]:.2f}", flush=True)
    mean = np.mean(rows, axis=0)
    print(f"{args.list}, {args.seeds} seeds, allocation at 130%: fluid best-fit {mean[0]:.2f}, "
          f"fluid + ideal migration {mean[1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
