"""A seeded multi-team workload for the fair-share evaluation (``orchestrator sim fairness``).

What it is made of, and where each part comes from:

* **shapes** -- the GPU pods of an openb pod list (``--pods``; CPU-only pods are left out: this is a GPU
  scheduler), or, without one, the packaged mix: openb's typical pods
  (:data:`orchestrator.scheduling.workloads.DEFAULT_WORKLOAD`, each shape ``round(popularity x 1000)`` times,
  named ``typical-<shape>-<k>``). Each job's request is its pod's (:func:`~orchestrator.sim.arrival.pod_request`:
  whole cards or a time-sliced share, with its host CPU and memory);
* **teams** -- a pod belongs to ``teams[crc32(pod name) % len(teams)]``: a stable hash, so the same pod
  list splits into the same teams on every machine and every seed, and each team has its own mix of the
  trace's shapes;
* **class from the trace's qos** -- ``LS`` and ``Guaranteed`` pods are latency-sensitive: class
  ``interactive`` (not preemptible, no checkpoint), their run clipped to ``interactive_s`` (short work: a
  notebook, an evaluation, a serving test); ``BE``, ``Burstable`` and an empty qos are ``training``
  (preemptible, checkpoints when asked), clipped to ``training_s``. The run is the pod's trace lifetime
  (``deletion_time - creation_time``) clipped so; a pod list without times (and the packaged mix, which has
  neither qos nor times) draws it log-uniformly in the class's range, and the packaged mix's qos is the
  hash again: ``LS`` for the first :data:`LS_FRACTION` of ``crc32(name + ":qos")``, openb ``default``'s
  share of LS among its GPU pods;
* **gangs** -- a training job on one whole card becomes, with probability ``gang_fraction``, a gang of
  one of :data:`GANG_SHAPES` (4 to 8 whole cards over 2 to 8 workers, each worker with its pod's host CPU
  and memory per card): what waits longest when small work backfills every freed card;
* **phases** -- time is cut into epochs of ``epoch_s``; in each epoch each team is *busy* (submits at a
  Poisson rate whose offered load is ``busy_load`` of the cluster's GPUs) or *quiet* (submits nothing),
  drawn with ``busy_probability``, at least ``min_busy`` teams busy and the busy set not the same two
  epochs running (where the probability leaves another). So demand changes at epoch boundaries, several
  times a run; :attr:`Workload.changes` lists them (the times the busy set changed).

Invariants: a function of (pool, teams, params, seed) alone (``numpy.random.default_rng`` streams, one for
the phases and one per team); jobs are sorted by submission time, then id; every job's ``work_s`` is
within its class's range and > 0; a gang's workers are identical.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.priorities import SchedulerConfig
from orchestrator.core.request import GpuRequest
from orchestrator.scheduling.fairshare import QueueTree
from orchestrator.scheduling.workloads import DEFAULT_WORKLOAD
from orchestrator.sim.arrival import pod_request
from orchestrator.sim.openb import MILLI, PodTable, load_pods

#: Share of LS (and Guaranteed) pods among openb ``default``'s GPU pods (4,017 of 7,064): the packaged
#: mix's qos split, which the mix itself does not carry.
LS_FRACTION = 0.569
#: (workers, whole cards each) a gang may take: 4 to 8 cards in all.
GANG_SHAPES: tuple[tuple[int, int], ...] = ((2, 2), (4, 1), (2, 4), (8, 1))
INTERACTIVE, TRAINING = "interactive", "training"
#: Draws of an epoch's busy set before one equal to the last (or, below ``min_busy``, every team) is taken.
_DRAWS = 1000
LS_QOS = ("LS", "Guaranteed")


@dataclass(frozen=True, slots=True)
class PodShape:
    """One pod of the pool: its name (what its team and, for the packaged mix, its qos hash from), its
    request's parts and its trace lifetime in seconds (-1: none)."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    qos: str
    lifetime_s: float = -1.0
    models: tuple[str, ...] = ()


@dataclass(frozen=True)
class TenantParams:
    """The generator's knobs; the defaults are the evaluation's (docs/fairness.md), chosen, not measured."""

    hours: float = 3.0  # the issue asks for 2 to 4 hours of simulated time
    epoch_s: float = 1800.0  # demand changes every half hour: 20 settled minutes after each change's first 10
    busy_probability: float = 0.5
    min_busy: int = 2
    #: Offered load of one busy team, as a share of the cluster's GPUs: with 2 to 5 teams busy an epoch asks for
    #: 60 to 150% of the cluster (about 80% over a run), so some epochs contend and fair share decides there.
    busy_load: float = 0.3
    gang_fraction: float = 0.08  # of training jobs on one whole card: about 3% of all jobs are gangs
    interactive_s: tuple[float, float] = (30.0, 600.0)  # LS runs: openb's p10 is 89 s; "short work"
    training_s: tuple[float, float] = (60.0, 2400.0)  # BE runs: openb's median is 266 s, p90 5558 s

    def check(self) -> None:
        """Raise :class:`InvalidRequestError` naming the first field out of range."""
        if not 0 < self.hours <= 48:
            raise InvalidRequestError("hours", self.hours, "0 < hours <= 48")
        if not 60 <= self.epoch_s <= 48 * 3600:
            raise InvalidRequestError("epoch_s", self.epoch_s, "60 s to 48 h (longer than the run: one epoch)")
        if not 0 <= self.busy_probability <= 1:
            raise InvalidRequestError("busy_probability", self.busy_probability, "0 to 1")
        if not 0 < self.busy_load <= 10:
            raise InvalidRequestError("busy_load", self.busy_load, "0 < busy_load <= 10")
        if not 0 <= self.gang_fraction <= 1:
            raise InvalidRequestError("gang_fraction", self.gang_fraction, "0 to 1")
        for name in ("interactive_s", "training_s"):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi:
                raise InvalidRequestError(name, (lo, hi), "0 < low <= high seconds")


@dataclass(frozen=True, slots=True)
class Job:
    """One job: ``workers`` identical workers (1: no gang) each asking ``request``, of ``team``'s queue, in
    ``priority_class``, needing ``work_s`` seconds of running on what it asks, submitted at ``submit_s``."""

    job_id: str
    team: str
    submit_s: float
    request: GpuRequest
    priority_class: str
    work_s: float
    workers: int = 1
    pod: str = ""

    @property
    def gpus(self) -> float:
        return self.request.gpu_demand * self.workers

    @property
    def gang(self) -> bool:
        return self.workers > 1


@dataclass(frozen=True)
class Workload:
    """The jobs, the busy teams of each epoch and the demand-change times (epoch starts where the busy set
    changed, 0 included)."""

    teams: tuple[str, ...]
    jobs: tuple[Job, ...]
    busy: tuple[tuple[str, ...], ...]
    changes: tuple[float, ...]
    horizon_s: float
    epoch_s: float
    source: str
    seed: int
    by_team: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        gpu_s = sum(j.gpus * j.work_s for j in self.jobs)
        return {"source": self.source, "teams": list(self.teams), "jobs": len(self.jobs),
                "gangs": sum(1 for j in self.jobs if j.gang),
                "interactive": sum(1 for j in self.jobs if j.priority_class == INTERACTIVE),
                "jobs_by_team": dict(self.by_team), "asked_gpu_hours": round(gpu_s / 3600, 1),
                "hours": round(self.horizon_s / 3600, 3), "epoch_s": self.epoch_s,
                "busy": [list(b) for b in self.busy], "demand_changes_s": list(self.changes)}


def stable_hash(text: str) -> int:
    """CRC-32 of the UTF-8 text: the same on every machine and Python (``hash`` is salted per process)."""
    return zlib.crc32(text.encode())


def team_of(pod_name: str, teams: Sequence[str]) -> str:
    return teams[stable_hash(pod_name) % len(teams)]


def teams_of(config: SchedulerConfig) -> tuple[str, ...]:
    """The leaf queues of the config's tree, ``default`` left out: the teams jobs are submitted to."""
    tree = QueueTree.of(config)
    return tuple(q for q in sorted(config.queues) if q != "default" and tree.is_leaf(q))


def load_pool(pods: str | Path | None = None) -> tuple[list[PodShape], str]:
    """The shapes jobs are drawn from and where they come from: an openb pod list's GPU pods (read and checked
    by :func:`~orchestrator.sim.openb.load_pods`), or the packaged mix."""
    if pods is None:
        return packaged_pool(), "packaged: openb default's typical pods"
    return pool_from_pods(load_pods(pods)), str(pods)


def pool_from_pods(pods: PodTable) -> list[PodShape]:
    """The GPU pods of an openb pod list, in file order."""
    out = []
    for i in range(len(pods)):
        if int(pods.num_gpu[i]) <= 0:
            continue
        life = -1.0
        if pods.has_times and pods.creation_time[i] >= 0 and pods.deletion_time[i] >= pods.creation_time[i]:
            life = float(pods.deletion_time[i] - pods.creation_time[i])
        out.append(PodShape(pods.name[i], int(pods.cpu_milli[i]), int(pods.memory_mib[i]), int(pods.num_gpu[i]),
                            int(pods.gpu_milli[i]), pods.qos[i], life, pods.models[i]))
    if not out:
        raise InvalidRequestError("pods", pods.path, "a pod list with at least one GPU pod")
    return out


def packaged_pool() -> list[PodShape]:
    """openb's typical GPU pods (the packaged mix), each shape in proportion to its popularity."""
    out = []
    for s, (t, pop) in enumerate(DEFAULT_WORKLOAD):
        if not t.gpu_count:
            continue
        for k in range(max(1, round(pop * 1000))):
            name = f"typical-{s}-{k}"
            qos = "LS" if (stable_hash(name + ":qos") % 1000) < LS_FRACTION * 1000 else "BE"
            out.append(PodShape(name, t.cpu_milli, t.memory_mib, t.gpu_count, t.gpu_milli, qos, -1.0, t.models))
    return out


def _job_request(pod: PodShape, cards: int = 0) -> GpuRequest:
    """The pod's request; ``cards`` > 0: a gang worker of that many whole cards with the pod's host CPU and
    memory per card."""
    if cards:
        per = max(1, pod.num_gpu)
        return GpuRequest.whole(cards, cpu_milli=pod.cpu_milli * cards // per,
                                host_memory_mib=pod.memory_mib * cards // per, models=pod.models)
    return pod_request(pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli, pod.models)


def _busy_sets(teams: Sequence[str], epochs: int, p: TenantParams, rng: np.random.Generator) -> list[tuple[str, ...]]:
    """Each epoch's busy teams: each busy with ``busy_probability``, at least ``min_busy`` (or all), and not the
    previous epoch's set again (so every epoch boundary is a demand change) unless :data:`_DRAWS` draws found no
    other (a probability of 0 or 1 allows one set only)."""
    need = min(p.min_busy, len(teams))
    out: list[tuple[str, ...]] = []
    for _ in range(epochs):
        fallback = None
        for _ in range(_DRAWS):
            pick = tuple(t for t in teams if rng.random() < p.busy_probability)
            if len(pick) < need:
                continue
            fallback = fallback or pick
            if not out or pick != out[-1]:
                break
        else:
            pick = fallback or tuple(teams)
        out.append(pick)
    return out


def generate(pool: Sequence[PodShape], teams: Sequence[str], cluster_gpus: float, seed: int,
             params: TenantParams = TenantParams(), source: str = "packaged") -> Workload:
    """The workload of ``seed``; see the module docstring."""
    params.check()
    if not teams:
        raise InvalidRequestError("teams", list(teams), "at least one team (a leaf queue of the config)")
    if cluster_gpus <= 0:
        raise InvalidRequestError("cluster_gpus", cluster_gpus, "> 0")
    by_team: dict[str, list[PodShape]] = {t: [] for t in teams}
    for pod in pool:
        by_team[team_of(pod.name, teams)].append(pod)
    empty = [t for t, pods in by_team.items() if not pods]
    if empty:
        raise InvalidRequestError("teams", empty, "teams the pool's pods hash into",
                                  detail=f"no pod of {len(pool)} falls to them: give a larger pod list or fewer teams")
    horizon = params.hours * 3600.0
    epochs = max(1, math.ceil(horizon / params.epoch_s - 1e-9))
    phase_rng, *team_rngs = np.random.default_rng(seed).spawn(1 + len(teams))
    busy = _busy_sets(teams, epochs, params, phase_rng)
    jobs: list[tuple[float, str, Job]] = []
    for t_i, team in enumerate(teams):
        rng, pods = team_rngs[t_i], by_team[team]
        mean = float(np.mean([_mean_gpu_s(p, params) for p in pods]))
        rate = params.busy_load * cluster_gpus / mean  # jobs per second while busy
        n = 0
        for e, names in enumerate(busy):
            if team not in names:
                continue
            t, end = e * params.epoch_s, min(horizon, (e + 1) * params.epoch_s)
            while True:
                t += float(rng.exponential(1.0 / rate))
                if t >= end:
                    break
                job = _draw(pods[int(rng.integers(len(pods)))], team, f"{team}-{n:05d}", t, params, rng)
                jobs.append((t, job.job_id, job))
                n += 1
    jobs.sort(key=lambda x: (x[0], x[1]))
    counts = {t: sum(1 for _, _, j in jobs if j.team == t) for t in teams}
    changes = [e * params.epoch_s for e in range(epochs) if e == 0 or busy[e] != busy[e - 1]]
    return Workload(tuple(teams), tuple(j for _, _, j in jobs), tuple(busy), tuple(changes), horizon,
                    params.epoch_s, source, seed, counts)


def _range(pod: PodShape, p: TenantParams) -> tuple[float, float]:
    return p.interactive_s if pod.qos in LS_QOS else p.training_s


def _mean_gpu_s(pod: PodShape, p: TenantParams) -> float:
    """What one job of ``pod`` asks on average, GPU-seconds (its lifetime clipped, or the log-uniform mean)."""
    lo, hi = _range(pod, p)
    run = min(max(pod.lifetime_s, lo), hi) if pod.lifetime_s >= 0 else (hi - lo) / math.log(hi / lo) if hi > lo else lo
    gpus = pod.num_gpu * (pod.gpu_milli / MILLI)
    return max(gpus, 1e-3) * run


def _draw(pod: PodShape, team: str, job_id: str, t: float, p: TenantParams, rng: np.random.Generator) -> Job:
    lo, hi = _range(pod, p)
    u = float(rng.random())  # drawn always, so a pod list with times keeps the same stream as one without
    run = min(max(pod.lifetime_s, lo), hi) if pod.lifetime_s >= 0 else lo * (hi / lo) ** u
    if pod.qos in LS_QOS:
        return Job(job_id, team, t, _job_request(pod), INTERACTIVE, run, pod=pod.name)
    g = float(rng.random())
    if pod.num_gpu == 1 and pod.gpu_milli >= MILLI and g < p.gang_fraction:
        workers, cards = GANG_SHAPES[int(rng.integers(len(GANG_SHAPES)))]
        return Job(job_id, team, t, _job_request(pod, cards), TRAINING, run, workers=workers, pod=pod.name)
    return Job(job_id, team, t, _job_request(pod), TRAINING, run, pod=pod.name)
