"""``LeasedService``: the driver side of the inference service -- load in, leased replicas out.

One object per service, in the driver (a scenario, a test, a notebook)::

    svc = LeasedService(cfg.service, head=head, namespace="rgo")
    svc.start()                      # Serve, the ingress at http://127.0.0.1:PORT/, min_replicas leased replicas
    while ...:
        d = svc.step(floor=window_floor)   # sample the load, ask the autoscaler, add / remove leased replicas
        time.sleep(cfg.control_interval_s)
    svc.stats()                      # per replica: lease, kind, requests, busy seconds, busy GPU-seconds
    svc.stop()                       # every replica deleted and its lease released

**A replica is a lease.** Adding one asks the head for a lease with the
service's request (``ServiceConfig.request``, its priority class -- ``inference``,
1000, above training's 100 -- and queue); when the cluster is full the head
preempts training through its checkpoint path, as for any other lease:
nothing here names a victim. Once granted, the replica's Serve application is
deployed on exactly the lease's devices (:func:`.leased.replica_app`,
:func:`orchestrator.rayport.serve_api.replica_options`), the lease is
activated with the replica's actor as its workload (so the node's agent can
reach it), and the ingress starts routing to it. Removing one is the reverse,
in this order: the ingress stops routing to it, its ongoing requests drain
(bounded), its application is deleted, its process has left the node, and
only then is the lease released -- a card is never handed on while the
replica may still run on it.

**Which replica goes.** The newest first (LIFO): it is the lease most likely
to have displaced training, so releasing it gives training its card back
soonest; the oldest replicas keep their warm state.

**The signal.** ``sample()`` reads the ingress's router: the time-averaged
total of ongoing requests since the previous sample (Ray Serve averages its
ongoing-requests metric the same way) and the p99 of requests finished in
the last 5 s. :func:`orchestrator.scheduling.autoscale.decide` turns it into a
replica count with hysteresis; ``step`` applies it. Each decision and each
change is kept in :attr:`LeasedService.history` with its reason.

**Time.** ``clock.monotonic()`` (an injected :class:`~orchestrator.core.clock.Clock`)
stamps samples, so the autoscaler's delays follow the clock a scenario runs
on. By default adding a replica is synchronous: ``step`` returns once the new
replicas serve (or their lease timed out), and :attr:`LeasedReplicaInfo.add_s`
records how long that took. ``asynchronous=True`` starts them on threads of
their own (their Serve deployments submitted one at a time, their start-up
awaited together), so the loop keeps sampling while they come up.

**Warm spares.** A replica takes seconds to start (a worker process, Serve,
torch; 7-30 s on a busy 2-core machine), minutes for a large model: a load
spike arrives faster. ``warm_spares=N`` keeps N replicas started and leased but
not routed: a scale-up routes one at once and starts its replacement; a
scale-down parks the replica it takes out of routing as a spare while there
are fewer than N (:func:`plan_replicas`, pure). A spare costs its lease (a
1g slice is a seventh of a card) and nothing else.
"""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from orchestrator.control.revocation import actor_workload
from orchestrator.core.api import HeadApi
from orchestrator.core.clock import Clock, SystemClock
from orchestrator.core.colocation import ServiceConfig
from orchestrator.core.errors import LeaseTimeoutError, OrchestratorError
from orchestrator.core.reasons import Reason
from orchestrator.core.request import GpuRequest
from orchestrator.rayport import serve_api
from orchestrator.rayport.agent import process_alive
from orchestrator.scheduling.autoscale import LoadSample, ScaleDecision, ScalerState, decide
from orchestrator.sdk.leases import LeaseHandle, lease
from orchestrator.serve.leased import ingress_app, replica_app
from orchestrator.sim.perfmodel import InferenceModel

__all__ = ["LeasedService", "LeasedReplicaInfo"]


@dataclass
class LeasedReplicaInfo:
    """One leased replica: its lease, where it runs, and (once removed) its final counters."""

    name: str  # also its Serve application's name
    lease_id: str
    kind: str | None
    node: str | None
    devices: str
    add_s: float  # from asking for the lease to the replica serving
    granted_s: float  # from asking for the lease to its grant
    added_at: float  # clock.monotonic()
    removed_at: float | None = None
    final: dict[str, Any] | None = None  # its stats when it was removed
    pid: int | None = None
    _stack: ExitStack | None = field(default=None, repr=False)
    handle: LeaseHandle | None = field(default=None, repr=False)


@dataclass(frozen=True)
class ReplicaMoves:
    """What :func:`plan_replicas` asks for: spares to route, routed replicas to park as spares or retire,
    spares to retire, replicas to start."""

    route: int = 0
    park: int = 0
    retire_routed: int = 0
    retire_spares: int = 0
    start: int = 0


def plan_replicas(routed: int, spares: int, starting: int, want: int, warm: int) -> ReplicaMoves:
    """How to go from ``routed`` replicas taking traffic, ``spares`` ready but unrouted and ``starting`` on
    their way, to ``want`` routed with ``warm`` spares ready behind them. Pure.

    Invariants: a spare is routed before any replica is started (a scale-up takes effect at once when a
    spare exists); a replica taken out of routing becomes a spare while there are fewer than ``warm``,
    else it is retired (its lease released); replicas being started count toward what is missing, so
    repeated calls while they start never start more.
    """
    route = min(max(0, want - routed), spares)
    routed, spares = routed + route, spares - route
    park = retire_routed = 0
    if routed > want:
        park = min(routed - want, max(0, warm - spares))
        retire_routed = routed - want - park
        spares += park
    missing_routed = max(0, want - routed)
    retire_spares = max(0, spares - warm)
    start = max(0, missing_routed + warm - spares + retire_spares - starting)
    return ReplicaMoves(route, park, retire_routed, retire_spares, start)


class LeasedService:
    """An inference service whose every replica holds one lease; see the module docstring."""

    def __init__(self, cfg: ServiceConfig, *, head: HeadApi | None = None, namespace: str = "rgo",
                 address: str | None = None, clock: Clock | None = None, host: str = "127.0.0.1", port: int = 8000,
                 seed: int = 0, width: int = 256, lease_timeout_s: float = 120.0, drain_timeout_s: float = 10.0,
                 request: GpuRequest | None = None, perf: InferenceModel | None = None,
                 say: Callable[[str], None] = lambda s: None, warm_spares: int = 0,
                 asynchronous: bool = False, max_starting: int | None = None) -> None:
        """``request`` overrides ``cfg.request`` (a ``GpuRequest`` may carry constraints the ``--gpu`` string
        cannot, such as ``node``); ``perf`` is the replicas' batch cost model on simulated GPUs."""
        self.cfg, self.head, self.namespace, self.address = cfg, head, namespace, address
        self.request = request or cfg.gpu_request()
        self.perf = perf
        self.clock: Clock = clock or SystemClock()
        self.host, self.port, self.seed, self.width = host, port, seed, width
        self.lease_timeout_s, self.drain_timeout_s, self.say = lease_timeout_s, drain_timeout_s, say
        self.replicas: list[LeasedReplicaInfo] = []  # serving, oldest first
        #: ready and leased but not routed: a scale-up routes one at once (see "Warm spares")
        self.spares: list[LeasedReplicaInfo] = []
        self.warm_spares, self.asynchronous = warm_spares, asynchronous
        #: at most this many replicas starting at once (None: no limit): on a small machine, starting many
        #: at once slows every replica that serves, which reads as more load
        self.max_starting = max_starting
        self._want = 0
        self._starting = 0
        self._lock = threading.RLock()
        self._starters: list[threading.Thread] = []
        self._asking: set[str] = set()  # replicas whose lease is asked for and not yet answered
        self._stopping = False
        self.retired: list[LeasedReplicaInfo] = []
        self.state = ScalerState()
        #: every decision and change: {"t_s", "event" (decide/add/remove/add_failed), "replicas", "reason"...}
        self.history: list[dict[str, Any]] = []
        self._seq = 0
        self._ingress: Any = None
        self.url = ""

    # ---- life ------------------------------------------------------------------------------------
    @property
    def ingress_name(self) -> str:
        return f"{self.cfg.name}-ingress"

    def start(self, replicas: int | None = None) -> str:
        """Serve, the ingress at ``/``, and ``replicas`` (default ``min_replicas``) leased replicas routed (plus
        the warm spares); the URL. Returns once they serve (asynchronous: started together, then awaited)."""
        base = serve_api.start(self.host, self.port)
        self._ingress = serve_api.run(ingress_app(), self.ingress_name, route_prefix="/")
        self.url = base + "/"
        want = self.cfg.autoscale.min_replicas if replicas is None else replicas
        self._reconcile(want, None)
        deadline = time.monotonic() + self.lease_timeout_s + 120
        while self.asynchronous and time.monotonic() < deadline:
            with self._lock:
                if len(self.replicas) >= want or not self._starting:
                    break
            time.sleep(0.1)
        self.say(f"{self.cfg.name}: serving at {self.url} with {len(self.replicas)} leased replica(s)"
                 + (f" and {len(self.spares)} warm spare(s)" if self.spares else ""))
        return self.url

    def stop(self, *, shutdown_serve: bool = True) -> None:
        """Remove every replica and spare (releasing its lease), the ingress, and Serve itself unless told
        not to. Replicas still starting are awaited first."""
        with self._lock:
            self._want, self.warm_spares = 0, 0
            self._stopping = True
            asking = list(self._asking)
        if self.head is not None:  # a start still waiting for its lease gives up now, not at its lease timeout
            for name in asking:
                _quiet(self.head.release, name, None, "withdrawn: the service is stopping")
        for t in list(self._starters):
            t.join(timeout=self.lease_timeout_s + 120)
        with self._lock:
            infos = self.replicas[::-1] + self.spares[::-1]
            self.replicas, self.spares = [], []
        if infos and self._ingress is not None:
            self._route()  # none routed: each drains, then all are removed at once (not 3 s after one another)
        retiring = [threading.Thread(target=self._retire, args=(info, None), daemon=True, name=f"retire-{info.name}")
                    for info in infos]
        for t in retiring:
            t.start()
        for t in retiring:
            t.join()
        if self._ingress is not None:
            serve_api.delete(self.ingress_name)
            self._ingress = None
        if shutdown_serve:
            serve_api.shutdown()

    # ---- the loop --------------------------------------------------------------------------------
    def load(self, reset: bool = True) -> dict[str, Any]:
        """The ingress's router figures (see :meth:`.leased.Router.load`); ``reset`` starts a new averaging
        window (only :meth:`sample` should)."""
        return serve_api.call(self._ingress, "load", reset)

    def sample(self) -> LoadSample:
        """Replicas serving, mean ongoing requests since the last sample, recent p99 (ms)."""
        ld = self.load()
        return LoadSample(t_s=self.clock.monotonic(), replicas=len(self.replicas), ongoing=float(ld["mean_ongoing"]),
                          p99_ms=ld["p99_ms"])

    def step(self, now_s: float | None = None, *, floor: int = 0, ceiling: int | None = None) -> ScaleDecision:
        """One control step: sample, decide, then add or remove leased replicas to match the decision.

        ``now_s`` overrides the sample's time (default ``clock.monotonic()``); ``floor`` / ``ceiling`` are the
        time window's bounds on the replica count."""
        s = self.sample()
        if now_s is not None:
            s = LoadSample(t_s=now_s, replicas=s.replicas, ongoing=s.ongoing, p99_ms=s.p99_ms)
        d = decide(self.cfg.autoscale, self.state, s, floor=floor, ceiling=ceiling)
        self.state = d.state
        before = len(self.replicas) if not self.asynchronous else self._want
        if d.replicas != before:  # asynchronous: a change of the decision, not replicas still starting
            self._log("decide", s.t_s, replicas=d.replicas, before=before, ongoing=round(s.ongoing, 3),
                      p99_ms=s.p99_ms, reason=d.reason)
            self.say(f"{self.cfg.name}: {before} -> {d.replicas} replica(s): {d.reason.text}")
        self._reconcile(d.replicas, d.reason)
        return d

    def _reconcile(self, want: int, reason: Reason | None) -> None:
        """Route spares, park or retire routed replicas, retire extra spares, start what is missing
        (:func:`plan_replicas`); starts run on their own threads when ``asynchronous``."""
        with self._lock:
            self._want = want
            m = plan_replicas(len(self.replicas), len(self.spares), self._starting, want, self.warm_spares)
            if self.max_starting is not None:
                m = replace(m, start=max(0, min(m.start, self.max_starting - self._starting)))
            changed = m.route + m.park + m.retire_routed > 0
            self.replicas.extend(self.spares.pop(0) for _ in range(m.route))
            retire: list[tuple[LeasedReplicaInfo, bool]] = []
            for _ in range(m.park):
                self.spares.append(self.replicas.pop())  # the newest: see "Which replica goes"
            for _ in range(m.retire_routed):
                retire.append((self.replicas.pop(), True))
            for _ in range(m.retire_spares):
                retire.append((self.spares.pop(), False))
            self._starting += m.start
        if changed:
            self._route()
        for info, routed in retire:
            self._retire(info, reason, drain=routed)
        for _ in range(m.start):
            if self.asynchronous:
                t = threading.Thread(target=self._start_one, args=(reason,), name=f"{self.cfg.name}-start",
                                     daemon=True)
                self._starters = [x for x in self._starters if x.is_alive()] + [t]
                t.start()
            else:
                self._start_one(reason)

    def _start_one(self, reason: Reason | None) -> None:
        info = None
        try:
            info = self._add(reason)
        finally:
            with self._lock:
                self._starting -= 1
                if info is not None:
                    self.spares.append(info)
        if info is not None:
            self._reconcile(self._want, reason)  # routes it if it is wanted, keeps it as a spare if not

    # ---- replicas --------------------------------------------------------------------------------
    def _add(self, reason: Reason | None) -> LeasedReplicaInfo | None:
        self._seq += 1
        name = f"{self.cfg.name}-r{self._seq}"
        t0 = time.monotonic()
        stack = ExitStack()
        kw: dict[str, Any] = {"head": self.head} if self.head is not None else {"address": self.address}
        with self._lock:
            self._asking.add(name)
        try:
            le = stack.enter_context(lease(self.request, priority=self.cfg.priority_class,
                                           queue=getattr(self.cfg, "queue", "default"), namespace=self.namespace,
                                           owner=f"service:{self.cfg.name}", lease_id=name,
                                           timeout=self.lease_timeout_s, **kw))
        except LeaseTimeoutError as e:
            stack.close()
            self._log("add_failed", self.clock.monotonic(), replica=name, reason=reason, error=str(e))
            self.say(f"{name}: no lease within {self.lease_timeout_s:g}s: {e}")
            return None
        except OrchestratorError:
            stack.close()
            if self._stopping:  # stop() withdrew the request
                return None
            raise
        finally:
            with self._lock:
                self._asking.discard(name)
        granted = time.monotonic() - t0
        try:
            opts = serve_api.replica_options(le.handout, le.node or "", num_cpus=0)
            handle = serve_api.run(replica_app(le.lease_id, opts, seed=self.seed, width=self.width,
                                               max_batch_size=self.cfg.max_batch_size,
                                               batch_wait_timeout_s=self.cfg.batch_wait_timeout_s, perf=self.perf),
                                   name, wait=not self.asynchronous)
            who = serve_api.call(handle, "whoami", timeout_s=60)
            le.head.activate(le.lease_id, le.fencing_token, None, actor_workload(who["namespace"], who["actor_name"]))
        except BaseException as e:
            _quiet(serve_api.delete, name)
            info = _quiet(le.refresh) or {}
            _quiet(stack.close)
            if isinstance(e, OrchestratorError):
                last = (info.get("history") or [{}])[-1]
                raise OrchestratorError(f"replica {name} did not start on lease {le.lease_id}: {e}; the lease is "
                                        f"{info.get('state')} ({last.get('reason')})") from e
            raise
        info = LeasedReplicaInfo(name, le.lease_id, le.allocation.get("kind"), le.node, who["cuda_visible_devices"],
                                 round(time.monotonic() - t0, 3), round(granted, 3), self.clock.monotonic(),
                                 pid=who["pid"], _stack=stack, handle=le)
        self._log("add", info.added_at, replica=name, lease_id=le.lease_id, kind=info.kind, node=info.node,
                  add_s=info.add_s, granted_s=info.granted_s, replicas=len(self.replicas), reason=reason)
        self.say(f"{name}: lease {le.lease_id} ({info.kind} on {info.node} {info.devices}) granted in "
                 f"{granted:.2f}s, serving {info.add_s:.2f}s after it was asked")
        return info

    def _retire(self, info: LeasedReplicaInfo, reason: Reason | None, *, drain: bool = True) -> None:
        """Delete one replica already taken out of routing, then release its lease (see the module docstring)."""
        deadline = time.monotonic() + (self.drain_timeout_s if drain else 0.0)
        while drain and info.name in self.load(reset=False)["ongoing"] and time.monotonic() < deadline:
            time.sleep(0.05)
        info.final = self._replica_stats(info)
        serve_api.delete(info.name)
        deadline = time.monotonic() + 30  # a careful holder releases only once its process has gone
        while info.pid is not None and process_alive(info.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert info._stack is not None
        info._stack.close()  # releases the lease
        info.removed_at = self.clock.monotonic()
        self.retired.append(info)
        self._log("remove", info.removed_at, replica=info.name, lease_id=info.lease_id, replicas=len(self.replicas),
                  reason=reason)
        self.say(f"{info.name}: removed, lease {info.lease_id} released")

    def _route(self) -> None:
        serve_api.call(self._ingress, "set_replicas", {r.name: r.name for r in self.replicas})

    def _replica_stats(self, info: LeasedReplicaInfo) -> dict[str, Any] | None:
        try:
            return serve_api.call(serve_api.app_handle(info.name), "stats", timeout_s=10)
        except Exception as e:  # its stats are lost, not the removal
            self.say(f"{info.name}: no stats ({type(e).__name__})")
            return None

    def _log(self, event: str, t_s: float, *, reason: Reason | None = None, **kw: Any) -> None:
        self.history.append({"t_s": round(t_s, 3), "event": event, **kw,
                             "cause": reason.cause.value if reason is not None else None,
                             "reason": reason.text if reason is not None else None})

    # ---- figures ---------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Per replica (serving and removed): lease id, kind, node, devices, requests, batches, busy seconds
        and useful GPU-seconds (``InferenceModel.useful_gpu_s`` of its batches), add_s; and their totals."""
        rows = []
        for info in [*self.retired, *self.replicas, *self.spares]:
            st = info.final if info.final is not None else self._replica_stats(info)
            rows.append({"replica": info.name, "lease_id": info.lease_id, "kind": info.kind, "node": info.node,
                         "devices": info.devices, "add_s": info.add_s, "granted_s": info.granted_s,
                         "serving": info.removed_at is None, **({k: st[k] for k in (
                             "requests", "batches", "busy_s", "useful_gpu_s", "card_share", "simulated")} if st else {})})
        return {"replicas": rows, "serving": len(self.replicas),
                "requests": sum(r.get("requests", 0) for r in rows),
                "busy_s": round(sum(r.get("busy_s", 0.0) for r in rows), 6),
                "useful_gpu_s": round(sum(r.get("useful_gpu_s", 0.0) for r in rows), 6)}


def _quiet(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or None when it fails: for clean-up after a failure that matters more."""
    try:
        return fn(*args)
    except Exception:
        return None
