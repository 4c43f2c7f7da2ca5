"""The sharing schemes compared on one openb arrival replay: whole cards, time-slicing, MPS, MIG, ours.

The trace's sharing pods (``num_gpu == 1``, ``gpu_milli < 1000``) are asked for
the way each scheme would ask; whole-card and CPU-only pods are the same under
every scheme:

* ``whole`` -- a whole card each (what Kubernetes' device plugin hands out);
* ``timeslice`` -- a time-slice of ``gpu_milli`` (the trace's own form);
* ``mps`` -- an MPS share of ``ceil(gpu_milli / 10)`` % of the SMs (cards whose
  model has no MPS cannot take it);
* ``mig`` -- hard isolation (``isolation=hard``): the smallest MIG profile with
  enough compute slices, else a whole card (openb's cards -- T4, P100, V100, A10,
  G2, G3 -- have no MIG, so every such pod ends on a whole card: the table's
  ``by_kind`` says so);
* ``adaptive`` (ours) -- the unified request (``isolation=none``): a time-slice,
  else an MPS share, else a whole card, whichever fits.

Figures per scheme, with the same seed (pod order, node order) for all: GPU
demand served (the placed pods' ``gpu_milli`` over capacity), GPU capacity
occupied (what the placements hold: a whole card for a 0.2-GPU pod occupies
1000), pods placed, and placements by the kind they got. Pure; no I/O beyond
reading the two CSV files.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.core.request import GpuRequest, Isolation
from orchestrator.scheduling.engine import Placement, place, resolve
from orchestrator.scheduling.snapshot import ClusterSnapshot
from orchestrator.sim.arrival import arrival_sequence, demand_workload, make_policy, node_specs, pod_request, seed_streams
from orchestrator.sim.openb import MILLI, NodeTable, PodTable, load_nodes, load_pods
from orchestrator.sim.workload import typical_workload

SCHEMES: tuple[tuple[str, str], ...] = (
    ("whole", "whole cards"), ("timeslice", "time-slicing"), ("mps", "MPS"), ("mig", "MIG"),
    ("adaptive", "ours (adaptive)"),
)


def scheme_request(scheme: str, cpu_milli: int, memory_mib: int, num_gpu: int, gpu_milli: int,
                   models: tuple[str, ...]) -> GpuRequest:
    """One pod's request under ``scheme`` (see the module docstring)."""
    if num_gpu == 0 or gpu_milli >= MILLI or scheme == "timeslice":
        return pod_request(cpu_milli, memory_mib, num_gpu, gpu_milli, models)
    kw: dict[str, Any] = dict(cpu_milli=cpu_milli, host_memory_mib=memory_mib, models=models)
    fraction = gpu_milli / MILLI
    if scheme == "whole":
        return GpuRequest.whole(1, **kw)
    if scheme == "mps":
        return GpuRequest.mps(max(1, math.ceil(gpu_milli / 10)), **kw)
    if scheme == "mig":
        return GpuRequest(compute=fraction, isolation=Isolation.HARD, **kw)
    if scheme == "adaptive":
        return GpuRequest(compute=fraction, isolation=Isolation.NONE, **kw)
    raise ValueError(f"scheme must be one of {[s for s, _ in SCHEMES]}, got {scheme!r}")


def replay_scheme(nodes: NodeTable, pods: PodTable, scheme: str, *, seed: int = 0, target_pct: float = 100.0,
                  policy: str = "default") -> dict[str, Any]:
    """One arrival replay with every sharing pod asked for as ``scheme`` asks."""
    t0 = time.perf_counter()
    order_rng, node_rng, _ = seed_streams(seed)
    capacity = nodes.total_gpu_milli
    snap = ClusterSnapshot.build(node_specs(nodes, node_rng.permutation(len(nodes))))
    pol = make_policy(policy, typical_workload(pods, with_memory=True), demand_workload(pods))
    seq = arrival_sequence(pods, capacity, order_rng, target_pct=target_pct, order="shuffled")
    demand = pods.gpu_request_milli
    cache: dict[tuple[Any, ...], tuple[GpuRequest, Any]] = {}
    served = placed = 0
    by_kind: dict[str, int] = {}
    for j in seq:
        key = (int(pods.cpu_milli[j]), int(pods.memory_mib[j]), int(pods.num_gpu[j]), int(pods.gpu_milli[j]),
               pods.models[j])
        if key not in cache:
            req = scheme_request(scheme, *key)
            cache[key] = (req, resolve(req))
        req, resolved = cache[key]
        res = place(snap, req, pol, resolved=resolved)
        if isinstance(res, Placement):
            snap = snap.apply(res.allocation)
            served += int(demand[j])
            placed += 1
            if key[2]:
                kind = res.allocation.kind.value
                by_kind[kind] = by_kind.get(kind, 0) + 1
    return {"scheme": scheme, "label": dict(SCHEMES)[scheme], "pods": int(len(seq)), "placed": placed,
            "placed_pct": round(100.0 * placed / max(1, len(seq)), 2),
            "served_pct": round(100.0 * served / capacity, 2),
            "occupied_pct": round(100.0 * snap.allocated_milli() / capacity, 2),
            "failed": int(len(seq) - placed), "by_kind": by_kind, "wall_s": round(time.perf_counter() - t0, 2)}


def compare_schemes(nodes_csv: str | Path, pods_csv: str | Path, *, seed: int = 0, target_pct: float = 100.0,
                    policy: str = "default", schemes: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Every scheme on one trace; the dict the dashboard's comparison shows."""
    nodes, pods = load_nodes(nodes_csv), load_pods(pods_csv)
    names = schemes or tuple(s for s, _ in SCHEMES)
    rows = [replay_scheme(nodes, pods, s, seed=seed, target_pct=target_pct, policy=policy) for s in names]
    return {"title": f"openb replay at {target_pct:g}% arrival ({Path(pods_csv).name}, seed {seed}, "
                     f"policy {policy})",
            "source": f"{Path(nodes_csv).name} + {Path(pods_csv).name}", "schemes": rows,
            "gpus": float(np.sum(nodes.gpus)),
            "notes": ["Served: the placed pods' own GPU demand; occupied: what their placements hold.",
                      "The co-location scenario's comparison (utilisation and SLO by day and night) "
                      "joins this when that scenario exists."]}
