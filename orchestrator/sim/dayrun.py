"""One scheme's co-location day in simulated time: the real head, in process, driven by a workload model.

No Ray and no sleeping. What runs is the head's own code: a
:class:`~orchestrator.control.service.HeadService` (its controller, ledger, scheduling cycle, preemption
through the checkpoint path, time windows read from an injected :class:`~orchestrator.core.clock.ManualClock`,
the MIG repartition planner and its state machine) over :class:`~orchestrator.control.agent.AgentCore` s on
the ``simulated`` discovery backend, and the autoscaler's rules
(:func:`orchestrator.scheduling.autoscale.decide`). What is modelled stands in for the processes:

* **inference replicas** -- one lease per replica, asked with the scheme's request in the ``inference``
  class and queue; a replica serves ``replica_start_s`` after its grant (measured, see
  :class:`SimParams`); its capacity and latency come from :mod:`orchestrator.sim.queueing` on the share
  its lease holds (:class:`~orchestrator.sim.perfmodel.ShareSpeed` of the allocation);
* **the scaling loop** (load-driven schemes) -- every ``control_interval_s`` while anything moves, as
  ``LeasedService.step`` does: a :class:`~orchestrator.scheduling.autoscale.LoadSample` (serving replicas,
  time-averaged ongoing requests since the last sample, the last step's p99), ``decide``, then as many
  lease requests as the decision adds, at once (a scale-down withdraws requests still pending first,
  then the newest replicas); no warm spares. Its ``ceiling`` (the autoscaler's own input: "a lease that
  cannot be had is not asked for") is, for a MIG request, the slices of that profile the cluster's layout
  has now, shared over the services; the scenario's loop passes none, which on 10 cards costs nothing but
  here would fill the queue with thousands of requests no layout can hold;
* **training runs** -- preemptible leases (``training`` class, requeued on preemption) that train at
  their share's speed after ``resume_s`` of start-up, checkpoint every ``checkpoint_every_s`` (taking
  ``checkpoint_s``, no progress meanwhile), and, asked to checkpoint by a preemption or a MIG drain,
  write one (``checkpoint_s``) and acknowledge it through the head; a lease ended without that
  (its grace period ran out) loses the work since its last checkpoint: **steps lost** are counted from
  those checkpoints;
* **the MIG windows** (``mig: live``) -- at each window's start the scheme's MIG target for it is asked
  of the head (``repartition_mig``), again every ``tick_s`` until the layout holds, as the scenario's
  ``_mig_windows`` loop does every 0.5 s.

**Time.** The step is ``tick_s`` while nothing moves and ``control_interval_s`` (the scaling loop's
interval) while anything does: an autoscaler wish pending, a backlog, a replica starting, a checkpoint
or a relayout under way, a lease just asked for, or the load changing by more than 2 % within the next
tick. A step never crosses an event (a replica ready, a checkpoint written, a training lease past its
minimum runtime or grace period) nor a window's start. The head cycles after every step in which
something changed (a request, a release, a checkpoint, a relayout, such an event) and at least every
``idle_cycle_s`` (the real head cycles every 0.25 s; what time alone changes besides those events is the
queue's aging, which orders the queue but frees nothing); agents heartbeat when they have work (a
revocation to confirm, a layout to apply) and all of them every ``heartbeat_every_s``.

Invariants (asserted each step): the busy GPU-time of a step -- training at its share's speed while it
trains, inference replicas by their busy time from the queue model times their share -- never exceeds
``cards x dt``; so neither does the day's.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from orchestrator.control.agent import AgentCore
from orchestrator.control.discovery.simulated import SimulatedBackend
from orchestrator.control.jobs.runner import AdmissionOnlyRunner
from orchestrator.control.nodes import RayNodeInfo
from orchestrator.control.service import HeadService
from orchestrator.control.store import MemoryStore
from orchestrator.core.allocation import Allocation
from orchestrator.core.clock import DAY_S, ManualClock, parse_hhmm
from orchestrator.core.colocation import ServiceConfig
from orchestrator.core.config import ClusterConfig, RuntimeSettings, SimNode
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.lease import LeaseState, key_digest
from orchestrator.core.request import GpuRequest, ShareKind
from orchestrator.core.stats import quantile
from orchestrator.scheduling.autoscale import LoadSample, ScalerState, decide
from orchestrator.sim.curves import FastCurve, spikes
from orchestrator.sim.perfmodel import InferenceModel, ShareSpeed, TrainingModel
from orchestrator.sim.queueing import ReplicaKind, StepOut, step as queue_step

KEY = "sim-colocation-requester"
#: Rate change within the next tick above which the step is the scaling loop's interval.
RATE_CHANGE = 0.02


class SchemeLike(Protocol):
    """What the day needs of a scheme (``orchestrator.scenarios.colocation.Scheme`` is one)."""

    name: str
    inference_request: str
    load_driven: bool
    mig: str
    windows: bool


@dataclass(frozen=True)
class SimParams:
    """The workload model's parameters; each default says where it comes from."""

    #: Simulated seconds per step while nothing moves.
    tick_s: float = 10.0
    #: Measured: lease asked -> replica serving, 4.1 s (first replica) and 5.5 s (second, under a 40 req/s
    #: spike, after a training preemption) in tests/integration/test_colocation.py (docs/colocation.md). The
    #: grant itself is the head's (simulated); this is the start after it.
    replica_start_s: float = 5.5
    #: Assumption, to be replaced by the real-time runs' measurement (#36 item 3a): writing a checkpoint of a
    #: multi-GB model. The toy MLP of the real runs writes one in 4-20 ms (docs/preemption.md).
    checkpoint_s: float = 30.0
    #: Assumption: a periodic checkpoint every half hour of training.
    checkpoint_every_s: float = 1800.0
    #: Assumption: a (re)started run's start-up (process, data loader, checkpoint read) before its first step.
    resume_s: float = 60.0
    #: The load generator's client timeout: a request waiting longer fails (jobs/loadgen.py).
    timeout_s: float = 30.0
    #: As the scenario's DayConfig: a step of 0.1 s on a card; a batch of b: 100 + 25 b ms on a card.
    trainer: TrainingModel = TrainingModel(step_s=0.1)
    inference: InferenceModel = InferenceModel(base_ms=100.0, per_item_ms=25.0, sm_per_item=0.04)
    #: Stratified latency samples kept for the day's p99 (each step in proportion to its requests).
    representatives: int = 50_000
    #: The head, the backlog and the first replicas start this long before 00:00 (not measured).
    warmup_s: float = 300.0
    #: A spike is absorbed once every service's p99 is back under the SLO and stays there this long.
    settle_s: float = 30.0
    #: Every agent heartbeats this often (and at once when it has work: a revocation, a relayout).
    heartbeat_every_s: float = 1200.0
    #: The head cycles after every step that changed something (a request, a release, a checkpoint, a
    #: relayout, a training lease past its minimum runtime or its grace period) and at least this often
    #: otherwise (what time alone changes besides those is the queue's aging, which orders but frees nothing).
    idle_cycle_s: float = 3600.0


@dataclass
class Replica:
    lease_id: str
    service: int
    seq: int
    state: str = "pending"  # pending -> starting -> serving
    kind: ReplicaKind | None = None


@dataclass
class Run:
    """One training run across its lease attempts (the ``owner`` of every attempt). Work (GPU-seconds) accrues
    lazily: ``work`` is what it had at ``since``, and it trains at ``speed`` from then while ``training``."""

    owner: str
    request: str
    lease_id: str | None = None
    phase: str = "waiting"  # waiting | resuming | training | saving | checkpointing | refused
    speed: float = 0.0
    since: float = 0.0
    work: float = 0.0  # GPU-seconds trained and kept, at ``since``
    saved: float = 0.0  # GPU-seconds at the last checkpoint
    saving: float = 0.0  # what the checkpoint being written holds
    version: int = 0  # bumped on every phase change: older timers are stale
    offset: float = 0.0  # in [0, 1): where in the checkpoint interval this run's first save falls


@dataclass
class Tally:
    arrived: float = 0.0
    within: float = 0.0
    dropped: float = 0.0
    train_busy: float = 0.0
    inf_busy: float = 0.0
    inf_sm: float = 0.0
    max_sample: float = 0.0
    preemptions: int = 0
    checkpoints: int = 0
    lost_work: float = 0.0
    reps: list[float] = field(default_factory=list)
    p99s: list[tuple[float, float | None]] = field(default_factory=list)  # (step end, worst service p99 s)
    peak_replicas: int = 0
    peak_replica_cards: float = 0.0
    steps: int = 0
    cycles: int = 0


class SimPort:
    """The head's :class:`~orchestrator.control.service.ClusterPort`: every node alive, every holder alive,
    an :class:`AgentCore` per node on the simulated backend."""

    def __init__(self, config: ClusterConfig, settings: RuntimeSettings) -> None:
        self.settings = settings
        self.alive = [RayNodeInfo(f"{i:056x}", n.name) for i, n in enumerate(config.nodes)]
        self.agents: dict[str, AgentCore] = {}

    def alive_nodes(self) -> list[RayNodeInfo]:
        return self.alive

    def holders_alive(self, holders: Sequence[str]) -> Mapping[str, bool]:
        return dict.fromkeys(holders, True)

    def start_agent(self, node_name: str, ray_node_id: str, sim_node: SimNode | None, agent_key: str) -> None:
        self.agents[node_name] = AgentCore(node_name, ray_node_id, SimulatedBackend(sim_node, node_name=node_name),
                                           self.settings)


def share_of(a: Allocation) -> ShareSpeed:
    """The share an allocation gives its holder (what ``ShareSpeed.of_env`` reads from its hand-out)."""
    if a.kind is ShareKind.MIG:
        return ShareSpeed.mig(a.mig_profile or "")
    if a.kind is ShareKind.MPS:
        return ShareSpeed.mps(int(a.sm_percent or 100))
    if a.kind is ShareKind.TIMESLICE:
        return ShareSpeed.timeslice(max(1, min(1000, int(a.milli))))
    return ShareSpeed.whole(max(1, len(a.gpu_indices)))


class DayRun:
    """One scheme's day; :meth:`run` returns its figures. ``fixed`` (baselines): replicas per service all day."""

    def __init__(self, cluster: ClusterConfig, scheme: SchemeLike, service: ServiceConfig, services: int,
                 curve: Any, params: SimParams, *, training: Sequence[str], mig_targets: Mapping[str, Any],
                 control_s: float, fixed: int | None = None) -> None:
        self.scheme, self.cfg, self.services, self.p = scheme, service, services, params
        self.curve, self.fixed, self.control_s = FastCurve(curve), fixed, control_s
        self.mig_targets = mig_targets
        self.cards = sum(n.gpus for n in cluster.nodes)
        self.clock = ManualClock(t=1_000_000.0, time_of_day_s=DAY_S - params.warmup_s)
        self.settings = RuntimeSettings(namespace="rgo-sim", heartbeat_interval_s=60.0, agent_ttl_s=3600.0,
                                        reconcile_interval_s=1.0, ended_retention_s=60.0,
                                        metrics_gauges_every_s=60.0)
        self.port = SimPort(cluster, self.settings)
        self.head = HeadService(self.settings, cluster, MemoryStore(), AdmissionOnlyRunner(), self.port,
                                clock=self.clock.monotonic, status_poll_s=60.0, day_clock=self.clock)
        _, training_class = cluster.scheduler.priority_class("training")
        self.min_runtime_s, self.grace_s = training_class.min_runtime_s, training_class.grace_period_s
        self.digest = key_digest(KEY)
        self.replicas: dict[str, Replica] = {}
        self.mine: list[dict[str, Replica]] = [{} for _ in range(services)]
        self.serving: list[dict[ReplicaKind, int]] = [{} for _ in range(services)]
        self.starting = 0
        self.replica_timeline: list[tuple[float, int]] = []  # (monotonic, replicas serving) at every change
        self.n_serving = 0
        self.runs = {f"train-{i}": Run(f"train-{i}", r, offset=(i * 0.618034) % 1.0) for i, r in enumerate(training)}
        self.train_speed = 0.0  # the summed speed of the runs training now
        self.timers: list[tuple[float, int, str, str, int]] = []  # (at, seq, what, id, version): a heap
        self.scalers = [ScalerState() for _ in range(services)]
        self.backlog = [0.0] * services
        self.ongoing = [0.0] * services  # integral of ongoing requests since the last sample
        self.last_p99: list[float | None] = [None] * services
        self.last_sample = -math.inf
        self.seq = 0
        self.changed = True  # a call since the last cycle may have made the queue schedulable
        self.last_cycle = -math.inf
        self.to_beat: set[str] = set()
        self.last_all_beat = -math.inf
        self.window_starts = sorted((parse_hhmm(w.start), w.name) for w in cluster.scheduler.windows)
        self.mig_pending: str | None = None
        self.mig_tried = -math.inf
        self.ceiling: int | None = None
        self.relaying = False  # a relayout asked for has GPUs still under way
        self.applying: set[str] = set()  # nodes whose agent must apply a new layout now
        self.tally = Tally()
        self.per_rep = max(1e-9, self.curve.integral() / max(1, params.representatives))
        self.rep_acc = 0.0

    # ---- the day -----------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        started = time.perf_counter()
        self._bring_up()
        n = self.fixed if self.fixed is not None else self.cfg.autoscale.min_replicas
        for svc in range(self.services):
            self._add(svc, n)
        for run in self.runs.values():
            self._request_training(run)
        t = -self.p.warmup_s
        while t < -1e-9:  # warm-up: no load, nothing counted
            t = self._advance(t, min(self.p.tick_s, -t), count=False)
        t = 0.0
        while t < DAY_S - 1e-9:
            t = self._advance(t, self._next_dt(t), count=True)
        now = self.clock.monotonic()
        for run in self.runs.values():
            self._accrue(run, now)
        return self._figures(time.perf_counter() - started)

    def _bring_up(self) -> None:
        self.head.cycle()  # the head asks for an agent on every node
        for core in self.port.agents.values():
            ack = self.head.register_agent(**core.registration())
            core.apply_assignments(ack["assignments"], ack.get("revocations"))
        self.head.cycle()
        self._ceiling()

    def _next_dt(self, t: float) -> float:
        dt = min(self.p.tick_s, DAY_S - t)
        lo, hi = self.curve.span(t, t + dt)
        moving = (hi - lo) > RATE_CHANGE * max(hi, 1e-9) or self.starting > 0 or self.changed or any(
            b > 0 for b in self.backlog) or any(s.wish for s in self.scalers) or self.mig_pending is not None or self.relaying
        if moving:
            dt = min(dt, self.control_s)
        nxt = self._next_timer()
        tod = self.clock.time_of_day_s()
        for at, _ in self.window_starts:
            ahead = (at - tod) % DAY_S
            if ahead > 1e-6:
                nxt = min(nxt, t + ahead)
        return max(1e-3, min(dt, nxt - t))

    def _advance(self, t: float, dt: float, *, count: bool) -> float:
        """The workload over ``[t, t + dt]``, then the clock, the holders, the loop and the head at ``t + dt``."""
        self._work(t, dt, count)
        now = self.clock.advance(dt)
        self._fire(now)
        tod = self.clock.time_of_day_s()
        if any(abs(tod - at) < 1e-6 for at, _ in self.window_starts):
            self.changed = True  # a window starts: the head schedules with its quotas at once
        if self.scheme.load_driven and now - self.last_sample >= self.control_s - 1e-9:
            self._scale(now)
        if self.scheme.mig == "live":
            self._mig_windows(now)
        self._beat(now)
        if self.changed or now - self.last_cycle >= self.p.idle_cycle_s - 1e-9:
            self._cycle(now)
        if self.relaying:  # read once a step: the head's list of repartitions grows with every GPU relaid
            self.relaying = bool(self.head.ctl.repartitions.live())
            self.applying = set(self.head.ctl.repartitions.agent_work())
        return t + dt

    # ---- the workload -------------------------------------------------------------------------------
    def _work(self, t: float, dt: float, count: bool) -> None:
        lam = self.curve.mean(t, t + dt) / self.services if count else 0.0
        inf_busy = inf_sm = 0.0
        worst: float | None = None
        live = cards = 0.0
        for svc in range(self.services):
            kinds = self.serving[svc]
            c = sum(kinds.values())
            kind = max(kinds, key=kinds.__getitem__) if kinds else None  # one kind a service in these schemes
            if kind is None:
                out = StepOut(arrived=lam * dt, dropped=lam * dt)
            else:
                out = queue_step(kind, c, lam, dt, self.backlog[svc], self.p.timeout_s)
                inf_busy += out.busy_replica_s * kind.card_share
                live += c
                cards += c * kind.card_share
            self.backlog[svc] = out.backlog
            self.ongoing[svc] += out.ongoing_s
            p99 = out.quantile(0.99)
            self.last_p99[svc] = p99
            inf_sm += out.sm_s
            if count:
                self._count_requests(out)
                if out.dropped > 0:
                    p99 = math.inf  # requests failed: the service is not absorbing its load
                if p99 is not None:
                    worst = p99 if worst is None else max(worst, p99)
        train_busy = self.train_speed * dt
        busy = train_busy + inf_busy
        assert busy <= self.cards * dt * (1 + 1e-9), f"busy {busy} GPU-s > {self.cards} cards x {dt} s"
        if not count:
            return
        tl = self.tally
        tl.train_busy += train_busy
        tl.inf_busy += inf_busy
        tl.inf_sm += inf_sm
        tl.max_sample = max(tl.max_sample, busy / (self.cards * dt))
        tl.p99s.append((t + dt, worst))
        tl.steps += 1
        tl.peak_replicas = max(tl.peak_replicas, int(live))
        tl.peak_replica_cards = max(tl.peak_replica_cards, cards)

    def _count_requests(self, out: StepOut) -> None:
        slo_s = self.cfg.slo_p99_ms / 1000.0
        tl = self.tally
        tl.arrived += out.arrived
        tl.dropped += out.dropped
        tl.within += out.within(slo_s)
        for g in out.segments:
            self.rep_acc += g.answered / self.per_rep
            m = int(self.rep_acc)
            self.rep_acc -= m
            tl.reps.extend(g.quantile((j + 0.5) / m) for j in range(m))

    # ---- holders ------------------------------------------------------------------------------------
    def _timer(self, at: float, what: str, ident: str, version: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.timers, (at, self.seq, what, ident, version))

    def _next_timer(self) -> float:
        while self.timers and not self._live_timer(self.timers[0]):
            heapq.heappop(self.timers)
        return self.timers[0][0] if self.timers else math.inf

    def _live_timer(self, item: tuple[float, int, str, str, int]) -> bool:
        _, _, what, ident, version = item
        if what == "replica":
            r = self.replicas.get(ident)
            return r is not None and r.state == "starting"
        if what == "run":
            return self.runs[ident].version == version
        return True

    def _fire(self, now: float) -> None:
        while self.timers and self.timers[0][0] <= now + 1e-9:
            item = heapq.heappop(self.timers)
            if not self._live_timer(item):
                continue
            _, _, what, ident, _ = item
            if what == "replica":
                r = self.replicas[ident]
                r.state = "serving"
                self.starting -= 1
                assert r.kind is not None
                self.serving[r.service][r.kind] = self.serving[r.service].get(r.kind, 0) + 1
                self.n_serving += 1
                self.replica_timeline.append((now, self.n_serving))
            elif what == "run":
                self._run_timer(self.runs[ident], now)
            else:  # "cycle": a training lease's minimum runtime has passed: it may be a victim now
                self.changed = True

    def _run_timer(self, run: Run, now: float) -> None:
        if run.phase == "resuming":  # the first periodic checkpoint is staggered: runs never save all at once
            self._phase(run, "training", now)
            self._timer(now + self.p.checkpoint_every_s * (1 + run.offset), "run", run.owner, run.version)
        elif run.phase == "saving":
            run.saved = run.saving
            self._phase(run, "training", now)
            self._timer(now + self.p.checkpoint_every_s, "run", run.owner, run.version)
        elif run.phase == "training":  # a periodic checkpoint
            self._phase(run, "saving", now)
            run.saving = run.work
            self._timer(now + self.p.checkpoint_s, "run", run.owner, run.version)
        elif run.phase == "checkpointing" and run.lease_id:
            run.saved = run.saving
            e = self.head.ctl.ledger.get(run.lease_id)
            if e.lease.state is LeaseState.CHECKPOINTING:
                self.head.ack_preemption(run.lease_id, e.lease.fencing_token, f"/ckpt/{run.owner}/{run.saved:.0f}",
                                         key=KEY)
                self.tally.checkpoints += 1
                self._ended(run, e, now)

    def _accrue(self, run: Run, now: float) -> None:
        if run.phase == "training":
            run.work += run.speed * (now - run.since)
        run.since = now

    def _phase(self, run: Run, phase: str, now: float) -> None:
        """Move ``run`` to ``phase`` at ``now``: its work brought up to date, the summed speed kept, timers voided."""
        self._accrue(run, now)
        if run.phase == "training":
            self.train_speed -= run.speed
        if phase == "training":
            self.train_speed += run.speed
        run.phase = phase
        run.version += 1

    def _ended(self, run: Run, e: Any, now: float) -> None:
        """The run's lease ended: its node confirms the stop at its next beat; the run waits for its next attempt."""
        if e.lease.allocation is not None:
            self.to_beat.add(e.lease.allocation.node_name)
        self._phase(run, "waiting", now)
        run.lease_id, run.speed = None, 0.0
        self.changed = True

    def _request_training(self, run: Run) -> None:
        try:
            self.head.request_lease({"lease_id": run.owner, "request": run.request, "owner": run.owner,
                                     "priority_class": "training", "queue": "training",
                                     "requester_digest": self.digest, "requeue_on_preempt": True,
                                     "checkpoint_dir": f"/ckpt/{run.owner}"})
        except InvalidRequestError:  # no card of this scheme's cluster could ever hold it: refused at admission
            run.phase = "refused"
        self.changed = True

    def _add(self, svc: int, n: int) -> None:
        for _ in range(n):
            self.seq += 1
            lid = f"svc{svc}-r{self.seq}"
            self.head.request_lease({"lease_id": lid, "request": self.scheme.inference_request, "owner": f"svc{svc}",
                                     "priority_class": self.cfg.priority_class, "queue": self.cfg.queue,
                                     "requester_digest": self.digest})
            self.replicas[lid] = self.mine[svc][lid] = Replica(lid, svc, self.seq)
        self.changed = self.changed or n > 0

    def _remove(self, svc: int, n: int) -> None:
        """Withdraw pending requests first, then the replicas starting, then the newest serving."""
        order = {"pending": 0, "starting": 1, "serving": 2}
        for r in sorted(self.mine[svc].values(), key=lambda r: (order[r.state], -r.seq))[:n]:
            e = self.head.ctl.ledger.get(r.lease_id)
            token = None if e.lease.state is LeaseState.PENDING else e.lease.fencing_token
            self.head.release(r.lease_id, token, "the autoscaler removed the replica", key=KEY)
            if r.state == "serving":
                assert r.kind is not None
                self.serving[svc][r.kind] -= 1
                if not self.serving[svc][r.kind]:
                    del self.serving[svc][r.kind]
                self.n_serving -= 1
                self.replica_timeline.append((self.clock.monotonic(), self.n_serving))
            elif r.state == "starting":
                self.starting -= 1
            del self.replicas[r.lease_id], self.mine[svc][r.lease_id]
        self.changed = True

    def _scale(self, now: float) -> None:
        span = max(1e-9, now - self.last_sample) if self.last_sample > -math.inf else 1.0
        ceiling = None if self.ceiling is None else math.ceil(self.ceiling / self.services)
        for svc in range(self.services):
            have = len(self.mine[svc])
            p99 = self.last_p99[svc]
            sample = LoadSample(now, sum(self.serving[svc].values()), self.ongoing[svc] / span,
                                None if p99 is None else 1000.0 * p99)
            d = decide(self.cfg.autoscale, self.scalers[svc], sample, ceiling=ceiling)
            self.scalers[svc] = d.state
            if d.replicas > have:
                self._add(svc, d.replicas - have)
            elif d.replicas < have:
                self._remove(svc, have - d.replicas)
            self.ongoing[svc] = 0.0
        self.last_sample = now

    def _ceiling(self) -> None:
        """How many replicas of the service's request the cluster's layout holds now (None: not a MIG slice):
        the scaling loop's ceiling, so it never asks for replicas that cannot exist."""
        req = GpuRequest.parse(self.scheme.inference_request)
        if req.kind is not ShareKind.MIG:
            return
        self.ceiling = sum(1 for r in self.head.ctl.nodes.registered() for g in r.inventory.gpus
                           for d in g.mig_devices if d.profile == req.profile)

    # ---- the head -----------------------------------------------------------------------------------
    def _cycle(self, now: float) -> None:
        report = self.head.cycle()
        self.tally.cycles += 1
        self.last_cycle = now
        self.changed = False
        for lid in report.granted:
            self._granted(lid, now)
        for lid in report.checkpoint_requested:
            run = self._run_of(lid)
            if run is not None and run.lease_id == lid:
                self.tally.preemptions += 1
                self._phase(run, "checkpointing", now)
                run.saving = max(run.work, run.saved)
                # nothing new since the last checkpoint: acknowledged at once, nothing to write
                self._timer(now + (self.p.checkpoint_s if run.work > run.saved else 0.0), "run", run.owner,
                            run.version)
                self._timer(now + self.grace_s + 1e-3, "cycle", lid)  # past it, the head stops the run
        for lid in report.preempted:  # stopped without (or past the grace of) a checkpoint
            run = self._run_of(lid)
            if run is not None and run.lease_id == lid:
                if run.phase != "checkpointing":
                    self.tally.preemptions += 1
                self._accrue(run, now)
                self.tally.lost_work += run.work - run.saved
                run.work = run.saved
                self._ended(run, self.head.ctl.ledger.get(lid), now)
        if report.reconfigured or report.reconfigure_failed:
            self._ceiling()

    def _run_of(self, lid: str) -> Run | None:
        e = self.head.ctl.ledger.find(lid)
        return self.runs.get(e.spec.owner or "") if e is not None else None

    def _granted(self, lid: str, now: float) -> None:
        e = self.head.ctl.ledger.get(lid)
        a = e.lease.allocation
        assert a is not None
        self.head.activate(lid, e.lease.fencing_token, holder=f"sim-{lid}", key=KEY)
        r = self.replicas.get(lid)
        if r is not None:
            r.state, r.kind = "starting", ReplicaKind(share_of(a), self.p.inference, self.cfg.max_batch_size)
            self.starting += 1
            self._timer(now + self.p.replica_start_s, "replica", lid)
            return
        run = self._run_of(lid)
        if run is not None:
            run.lease_id, run.speed = lid, share_of(a).speed
            self._phase(run, "resuming", now)
            self._timer(now + self.p.resume_s, "run", run.owner, run.version)
            self._timer(now + self.min_runtime_s + 1e-3, "cycle", lid)

    def _beat(self, now: float) -> None:
        nodes = set(self.to_beat)
        nodes.update(self.applying)
        if now - self.last_all_beat >= self.p.heartbeat_every_s:
            nodes = set(self.port.agents)
            self.last_all_beat = now
        self.to_beat.clear()
        for name in sorted(nodes):
            core = self.port.agents[name]
            reply = self.head.heartbeat(**core.heartbeat_payload())
            core.apply_assignments(reply.get("assignments", {}), reply.get("revocations"), reply.get("reconfigure"))
            if reply.get("revocations"):
                self.to_beat.add(name)  # confirmed at the next beat
            changed = core.poll_health(0.0)
            if changed is not None:
                self.head.update_inventory(core.node_name, core.incarnation, changed.model_dump(mode="json"))
                self.changed = True
            if reply.get("reconfigure") or reply.get("revocations"):
                self.changed = True

    def _mig_windows(self, now: float) -> None:
        """At each window's start, that window's MIG target; again every tick until it holds."""
        tod = self.clock.time_of_day_s()
        for at, name in self.window_starts:
            if abs(tod - at) < 1e-6 and self.mig_pending != name and name in self.mig_targets:
                self.mig_pending, self.mig_tried = name, -math.inf
        if self.mig_pending is None or now - self.mig_tried < self.p.tick_s - 1e-9:
            return
        self.mig_tried = now
        if self.relaying:
            return  # one relayout at a time
        target = self.mig_targets[self.mig_pending]
        plan = self.head.repartition_mig(target, True)["plan"]
        if not plan["changes"]:
            if plan["meets_target"]:
                self.mig_pending = None
            return
        self.head.repartition_mig(target)
        self.changed = self.relaying = True

    # ---- the figures --------------------------------------------------------------------------------
    def _figures(self, wall_s: float) -> dict[str, Any]:
        tl = self.tally
        avail = self.cards * DAY_S
        util = (tl.train_busy + tl.inf_busy) / avail
        assert util <= 1 + 1e-9, util
        p99 = quantile(tl.reps, 0.99)
        step_s = self.p.trainer.step_s
        absorb = spike_absorb(tl.p99s, spikes(self.curve.curve), self.cfg.slo_p99_ms / 1000.0, self.p.settle_s)
        done = sum(1 for r in self.head.ctl.repartitions.to_json() if r.get("state") == "done")
        return {
            "scheme": self.scheme.name,
            "utilisation_pct": round(100 * util, 2),
            "sm_utilisation_pct": round(100 * (tl.train_busy + tl.inf_sm) / avail, 2),
            "training_pct": round(100 * tl.train_busy / avail, 2),
            "inference_busy_pct": round(100 * tl.inf_busy / avail, 2),
            "max_sample_utilisation_pct": round(100 * tl.max_sample, 2),
            "slo_attainment_pct": round(100 * tl.within / tl.arrived, 3) if tl.arrived else None,
            "p99_latency_ms": round(1000 * p99, 1) if p99 is not None else None,
            "requests": round(tl.arrived),
            "failed_requests": round(tl.dropped),
            "peak_replicas": tl.peak_replicas,
            "peak_replica_cards": round(tl.peak_replica_cards, 2),
            "preemptions": tl.preemptions,
            "checkpoints": tl.checkpoints,
            "steps_lost": round(tl.lost_work / step_s),
            "training_steps": round(sum(r.work for r in self.runs.values()) / step_s),
            "training_runs_refused": sum(1 for r in self.runs.values() if r.phase == "refused"),
            "mig_reconfigurations": done,
            "spikes": absorb,
            "absorb_max_s": _max_absorb(absorb),
            "spikes_not_absorbed": sum(1 for s in absorb if s["absorb_s"] is None),
            "sim_steps": tl.steps,
            "head_cycles": tl.cycles,
            "wall_s": round(wall_s, 2),
        }


def spike_absorb(p99s: Sequence[tuple[float, float | None]], starts: Sequence[float], slo_s: float,
                 settle_s: float) -> list[dict[str, Any]]:
    """For each spike start, seconds until the worst service's p99 is back under ``slo_s`` and stays there for
    ``settle_s`` (0 when it never went over; None when it never came back within the day). ``p99s`` is
    ``(step end, p99)`` per step; a step with no answered request does not break a settled stretch."""
    out = []
    for s in starts:
        over_seen = False
        ok_since: float | None = None
        absorbed: float | None = None
        prev_end = s
        for end, p99 in p99s:
            if end <= s:
                continue
            over = p99 is not None and p99 > slo_s
            if over:
                over_seen, ok_since = True, None
            elif ok_since is None:
                ok_since = prev_end
            prev_end = end
            if ok_since is not None and end - ok_since >= settle_s:
                absorbed = (ok_since - s) if over_seen else 0.0
                break
        out.append({"at_s": round(s, 1), "absorb_s": None if absorbed is None else round(absorbed, 1)})
    return out


def _max_absorb(absorb: Sequence[Mapping[str, Any]]) -> float | None:
    vals = [a["absorb_s"] for a in absorb if a["absorb_s"] is not None]
    return max(vals) if vals else None
