"""The head, whole and in-process: the controller, the job layer and the metrics behind :class:`HeadApi`.

:class:`HeadService` is what the head actor (:mod:`orchestrator.rayport.head`)
runs and what tests run in-process: every method of
:class:`~orchestrator.core.api.HeadApi` is implemented by it once, over the
:class:`~orchestrator.control.controller.HeadController` and the
:class:`~orchestrator.control.jobs.JobManager`. What needs Ray is behind two
narrow ports: :class:`ClusterPort` (the GCS node and actor tables, starting an
agent) and :class:`~orchestrator.control.jobs.JobRunner` (Ray's job API).

Invariants:

* arguments arrive JSON-safe and are validated here, once: their declared
  types first (:mod:`.edge`, for every method), then into the typed models
  (``LeaseRequest``, ``JobSpec``, ``NodeInventory``); nothing inward
  validates them again. A lease no card of the cluster could ever hold is
  refused here, as a job is at submission
  (:func:`~orchestrator.scheduling.admission.check_request`);
* :meth:`HeadService.cycle` is the only place time moves the state on (one
  controller cycle, agents started, one job-layer step, metrics refreshed);
  the loops call :meth:`cycle_safely`, which logs an exception and lets the
  next cycle retry;
* :meth:`HeadService.wait_lease` in-process drives :meth:`cycle` itself; the
  actor answers it from :meth:`lease_settled` on its event loop instead;
* the one exception to "only a cycle moves the state on": :meth:`grant_now`,
  the fast grant path of ``acquire_lease``, schedules a request that is alone
  in the queue in the call that brought it (the same plan a cycle would make),
  or the requests of calls a client sent together (:meth:`begin`): one plan for
  them all, in the scheduler's order, each call answered after it;
* one mode for the job layer: a cycle (or a call) admits, cancels and drops jobs but calls Ray's job
  API for none of them; what it made due is handed out only once the store holds why
  (:mod:`orchestrator.control.jobs.launches`): by the head actor after its group commit, off its loop
  (``rayport.head.launch_off_loop``), and by whoever runs the head in-process through
  :func:`~orchestrator.control.jobs.launches.run_due` after its cycle (``tests/headless.py``);
* :class:`HeadService` is the one class that implements :class:`~orchestrator.core.api.HeadApi`. It is made
  of three parts, one per responsibility: this module (callers, time, leases, agents),
  :class:`~.service_jobs.JobMethods` (jobs, and the job API's hand-out side) and
  :class:`~.service_cluster.ClusterMethods` (status, metrics, the dashboard, the day clock, MIG). The two
  mixins hold no state of their own, and every API method, wherever defined, is wrapped by the edge check
  below the class;
* time windows read ``day_clock`` (an injected :class:`~orchestrator.core.clock.Clock`):
  the one given, else a compressed day when ``settings.day_clock`` is set, else the
  machine's local time (:func:`day_clock_of`).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import time
from typing import Any, Callable, Mapping, Protocol, Sequence

from pydantic import ValidationError

from orchestrator.control import edge, revocation
from orchestrator.control.controller import HeadController, ReconcileReport
from orchestrator.control.curves import CurveHistory
from orchestrator.control.demand import Demand, demand_of
from orchestrator.control.heap import HeapAction, HeapState, decide as decide_heap
from orchestrator.control.inventory_check import InventoryCheck
from orchestrator.control.jobs import JobManager, JobRunner
from orchestrator.control.metrics import HeadMetrics
from orchestrator.control.nodes import RayNodeInfo
from orchestrator.control.service_cluster import CLUSTER_LOCAL, ClusterMethods, cluster_local_url
from orchestrator.control.service_jobs import Begun, JobMethods
from orchestrator.control.store import StateStore
from orchestrator.core.api import HEAD_METHODS, Caller, Json
from orchestrator.core.clock import Clock, SystemClock
from orchestrator.core.config import ClusterConfig, RuntimeSettings, SimNode, Tuning
from orchestrator.core import credentials
from orchestrator.core.errors import InvalidRequestError, LeaseTimeoutError, PermissionDeniedError
from orchestrator.core.inventory import NodeInventory
from orchestrator.core.lease import LeaseRequest, LeaseState, key_matches
from orchestrator.core.validation import typed_error
from orchestrator.scheduling.admission import check_request
from orchestrator.scheduling.snapshot import ClusterSnapshot

log = logging.getLogger(__name__)

__all__ = ["CLUSTER_LOCAL", "JOB_STATUS_POLL_S", "TABLES_EVERY_S", "Begun", "ClusterPort", "HeadService",
           "cluster_local_url", "day_clock_of"]

#: How often the service re-reads the cluster's node and actor tables (a cycle may run faster). The default of
#: ``settings.tuning.tables_every_s``, which the service reads.
TABLES_EVERY_S = Tuning().tables_every_s

#: Seconds between two reads of the Ray status of the running jobs (one batched read: ``JobManager``). The
#: default of ``settings.tuning.job_status_poll_s``, which the service gives its job manager.
JOB_STATUS_POLL_S = Tuning().job_status_poll_s


class ClusterPort(Protocol):
    """What the head asks of the cluster it runs in (``rayport.head.RayClusterPort`` is the real one)."""

    def alive_nodes(self) -> list[RayNodeInfo]: ...

    def holders_alive(self, holders: Sequence[str]) -> Mapping[str, bool]: ...

    def start_agent(self, node_name: str, ray_node_id: str, sim_node: SimNode | None, agent_key: str) -> None:
        """Start node ``node_name``'s agent with ``agent_key``, its credential (core.credentials)."""


class HeadService(JobMethods, ClusterMethods):
    """The head's API over its parts; see the module docstring. The one class that implements
    :class:`~orchestrator.core.api.HeadApi` (with its parts :class:`JobMethods` and :class:`ClusterMethods`)."""

    def __init__(self, settings: RuntimeSettings, cluster: ClusterConfig, store: StateStore, runner: JobRunner,
                 port: ClusterPort, *, clock: Callable[[], float] = time.time, status_poll_s: float | None = None,
                 metrics: HeadMetrics | None = None, day_clock: Clock | None = None,
                 token_secret: bytes | None = None) -> None:
        self.settings = settings
        self.cluster = cluster
        self.port = port
        self.clock = clock
        self._nodes_read_at = float("-inf")
        self.ctl = HeadController(settings, store, clock=clock, holder_probe=port.holders_alive,
                                  sched_config=cluster.scheduler, day_clock=day_clock or day_clock_of(settings),
                                  token_secret=token_secret)
        tuning = settings.tuning
        self.jobs = JobManager(self.ctl, store, runner, clock=clock, namespace=settings.namespace,
                               head_name=settings.head_name,
                               status_poll_s=tuning.job_status_poll_s if status_poll_s is None else status_poll_s)
        if metrics is None:
            metrics = HeadMetrics(gauges_every_s=settings.metrics_gauges_every_s,
                                  priority_classes=cluster.scheduler.classes, queues=cluster.scheduler.queues,
                                  inference_services=settings.inference_services,
                                  curves=CurveHistory(origin=None, every_s=tuning.curves_every_s,
                                                      rate_s=tuning.curves_rate_s, window_s=tuning.curves_window_s))
        self.metrics = metrics
        self.metrics_port: int | None = None
        self.inventory_check: InventoryCheck | None = None  # soft state: the Kubernetes side sends it again
        self.metrics_url: str | None = None  # set by whoever serves the metrics (the head actor)
        self._dashboard: tuple[str, float] | None = None  # (url, announced until)
        self.store = store
        self.restored = self.ctl.restore()
        self.jobs.restore()
        self.started_at = clock()
        self._heap = HeapState()  # when the heap was last frozen and collected (orchestrator.control.heap)
        self._fast_reports: list[ReconcileReport] = []  # what grant_now did since the last cycle

    # ---- callers ---------------------------------------------------------------------------------
    def _new_agent_key(self, node_name: str) -> str:
        """The credential of node ``node_name``'s agent: an HMAC of the node's name under the head's secret (the one
        its tokens are made from), so a restarted head knows every agent's key without having written anything
        first (an agent started just before a head's crash would otherwise be refused by the head after it). A
        replaced agent keeps the key but not the node: its incarnation is refused (``NodeRegistry.current``)."""
        import hashlib
        import hmac

        return hmac.new(self.ctl.ledger.token_secret, b"agent\0" + node_name.encode(), hashlib.sha256).hexdigest()

    def _agent_digest(self, node_name: str) -> str:
        return credentials.digest(self._new_agent_key(node_name))

    def caller(self, creds: Any) -> credentials.Principal:
        """The :class:`~orchestrator.core.credentials.Principal` a transport's credentials prove (a wrong
        administrator or agent key is an ``InvalidRequestError``; none, an anonymous caller)."""
        return credentials.principal(creds, admin_digest=self.settings.admin_key_sha256,
                                     agent_digest=self._agent_digest)

    # ---- time ----------------------------------------------------------------------------------
    def cycle(self) -> ReconcileReport:
        """One step of everything time drives; see the module docstring."""
        now = time.monotonic()
        if now - self._nodes_read_at > self.settings.tuning.tables_every_s:
            self.ctl.observe_ray_nodes(self.port.alive_nodes())
            self._nodes_read_at = now
        report = self.ctl.reconcile()
        sim_nodes = {n.name: n for n in self.cluster.nodes} if report.start_agents else {}
        for start in report.start_agents:
            try:
                self.port.start_agent(start.node_name, start.ray_node_id, sim_nodes.get(start.node_name),
                                      self._new_agent_key(start.node_name))
                log.info("started agent on %s (%s)", start.node_name, start.reason)
            except Exception:
                log.exception("could not start the agent of %s", start.node_name)
            self.ctl.agent_start_requested(start.node_name)
        if report.pruned_before is not None:  # ended jobs go in the ledger's prune pass, at its cutoff
            pruned = self.jobs.prune_ended(report.pruned_before)
            if pruned:
                log.info("dropped %d job(s) ended before the retention cutoff", len(pruned))
        for event in self.jobs.reconcile():
            log.info("%s", event)
        fast, self._fast_reports = self._fast_reports, []
        self.metrics.update(self.ctl, _merged(fast, report), measured=self.ctl.measured)
        self._tend_heap()
        if report.lost_nodes or report.lost_leases:
            log.warning("lost nodes %s, lost leases %s, requeued %s", report.lost_nodes, report.lost_leases,
                        report.requeued)
        return report

    def _tend_heap(self) -> None:
        """Collect and freeze the heap as :func:`orchestrator.control.heap.decide` says.

        Once nodes have joined (at start-up, after a restore, when the cluster grows) and the
        agents asked for have registered -- or no more registered for a cycle -- collect garbage
        once and freeze what survives (``gc.freeze``); after that, every ``tuning.heap_freeze_every_s``
        of the head's clock, collect what came since (a collection walks only what is not frozen) and
        freeze it too; every ``tuning.heap_full_every_s``, unfreeze and collect everything once.

        Frozen, what the nodes and the settled leases brought is not walked by later
        collections, so a pause costs what changed since the last freeze instead of the whole
        heap (a million objects and more at 5,000 nodes and 50,000 leases). The price: a frozen
        object that later becomes part of a garbage cycle waits for the next full collection
        (ledger entries, leases and node records form no cycles; reference counting frees them)."""
        action, why, self._heap = decide_heap(self._heap, nodes=len(self.ctl.nodes.records),
                                              starts_pending=bool(self.ctl.nodes.starts), now=self.clock(),
                                              freeze_every_s=self.settings.tuning.heap_freeze_every_s,
                                              full_every_s=self.settings.tuning.heap_full_every_s)
        if action is HeapAction.NONE:
            return
        if action is HeapAction.FULL_COLLECT:
            gc.unfreeze()
        gc.collect()
        gc.freeze()
        if action is not HeapAction.FREEZE_RECENT:  # gc.get_freeze_count() walks every frozen object: not each time
            log.info("heap %s (%s): %d objects frozen", action.value, why, gc.get_freeze_count())

    def loop_due(self) -> bool:
        """Whether the head's loop has work now rather than at its next tick: something to hand Ray's job API, or a
        queue that may have become schedulable (:meth:`HeadController.may_schedule`). An answer from the job API
        that changed nothing else (a job now running) leaves the loop asleep."""
        return self.launch_due() or self.ctl.may_schedule()

    def cycle_safely(self) -> ReconcileReport | None:
        """:meth:`cycle`, logging instead of raising: one bad cycle never stops the loop (the next one retries)."""
        try:
            return self.cycle()
        except Exception:
            log.exception("reconcile cycle failed; the next one retries")
            return None

    def agent_work(self) -> dict[str, set[tuple[str, str]]]:
        """Per node, what its agent must act on now (:func:`revocation.agent_work`): whom the head wakes."""
        work = revocation.agent_work(self.ctl.ledger)
        for node, items in self.ctl.repartitions.agent_work().items():  # a MIG layout to apply
            work.setdefault(node, set()).update(items)
        return work

    def autoscaler_demand(self) -> Demand:
        """What the head asks Ray's autoscaler for now (:func:`~orchestrator.control.demand.demand_of`, at most
        ``settings.tuning.autoscaler_demand_max_bundles`` pending bundles); the head actor sends it."""
        return demand_of(self.ctl.ledger, self.settings.tuning.autoscaler_demand_max_bundles)

    # ---- leases --------------------------------------------------------------------------------
    def request_lease(self, lease_request: Mapping[str, Any]) -> str:
        spec = LeaseRequest.parse(lease_request)
        if self.ctl.ledger.find(spec.lease_id) is None:  # a retry returns its id even if the cluster shrank
            check_request(spec.request, self.ctl.snapshot())  # refuse what no card could ever hold
        return self.ctl.request_lease(spec)

    def get_lease(self, lease_id: str, key: str | None = None) -> Json:
        return self.ctl.get_lease(lease_id, key)

    def lease_settled(self, lease_id: str, key: str | None = None) -> Json | None:
        """The lease's latest attempt once handed out or ended for good; None while it is on its way.
        The fencing token is in it only for the requester's ``key``."""
        e = self.ctl.ledger.latest(lease_id)
        state = e.lease.state
        if (state is not LeaseState.PENDING and e.handout is not None) or state in (
                LeaseState.RELEASED, LeaseState.PREEMPTED, LeaseState.EXPIRED) or (
                state is LeaseState.LOST and not e.requeued_as):
            return e.to_dict(reveal=key_matches(e.spec.requester_digest, key))
        return None

    def lease_timeout(self, lease_id: str, timeout: float) -> LeaseTimeoutError:
        e = self.ctl.ledger.latest(lease_id)
        return LeaseTimeoutError(e.spec.request.describe(), timeout, e.why_pending or f"lease is {e.lease.state.value}")

    def wait_lease(self, lease_id: str, timeout: float, key: str | None = None) -> Json:
        deadline = time.monotonic() + timeout
        while (d := self.lease_settled(lease_id, key)) is None:
            if time.monotonic() >= deadline:
                raise self.lease_timeout(lease_id, timeout)
            self.cycle()
            time.sleep(min(0.05, self.settings.reconcile_interval_s))
        return d

    def request_lease_now(self, lease_request: Mapping[str, Any]) -> str:
        """Queue the request and try the fast grant path (:meth:`grant_now`); the lease id. What the waiting
        ``acquire_lease`` begins with, here and in the head actor (``acquire_lease_now`` is :meth:`begin`'s)."""
        lease_id = self.request_lease(lease_request)
        self.grant_now()
        return lease_id

    def acquire_lease(self, lease_request: Mapping[str, Any], timeout: float, key: str | None = None,
                      holder: str | None = None) -> Json:
        lease_id = self.request_lease_now(lease_request)
        return self.activate_settled(self.wait_lease(lease_id, timeout, key), key, holder)

    def acquire_lease_now(self, lease_request: Mapping[str, Any], key: str | None = None,
                          holder: str | None = None) -> Json:
        return self._planned(self._begin_acquire_lease_now(lease_request, key, holder))

    def _begin_acquire_lease_now(self, lease_request: Mapping[str, Any], key: str | None = None,
                                 holder: str | None = None) -> Begun:
        lease_id = self.request_lease(lease_request)

        def finish(_: ReconcileReport) -> Json:
            settled = self.lease_settled(lease_id, key)
            if settled is None:  # still on its way: it stays queued for the caller to wait on (or withdraw)
                return self.get_lease(lease_id, key)
            return self.activate_settled(settled, key, holder)
        return Begun(True, finish)

    #: The calls that queue a request and answer with what the fast grant path made of it: a client's calls of
    #: these sent together (``HeadActor.call_many``) are begun one by one and planned once (:meth:`begin`).
    PLANNED = frozenset({"submit_job", "acquire_lease_now"})

    def begin(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Begun:
        """The first half of ``name(*args, **kwargs)``, one of :data:`PLANNED`: its checks and its request queued,
        without the fast grant path. Calls begun together are then planned together, by one :meth:`grant_now`
        whose ``most`` is how many of them queued a request, and each is answered by its ``finish`` with that
        plan's report: one plan, in the scheduler's order (priority, then submission), where one call after
        another planned each request alone in the order the calls came. A refusal is raised here, as the whole
        call would raise it. Arguments are checked as for the call itself (:func:`.edge.check_args`). The plan:
        :meth:`plan_begun`."""
        if name not in self.PLANNED:
            raise InvalidRequestError("method", name, " | ".join(sorted(self.PLANNED)))
        edge.check_args(name, tuple(args), kwargs)
        return getattr(self, f"_begin_{name}")(*args, **kwargs)

    def plan_begun(self, begun: Sequence[Begun]) -> ReconcileReport:
        """One fast grant path for the requests that the calls ``begun`` together queued; when none queued one,
        no plan and an empty report. Each call is then answered by its ``finish`` with this report."""
        queued = sum(1 for b in begun if b.queued)
        return self.grant_now(queued) if queued else ReconcileReport()

    def _planned(self, begun: Begun) -> Json:
        """A call of :data:`PLANNED` made alone: begun, planned, finished."""
        return begun.finish(self.plan_begun([begun]))

    def grant_now(self, most: int = 1) -> ReconcileReport:
        """The fast grant path (:meth:`HeadController.schedule_now`): a request alone in the queue is placed
        in the call that brought it, and the requests of calls begun together (:meth:`begin`; ``most`` of them)
        in one plan after them; the next cycle does everything else (agents, jobs, metrics).

        Invariants: what it did (grants, victims asked to checkpoint, its plan time) reaches the metrics with
        the next cycle's report, as if that cycle had done it; its failure is logged and leaves the queue to the
        next cycle, as a failed cycle does, so the call that queued a request (or a job) still answers with it
        queued, never with an error for something it did."""
        try:
            report = self.ctl.schedule_now(most)
        except Exception:
            log.exception("fast grant path failed; the next cycle schedules the queue")
            return ReconcileReport()
        self._fast_reports.append(report)
        return report

    def activate_settled(self, settled: Json, key: str | None, holder: str | None) -> Json:
        """What ``acquire_lease`` answers: the settled view, activated by ``holder`` when it was granted and
        the requester's ``key`` revealed its token (only the requester may activate)."""
        if holder is None or settled.get("state") != LeaseState.GRANTED.value or settled.get("fencing_token") is None:
            return settled
        return self.ctl.activate(settled["lease_id"], int(settled["fencing_token"]), holder)

    def activate(self, lease_id: str, token: int, holder: str | None = None, workload: str | None = None,
                 key: str | None = None) -> Json:
        self.check_lease_key("activate", lease_id, key)
        return self.ctl.activate(lease_id, token, holder, workload)

    def release(self, lease_id: str, token: int | None = None, reason: str = "released by its holder",
                key: str | None = None, when_gone: bool = False) -> Json:
        self.check_lease_key("release", lease_id, key)
        return self.ctl.release(lease_id, token, reason, when_gone)

    def ack_preemption(self, lease_id: str, token: int, checkpoint_path: str | None = None,
                       key: str | None = None) -> Json:
        self.check_lease_key("ack_preemption", lease_id, key)
        return self.ctl.ack_preemption(lease_id, checkpoint_path, token,
                                       reason="checkpoint acknowledged by its requester")

    def check_lease_key(self, method: str, lease_id: str, key: str | None) -> None:
        """Refuse (:class:`PermissionDeniedError`) a call that changes lease ``lease_id`` without its requester's
        ``key``, in every state (pending, granted, active, checkpointing, ended): the token fences a holder against
        its own older attempts, the key says the caller is the requester or a holder it handed the lease to. A
        lease asked without a key (the head's own job leases) is changed only by the head itself. An unknown
        lease is ``UnknownObjectError``, as before."""
        if credentials.current().internal:
            return
        e = self.ctl.ledger.get(lease_id)
        if not key_matches(e.spec.requester_digest, key):
            raise PermissionDeniedError(method, Caller.LEASE_HOLDER.value, lease_id)

    def explain_lease(self, lease_id: str) -> Json:
        return self.ctl.explain_lease(lease_id)

    # ---- agents --------------------------------------------------------------------------------
    def register_agent(self, node_name: str, ray_node_id: str, incarnation: str, inventory: Mapping[str, Any]) -> Json:
        return self.ctl.register_agent(node_name, ray_node_id, incarnation, _inventory(inventory))

    def heartbeat(self, node_name: str, incarnation: str, allocated: Sequence[str] = (),
                  rejected: Mapping[str, str] | None = None, mig_uuids: Mapping[str, str] | None = None,
                  utilization: Mapping[str, float] | None = None, revoked: Sequence[str] = (),
                  checkpointed: Mapping[str, str] | None = None,
                  reconfigure_failed: Mapping[str, str] | None = None) -> Json:
        return self.ctl.heartbeat(node_name, incarnation, allocated or (), rejected, mig_uuids, utilization,
                                  revoked or (), checkpointed, reconfigure_failed)


    def update_inventory(self, node_name: str, incarnation: str, inventory: Mapping[str, Any]) -> Json:
        return self.ctl.update_inventory(node_name, incarnation, _inventory(inventory))


def day_clock_of(settings: RuntimeSettings) -> Clock:
    """The head's time of day: a compressed day from ``settings.day_clock`` (started now), else local time."""
    return settings.day_clock.build() if settings.day_clock is not None else SystemClock()


def _inventory(data: Mapping[str, Any]) -> NodeInventory:
    """An agent's inventory, validated at the edge: a typed error naming the field, and one the
    snapshot can be built from (a bad one would fail every rebuild after it was stored)."""
    try:
        inv = NodeInventory.model_validate(data)
    except ValidationError as e:
        raise typed_error(e, "inventory", NodeInventory) from None
    try:
        ClusterSnapshot.build([inv])
    except (InvalidRequestError, ValueError, IndexError, KeyError) as e:
        raise InvalidRequestError("inventory", inv.name, "an inventory the scheduler can place on",
                                  detail=str(e)) from None
    return inv


# Every method of the API checks its arguments' declared types first (orchestrator.control.edge).
for _name in HEAD_METHODS:
    setattr(HeadService, _name, edge.checked(_name, getattr(HeadService, _name)))


def _merged(earlier: list[ReconcileReport], report: ReconcileReport) -> ReconcileReport:
    """A copy of ``report`` with the fast grant path's reports since the last cycle folded in (lists joined,
    plan times added), so metrics count a preemption the fast path started as the cycle's own."""
    if not earlier:
        return report
    report = dataclasses.replace(report, **{f.name: list(getattr(report, f.name)) for f in dataclasses.fields(report)
                                            if isinstance(getattr(report, f.name), list)})
    for r in earlier:
        for f in dataclasses.fields(ReconcileReport):
            mine = getattr(report, f.name)
            if isinstance(mine, list):
                mine[:0] = getattr(r, f.name)
        if r.plan_seconds is not None:
            report.plan_seconds = (report.plan_seconds or 0.0) + r.plan_seconds
    return report
