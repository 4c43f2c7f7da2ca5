"""Build test pod lists from openb's ``default`` list, the way openb's variants were made from it.

    .venv/bin/python bench/make_pod_lists.py --out /tmp/openb-built          # seed 0, every list
    .venv/bin/python bench/trace_eval.py --lists /tmp/openb-built/gpuspec33_s0.csv --compare default fgd --seeds 3

Why: ``default`` must be judged on workloads the project has not tuned on
(issue #16). openb ships one list per knob (``gpuspec10``, ``cpu050``, ...);
this script turns the same knobs further, with a seed, so the lists can be
rebuilt anywhere instead of committed (each is ~600 kB).

What it writes into ``--out`` (a folder outside the repository; the script
refuses one inside it), for seed ``S``:

* ``gpuspecNN_sS.csv`` for each ``--spec-shares`` (default 20, 25, 33, 40 %):
  the ``default`` list with its ``gpu_spec`` column re-drawn -- exactly
  ``round(share x GPU pods)`` GPU pods, chosen uniformly without replacement,
  name a model; the others name none. Each chosen pod's ``gpu_spec`` is drawn
  from the mix of ``gpuspec10`` (openb's own constrained list: T4 36%, G2 16%,
  P100 14%, ``V100M16|V100M32`` 8%, ...), weighted by how often it appears
  there, among the specs that some node of the node list can serve (a node of
  one of its models with at least ``num_gpu`` GPUs), so no pod is made
  unplaceable by construction. CPU-only pods are left alone.
* ``cpuxK_sS.csv`` for each ``--cpu-scales`` (default 2, 3): every pod's
  ``cpu_milli`` multiplied by ``K``, capped at the largest node's CPU (a pod no
  node can hold tells nothing about placement); nothing else changes.
* ``multigpuNN_sS.csv`` for each ``--multi-gpu-shares`` (default 30, 40, 50 %):
  built the way openb's own ``multigpu20`` was built from ``default`` (that
  list is ``default``'s 8,152 pods plus 172 more 2-, 4- and 8-GPU pods, so that
  multi-GPU pods make 20.4% of the GPU demand instead of 7.3%): the
  ``default`` list, then copies of its own multi-GPU pods (every column, a new
  name ``openb-pod-NNNN`` continuing the numbering) drawn uniformly with
  replacement until multi-GPU pods make at least ``NN``% of the list's GPU
  demand (GPU-milli). Appended at the end: the replay shuffles by seed anyway.
* ``MANIFEST.json``: the seed, the inputs, and per list the pods, the
  constrained share, the multi-GPU share of the GPU demand and the total CPU asked.

Every other column (names, memory, GPUs, QoS, times) is the ``default``
list's, in its order. Same seed, same files (``numpy.random.default_rng``;
one independent stream per list, so adding a share does not change the others).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def _read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


def _write(path: Path, header: list[str], rows: list[dict[str, str]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=header, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def spec_mix(spec_rows: list[dict[str, str]]) -> list[tuple[str, int]]:
    """``gpu_spec`` values of a constrained list and how often each appears, most frequent first."""
    return sorted(Counter(r["gpu_spec"] for r in spec_rows if r["gpu_spec"]).items(), key=lambda kv: (-kv[1], kv[0]))


def max_gpus_by_model(node_rows: list[dict[str, str]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in node_rows:
        if r["model"]:
            out[r["model"]] = max(out.get(r["model"], 0), int(r["gpu"]))
    return out


def with_specs(rows: list[dict[str, str]], share: float, mix: list[tuple[str, int]], biggest: dict[str, int],
               rng: np.random.Generator) -> list[dict[str, str]]:
    """``rows`` with ``round(share x GPU pods)`` GPU pods naming a model drawn from ``mix`` (servable specs only)."""
    gpu_idx = [i for i, r in enumerate(rows) if int(r["num_gpu"]) > 0]
    chosen = rng.choice(len(gpu_idx), size=int(round(share * len(gpu_idx))), replace=False)
    out = [dict(r, gpu_spec="") for r in rows]
    for k in sorted(chosen.tolist()):
        i = gpu_idx[k]
        need = int(rows[i]["num_gpu"])
        ok = [(s, n) for s, n in mix if max(biggest.get(m, 0) for m in s.split("|")) >= need]
        w = np.array([n for _, n in ok], dtype=float)
        out[i]["gpu_spec"] = ok[int(rng.choice(len(ok), p=w / w.sum()))][0]
    return out


def with_cpu_scale(rows: list[dict[str, str]], factor: float, cap: int) -> list[dict[str, str]]:
    return [dict(r, cpu_milli=str(min(cap, int(round(int(r["cpu_milli"]) * factor))))) for r in rows]


def with_multi_gpu(rows: list[dict[str, str]], share: float, rng: np.random.Generator) -> list[dict[str, str]]:
    """``rows`` plus copies of its multi-GPU pods, drawn uniformly with replacement, until they make at
    least ``share`` of the GPU demand (GPU-milli); the copies are renamed ``openb-pod-NNNN`` after the last."""
    def demand(r: dict[str, str]) -> int:
        return int(r["num_gpu"]) * int(r["gpu_milli"])
    multi = [r for r in rows if int(r["num_gpu"]) > 1]
    if not multi:
        raise ValueError("the source list has no multi-GPU pod to copy")
    total = sum(demand(r) for r in rows)
    have = sum(demand(r) for r in multi)
    out = [dict(r) for r in rows]
    width = len(rows[-1]["name"].rsplit("-", 1)[-1])
    while have < share * total:
        r = dict(multi[int(rng.integers(len(multi)))], name=f"openb-pod-{len(out):0{width}d}")
        out.append(r)
        have += demand(r)
        total += demand(r)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace-dir", type=Path, default=REPO.parent / "shared" / "traces" / "openb")
    ap.add_argument("--out", type=Path, required=True, help="folder to write into (outside the repository)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--spec-shares", type=float, nargs="*", default=[0.20, 0.25, 0.33, 0.40],
                    help="shares of the GPU pods that name a model")
    ap.add_argument("--multi-gpu-shares", type=float, nargs="*", default=[0.30, 0.40, 0.50],
                    help="shares of the GPU demand that multi-GPU pods make")
    ap.add_argument("--cpu-scales", type=float, nargs="*", default=[2.0, 3.0], help="CPU-ask multipliers")
    args = ap.parse_args()
    out = args.out.resolve()
    if out == REPO or REPO in out.parents:
        print(f"--out {out} is inside the repository; write the lists elsewhere (they are not committed)",
              file=sys.stderr)
        return 2
    src = {k: args.trace_dir / f for k, f in (("pods", "openb_pod_list_default.csv"),
                                              ("spec", "openb_pod_list_gpuspec10.csv"),
                                              ("nodes", "openb_node_list_gpu_node.csv"))}
    missing = [str(p) for p in src.values() if not p.is_file()]
    if missing:
        print(f"needs the openb trace: missing {', '.join(missing)}", file=sys.stderr)
        return 2
    header, rows = _read(src["pods"])
    _, spec_rows = _read(src["spec"])
    _, node_rows = _read(src["nodes"])
    mix, biggest = spec_mix(spec_rows), max_gpus_by_model(node_rows)
    cap = max(int(r["cpu_milli"]) for r in node_rows)
    out.mkdir(parents=True, exist_ok=True)
    # One stream per spec share first, as before (so adding the multi-GPU lists changed no existing list).
    streams = np.random.default_rng(args.seed).spawn(len(args.spec_shares))
    multi_streams = np.random.default_rng([args.seed, 1]).spawn(len(args.multi_gpu_shares))
    manifest: dict = {"seed": args.seed, "source": {k: str(p) for k, p in src.items()}, "lists": {}}
    built: list[tuple[str, list[dict[str, str]]]] = []
    for share, rng in zip(args.spec_shares, streams):
        built.append((f"gpuspec{int(round(share * 100))}_s{args.seed}", with_specs(rows, share, mix, biggest, rng)))
    for factor in args.cpu_scales:
        built.append((f"cpux{factor:g}_s{args.seed}", with_cpu_scale(rows, factor, cap)))
    for share, rng in zip(args.multi_gpu_shares, multi_streams):
        built.append((f"multigpu{int(round(share * 100))}_s{args.seed}", with_multi_gpu(rows, share, rng)))
    for name, new in built:
        path = out / f"{name}.csv"
        _write(path, header, new)
        gpu = [r for r in new if int(r["num_gpu"]) > 0]
        manifest["lists"][name] = {
            "path": str(path), "pods": len(new),
            "gpu_pods_naming_a_model_pct": round(100 * sum(1 for r in gpu if r["gpu_spec"]) / len(gpu), 2),
            "multi_gpu_demand_pct": round(100 * sum(int(r["num_gpu"]) * int(r["gpu_milli"]) for r in gpu
                                                    if int(r["num_gpu"]) > 1)
                                          / sum(int(r["num_gpu"]) * int(r["gpu_milli"]) for r in gpu), 2),
            "cpu_asked_cores": round(sum(int(r["cpu_milli"]) for r in new) / 1000, 1)}
        print(f"{path}: {manifest['lists'][name]}")
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
