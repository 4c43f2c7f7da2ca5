"""``LeasedService``: the driver side of the inference service -- load in, a replica count out.

One object per service, in the driver (a scenario, a test, a notebook)::

    svc = LeasedService(cfg.service, head=head, namespace="rgo")
    svc.start()                      # Serve, one application: the ingress at http://127.0.0.1:PORT/ and the GPU deployment
    while ...:
        d = svc.step(floor=window_floor)   # sample the load, ask the autoscaler, set the GPU deployment's replica count
        time.sleep(cfg.control_interval_s)
    svc.stats()                      # per replica: lease, kind, requests, busy seconds, busy GPU-seconds
    svc.stop()                       # the application deleted; each replica's lease is freed as its actor ends

**One Serve application, a lease per replica.** The service is the Ray Serve application a user would write
(:func:`.leased.service_app`): an ingress and one GPU deployment whose replicas ask Ray for ``num_gpus`` and name
their lease's request, priority class (``inference``, 1000, above training's 100) and queue in their runtime
env. Serve's controller, started here with the head's namespace in its environment, asks the head for one lease
per replica (:mod:`orchestrator.rayport.serve_leases`): all of a scale-up's leases are in the queue at once and
its replicas start in parallel; when the cluster is full the head preempts training through its checkpoint
path, as for any lease -- nothing here names a victim. Each replica runs inside its lease's placement group
(its ``ray.get_gpu_ids()`` is the leased card or slice); the lease is activated by the replica's actor, so the
node's agent stops exactly that actor when the lease is revoked, and the head frees the lease when the actor
ends. Removing replicas is Serve's own graceful downscale: it stops routing to the replica, lets its requests
finish, then stops its actor; only then is the lease freed -- a card is never handed on while the replica may
still run on it.

**The signal.** ``sample()`` reads the ingress: the time-averaged total of ongoing requests since the previous
sample (Ray Serve averages its ongoing-requests metric the same way) and the p99 of requests finished in the
last 5 s. :func:`orchestrator.scheduling.autoscale.decide` turns it into a replica count with hysteresis, the
time window's floor and ceiling; ``step`` sets it through Serve's external scaler API. Each decision is kept in
:attr:`LeasedService.history` with its reason.

**Warm spares.** ``warm_spares=N`` keeps N replicas more than the decision asks for (ready, leased, serving:
Serve routes to every replica), so a spike is met by capacity already up while the next replicas start. A
spare costs its lease (a 1g slice is a seventh of a card). ``max_starting`` caps how far the count is raised
above the replicas already running (on a small machine many starts at once slow every replica that serves).

**Replicas seen.** :attr:`replicas` is the GPU deployment's replicas that Serve reports RUNNING, each with its
lease (``serve-<app>-<deployment>-<replica id>``) as the head shows it; ``add_s`` is from its lease's request to
the first time it was seen running, ``granted_s`` to its grant. A replica that leaves is kept in
:attr:`retired` with its last counters (the ingress keeps each replica's latest, sent with every answer).

**Time.** ``clock.monotonic()`` (an injected :class:`~orchestrator.core.clock.Clock`) stamps samples, so the
autoscaler's delays follow the clock a scenario runs on.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from orchestrator.core import env as E
from orchestrator.core.api import HeadApi
from orchestrator.core.clock import Clock, SystemClock
from orchestrator.core.colocation import ServiceConfig
from orchestrator.core.reasons import Reason
from orchestrator.core.request import GpuRequest
from orchestrator.rayport import serve_api
from orchestrator.rayport.serve_leases import lease_id_of, lease_prefix
from orchestrator.scheduling.autoscale import LoadSample, ScaleDecision, ScalerState, decide
from orchestrator.serve.leased import REPLICA_DEPLOYMENT, service_app
from orchestrator.sim.perfmodel import InferenceModel, ShareSpeed

__all__ = ["LeasedService", "LeasedReplicaInfo"]


@dataclass
class LeasedReplicaInfo:
    """One replica of the GPU deployment: its lease, where it runs, and (once gone) its last counters."""

    name: str  # Serve's replica id
    lease_id: str
    kind: str | None
    node: str | None
    devices: str
    add_s: float  # from asking for its lease to the replica first seen running
    granted_s: float  # from asking for its lease to its grant
    added_at: float  # clock.monotonic() when first seen running
    removed_at: float | None = None
    final: dict[str, Any] | None = None  # its counters when it left
    pid: int | None = None
    card_share: float = 1.0  # the cards its lease holds (a 1g slice 1/7, a quarter time-slice 0.25)


class LeasedService:
    """An inference service whose every replica holds one lease; see the module docstring."""

    def __init__(self, cfg: ServiceConfig, *, head: HeadApi, namespace: str = "rgo", head_name: str = "rgo-head",
                 clock: Clock | None = None, host: str = "127.0.0.1", port: int = 8000, seed: int = 0,
                 width: int = 256, lease_timeout_s: float = 120.0, request: GpuRequest | None = None,
                 perf: InferenceModel | None = None, say: Callable[[str], None] = lambda s: None,
                 warm_spares: int = 0, max_starting: int | None = None) -> None:
        """``request`` overrides ``cfg.request`` (a ``GpuRequest`` may carry constraints the ``--gpu`` string
        cannot, such as ``node``); ``perf`` is the replicas' batch cost model on simulated GPUs."""
        self.cfg, self.head, self.namespace, self.head_name = cfg, head, namespace, head_name
        self.request = request or cfg.gpu_request()
        self.perf = perf
        self.clock: Clock = clock or SystemClock()
        self.host, self.port, self.seed, self.width = host, port, seed, width
        self.lease_timeout_s, self.say = lease_timeout_s, say
        self.warm_spares, self.max_starting = warm_spares, max_starting
        self.retired: list[LeasedReplicaInfo] = []
        self.state = ScalerState()
        #: every decision and change: {"t_s", "event" (decide/scale/add/remove), "replicas", "reason"...}
        self.history: list[dict[str, Any]] = []
        self._lock = threading.RLock()
        self._running: dict[str, LeasedReplicaInfo] = {}  # replica id -> info, in the order first seen
        self._seen_at = 0.0
        self._target = 0
        self._want = 0
        self._ingress: Any = None
        self.url = ""

    # ---- life ------------------------------------------------------------------------------------
    @property
    def app(self) -> str:
        return self.cfg.name

    def actor_options(self) -> dict[str, Any]:
        """The GPU deployment's ``ray_actor_options``: Ray's ``num_gpus`` (the share's fraction of a card; the
        lease's group then gives it the whole share), and its lease's request, priority class and queue."""
        r = self.request
        if r.kind is not None and r.kind.value == "whole":
            gpus = float(r.count)
        else:
            gpus = float(r.compute or r.fraction or (r.sm_percent or 0) / 100 or 0.1)
        env = {E.GPU_REQUEST: r.model_dump_json(exclude_defaults=True),
               E.PRIORITY_CLASS: self.cfg.priority_class, E.QUEUE: getattr(self.cfg, "queue", "default")}
        return {"num_gpus": gpus, "num_cpus": 0, "runtime_env": {"env_vars": env}}

    def start(self, replicas: int | None = None) -> str:
        """Serve (its controller asking the head of ``namespace`` for its replicas' leases), the application with
        ``replicas`` (default ``min_replicas``) GPU replicas plus the warm spares; the URL. Returns once ``replicas``
        serve (the spares come up behind them), or after ``lease_timeout_s`` with what serves then."""
        base = serve_api.start(self.host, self.port, controller_env={
            E.SERVE_LEASES: "1", E.NAMESPACE: self.namespace, E.HEAD_NAME: self.head_name})
        want = self.cfg.autoscale.min_replicas if replicas is None else replicas
        self._want, self._target = want, want + self.warm_spares
        app = service_app(self.actor_options(), self._target, seed=self.seed, width=self.width,
                          max_batch_size=self.cfg.max_batch_size, batch_wait_timeout_s=self.cfg.batch_wait_timeout_s,
                          perf=self.perf)
        self._ingress = serve_api.run(app, self.app, route_prefix="/", wait=False, external_scaler=True)
        self.url = base + "/"
        deadline = time.monotonic() + self.lease_timeout_s
        while len(self.refresh()) < want and time.monotonic() < deadline:  # the spares come up behind them
            time.sleep(0.2)
        self.say(f"{self.cfg.name}: serving at {self.url} with {len(self._running)} leased replica(s) of "
                 f"{self._target} asked" + (f" ({self.warm_spares} warm spares)" if self.warm_spares else ""))
        return self.url

    def stop(self, *, shutdown_serve: bool = True) -> None:
        """Delete the application (Serve drains and stops every replica; each lease is freed as its actor
        ends), wait until the head shows none of its leases held, and stop Serve unless told not to."""
        if self._ingress is not None:
            final = self._quiet_load()
            serve_api.delete(self.app)
            self._ingress = None
            with self._lock:
                for info in self._running.values():
                    self._retire(info, final)
                self._running = {}
            deadline = time.monotonic() + 60
            while self._held_leases() and time.monotonic() < deadline:
                time.sleep(0.2)
        if shutdown_serve:
            serve_api.shutdown()

    # ---- the loop --------------------------------------------------------------------------------
    def load(self, reset: bool = True) -> dict[str, Any]:
        """The ingress's figures (see :meth:`.leased.LoadMeter.load`) and ``replicas``: each replica's latest
        counters by lease; ``reset`` starts a new averaging window (only :meth:`sample` should)."""
        return serve_api.call(self._ingress, "load", reset)

    def sample(self) -> LoadSample:
        """Replicas serving (less the warm spares), mean ongoing requests since the last sample, recent p99 (ms)."""
        ld = self.load()
        serving = max(0, len(self.refresh(ld)) - self.warm_spares)
        return LoadSample(t_s=self.clock.monotonic(), replicas=serving, ongoing=float(ld["mean_ongoing"]),
                          p99_ms=ld["p99_ms"])

    def step(self, now_s: float | None = None, *, floor: int = 0, ceiling: int | None = None) -> ScaleDecision:
        """One control step: sample, decide, then set the GPU deployment's replica count to the decision (plus
        the warm spares). ``now_s`` overrides the sample's time (default ``clock.monotonic()``); ``floor`` /
        ``ceiling`` are the time window's bounds on the replica count."""
        s = self.sample()
        if now_s is not None:
            s = LoadSample(t_s=now_s, replicas=s.replicas, ongoing=s.ongoing, p99_ms=s.p99_ms)
        d = decide(self.cfg.autoscale, self.state, s, floor=floor, ceiling=ceiling)
        self.state = d.state
        if d.replicas != self._want:
            self._log("decide", s.t_s, replicas=d.replicas, before=self._want, ongoing=round(s.ongoing, 3),
                      p99_ms=s.p99_ms, reason=d.reason)
            self.say(f"{self.cfg.name}: {self._want} -> {d.replicas} replica(s): {d.reason.text}")
            self._want = d.replicas
        self._apply(d.reason)
        return d

    def _apply(self, reason: Reason | None) -> None:
        """The replica count Serve is told: the decision plus the spares, raised at most ``max_starting`` above
        what runs now (so repeated steps while replicas start raise it as they come up)."""
        target = replica_target(self._want, self.warm_spares, self._target, len(self._running), self.max_starting)
        if target != self._target:
            serve_api.scale(self.app, REPLICA_DEPLOYMENT, target)
            self._log("scale", self.clock.monotonic(), replicas=target, before=self._target, reason=reason)
            self._target = target

    # ---- replicas --------------------------------------------------------------------------------
    @property
    def replicas(self) -> list[LeasedReplicaInfo]:
        """The replicas serving now, oldest first (refreshed at most every 0.25 s)."""
        if time.monotonic() - self._seen_at > 0.25:
            self.refresh()
        with self._lock:
            return list(self._running.values())

    def refresh(self, load: dict[str, Any] | None = None) -> list[LeasedReplicaInfo]:
        """Read Serve's replicas: new RUNNING ones are added (with their lease as the head shows it), ones no
        longer RUNNING retired with their last counters."""
        rows = serve_api.replicas(self.app, REPLICA_DEPLOYMENT) if self._ingress is not None else []
        now_wall, now = time.time(), self.clock.monotonic()
        running = {r["replica_id"]: r for r in rows if str(r.get("state")).endswith("RUNNING")}
        with self._lock:
            gone = [rid for rid in self._running if rid not in running]
            if gone:
                final = load if load is not None else self._quiet_load()
                for rid in gone:
                    self._retire(self._running.pop(rid), final)
            for rid, row in sorted(running.items(), key=lambda kv: kv[1].get("start_time_s") or 0):
                if rid not in self._running:
                    self._running[rid] = self._added(rid, row, now_wall, now)
            self._seen_at = time.monotonic()
            return list(self._running.values())

    def _added(self, rid: str, row: dict[str, Any], now_wall: float, now: float) -> LeasedReplicaInfo:
        lid = lease_id_of(self.app, REPLICA_DEPLOYMENT, rid)
        le = _quiet(self.head.get_lease, lid) or {}
        alloc = le.get("allocation") or {}
        hist = le.get("history") or []
        asked = hist[0]["at"] if hist else now_wall
        granted = next((h["at"] for h in hist if h["state"] == "granted"), now_wall)
        info = LeasedReplicaInfo(rid, lid, alloc.get("kind"), alloc.get("node"),
                                 ",".join(alloc.get("gpu_uuids") or alloc.get("mig_uuids") or []),
                                 round(now_wall - asked, 3), round(granted - asked, 3), now, pid=row.get("pid"),
                                 card_share=card_share_of(le))
        self._log("add", now, replica=rid, lease_id=lid, kind=info.kind, node=info.node, add_s=info.add_s,
                  granted_s=info.granted_s, replicas=len(self._running) + 1, reason=None)
        self.say(f"{self.app}: replica {rid} on lease {lid} ({info.kind} on {info.node}) granted in "
                 f"{info.granted_s:.2f}s, serving {info.add_s:.2f}s after its lease was asked")
        return info

    def _retire(self, info: LeasedReplicaInfo, load: dict[str, Any] | None) -> None:
        info.final = ((load or {}).get("replicas") or {}).get(info.lease_id) or info.final
        info.removed_at = self.clock.monotonic()
        self.retired.append(info)
        self._log("remove", info.removed_at, replica=info.name, lease_id=info.lease_id,
                  replicas=len(self._running), reason=None)
        self.say(f"{self.app}: replica {info.name} gone, lease {info.lease_id}")

    def _held_leases(self) -> list[str]:
        prefix = lease_prefix(self.app, REPLICA_DEPLOYMENT)
        got = _quiet(self.head.status) or {}
        return [le["lease_id"] for le in got.get("leases", [])
                if le["lease_id"].startswith(prefix) and le["state"] in ("pending", "granted", "active", "checkpointing")]

    def _quiet_load(self) -> dict[str, Any] | None:
        return _quiet(self.load, False) if self._ingress is not None else None

    def _log(self, event: str, t_s: float, *, reason: Reason | None = None, **kw: Any) -> None:
        self.history.append({"t_s": round(t_s, 3), "event": event, **kw,
                             "cause": reason.cause.value if reason is not None else None,
                             "reason": reason.text if reason is not None else None})

    # ---- figures ---------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Per replica (serving and gone): lease id, kind, node, devices, requests, batches, busy seconds and
        useful GPU-seconds (``InferenceModel.useful_gpu_s`` of its batches), add_s; and their totals."""
        latest = ((self._quiet_load() or {}).get("replicas") or {})
        rows = []
        for info in [*self.retired, *self.replicas]:
            st = latest.get(info.lease_id) or info.final
            rows.append({"replica": info.name, "lease_id": info.lease_id, "kind": info.kind, "node": info.node,
                         "devices": info.devices, "add_s": info.add_s, "granted_s": info.granted_s,
                         "serving": info.removed_at is None, **({k: st[k] for k in (
                             "requests", "batches", "busy_s", "useful_gpu_s", "card_share", "simulated")} if st else {})})
        return {"replicas": rows, "serving": len(self._running),
                "requests": sum(r.get("requests", 0) for r in rows),
                "busy_s": round(sum(r.get("busy_s", 0.0) for r in rows), 6),
                "useful_gpu_s": round(sum(r.get("useful_gpu_s", 0.0) for r in rows), 6)}


def replica_target(want: int, warm: int, current: int, running: int, max_starting: int | None) -> int:
    """The replica count to tell Serve: ``want`` plus ``warm`` spares; a rise is capped at ``max_starting`` above
    the ``running`` replicas (never below the ``current`` count: what is starting keeps starting); a fall is
    at once. Pure. Invariant: the answer is at most ``want + warm`` and, when rising, at least ``current``."""
    target = want + warm
    if max_starting is not None and target > current:
        target = min(target, max(current, running + max_starting))
    return target


def card_share_of(lease: dict[str, Any]) -> float:
    """The cards a lease (the head's view of it) holds: its hand-out's share (a 1g slice 1/7, a quarter
    time-slice 0.25, MPS its SM fraction); one card when the view has no hand-out. Pure."""
    handout = lease.get("handout") or {}
    if not handout:
        return 1.0
    return ShareSpeed.of_env(handout.get("env_vars") or {}).card_share * max(1, len(
        (lease.get("allocation") or {}).get("gpu_uuids") or [None]))


def _quiet(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or None when it fails: for clean-up after a failure that matters more."""
    try:
        return fn(*args)
    except Exception:
        return None
