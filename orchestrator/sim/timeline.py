"""Timeline replay: the trace's own clock, departures included.

Each pod arrives at its ``creation_time`` and, once placed, runs for the
trace's lifetime ``deletion_time - creation_time`` and then leaves. A pod
that fits nowhere waits; the waiting pods are retried, oldest first, each
time a pod leaves (kube-scheduler requeues unschedulable pods on cluster
events; a waiting pod never blocks a later one that fits, so the queue is
FIFO with backfill). Pods of one shape fit or fail together on a given
snapshot, so each retry round tries the oldest waiting pod of each shape and
goes on with that shape only while it succeeds.

Reported (``TimelineResult``): GPU-time utilisation (allocated GPU-milli x
seconds over capacity x the replay's span, from the first arrival to the last
departure), the queueing-delay percentiles of the pods that waited, how many
latency-sensitive (``qos == LS``) pods waited at all, and how many were still
waiting when the trace ended. Node order and the ``random`` policy's ties
come from the seed, as in the arrival replay.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchestrator.core.stats import quantile
from orchestrator.scheduling.engine import Placement, place
from orchestrator.scheduling.fragmentation import Workload
from orchestrator.sim.arrival import load_trace, run_parallel, setup_replay
from orchestrator.sim.openb import NodeTable, PodTable, TraceFormatError

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class TimelineResult:
    policy: str
    seed: int
    pods: int
    gpu_time_utilisation_pct: float
    demanded_gpu_time_pct: float
    waited: int
    delay_s: dict[str, float]
    ls_pods: int
    ls_waited: int
    never_placed: int
    span_s: int
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "seed": self.seed, "pods": self.pods,
            "gpu_time_utilisation_pct": round(self.gpu_time_utilisation_pct, 4),
            "demanded_gpu_time_pct": round(self.demanded_gpu_time_pct, 4),
            "waited": self.waited, "queueing_delay_s": {k: round(v, 1) for k, v in self.delay_s.items()},
            "ls_pods": self.ls_pods, "ls_waited": self.ls_waited, "never_placed": self.never_placed,
            "span_s": self.span_s, "wall_s": round(self.wall_s, 3),
        }


def summarise(runs: list[TimelineResult]) -> dict[str, Any]:
    """Mean over seeds of one policy's timeline runs."""
    if not runs:
        raise ValueError("no runs to summarise")
    mean = lambda f: float(np.mean([f(r) for r in runs]))  # noqa: E731
    keys = runs[0].delay_s.keys()
    return {
        "policy": runs[0].policy, "seeds": len(runs), "seed_values": [r.seed for r in runs], "mode": "timeline",
        "pods": runs[0].pods,
        "gpu_time_utilisation_pct": round(mean(lambda r: r.gpu_time_utilisation_pct), 4),
        "demanded_gpu_time_pct": round(mean(lambda r: r.demanded_gpu_time_pct), 4),
        "waited": round(mean(lambda r: r.waited), 2),
        "queueing_delay_s": {k: round(mean(lambda r: r.delay_s[k]), 1) for k in keys},
        "ls_pods": runs[0].ls_pods,
        "ls_waited": round(mean(lambda r: r.ls_waited), 2),
        "never_placed": round(mean(lambda r: r.never_placed), 2),
        "span_s": runs[0].span_s, "cpu_s": round(sum(r.wall_s for r in runs), 2),
    }


def replay_timeline(nodes: NodeTable, pods: PodTable, policy_name: str, seed: int, *,
                    workload: Workload | None = None, load: float = 1.0) -> TimelineResult:
    """One timeline replay; see the module docstring.

    ``load`` compresses the arrival times by that factor (lifetimes unchanged):
    the openb lists are samples whose own clock loads the full cluster lightly
    (at most ~1% of its GPUs at once on ``default``), so contention needs
    ``load`` of the order of 100.
    """
    if load <= 0:
        raise ValueError(f"load must be > 0, got {load}")
    if not pods.has_times:
        raise TraceFormatError(pods.path, 1, 0, "creation_time", "", "a pod list with creation_time and deletion_time",
                               "timeline mode replays the trace's own times")
    t0 = time.perf_counter()
    capacity = nodes.total_gpu_milli
    setup = setup_replay(nodes, pods, policy_name, seed, workload)
    snap, policy, rng = setup.snapshot, setup.policy, setup.rng
    shape, reqs, resolved = setup.shape, setup.requests, setup.resolved
    gpu = pods.gpu_request_milli
    valid = (pods.creation_time >= 0) & (pods.deletion_time >= 0)
    lifetime = np.maximum(pods.deletion_time - pods.creation_time, 0)
    origin = int(pods.creation_time[valid].min()) if valid.any() else 0
    created = np.where(valid, origin + np.floor((pods.creation_time - origin) / load), -1).astype(np.int64)
    arrivals = sorted((int(created[i]), i) for i in np.flatnonzero(valid))

    start = np.full(len(pods), -1, dtype=np.int64)
    departures: list[tuple[int, int, int]] = []   # (time, seq, pod)
    allocs: dict[int, Any] = {}
    waiting: dict[int, deque[int]] = {}            # shape -> pods, oldest first
    n_wait = 0
    seq = 0
    used_milli = 0
    gpu_time = 0.0
    now = arrivals[0][0] if arrivals else 0
    t_first = now

    def advance(t: int) -> None:
        nonlocal gpu_time, now
        gpu_time += used_milli * (t - now)
        now = t

    def try_place(i: int) -> bool:
        nonlocal snap, used_milli, seq
        s = int(shape[i])
        res = place(snap, reqs[s], policy, rng=rng, resolved=resolved[s])
        if not isinstance(res, Placement):
            return False
        snap = snap.apply(res.allocation)
        allocs[i] = res.allocation
        used_milli += int(gpu[i])
        start[i] = now
        seq += 1
        heapq.heappush(departures, (now + int(lifetime[i]), seq, i))
        return True

    def retry_waiting() -> None:
        nonlocal n_wait
        for s in sorted(waiting, key=lambda k: waiting[k][0]):
            q = waiting[s]
            while q and try_place(q[0]):
                q.popleft()
                n_wait -= 1
            if not q:
                del waiting[s]

    ai = 0
    while ai < len(arrivals) or departures:
        next_arrival = arrivals[ai][0] if ai < len(arrivals) else None
        if departures and (next_arrival is None or departures[0][0] <= next_arrival):
            t, _, i = heapq.heappop(departures)
            advance(t)
            snap = snap.release(allocs.pop(i))
            used_milli -= int(gpu[i])
            # Leave together with everything else that leaves at this instant, then retry once.
            while departures and departures[0][0] == t:
                _, _, k = heapq.heappop(departures)
                snap = snap.release(allocs.pop(k))
                used_milli -= int(gpu[k])
            if n_wait:
                retry_waiting()
        else:
            t, i = arrivals[ai]
            ai += 1
            advance(t)
            s = int(shape[i])
            if s in waiting or not try_place(i):
                waiting.setdefault(s, deque()).append(i)
                n_wait += 1
    span = max(now - t_first, 1)
    placed = start >= 0
    delay = np.where(placed, start - created, -1)
    waited_mask = placed & (delay > 0)
    d = delay[waited_mask].astype(np.float64)
    delay_s = {f"p{q}": quantile(d.tolist(), q / 100) or 0.0 for q in PERCENTILES}  # core/stats, as every figure
    delay_s["max"] = float(d.max()) if len(d) else 0.0
    ls = np.array([q == "LS" for q in pods.qos]) & valid
    never = valid & ~placed
    demanded = float((gpu[valid] * lifetime[valid]).sum())
    return TimelineResult(
        policy_name, seed, int(valid.sum()), 100.0 * gpu_time / (capacity * span),
        100.0 * demanded / (capacity * span), int(waited_mask.sum()), delay_s, int(ls.sum()),
        int((ls & (waited_mask | never)).sum()), int(never.sum()), int(span), time.perf_counter() - t0)


def _run_one(args: tuple[str, str, str, int, float]) -> TimelineResult:
    nodes_path, pods_path, policy, seed, load = args
    nodes, pods, workload = load_trace(nodes_path, pods_path)
    return replay_timeline(nodes, pods, policy, seed, workload=workload, load=load)


def run_timeline(nodes_path: str, pods_path: str, policies: list[str] | tuple[str, ...], seeds: list[int] | range, *,
                 workers: int = 2, load: float = 1.0) -> list[dict[str, Any]]:
    """Every (policy, seed) timeline replay; one summary dict per policy, in order."""
    _, pods, _ = load_trace(nodes_path, pods_path)
    if not pods.has_times:
        raise TraceFormatError(pods_path, 1, 0, "creation_time", "", "a pod list with creation_time and deletion_time",
                               "timeline mode replays the trace's own times")
    jobs = [(nodes_path, pods_path, p, int(s), float(load)) for p in policies for s in seeds]
    results = run_parallel(_run_one, jobs, workers, first=lambda j: j[2] in ("fgd", "default"))
    by: dict[str, list[TimelineResult]] = {}
    for r in results:
        by.setdefault(r.policy, []).append(r)
    return [summarise(by[p]) for p in policies]
