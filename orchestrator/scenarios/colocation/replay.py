"""One scheme's replay of the co-location day on a running Ray cluster: a fresh head in its own namespace,
the training backlog, the inference service, the load; the figures of the day
(:mod:`orchestrator.scenarios.colocation` lists them).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.core.api import HeadApi
from orchestrator.core.stats import quantile
from orchestrator.rayport import ray_api
from orchestrator.scenarios.colocation.backlog import TrainingBacklog
from orchestrator.scenarios.colocation.charts import replica_cards
from orchestrator.scenarios.colocation.schemes import (
    DAY_S, MIG_TARGETS, WINDOWS, Say, Scheme, TrainingJob, load_loadgen,
)
from orchestrator.sim.perfmodel import InferenceModel, TrainingModel


@dataclass(frozen=True)
class DayConfig:
    """The day every scheme replays: its length in real seconds, the load, the backlog, the models."""

    day_s: float = 90.0
    start: str = "00:00"
    tick_s: float = 0.5
    curve: Any = None  # jobs/loadgen.RateCurve over DAY_S seconds; None = the default day (see default_curve)
    training: tuple[TrainingJob, ...] = ()
    inference: InferenceModel = InferenceModel(base_ms=100.0, per_item_ms=25.0, sm_per_item=0.04)
    trainer: TrainingModel = TrainingModel(step_s=0.1)
    seed: int = 0
    #: Half a second (an eighth of a compressed hour): routing a warm spare costs nothing, so waiting longer
    #: only lets a spike's queue grow.
    upscale_delay_s: float = 0.5
    downscale_delay_s: float = 4.0
    #: Ongoing requests per replica the autoscaler aims at (the config's, 2, at most). A compressed hour lasts
    #: 3.75 s, less than a replica takes to start here (4-5 s): a spike is over before a replica started for it
    #: serves, so ours keeps headroom instead -- on 1g slices a replica costs a seventh of a card.
    target_ongoing_per_replica: float = 1.0
    #: Replicas started and leased but not routed (``ours``): a scale-up routes them at once. Three: the 14:00
    #: spike doubles the load within a compressed quarter hour; with two, ours missed the SLO on 2 % of the
    #: day's requests there (p99 585 ms), with three none (p99 378 ms), for 3/7 of a card held idle.
    warm_spares: int = 3
    #: Warm spares by night (``ours``): the night layout has one 1g slice a MIG card, for the inference floor.
    night_warm_spares: int = 0

    @property
    def speedup(self) -> float:
        return DAY_S / self.day_s


@dataclass
class ReplayResult:
    scheme: str
    figures: dict[str, Any]
    timeline: list[dict[str, Any]]
    peak_replicas: int
    requests: list[tuple[float, float, Any]] = field(default_factory=list)  # (sent_s, latency_s, status)


def _percentile(xs: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100), as every figure is computed (:func:`orchestrator.core.stats.quantile`)."""
    return quantile(xs, q / 100)


class Replay:
    """One scheme's day on a running Ray cluster: a fresh head in its own namespace, the backlog, the service,
    the load; see the module docstring. ``fixed_replicas`` (baselines): the service's size all day."""

    def __init__(self, cluster: Any, scheme: Scheme, day: DayConfig, service: Any, address: str, workdir: Path,
                 say: Say, *, fixed_replicas: int | None = None, timeline: bool = True) -> None:
        self.base, self.scheme, self.day, self.service_cfg = cluster, scheme, day, service
        self.address, self.workdir, self.say = address, workdir, say
        self.fixed_replicas, self.keep_timeline = fixed_replicas, timeline
        self.namespace = f"rgo-colo-{scheme.name.replace('_', '-')}"
        self.timeline: list[dict[str, Any]] = []
        self._stop = threading.Event()

    # ---- the cluster, as this scheme sees it --------------------------------------------------------------
    def cluster_config(self) -> Any:
        """The demo cluster's hardware with this scheme's MIG mode, namespace and (ours) time windows."""
        from orchestrator.core.priorities import QueueConfig, SchedulerConfig

        nodes = self.base.nodes
        if self.scheme.mig == "off":
            nodes = tuple(type(n).model_validate({**n.model_dump(), "mig": {}}) for n in nodes)
        elif self.scheme.mig == "live":  # the day starts at night: the night layout on every MIG card
            nodes = tuple(self._night_layout(n) for n in nodes)
        # A 2-core machine running a day of replicas, trainers and a load generator stalls processes for
        # seconds: a longer TTL than the demo's keeps a slow agent from losing its node's leases.
        settings = self.base.settings.model_copy(update={"namespace": self.namespace,
                                                         "agent_ttl_s": max(self.base.settings.agent_ttl_s, 30.0)})
        sched = self.base.scheduler.model_dump()
        sched["queues"] = {**{k: v.model_dump() for k, v in self.base.scheduler.queues.items()},
                           "inference": QueueConfig().model_dump(), "training": QueueConfig().model_dump()}
        sched["windows"] = list(WINDOWS) if self.scheme.windows else []
        return self.base.model_copy(update={"nodes": nodes, "settings": settings,
                                            "scheduler": SchedulerConfig.parse(sched)})

    @staticmethod
    def _night_layout(node: Any) -> Any:
        from orchestrator.scheduling.repartition import validate_layout

        if not node.mig:
            return node
        slots = validate_layout(node.model, MIG_TARGETS["night"]["layout"])
        layout = [{"profile": m.profile, "start": m.start} for m in slots]
        return type(node).model_validate({**node.model_dump(), "mig": {i: layout for i in node.mig}})

    @property
    def cards(self) -> int:
        return sum(n.gpus for n in self.base.nodes)

    def service_config(self) -> Any:
        """The service's config with this scheme's request, and the autoscaler's delays in the day's scale: a
        compressed day cannot wait 30 real seconds (hours of its time) before it shrinks."""
        auto = self.service_cfg.autoscale.model_copy(update={
            "upscale_delay_s": min(self.service_cfg.autoscale.upscale_delay_s, self.day.upscale_delay_s),
            "downscale_delay_s": min(self.service_cfg.autoscale.downscale_delay_s, self.day.downscale_delay_s),
            "target_ongoing_per_replica": min(self.service_cfg.autoscale.target_ongoing_per_replica,
                                              self.day.target_ongoing_per_replica)})
        return self.service_cfg.model_copy(update={"request": self.scheme.inference_request, "autoscale": auto})

    # ---- the run ------------------------------------------------------------------------------------------
    def run(self) -> ReplayResult:
        from orchestrator.deploy import local as launcher
        from orchestrator.rayport.client import HeadClient
        from orchestrator.serve.manager import LeasedService

        lg = load_loadgen()
        cfg = self.cluster_config()
        s = cfg.settings
        self.say(f"[{self.scheme.name}] head and agents in namespace {self.namespace}")
        launcher.start_orchestrator(cfg, self.address, self.say, 180.0, expect_nodes=len(cfg.nodes))
        ray_api.connect(self.address, self.namespace)
        head = HeadClient(self.namespace, s.head_name)
        backlog = TrainingBacklog(head, self.namespace, self.workdir / self.scheme.name, self.day.training,
                                  self.day.trainer, self.say)
        svc = LeasedService(self.service_config(), head=head, namespace=self.namespace, head_name=s.head_name,
                            say=self.say, perf=self.day.inference, port=launcher.free_port(),
                            warm_spares=self.day.warm_spares if self.scheme.load_driven else 0,
                            max_starting=1 if self.scheme.load_driven else None)
        replay = None
        try:
            svc.start(self.fixed_replicas)  # a baseline's service is provisioned first, as a deployment is
            backlog.start()
            self._wait_backlog(backlog)
            self._start_day(head)
            t0 = time.monotonic()
            replay = lg.start(svc.url, self.day.curve, compress=self.day.speedup, seed=self.day.seed)
            loops = [threading.Thread(target=self._sample, args=(head, backlog, svc, t0), daemon=True,
                                      name="colocation-sample")]
            if self.scheme.load_driven:
                loops.append(threading.Thread(target=self._scale, args=(svc,), daemon=True, name="colocation-scale"))
            if self.scheme.mig == "live":
                loops.append(threading.Thread(target=self._mig_windows, args=(head, svc, t0), daemon=True,
                                              name="colocation-mig"))
            for t in loops:
                t.start()
            start_useful = (backlog.steps(), self._inference_useful(svc))
            replay.join(self.day.day_s + 60)
            wall = time.monotonic() - t0
            end_useful = (backlog.steps(), self._inference_useful(svc))
            self._stop.set()
            for t in loops:
                t.join(timeout=120)
            records = replay.records if hasattr(replay, "records") else replay.join(0)
            figures = self._figures(head, backlog, svc, records, wall, start_useful, end_useful)
            self.requests = [(round(r.sent_s, 3), round(r.latency_s, 4), r.status) for r in records]
        finally:
            self._stop.set()
            if replay is not None:
                replay.stop()
            backlog.stop()
            try:
                svc.stop()
            except Exception as e:  # the figures are taken; say what did not stop cleanly
                self.say(f"[{self.scheme.name}] service stop: {type(e).__name__}: {e}")
            self._stop_orchestrator(cfg)
            ray_api.disconnect()
        peak = max((p["replicas"] for p in self.timeline), default=self.fixed_replicas or 0)
        return ReplayResult(self.scheme.name, figures, self.timeline if self.keep_timeline else [], peak,
                            getattr(self, "requests", []))

    def _wait_backlog(self, backlog: TrainingBacklog, timeout_s: float = 240.0) -> None:
        """Until every run trains or waits in the queue (a baseline may have no room for some)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            settled = 0
            for r in backlog.runs:
                if r.attempts or r.error:
                    settled += 1
                else:
                    try:
                        st = backlog.head.get_lease(f"train-{r.job.seed}")["state"]
                    except Exception:
                        st = "unknown"
                    settled += st == "pending"
            if settled == len(backlog.runs):
                return
            time.sleep(0.5)
        raise TimeoutError(f"[{self.scheme.name}] the training backlog did not start within {timeout_s:g}s")

    def _start_day(self, head: HeadApi) -> None:
        """The head's clock starts the day now (the windows and MIG targets follow it)."""
        if self.scheme.windows and hasattr(head, "set_day_clock"):
            head.set_day_clock({"speedup": self.day.speedup, "start": self.day.start})

    def _scale(self, svc: Any) -> None:
        while not self._stop.wait(0.5):
            try:
                svc.step()
            except Exception as e:  # one failed step is reported; the next samples afresh
                self.say(f"[{self.scheme.name}] scaling step failed: {type(e).__name__}: {e}")

    def _mig_windows(self, head: HeadApi, svc: Any, t0: float) -> None:
        """At each window's start, ask the head for that window's MIG layout (it drains only what differs).
        The warm spares follow the window: by night they would hold the 1g slices the night layout merges
        back into training's 2g slice (a GPU serving inference is never drained), so there are none."""
        from orchestrator.core.clock import parse_hhmm

        starts = sorted((parse_hhmm(w["start"]), w["name"]) for w in WINDOWS)
        begin = parse_hhmm(self.day.start)
        pending: str | None = None
        done: set[float] = set()
        while not self._stop.wait(0.5):
            day_s = begin + (time.monotonic() - t0) * self.day.speedup
            for at, name in starts:
                if begin < at <= day_s and at not in done:
                    done.add(at)
                    pending = name
                    svc.warm_spares = self.day.warm_spares if name == "day" else self.day.night_warm_spares
            if pending is None:
                continue
            try:  # again every half second until the layout holds: a GPU serving inference is never drained,
                # so it waits for the service to shrink off it
                if any(r["state"] not in ("done", "failed") for r in head.status().get("repartitions", [])):
                    continue  # one relayout at a time: let the one under way finish first
                plan = head.repartition_mig(MIG_TARGETS[pending], True)["plan"]  # type: ignore[attr-defined]
                if not plan["changes"]:
                    if plan["meets_target"]:
                        pending = None
                    continue
                out = head.repartition_mig(MIG_TARGETS[pending])  # type: ignore[attr-defined]
                gpus = [f"{c['node']}/{c['gpu_index']}" for c in out["plan"]["changes"]]
                self.say(f"[{self.scheme.name}] {pending} window: MIG relayout of {', '.join(gpus)}")
            except Exception as e:  # the day goes on with the old layout; the figures say how many
                self.say(f"[{self.scheme.name}] {pending} window: no relayout yet ({type(e).__name__}: {e})")

    def _inference_useful(self, svc: Any) -> float:
        st = svc.stats()
        return float(st["useful_gpu_s"])

    def _sample(self, head: HeadApi, backlog: TrainingBacklog, svc: Any, t0: float) -> None:
        prev_t, prev_useful = time.monotonic(), (backlog.steps(), self._inference_useful(svc))
        prev_served = svc.load(reset=False)["served"]
        while not self._stop.wait(self.day.tick_s):
            try:
                now = time.monotonic()
                useful = (backlog.steps(), self._inference_useful(svc))
                gained = self.day.trainer.useful_gpu_s(useful[0] - prev_useful[0]) + (useful[1] - prev_useful[1])
                dt = max(1e-6, now - prev_t)
                util = 100.0 * gained / (self.cards * dt)
                ld = svc.load(reset=False)  # a peek: the scaling loop's averaging window is its own
                served_rps = (ld["served"] - prev_served) / dt
                prev_t, prev_useful, prev_served = now, useful, ld["served"]
                kinds: dict[str, float] = {}  # cards held by inference, by kind (a 1g slice is 1/7 of a card)
                for r in list(svc.replicas):
                    k = r.kind or "?"
                    kinds[k] = round(kinds.get(k, 0.0) + replica_cards(r), 3)
                hour = ((now - t0) * self.day.speedup / 3600.0)
                self.timeline.append({
                    "hour": round(hour, 3), "offered_rps": round(self.day.curve.rate((now - t0) * self.day.speedup), 2),
                    "served_rps": round(served_rps, 2), "replicas": len(svc.replicas), "inference_kinds": kinds,
                    "training_cards": round(sum(h["share"] for h in backlog.holding()), 3),
                    "utilization_pct": round(util, 2), "p99_ms": ld.get("p99_ms"),
                    "slo_ms": self.service_cfg.slo_p99_ms,
                })
            except Exception as e:  # a missed sample is a gap in the chart, not a failed replay
                self.say(f"[{self.scheme.name}] sample: {type(e).__name__}: {e}")

    def _figures(self, head: HeadApi, backlog: TrainingBacklog, svc: Any, records: list[Any], wall: float,
                 start: tuple[int, float], end: tuple[int, float]) -> dict[str, Any]:
        slo_s = self.service_cfg.slo_p99_ms / 1000.0
        lat = [r.latency_s for r in records if r.ok]
        within = sum(1 for r in records if r.ok and r.latency_s <= slo_s)
        steps = end[0] - start[0]
        useful = self.day.trainer.useful_gpu_s(steps) + (end[1] - start[1])
        p99 = _percentile(lat, 99)
        return {
            "scheme": self.scheme.name,
            "gpu_utilization_pct": round(100.0 * useful / (self.cards * wall), 2),
            "inference_slo_attainment_pct": round(100.0 * within / len(records), 2) if records else None,
            "p99_latency_ms": round(p99 * 1000, 1) if p99 is not None else None,
            "preemptions": backlog.preemptions(),
            "checkpoints": backlog.checkpoints(),
            "work_lost_steps": backlog.lost_steps(),
            "mig_reconfigurations": sum(1 for r in head.status().get("repartitions", []) if r["state"] == "done"),
            "training_steps_done": steps,
            "requests": len(records),
            "peak_replicas": max((p["replicas"] for p in self.timeline), default=len(svc.replicas)),
            "wall_s": round(wall, 1),
        }

    def _stop_orchestrator(self, cfg: Any) -> None:
        for n in [cfg.settings.head_name] + [ray_api.agent_name(n.name) for n in cfg.nodes]:
            try:
                ray_api.kill_named(n, self.namespace)
            except Exception as e:  # its node's raylet is gone with it
                self.say(f"[{self.scheme.name}] {n}: not killed ({type(e).__name__})")
