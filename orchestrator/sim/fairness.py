"""Fair share in simulated time: a multi-team workload through the real scheduling cycle, under three schemes.

Design notes, the workload and the figures' definitions are in docs/fairness.md. Names:

* a **cycle** (every ``cycle_s``) calls :func:`orchestrator.scheduling.cycle.schedule` itself over a
  :class:`~orchestrator.scheduling.snapshot.ClusterSnapshot`, the holding leases and the pending items, and
  carries the plan out as the head does (:mod:`orchestrator.control.victims`): a grant becomes a held lease
  (the plan's ``after`` is the new snapshot); a victim whose class checkpoints holds its cards while it writes
  (``checkpoint_s``; stopped without one at its grace period if that is shorter), any other is stopped at once;
  then it is released and its job requeued at its submission time, to restore (``restore_s``) and go on from
  what it saved. A request whose victims are still leaving is *nominated*; a victim checkpointing is *in flight*;
* **schemes** (:func:`schemes`): ``ours`` (the config's tree, fairness on, each queue's
  :class:`~orchestrator.scheduling.fairshare.DecayedUsage`), ``flat_quota`` (today's: flat queues, quota = own
  guarantee, borrowing, no fairness, limits or reservations) and ``fifo`` (one queue, submission order);
* **figures** (:class:`Figures`) judge every scheme against ours' tree: each ``sample_s``, Jain's index over the
  asking teams of used / fair share (:func:`~orchestrator.scheduling.fairshare.compute` on that moment's
  demand), its mean over samples more than ``settle_s`` after a demand change; work lost is counted from
  checkpoints, not assumed.

Invariants: everything happens at cycle instants (an end, a checkpoint written, an arrival is seen at the first
cycle at or after it) while work accrues exactly; the snapshot equals the held leases' allocations at every
cycle; GPU-time held never exceeds the cluster's (asserted each cycle), what ran never exceeds what was held; a
lease is preempted at most once; same inputs and seed, same figures.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from orchestrator.core import datafiles
from orchestrator.core.errors import ConfigError, InvalidRequestError
from orchestrator.core.gang_request import GangMember
from orchestrator.core.lease import Lease, LeaseState
from orchestrator.core.priorities import PriorityClass, QueueConfig, SchedulerConfig
from orchestrator.scheduling.cycle import PendingItem, Plan, schedule
from orchestrator.scheduling.fairshare import (
    ZERO, DecayedUsage, Resources, compute, jain, lease_resources,
)
from orchestrator.scheduling.policies import get_policy
from orchestrator.scheduling.snapshot import ClusterSnapshot, NodeSpec
from orchestrator.sim.arrival import run_parallel
from orchestrator.sim.dayrecords import SimParams
from orchestrator.sim.tenants import Job, PodShape, TenantParams, Workload, generate, teams_of

SCHEMES = ("ours", "flat_quota", "fifo")
#: Measured: "a new TorchTrainer ready to train, median 46.4 s" (docs/preemption.md, ``bench/preemption.py
#: --holder gang``): a resumed training job's start-up before its first step.
RESTORE_S = 46.4
#: A wait past the bound counts as a team's starvation (``waits_over_bound_below_share``) when its team held
#: less than this fraction of its fair share on average meanwhile (a share reached a few cycles late is not).
BELOW_SHARE = 0.9


@dataclass(frozen=True)
class FairnessParams:
    """The driver's parameters; each default says where it comes from."""

    cycle_s: float = 5.0
    sample_s: float = 30.0
    #: The issue's target window: the index counts from 10 simulated minutes after a demand change.
    settle_s: float = 600.0
    #: Assumption shared with the co-location day (:class:`~orchestrator.sim.dayrecords.SimParams`): writing a
    #: multi-GB checkpoint; the toy models measured write one in 4-20 ms (docs/preemption.md).
    checkpoint_s: float = SimParams.checkpoint_s
    checkpoint_every_s: float = SimParams.checkpoint_every_s
    restore_s: float = RESTORE_S
    node_gpus: int = 8
    node_cpu_milli: int = 128_000
    node_memory_mib: int = 786_432
    node_model: str = "G3"

    def nodes(self, cluster_gpus: int) -> list[NodeSpec]:
        """``cluster_gpus`` cards on nodes of ``node_gpus`` (the last one holds the rest)."""
        n, rest = divmod(cluster_gpus, self.node_gpus)
        sizes = [self.node_gpus] * n + ([rest] if rest else [])
        return [NodeSpec(f"node-{i:03d}", self.node_model, g, self.node_cpu_milli, self.node_memory_mib)
                for i, g in enumerate(sizes)]


@dataclass(frozen=True)
class Scheme:
    """A scheme: its config, and the queue and class every job goes to (None: the job's team, the job's class)."""

    name: str
    config: SchedulerConfig
    queue: str | None = None
    klass: str | None = None


def schemes(config: SchedulerConfig) -> dict[str, Scheme]:
    """``ours``, ``flat_quota`` and ``fifo`` from ``config`` (see the module docstring)."""
    base = config.model_dump()
    off = {**base["fairness"], "enabled": False, "starvation_bound_s": None}  # today's: no reservations either
    flat = {"default": {}, **{t: {"quota_gpus": config.queues[t].quota_gpus or 0.0, "borrowing": True}
                              for t in teams_of(config)}}
    # One queue with a quota of 0 that borrows: every grant borrows idle capacity and nothing is preempted for
    # anyone -- the same plans as an unlimited queue of a non-preemptible class, without the cycle asking the
    # preemption planner, for every request that does not fit, to find that no lease is eligible.
    fifo = SchedulerConfig(classes={"fifo": PriorityClass(priority=100, preemptible=False, checkpoint=False)},
                           default_class="fifo", queues={"default": QueueConfig(quota_gpus=0.0, borrowing=True)},
                           aging_per_minute=0.0, policy=config.policy)
    return {"ours": Scheme("ours", config),
            "flat_quota": Scheme("flat_quota", SchedulerConfig.parse({**base, "queues": flat, "fairness": off})),
            "fifo": Scheme("fifo", fifo, queue="default", klass="fifo")}


@dataclass
class _Run:
    """One job across its attempts. ``progress``: seconds of running done; ``saved``: at its last checkpoint;
    ``phase``: waiting | restoring | running | checkpointing | done; ``until``: when a start-up or a
    checkpoint write ends; ``leases``: the held attempt's lease ids (one per worker)."""

    job: Job
    queue: str
    klass: str
    priority: int
    checkpoints: bool
    attempt: int = 0
    progress: float = 0.0
    saved: float = 0.0
    phase: str = "waiting"
    until: float = 0.0
    pending_since: float = 0.0
    saves: bool = True
    leases: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Figures:
    """One scheme on one seed (see the module docstring)."""

    scheme: str
    seed: int
    fairness_index: float | None
    fairness_index_min_settled: float | None
    fairness_index_all: float | None
    settled_samples: int
    max_gang_wait_s: float
    max_wait_s: float
    waits_over_bound: int
    waits_over_bound_below_share: int
    starvation_bound_s: float | None
    allocation_pct: float
    useful_pct: float
    preemptions: int
    work_lost_gpu_s: float
    checkpoint_gpu_s: float
    restore_gpu_s: float
    jobs: int
    jobs_done: int
    still_waiting: int
    cycles: int
    wall_s: float
    series: tuple[tuple[float, tuple[tuple[float, float], ...]], ...] = field(repr=False, default=())

    def to_json(self) -> dict[str, Any]:
        """Every figure but the series, times to 0.1 s and GPU-seconds to 0.1, fractions to 4 places."""
        out: dict[str, Any] = {}
        for k in self.__dataclass_fields__:
            v = getattr(self, k)
            if k != "series":
                out[k] = round(v, 1 if k.endswith("_s") else 3 if k.endswith("_pct") else 4) \
                    if isinstance(v, float) else v
        out["within_bound"] = self.waits_over_bound == 0 if self.starvation_bound_s is not None else None
        return out


class Simulation:
    """One scheme on one workload; :meth:`run` returns its :class:`Figures`. ``judge``: the config whose tree
    the fair shares are measured against (ours', for every scheme)."""

    def __init__(self, scheme: Scheme, workload: Workload, judge: SchedulerConfig, cluster_gpus: int,
                 params: FairnessParams = FairnessParams()) -> None:
        self.s, self.w, self.judge, self.p = scheme, workload, judge, params
        self.cfg = scheme.config
        self.snap = ClusterSnapshot.build(params.nodes(cluster_gpus))
        st = self.snap.static
        self.capacity = Resources(float(cluster_gpus), float(st.cpu_total.sum()), float(st.mem_total.sum()))
        self.policy = get_policy(self.cfg.policy)
        self.half_life, self.bound = judge.fairness.half_life_s, judge.fairness.starvation_bound_s
        self.decayed = DecayedUsage()
        self.runs: dict[str, _Run] = {}
        self.held: dict[str, Lease] = {}  # lease id -> holding lease
        self.owner: dict[str, str] = {}  # lease / item id -> job id
        self.pending: dict[str, PendingItem] = {}
        self.nominating: dict[str, set[str]] = {}  # item id -> its victims still on their way out
        self.token = 0
        self.waits: list[tuple[float, float, str, bool]] = []  # (queued at, granted at, team, gang)
        self.samples: list[tuple[float, float]] = []  # (t, jain)
        self.series: list[tuple[float, tuple[tuple[float, float], ...]]] = []
        self.held_gpu_s = self.lost = self.ckpt_gpu_s = self.restore_gpu_s = 0.0
        self.preemptions = self.done = self.cycles = 0

    # ---- the run ------------------------------------------------------------------------------------
    def run(self) -> Figures:
        started = time.perf_counter()
        jobs, dt, horizon = list(self.w.jobs), self.p.cycle_s, self.w.horizon_s
        nxt, now, next_sample = 0, 0.0, 0.0
        while now <= horizon + 1e-9:
            while nxt < len(jobs) and jobs[nxt].submit_s <= now + 1e-9:
                self._submit(jobs[nxt], now)
                nxt += 1
            if self.pending:
                self._cycle(now)
            if now >= next_sample - 1e-9:
                self._sample(now)
                next_sample += self.p.sample_s
            if now + dt > horizon + 1e-9:
                break
            self._advance(now, dt)
            now += dt
        return self._figures(now, time.perf_counter() - started)

    def _submit(self, job: Job, now: float) -> None:
        klass = self.s.klass or job.priority_class
        _, pc = self.cfg.priority_class(klass)
        run = _Run(job, self.s.queue or job.team, klass, pc.priority, pc.checkpoint)
        self.runs[job.job_id] = run
        self._enqueue(run, now)

    def _enqueue(self, run: _Run, now: float) -> None:
        """The run's next attempt: one pending item per worker, at the job's submission time (its queue place)."""
        run.phase, run.pending_since, run.leases = "waiting", now, []
        job = run.job
        for i in range(job.workers):
            iid = f"{job.job_id}-w{i}-a{run.attempt}"
            gang = GangMember(gang_id=job.job_id, index=i, size=job.workers) if job.gang else None
            self.pending[iid] = PendingItem(iid, job.request, run.priority, run.klass, job.submit_s, queue=run.queue,
                                            gang=gang)
            self.owner[iid] = job.job_id

    # ---- time between two cycles ----------------------------------------------------------------------
    def _advance(self, now: float, dt: float) -> None:
        """``[now, now + dt]``: usage decays and accrues, runs progress; what ends by ``now + dt`` ends then."""
        end = now + dt
        used = self._queue_usage()
        self.decayed = self.decayed.advance(end, {q: r.dominant(self.capacity) for q, r in used.items()},
                                            self.half_life)
        gpus = sum(r.gpus for r in used.values())
        assert gpus <= self.capacity.gpus + 1e-6, f"{gpus} GPUs held of {self.capacity.gpus}"
        self.held_gpu_s += gpus * dt
        for run in [r for r in self.runs.values() if r.phase in ("restoring", "running", "checkpointing")]:
            g = run.job.gpus
            if run.phase == "restoring":
                self.restore_gpu_s += g * (min(end, run.until) - now)
                if run.until <= end + 1e-9:
                    run.phase, run.progress = "running", run.progress + (end - run.until)
            elif run.phase == "running":
                run.progress += dt
            else:
                self.ckpt_gpu_s += g * (min(end, run.until) - now)
                if run.until <= end + 1e-9:
                    self._stop(run, end, checkpointed=run.saves)
                continue
            if run.phase == "running":
                if run.progress >= run.job.work_s - 1e-9:
                    self._release(run)
                    run.phase = "done"
                    self.done += 1
                elif run.checkpoints and run.progress - run.saved >= self.p.checkpoint_every_s:
                    run.saved = run.progress  # a periodic checkpoint (its write is not charged)
                    for lid in run.leases:
                        self.held[lid] = replace(self.held[lid], last_checkpoint_at=end)

    def _release(self, run: _Run) -> None:
        for lid in run.leases:
            lease = self.held.pop(lid)
            assert lease.allocation is not None
            self.snap = self.snap.release(lease.allocation)
        run.leases = []

    def _stop(self, run: _Run, now: float, *, checkpointed: bool) -> None:
        """A victim ends: with its checkpoint (nothing lost) or without (its progress since the last is lost);
        its cards are freed and its job queued again."""
        if checkpointed:
            run.saved = run.progress
        else:
            self.lost += (run.progress - run.saved) * run.job.gpus
            run.progress = run.saved
        for lid in run.leases:
            for item, victims in list(self.nominating.items()):
                victims.discard(lid)
                if not victims:
                    del self.nominating[item]
        self._release(run)
        run.attempt += 1
        self._enqueue(run, now)

    # ---- the cycle ----------------------------------------------------------------------------------
    def _cycle(self, now: float) -> None:
        self.cycles += 1
        items = [i if i.nominated == (i.item_id in self.nominating) else replace(i, nominated=not i.nominated)
                 for i in self.pending.values()]
        in_flight = frozenset(lid for lid, lease in self.held.items() if lease.state is LeaseState.CHECKPOINTING)
        plan = schedule(self.snap, items, lambda: list(self.held.values()), self.cfg, now, self.policy,
                        in_flight=in_flight, decayed=self.decayed.usage)
        self._grant(plan, now)
        self._preempt(plan, now)

    def _grant(self, plan: Plan, now: float) -> None:
        granted: set[str] = set()
        for g in plan.grants:
            item = self.pending.pop(g.item_id)
            self.token += 1
            lease = Lease.new(g.item_id, item.request, now=item.submitted_at, owner=self.owner[g.item_id],
                              priority=item.priority, priority_class=item.priority_class, queue=item.queue,
                              gang=item.gang.gang_id if item.gang else None)
            lease = lease.grant(g.placement.allocation, self.token, now=now, reason=g.reason.text)
            lease = lease.transition(LeaseState.ACTIVE, now=now, reason="holder started")
            if self.runs[self.owner[g.item_id]].checkpoints:
                lease = replace(lease, restore_estimate_s=self.p.restore_s)
            self.held[g.item_id] = lease
            run = self.runs[self.owner[g.item_id]]
            run.leases.append(g.item_id)
            granted.add(run.job.job_id)
        self.snap = plan.after
        for jid in sorted(granted):
            run = self.runs[jid]
            assert len(run.leases) == run.job.workers, f"{jid}: {len(run.leases)} of {run.job.workers} workers"
            self.waits.append((run.pending_since, now, run.job.team, run.job.gang))
            resume = run.attempt > 0 and self.p.restore_s > 0
            run.phase, run.until = ("restoring", now + self.p.restore_s) if resume else ("running", now)

    def _preempt(self, plan: Plan, now: float) -> None:
        """Carry the plan's preemptions out as the head does (module docstring)."""
        stop: dict[str, _Run] = {}
        for p in plan.preemptions:
            lease = self.held.get(p.victim.lease_id)
            if lease is None or lease.state is not LeaseState.ACTIVE:
                continue
            run = self.runs[self.owner[lease.lease_id]]
            self.preemptions += 1
            if run.checkpoints and run.phase != "waiting":  # a gang's first worker already made it checkpointing
                _, pc = self.cfg.priority_class(run.klass)
                self.held[lease.lease_id] = lease.transition(LeaseState.CHECKPOINTING, now=now, reason=p.reason.text)
                self.nominating.setdefault(p.for_item, set()).add(lease.lease_id)
                if run.phase != "checkpointing":
                    write = self.p.checkpoint_s if run.progress > run.saved else 0.0
                    run.saves = write <= pc.grace_period_s
                    run.phase, run.until = "checkpointing", now + (write if run.saves else pc.grace_period_s)
            else:
                stop[run.job.job_id] = run
        for run in stop.values():
            self._stop(run, now, checkpointed=False)

    # ---- figures ------------------------------------------------------------------------------------
    def _queue_usage(self) -> dict[str, Resources]:
        out: dict[str, Resources] = {}
        for lease in self.held.values():
            out[lease.queue] = out.get(lease.queue, ZERO) + lease_resources(lease)
        return out

    def _sample(self, now: float) -> None:
        """Each team's use and ask, judged against ours' tree: Jain's index of used / fair over the teams asking."""
        used: dict[str, Resources] = {}
        asked: dict[str, Resources] = {}
        for lease in self.held.values():
            team = self.runs[self.owner[lease.lease_id]].job.team
            r = lease_resources(lease)
            used[team] = used.get(team, ZERO) + r
            asked[team] = asked.get(team, ZERO) + r
        for iid, item in self.pending.items():
            team = self.runs[self.owner[iid]].job.team
            r = item.request
            asked[team] = asked.get(team, ZERO) + Resources(r.gpu_demand, float(r.cpu_milli), float(r.host_memory_mib))
        shares = compute(self.judge, self.capacity, used, asked)
        xs, row = [], []
        for team in self.w.teams:
            line = shares.line(team)
            row.append((line.used_gpus if line else 0.0, line.fair_share_gpus if line else 0.0))
            if line is not None and line.asked_gpus > 1e-9 and line.fair_dominant > 1e-9:
                xs.append(line.used_dominant / line.fair_dominant)
        self.samples.append((now, jain(xs)))
        self.series.append((now, tuple(row)))

    def _figures(self, end: float, wall_s: float) -> Figures:
        settled = [j for t, j in self.samples if t - _last_change(self.w.changes, t) > self.p.settle_s]
        open_waits = [(r.pending_since, end, r.job.team, r.job.gang) for r in self.runs.values()
                      if r.phase == "waiting"]
        waits = [(b - a, team, gang, a, b) for a, b, team, gang in self.waits + open_waits]
        bound = self.bound if self.bound is not None else math.inf
        over = [w for w in waits if w[0] > bound]
        avail = self.capacity.gpus * end
        alloc = 100.0 * self.held_gpu_s / avail if end > 0 else 0.0
        useful = 100.0 * (self.held_gpu_s - self.ckpt_gpu_s - self.restore_gpu_s) / avail if end > 0 else 0.0
        assert -1e-6 <= useful <= alloc <= 100.0 + 1e-6, (useful, alloc)
        mean = lambda v: sum(v) / len(v) if v else None  # noqa: E731
        return Figures(self.s.name, self.w.seed, mean(settled), min(settled, default=None),
                       mean([j for _, j in self.samples]), len(settled),
                       max((w[0] for w in waits if w[2]), default=0.0), max((w[0] for w in waits), default=0.0),
                       len(over), sum(1 for w in over if self._below_share(w[1], w[3], w[4])), self.bound,
                       alloc, useful,
                       self.preemptions, self.lost, self.ckpt_gpu_s, self.restore_gpu_s, len(self.runs), self.done,
                       len(open_waits), self.cycles, wall_s, tuple(self.series))


    def _below_share(self, team: str, start: float, end: float) -> bool:
        """Whether ``team`` held less than :data:`BELOW_SHARE` of its fair share on average over the samples of
        ``[start, end]``: a request that waited then was not waiting for its own team's excess to drain."""
        i = self.w.teams.index(team)
        ratios = [row[i][0] / row[i][1] for t, row in self.series if start <= t <= end and row[i][1] > 1e-9]
        return bool(ratios) and sum(ratios) / len(ratios) < BELOW_SHARE


def _last_change(changes: Sequence[float], t: float) -> float:
    return max((c for c in changes if c <= t + 1e-9), default=-math.inf)


# ---- many seeds, every scheme -----------------------------------------------------------------------------
def run_one(args: tuple[Scheme, Workload, SchedulerConfig, int, FairnessParams]) -> Figures:
    scheme, workload, judge, gpus, params = args
    return Simulation(scheme, workload, judge, gpus, params).run()


#: For each figure, which way is worse across seeds (the ``worst`` block); the means cover these and the costs.
WORSE = {"fairness_index": min, "fairness_index_min_settled": min, "fairness_index_all": min,
         "max_gang_wait_s": max, "max_wait_s": max, "waits_over_bound": max, "waits_over_bound_below_share": max,
         "allocation_pct": min, "useful_pct": min, "preemptions": max, "work_lost_gpu_s": max, "jobs_done": min,
         "still_waiting": max}
MEAN = (*WORSE, "checkpoint_gpu_s", "restore_gpu_s")


def evaluate(config: SchedulerConfig, workloads: Sequence[Workload], cluster_gpus: int, *,
             params: FairnessParams = FairnessParams(), names: Sequence[str] = SCHEMES,
             workers: int = 2) -> tuple[dict[str, Any], dict[str, list[Figures]]]:
    """Every scheme on every workload (one per seed): the JSON object the CLI prints, and the figures."""
    all_schemes = schemes(config)
    jobs = [(all_schemes[n], w, config, cluster_gpus, params) for w in workloads for n in names]
    results = run_parallel(run_one, jobs, workers)
    by: dict[str, list[Figures]] = {n: [] for n in names}
    for f in results:
        by[f.scheme].append(f)
    out: dict[str, Any] = {"schemes": {}, "worst": {}, "seeds": [w.seed for w in workloads],
                           "workload": workloads[0].summary() if workloads else {}, "cluster_gpus": cluster_gpus,
                           "params": {k: getattr(params, k) for k in params.__dataclass_fields__}}
    for n, figs in by.items():
        rows = [f.to_json() for f in figs]
        out["schemes"][n] = {**{k: _mean([r[k] for r in rows]) for k in MEAN}, "per_seed": rows}
        out["worst"][n] = {k: _pick(how, [r[k] for r in rows]) for k, how in WORSE.items()}
    if "ours" in by and "flat_quota" in by:
        out["targets"] = targets(by["ours"], by["flat_quota"])
    return out, by


def load_config(path: str | Path | None = None) -> SchedulerConfig:
    """The evaluated tree (default ``configs/fairness.yaml``): refused, naming the field, unless fairness is on
    and it has teams (leaf queues besides ``default``)."""
    where = path if path is not None else datafiles.config_file("fairness.yaml")
    cfg = SchedulerConfig.load(where)
    if not cfg.fairness.enabled:
        raise ConfigError("fairness.enabled", False, "true", detail=f"{where}: ours is its tree with fairness on")
    if not teams_of(cfg):
        raise ConfigError("queues", sorted(cfg.queues), "at least one leaf queue besides default: the teams")
    return cfg


def run_evaluation(config: SchedulerConfig, pool: Sequence[PodShape], source: str, seeds: Sequence[int],
                   cluster_gpus: int, tenant: TenantParams = TenantParams(), *,
                   params: FairnessParams = FairnessParams(), names: Sequence[str] = SCHEMES,
                   workers: int = 2) -> tuple[dict[str, Any], dict[str, list[Figures]], list[Workload]]:
    """One workload per seed from ``pool``, then :func:`evaluate`; also the workloads (for the chart)."""
    for n in names:
        if n not in SCHEMES:
            raise InvalidRequestError("schemes", n, SCHEMES)
    if cluster_gpus < 1:
        raise InvalidRequestError("cluster_gpus", cluster_gpus, "at least 1")
    workloads = [generate(pool, teams_of(config), cluster_gpus, int(s), tenant, source) for s in seeds]
    out, by = evaluate(config, workloads, cluster_gpus, params=params, names=names, workers=workers)
    out["tenant_params"] = {k: getattr(tenant, k) for k in tenant.__dataclass_fields__}
    return out, by, workloads


def targets(ours: Sequence[Figures], flat: Sequence[Figures]) -> dict[str, Any]:
    """The issue's targets for ours, worst case over seeds."""
    fi = [f.fairness_index for f in ours if f.fairness_index is not None]
    gap = [o.allocation_pct - f.allocation_pct for o, f in zip(ours, flat)]
    over = sum(f.waits_over_bound for f in ours)
    starved = sum(f.waits_over_bound_below_share for f in ours)
    lost = max((f.work_lost_gpu_s for f in ours), default=0.0)
    return {"fairness_index_ge_0.95": {"worst": round(min(fi), 4) if fi else None, "met": bool(fi) and min(fi) >= 0.95},
            "waits_within_bound": {"over_bound": over, "over_bound_below_share": starved, "met": over == 0},
            "allocation_within_1pt_of_flat_quota": {"worst_gap_pts": round(min(gap), 3) if gap else None,
                                                    "met": bool(gap) and min(gap) >= -1.0},
            "work_lost_zero": {"worst_gpu_s": round(lost, 1), "met": lost == 0}}


def _mean(vals: list[Any]) -> Any:
    nums = [v for v in vals if v is not None]
    return round(sum(nums) / len(nums), 4) if nums else None


def _pick(how: Any, vals: list[Any]) -> Any:
    return how(v for v in vals if v is not None) if any(v is not None for v in vals) else None
