"""The co-location day (``orchestrator demo --scenario colocation``): inference by day, training by night.

One compressed 24 h on the demo cluster's hardware, replayed once per
*scheme* in the same invocation, each on a fresh head and fresh agents of the
same Ray cluster (so nothing of one replay's ledger, MIG layout or actors is
left for the next):

* ``ours`` -- the inference service asks for 1g MIG slices (hard isolation;
  never a whole card for a 10 GB model: the day's relayout makes the slices it
  needs) and the orchestrator scales it with its load
  (:mod:`orchestrator.scheduling.autoscale`, with hysteresis); its leases
  preempt training through the checkpoint path and give the cards back when
  the load falls; the time windows of the config move the queues' quotas at
  08:00 and 22:00, and the MIG cards are repartitioned for the window (small
  slices by day, big ones by night), draining only the leases on the cards
  being changed;
* the **baselines**, as those schemes are deployed today -- the service
  provisioned for its peak (the most replicas ``ours`` needed in the same
  run) all day, no load-driven preemption, no windows, no repartitioning:
  ``whole_card`` (a whole card per replica, MIG off), ``static_mig`` (1g
  slices of the administrator's fixed layout), ``timeslice`` (a quarter-card
  time-slice per replica, MIG off).

The training backlog is the same in every replay: lease-holding
:class:`TrainingActor` runs (``jobs/train.py``, ``requeue=True``) that train
for the whole day, paced at the workload model's speed on the share they
hold (:mod:`orchestrator.sim.perfmodel`); a preempted run checkpoints, waits
in the queue and resumes from its checkpoint.

Figures per replay: ``gpu_utilization_pct`` (useful GPU-time -- training
steps and inference batches valued by the workload model -- over
``cards × wall``, over the day), ``inference_slo_attainment_pct`` (requests
answered within the SLO, failures counted as misses), ``p99_latency_ms``,
``preemptions`` and ``checkpoints`` (training leases preempted; checkpoints
acknowledged), ``work_lost_steps`` (steps trained past a run's last
checkpoint and so trained again), ``mig_reconfigurations``,
``training_steps_done``. ``timeline`` (opt-in) holds one sample per tick for
the chart of the day.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from orchestrator.core import datafiles
from orchestrator.core.api import HeadApi
from orchestrator.core.stats import quantile
from orchestrator.core.errors import LeaseTimeoutError
from orchestrator.core.request import GpuRequest
from orchestrator.rayport import ray_api
from orchestrator.scenarios.actors import load_example, load_train
from orchestrator.sdk.leases import LeaseHandle, lease
from orchestrator.sim.perfmodel import InferenceModel, ShareSpeed, TrainingModel

LOADGEN = datafiles.job_script("loadgen.py")
DAY_S = 86_400.0
OPEN_ENDED = 10**9

Say = Callable[[str], None]


def load_loadgen() -> Any:
    """``jobs/loadgen.py`` as a module (an example, not part of the package)."""
    return load_example(LOADGEN, "rgo_example_loadgen")


@dataclass(frozen=True)
class TrainingJob:
    """One training run of the backlog: its seed (data and weights) and its request (a ``--gpu`` string)."""

    seed: int
    request: str


@dataclass(frozen=True)
class Scheme:
    """How one replay shares the cards; see the module docstring."""

    name: str
    label: str
    inference_request: str
    load_driven: bool
    mig: str  # "live" (repartitioned by window), "static" (the config's layout), "off"
    windows: bool


SCHEMES: dict[str, Scheme] = {
    "ours": Scheme("ours", "ours (load-driven, live MIG)", "mig:1g.10gb", True, "live", True),
    "whole_card": Scheme("whole_card", "whole cards", "1", False, "off", False),
    "static_mig": Scheme("static_mig", "static MIG", "mig:1g.10gb", False, "static", False),
    "timeslice": Scheme("timeslice", "time-slicing", "timeslice:0.25", False, "off", False),
}


@dataclass
class _Attempt:
    lease_id: str
    kind: str
    card_share: float
    step_time_s: float
    resumed_at: int
    pid: int
    last_step: int
    started_at: float


@dataclass
class _Run:
    job: TrainingJob
    attempts: list[_Attempt] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)  # the step each preemption's checkpoint holds
    waiting_since: float | None = None
    error: str | None = None
    lease: LeaseHandle | None = None


class TrainingBacklog:
    """Training runs that hold leases for the whole replay and resume from their checkpoints after preemption."""

    def __init__(self, head: HeadApi, namespace: str, workdir: Path, jobs: tuple[TrainingJob, ...],
                 model: TrainingModel, say: Say) -> None:
        self.head, self.namespace, self.workdir, self.model, self.say = head, namespace, workdir, model, say
        self.train = load_train()
        self.cls = ray_api.remote_class(self.train.TrainingActor, by_value=self.train)
        self.runs = [_Run(j) for j in jobs]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self, settle_s: float = 60.0) -> None:
        """Ask for the runs' leases one after another, in the order given (the biggest first, so the cluster
        fills as planned rather than as the threads race); each run's actor starts on its own thread."""
        for run in self.runs:
            t = threading.Thread(target=self._train, args=(run,), name=f"train-{run.job.seed}", daemon=True)
            t.start()
            self._threads.append(t)
            deadline = time.monotonic() + settle_s
            while time.monotonic() < deadline and not run.error and run.lease is None:
                try:
                    if self.head.get_lease(f"train-{run.job.seed}")["state"] in ("pending", "granted", "active"):
                        break
                except Exception:
                    pass  # not requested yet
                time.sleep(0.05)

    def steps(self) -> int:
        """Steps trained so far, across attempts, not counting steps trained again after a resume."""
        with self._lock:
            return sum(self._run_steps(r) for r in self.runs)

    @staticmethod
    def _run_steps(r: _Run) -> int:
        if not r.attempts:
            return 0
        return r.attempts[-1].last_step  # every resume starts from a checkpoint: the last step is the progress

    def lost_steps(self) -> int:
        """Steps trained past the checkpoint a run resumed from (work done twice)."""
        lost = 0
        with self._lock:
            for r in self.runs:
                for prev, nxt in zip(r.attempts, r.attempts[1:]):
                    lost += max(0, prev.last_step - nxt.resumed_at)
        return lost

    def preemptions(self) -> int:
        """Attempts that ended before the replay did: each was preempted (or drained) and resumed, or waits."""
        with self._lock:
            return sum(len(r.attempts) - 1 + (r.waiting_since is not None) for r in self.runs if r.attempts)

    def checkpoints(self) -> int:
        with self._lock:
            return sum(len(r.checkpoints) for r in self.runs)

    def holding(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"seed": r.job.seed, "kind": r.attempts[-1].kind, "share": r.attempts[-1].card_share}
                    for r in self.runs if r.attempts and r.lease is not None and r.waiting_since is None]

    def _train(self, run: _Run) -> None:
        """Lease sessions, one after another: a session ends when the replay stops, or when its lease is
        lost (its node's agent fell silent past the TTL on a starved machine): the run then asks afresh and
        resumes from its last checkpoint, and what it trained since counts as lost."""
        ck = self.workdir / f"train-{run.job.seed}"
        resume_from: str | None = None
        for session in range(1, 100):
            lid = f"train-{run.job.seed}" if session == 1 else f"train-{run.job.seed}.s{session}"
            try:
                with lease(run.job.request, priority="training", queue="training", requeue=True,
                           checkpoint_dir=str(ck), head=self.head, namespace=self.namespace,
                           owner=f"colocation:train-{run.job.seed}", lease_id=lid, timeout=DAY_S) as first:
                    self._session(run, first, resume_from)
                    return
            except Exception as e:
                if self._stop.is_set():
                    return
                if "lost" not in str(e):  # reported in the figures; the replay goes on
                    run.error = f"{type(e).__name__}: {e}"
                    self.say(f"train-{run.job.seed}: {run.error}")
                    return
                last = ck / "checkpoint.pt"
                resume_from = str(last) if last.exists() else None
                self.say(f"train-{run.job.seed}: lease lost ({e}); asking again, to resume from "
                         f"{'its last checkpoint' if resume_from else 'scratch'}")

    def _session(self, run: _Run, first: LeaseHandle, resume_from: str | None) -> None:
        gone = ray_api.actor_gone_errors()
        le: LeaseHandle | None = first
        while le is not None and not self._stop.is_set():
            run.lease, run.waiting_since = le, None
            share = ShareSpeed.of_env(le.env)
            step_time = self.model.step_time_s(share)
            actor = self.cls.options(**le.actor_options(max_concurrency=4, num_cpus=0)).remote(
                OPEN_ENDED, seed=run.job.seed, resume_from=resume_from, step_delay_s=step_time, paced=True)
            st = ray_api.get(actor.status.remote(), timeout=180)
            att = _Attempt(le.lease_id, share.kind, share.card_share, step_time, st["resumed_at"], st["pid"],
                           st["step"], time.monotonic())
            with self._lock:
                run.attempts.append(att)
            self.say(f"train-{run.job.seed}: {le.lease_id} on {share.kind} ({share.card_share:.2f} card) "
                     f"from step {att.resumed_at}, {step_time * 1000:.0f} ms/step")
            while not self._stop.wait(0.5):  # 7 runs polled: keep the driver's calls off the serving path's CPU
                try:
                    st = ray_api.get(actor.status.remote(), timeout=10)
                except gone:
                    break  # stopped by its agent: after its checkpoint, at its deadline, or its lease lost
                with self._lock:
                    att.last_step = st["step"]
            if self._stop.is_set():
                try:
                    att.last_step = ray_api.get(actor.status.remote(), timeout=10)["step"]
                except Exception:
                    pass  # the replay is over; the last step seen stands
                ray_api.kill(actor)
                return
            run.waiting_since, run.lease = time.monotonic(), None
            path = le.refresh().get("checkpoint_path")
            meta = Path(str(path) + ".meta.json") if path else None
            if meta is not None and meta.exists():
                step = json.loads(meta.read_text())["step"]
                with self._lock:
                    att.last_step = max(att.last_step, step)
                    run.checkpoints.append(step)
            le = self._wait_resumed(le)
            resume_from = le.resume_from if le is not None else None

    def _wait_resumed(self, le: LeaseHandle) -> LeaseHandle | None:
        while not self._stop.is_set():
            try:
                return le.wait_resumed(2.0)
            except LeaseTimeoutError:
                continue  # still queued (the day's window, or no room yet): ask again, or stop
        return None

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)


# ---- the chart of the day ---------------------------------------------------------------------------
def replica_cards(replica: Any) -> float:
    """The cards one leased replica holds (its share's ``card_share``: a 1g slice 1/7, a quarter time-slice
    0.25); one card when its hand-out is unknown."""
    return float(getattr(replica, "card_share", 1.0))


def rolling_mean(values: list[Any], n: int) -> list[float | None]:
    """The mean of each value and the ``n - 1`` before it (None values skipped): a tick's useful GPU-time
    arrives in whole steps, so one tick reads above 100 % and the next below; the chart shows the trend."""
    out: list[float | None] = []
    for i in range(len(values)):
        window = [v for v in values[max(0, i - n + 1): i + 1] if v is not None]
        out.append(round(sum(window) / len(window), 2) if window else None)
    return out


def day_charts(timeline: list[dict[str, Any]], label: str) -> list[Any]:
    """Chart specs of one replay's day: load, leases by kind, utilisation, p99 latency (x: hour of the day)."""
    from orchestrator.dashboard.report import ChartSpec, Series

    hours = [p["hour"] for p in timeline]
    kinds = sorted({k for p in timeline for k in p.get("inference_kinds", {})})

    def s(key: str, name: str) -> Series:
        return Series(name, hours, [p.get(key) for p in timeline])

    x = "hour of the (compressed) day"
    return [
        ChartSpec("colocation_load", f"Load and replicas: {label}", "per second / replicas",
                  [s("offered_rps", "offered requests/s"), s("served_rps", "answered requests/s"),
                   s("replicas", "inference replicas")], x_label=x),
        ChartSpec("colocation_leases", f"Cards held, by kind: {label}", "cards (a 1g MIG slice = 1/7)",
                  [s("training_cards", "training")] + [
                      Series(f"inference ({k})", hours, [p.get("inference_kinds", {}).get(k, 0.0) for p in timeline])
                      for k in kinds], kind="step", x_label=x),
        ChartSpec("colocation_utilisation", f"GPU utilisation: {label}", "% of the cluster's GPU-time",
                  [Series("useful GPU-time / available (2 s mean)", hours,
                          rolling_mean([p.get("utilization_pct") for p in timeline], 4))], x_label=x),
        ChartSpec("colocation_latency", f"Inference p99 latency: {label}", "ms",
                  [s("p99_ms", "p99 (last few seconds)"), s("slo_ms", "SLO")], x_label=x),
    ]


def write_day_charts(out_dir: Path, timeline: list[dict[str, Any]], label: str) -> list[Path]:
    """PNG of each chart of the day into ``out_dir`` (matplotlib; no browser needed)."""
    from orchestrator.dashboard.report import write_png

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for spec in day_charts(timeline, label):
        p = out_dir / f"{spec.key}.png"
        write_png(spec, p)
        paths.append(p)
    return paths


# ---- one replay ---------------------------------------------------------------------------------------
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


# ---- the day, every scheme ------------------------------------------------------------------------------
#: The default day (requests per second at hours of the day): a night trough, a morning ramp, a lunch
#: plateau, a spike at 14:00 for an hour, an evening tail. ``--load-curve`` replaces it.
DEFAULT_DAY = ((0, 2), (6, 1.5), (8, 5), (10, 9), (12, 11), (13.9, 11), (14, 20), (15, 20), (15.1, 11),
               (18, 9), (20, 6), (22, 3), (24, 2))

#: The backlog: 4 cards (a100-0), 2 (h100-0), 2 (a100-1's cards 0-1), and four runs that take a MIG slice
#: (4g.40gb or 2g.20gb: hard isolation) or else a whole card.
DEFAULT_TRAINING = (TrainingJob(1, "4"), TrainingJob(2, "2"), TrainingJob(3, "2"),
                    TrainingJob(4, "mem=40GiB,compute=0.5,isolation=hard"),
                    TrainingJob(5, "mem=40GiB,compute=0.5,isolation=hard"),
                    TrainingJob(6, "mem=20GiB,compute=0.25,isolation=hard"),
                    TrainingJob(7, "mem=20GiB,compute=0.25,isolation=hard"))

#: ``ours``' time windows (queue quotas by time of day): by day inference is guaranteed 60 % of the cards
#: and training may only borrow beyond 40 % (borrowed cards are reclaimed for inference); by night training
#: may take everything above a 10 % inference floor, beyond which inference only borrows.
WINDOWS = (
    {"name": "day", "start": "08:00", "end": "22:00",
     "queues": {"inference": {"quota_pct": 60}, "training": {"quota_pct": 40, "borrowing": True}}},
    {"name": "night", "start": "22:00", "end": "08:00",
     "queues": {"inference": {"quota_pct": 10, "borrowing": True}, "training": {"borrowing": True}}},
)

#: ``ours``' MIG layout for each window, applied live when the window starts. Only the instances that change
#: are drained (a 4g.40gb run keeps training through both relayouts, a replica on 1g.10gb@6 keeps serving):
#: by night each MIG card offers a 4g and a 2g slice for training and a 1g for the inference floor; by day the
#: 2g slice becomes two more 1g slices, so the service grows into six 1g slices without taking a whole card.
MIG_TARGETS = {
    "night": {"name": "night", "model": "A100-80GB", "layout": ["4g.40gb@0", "2g.20gb@4", "1g.10gb@6"]},
    "day": {"name": "day", "model": "A100-80GB", "layout": ["4g.40gb@0", "1g.10gb@4", "1g.10gb@5", "1g.10gb@6"]},
}


def baseline_replicas(scheme: Scheme, peak: int, cfg: Any) -> int | None:
    """A baseline's service size all day: the peak ``ours`` needed (None for ``ours``, which follows the
    load). Static MIG gets no more than its fixed layout has slices of the replica's profile: asking for more
    would wait out the lease timeout for slices that cannot exist."""
    if scheme.load_driven:
        return None
    if scheme.mig == "static":
        return min(peak, static_slices(cfg, scheme.inference_request))
    return peak


def static_slices(cfg: Any, request: str) -> int:
    """How many MIG instances of ``request``'s profile (``mig:<profile>``) the cluster file's layout holds."""
    profile = GpuRequest.parse(request).profile  # None unless a MIG slice is asked for
    return sum(1 for n in cfg.nodes for slices in n.mig.values() for m in slices if m.profile == profile)


def default_curve() -> Any:
    lg = load_loadgen()
    return lg.RateCurve(tuple((h * 3600.0, float(r)) for h, r in DEFAULT_DAY), "day")


def run_colocation(day: DayConfig, service: Any, say: Say, *, schemes: tuple[str, ...] = tuple(SCHEMES),
                   state_dir: Path | None = None, keep: bool = False, out_dir: Path | None = None,
                   cluster: Any = None) -> dict[str, Any]:
    """Up the demo cluster, replay the day under each scheme (``ours`` first: the baselines are provisioned
    for the peak it needed), down (always). Returns ``ours``' figures with ``baselines`` beside them."""
    import shutil
    import tempfile

    from orchestrator.core.config import DEMO_CONFIG, load_config
    from orchestrator.deploy import local as launcher

    for name in schemes:
        if name not in SCHEMES:
            raise ValueError(f"scheme {name!r}: expected one of {', '.join(SCHEMES)}")
    cfg = cluster or load_config(DEMO_CONFIG)
    sched = cfg.scheduler.model_copy(update={"classes": {
        **cfg.scheduler.classes,
        "training": cfg.scheduler.classes["training"].model_copy(update={"min_runtime_s": 1.0,
                                                                          "grace_period_s": 30.0})}})
    cfg = cfg.model_copy(update={"scheduler": sched})
    if day.curve is None:
        day = DayConfig(**{**day.__dict__, "curve": default_curve()})
    if not day.training:
        day = DayConfig(**{**day.__dict__, "training": DEFAULT_TRAINING})
    sd = state_dir or Path(tempfile.mkdtemp(prefix="rgo-colocation-"))
    results: dict[str, ReplayResult] = {}
    started = False
    try:
        state = launcher.up_local(cfg, sd, progress=say)
        started = True
        launcher.stop_orchestrator_actors(state.address, cfg)  # each replay starts its own head
        peak: int | None = None
        for name in schemes:
            scheme = SCHEMES[name]
            fixed = baseline_replicas(scheme, peak or service.autoscale.max_replicas, cfg)
            say(f"[{name}] replaying the day ({day.day_s:g}s): {scheme.label}"
                + (f", {fixed} replicas all day" if fixed else ", replicas follow the load"))
            res = Replay(cfg, scheme, day, service, state.address, sd / "work", say, fixed_replicas=fixed).run()
            results[name] = res
            if scheme.load_driven:
                peak = res.peak_replicas
            f = res.figures
            say(f"[{name}] utilisation {f['gpu_utilization_pct']}%, SLO {f['inference_slo_attainment_pct']}%, "
                f"p99 {f['p99_latency_ms']} ms, preemptions {f['preemptions']}, lost steps {f['work_lost_steps']}")
        if out_dir is not None and "ours" in results:
            files = write_day_charts(out_dir, results["ours"].timeline, SCHEMES["ours"].label)
            (out_dir / "colocation.json").write_text(json.dumps(
                {k: {"figures": r.figures, "timeline": r.timeline, "requests": r.requests}
                 for k, r in results.items()}))
            say(f"chart of the day: {', '.join(str(p) for p in files)}")
    finally:
        if started or (sd / "state.json").exists():
            launcher.down(sd, progress=say, keep_logs=keep)
        if not keep and state_dir is None:
            shutil.rmtree(sd, ignore_errors=True)
    first = next(iter(results.values()), None)
    out = dict(results["ours"].figures) if "ours" in results else (dict(first.figures) if first else {})
    out["baselines"] = {k: r.figures for k, r in results.items() if k != "ours"}
    return out
