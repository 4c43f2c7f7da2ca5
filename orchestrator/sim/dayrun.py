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
  then replicas on the largest shares, then the newest); the warm spares the autoscaler asks for
  (:func:`~orchestrator.scheduling.autoscale.warm_spares`: processes started, no lease) make a granted
  replica serve ``warm_start_s`` after its grant instead of ``replica_start_s``. Its ``ceiling`` (the
  autoscaler's own input: "a lease that cannot be had is not asked for") is what the request's whole
  fallback chain reaches on the cards as laid out now, in order, within the quota the window in force
  gives the service's queue -- its surge cap where the quota follows demand
  (:func:`~orchestrator.scheduling.autoscale.reachable_replicas`), shared over the services; the
  scenario's loop passes none, which on 10 cards costs nothing but here would fill the queue with
  thousands of requests no layout can hold;
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

Parts: the parameters and records are in :mod:`orchestrator.sim.dayrecords`, the head's in-process port in
:mod:`orchestrator.sim.port`, the inference services' side (replicas, the scaling loop, the queue) in
:mod:`orchestrator.sim.dayinference`, the training holders' side in :mod:`orchestrator.sim.daytraining`, the
spike-absorb maths in :mod:`orchestrator.sim.absorb`. This module keeps the day's steps, its event timers, the
head's cycles, the agents' beats, the MIG windows and the figures, and re-exports the parts' public names.
"""

from __future__ import annotations

import heapq
import math
import time
from typing import Any, Mapping, Sequence

from orchestrator.control.jobs.runner import AdmissionOnlyRunner
from orchestrator.control.service import HeadService
from orchestrator.control.store import MemoryStore
from orchestrator.core.clock import DAY_S, ManualClock, parse_hhmm
from orchestrator.core.colocation import ServiceConfig
from orchestrator.core.config import ClusterConfig, RuntimeSettings
from orchestrator.core.lease import key_digest
from orchestrator.core.stats import quantile
from orchestrator.scheduling.autoscale import ScalerState
from orchestrator.sim.absorb import max_absorb, spike_absorb
from orchestrator.sim.curves import FastCurve, spikes
from orchestrator.sim.dayinference import InferenceSide
from orchestrator.sim.dayrecords import KEY, Replica, Run, SchemeLike, SimParams, Tally, share_of
from orchestrator.sim.daytraining import TrainingSide
from orchestrator.sim.port import SimPort
from orchestrator.sim.queueing import ReplicaKind

__all__ = ["KEY", "RATE_CHANGE", "DayRun", "Replica", "Run", "SchemeLike", "SimParams", "SimPort", "Tally",
           "share_of", "spike_absorb"]

#: Rate change within the next tick above which the step is the scaling loop's interval.
RATE_CHANGE = 0.02


class DayRun(InferenceSide, TrainingSide):
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
        self.warm = [0] * services  # warm spare processes ready (started, model loaded, no lease)
        self.warm_coming = [0] * services  # warm spares starting
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
            self._ceiling()  # and the scaling loop asks within them
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
        inf_busy, inf_sm, worst, live, cards = self._serve(lam, dt, count)
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

    # ---- the timers ---------------------------------------------------------------------------------
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
                self._replica_serving(self.replicas[ident], now)
            elif what == "run":
                self._run_timer(self.runs[ident], now)
            elif what == "warm":
                self._warm_ready(int(ident), item[4], now)
            else:  # "cycle": a training lease's minimum runtime has passed: it may be a victim now
                self.changed = True

    # ---- the head -----------------------------------------------------------------------------------
    def _cycle(self, now: float) -> None:
        report = self.head.cycle()
        self.tally.cycles += 1
        self.last_cycle = now
        self.changed = False
        for lid in report.granted:
            self._granted(lid, now)
        for lid in report.checkpoint_requested:
            self._checkpoint_asked(lid, now)
        for lid in report.preempted:  # stopped without (or past the grace of) a checkpoint
            self._stopped(lid, now)
        if report.reconfigured or report.reconfigure_failed:
            self._ceiling()

    def _granted(self, lid: str, now: float) -> None:
        e = self.head.ctl.ledger.get(lid)
        a = e.lease.allocation
        assert a is not None
        self.head.activate(lid, e.lease.fencing_token, holder=f"sim-{lid}", key=KEY)
        r = self.replicas.get(lid)
        if r is not None:
            self._replica_granted(r, a, now)
            return
        run = self._run_of(lid)
        if run is not None:
            self._run_granted(run, lid, a, now)

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
            "warm_starts": tl.warm_starts,
            "replica_ready_saved_s": round(tl.ready_saved_s, 1),
            "spikes": absorb,
            "absorb_max_s": max_absorb(absorb),
            "spikes_not_absorbed": sum(1 for s in absorb if s["absorb_s"] is None),
            "sim_steps": tl.steps,
            "head_cycles": tl.cycles,
            "wall_s": round(wall_s, 2),
        }

