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
on. Adding a replica is synchronous: ``step`` returns once the new replicas
serve (or their lease timed out), and :attr:`LeasedReplicaInfo.add_s` records
how long that took.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
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


class LeasedService:
    """An inference service whose every replica holds one lease; see the module docstring."""

    def __init__(self, cfg: ServiceConfig, *, head: HeadApi | None = None, namespace: str = "rgo",
                 address: str | None = None, clock: Clock | None = None, host: str = "127.0.0.1", port: int = 8000,
                 seed: int = 0, width: int = 256, lease_timeout_s: float = 120.0, drain_timeout_s: float = 10.0,
                 request: GpuRequest | None = None, perf: InferenceModel | None = None,
                 say: Callable[[str], None] = lambda s: None) -> None:
        """``request`` overrides ``cfg.request`` (a ``GpuRequest`` may carry constraints the ``--gpu`` string
        cannot, such as ``node``); ``perf`` is the replicas' batch cost model on simulated GPUs."""
        self.cfg, self.head, self.namespace, self.address = cfg, head, namespace, address
        self.request = request or cfg.gpu_request()
        self.perf = perf
        self.clock: Clock = clock or SystemClock()
        self.host, self.port, self.seed, self.width = host, port, seed, width
        self.lease_timeout_s, self.drain_timeout_s, self.say = lease_timeout_s, drain_timeout_s, say
        self.replicas: list[LeasedReplicaInfo] = []  # serving, oldest first
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
        """Serve, the ingress at ``/``, and ``replicas`` (default ``min_replicas``) leased replicas; the URL."""
        base = serve_api.start(self.host, self.port)
        self._ingress = serve_api.run(ingress_app(), self.ingress_name, route_prefix="/")
        self.url = base + "/"
        want = self.cfg.autoscale.min_replicas if replicas is None else replicas
        for _ in range(want):
            self._add(None)
        self.say(f"{self.cfg.name}: serving at {self.url} with {len(self.replicas)} leased replica(s)")
        return self.url

    def stop(self, *, shutdown_serve: bool = True) -> None:
        """Remove every replica (releasing its lease), the ingress, and Serve itself unless told not to."""
        while self.replicas:
            self._remove(None)
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
        before = len(self.replicas)
        if d.replicas != before:
            self._log("decide", s.t_s, replicas=d.replicas, before=before, ongoing=round(s.ongoing, 3),
                      p99_ms=s.p99_ms, reason=d.reason)
            self.say(f"{self.cfg.name}: {before} -> {d.replicas} replica(s): {d.reason.text}")
        while len(self.replicas) < d.replicas:
            if not self._add(d.reason):
                break  # not granted in time: the next step samples the real count
        while len(self.replicas) > d.replicas:
            self._remove(d.reason)
        return d

    # ---- replicas --------------------------------------------------------------------------------
    def _add(self, reason: Reason | None) -> bool:
        self._seq += 1
        name = f"{self.cfg.name}-r{self._seq}"
        t0 = time.monotonic()
        stack = ExitStack()
        kw: dict[str, Any] = {"head": self.head} if self.head is not None else {"address": self.address}
        try:
            le = stack.enter_context(lease(self.request, priority=self.cfg.priority_class,
                                           queue=getattr(self.cfg, "queue", "default"), namespace=self.namespace,
                                           owner=f"service:{self.cfg.name}", lease_id=name,
                                           timeout=self.lease_timeout_s, **kw))
        except LeaseTimeoutError as e:
            stack.close()
            self._log("add_failed", self.clock.monotonic(), replica=name, reason=reason, error=str(e))
            self.say(f"{name}: no lease within {self.lease_timeout_s:g}s: {e}")
            return False
        granted = time.monotonic() - t0
        try:
            opts = serve_api.replica_options(le.handout, le.node or "", num_cpus=0)
            handle = serve_api.run(replica_app(le.lease_id, opts, seed=self.seed, width=self.width,
                                               max_batch_size=self.cfg.max_batch_size,
                                               batch_wait_timeout_s=self.cfg.batch_wait_timeout_s, perf=self.perf),
                                   name)
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
        self.replicas.append(info)
        self._route()
        self._log("add", info.added_at, replica=name, lease_id=le.lease_id, kind=info.kind, node=info.node,
                  add_s=info.add_s, granted_s=info.granted_s, replicas=len(self.replicas), reason=reason)
        self.say(f"{name}: lease {le.lease_id} ({info.kind} on {info.node} {info.devices}) granted in "
                 f"{granted:.2f}s, serving {info.add_s:.2f}s after it was asked")
        return True

    def _remove(self, reason: Reason | None) -> None:
        info = self.replicas.pop()  # the newest: see "Which replica goes"
        self._route()
        deadline = time.monotonic() + self.drain_timeout_s
        while info.name in self.load(reset=False)["ongoing"] and time.monotonic() < deadline:
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
        for info in [*self.retired, *self.replicas]:
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
