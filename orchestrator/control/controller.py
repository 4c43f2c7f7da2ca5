"""The head's control logic: the lease ledger, the queue and the agents, as a plain class.

:class:`HeadController` imports no Ray: the head service
(:mod:`orchestrator.control.service`) owns one, calls :meth:`reconcile` and
carries out the :class:`ReconcileReport` it returns (start agents). Its parts
live beside it -- the ledger (:mod:`.ledger`), the node registry
(:mod:`.nodes`), the read views (:mod:`.views`), the preemption rules
(:mod:`.preempting`) and the hand-out (:mod:`.handout`); this module is the
one that changes them.

Contract (as the Ray Serve controller states its own):

* **Hard state first.** Leases, the queue (the pending leases and their
  order) and the fencing counter are written to the store *before* the
  controller answers a caller or hands devices to an agent. The counter is
  written before the leases it covers, so a restore never reissues a token.
* **Idempotent.** Every state-changing call may be retried by its caller:
  ``request_lease`` with a known id and the same request returns that id;
  ``activate`` of an active lease, ``release`` of a released one and
  ``register_agent`` of a known incarnation return what the first call did.
* **Desired apart from actual.** The ledger is the desired state of every
  node's devices; agents report what they actually handed out in their
  heartbeats and receive the desired set in the reply (pull, so a lost
  message is repaired by the next heartbeat).

A reconcile cycle (:meth:`reconcile`) is a numbered script: (1) expire agents silent past the TTL --
their nodes and leases are *lost*, and leases asked to be requeued get a new attempt
(:func:`~orchestrator.core.ids.next_attempt`) at the same queue position; (2) lose the leases
of dead holders (at most every ``HOLDER_CHECK_EVERY_S``); (3) expire grants never activated within ``grant_ttl_s``; (4) stop preemption
victims past their grace deadline; (4b) move MIG repartitions on (:mod:`.repartition`: cordon, drain,
apply, uncordon); (5) schedule the queue over the snapshot (:meth:`_plan`, the
one call site of :func:`orchestrator.scheduling.cycle.schedule`) and grant what fits; (6) ask for
an agent on every live Ray node without one; (7) every 10 s, prune leases ended
``ended_retention_s`` ago, from the store first, keeping one while its retry lives; (8) bring the
placement engine's node totals of the requests placed since the last cycle up to date with the
snapshot (:func:`orchestrator.scheduling.engine.warm`), so that the next call that asks alike is
placed without recomputing them (the cycle runs while the call that woke it waits for its commit).

Time windows: step 5 schedules with the quotas of the window in force at the injected
``day_clock``'s time of day (:func:`orchestrator.scheduling.windows.effective_config`,
percentages of the registered GPUs); a change of window counts as a change (the queue is
scheduled again at once). ``clock`` stays the monotonic time of leases and delays.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence

from orchestrator.control import preempting, revocation, views
from orchestrator.control.handout import lease_handout
from orchestrator.control.ledger import Ledger, LedgerEntry
from orchestrator.control.nodes import AgentStart, NodeRecord, NodeRegistry, NodeState, RayNodeInfo
from orchestrator.control.repartition import Repartitions
from orchestrator.control.store import StateStore
from orchestrator.core.allocation import Allocation
from orchestrator.core.clock import Clock, SystemClock
from orchestrator.core.config import RuntimeSettings
from orchestrator.core.errors import InvalidRequestError, StaleFencingTokenError
from orchestrator.core.inventory import NodeInventory
from orchestrator.core.lease import Lease, LeaseRequest, LeaseState, key_matches
from orchestrator.core.priorities import SchedulerConfig
from orchestrator.core.reasons import Cause
from orchestrator.scheduling.cycle import PendingItem, Plan, schedule
from orchestrator.scheduling.engine import warm
from orchestrator.scheduling.policies import get_policy
from orchestrator.scheduling.repartition import MigSlot, MigTarget, RepartitionPlan, must_move, plan_repartition
from orchestrator.scheduling.snapshot import ClusterSnapshot, NodeSpec
from orchestrator.scheduling.windows import WindowStatus, effective_config, window_status

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ReconcileReport:
    """What one cycle did, and what the wrapper must do (start agents)."""

    lost_nodes: list[str] = field(default_factory=list)
    lost_leases: list[str] = field(default_factory=list)
    expired_leases: list[str] = field(default_factory=list)
    granted: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    start_agents: list[AgentStart] = field(default_factory=list)
    checkpoint_requested: list[str] = field(default_factory=list)  # victims asked to checkpoint
    preempted: list[str] = field(default_factory=list)  # victims whose holders must now be stopped
    pruned: list[str] = field(default_factory=list)  # ended leases dropped after settings.ended_retention_s
    pruned_before: float | None = None  # the cutoff of this cycle's prune pass, when one ran (jobs use it too)
    plan_seconds: float | None = None  # wall time of this cycle's scheduling pass, when one ran with work
    reconfigured: list[str] = field(default_factory=list)  # MIG repartitions done (the agent shows the new layout)
    reconfigure_failed: list[str] = field(default_factory=list)  # MIG repartitions failed (old layout kept)


HolderProbe = Callable[[Sequence[str]], Mapping[str, bool]]

#: Step 2 (dead holders) runs at most this often (head clock): it walks every active lease and asks the
#: probe (the head's: a read of Ray's actor table) about their holders, ~10 ms at 12,000 active leases
#: besides the read, so every cycle was too often. The one throttle of that read: a holder's death is seen
#: within this.
HOLDER_CHECK_EVERY_S = 1.0


class HeadController:
    """The head's state and decisions; see the module docstring for the contract."""

    def __init__(self, settings: RuntimeSettings, store: StateStore, *, clock: Callable[[], float],
                 holder_probe: HolderProbe = lambda hs: {h: True for h in hs}, sched_config: SchedulerConfig | None = None,
                 day_clock: Clock | None = None, token_secret: bytes | None = None) -> None:
        self.settings = settings
        self.sched_config = sched_config or SchedulerConfig()
        self.day_clock: Clock = day_clock or SystemClock()  # the time of day time windows read
        self._window_key: tuple[str | None, float] | None = None  # (window in force, GPU capacity) last applied
        self._window_cfg = self.sched_config
        self.store = store
        self.clock = clock
        self.holder_probe = holder_probe
        self.policy = get_policy(self.sched_config.policy)
        self.ledger = Ledger(store, settings.namespace, token_secret)  # tokens are made from the head's secret
        self.nodes = NodeRegistry(store, settings.namespace)
        self.repartitions = Repartitions(store, settings.namespace)
        self._last_enqueued = 0.0
        self._snap = ClusterSnapshot.build([], timeslice_capacity_milli=settings.timeslice_capacity_milli)
        self._stale = False  # nodes changed with nothing on them: rebuild the snapshot before its next use
        self._specs: dict[str, tuple[NodeInventory, NodeSpec]] = {}  # per node: its inventory as the engine sees it
        self._dirty = False  # the queue may have become schedulable (new request, freed devices, new node)
        self._last_schedule = float("-inf")
        self._last_reconcile = float("inf")  # no cycle yet: nothing to forgive
        self._last_prune = float("-inf")
        self._last_holder_check = float("-inf")

    # ---- persistence ---------------------------------------------------------------------------
    def restore(self) -> int:
        """Load the ledger, queue, counter and node inventories from the store; returns the leases loaded.

        Restored nodes count as just seen: their agents kept running while the head
        restarted and get a full TTL to heartbeat to the new head.
        """
        self.nodes.restore(self.clock())
        entries = self.ledger.restore()
        self.repartitions.restore()
        self._last_enqueued = max([self._last_enqueued] + [e.enqueued_at for e in entries])
        self._rebuild_snapshot()
        self._dirty = True
        return len(entries)

    # ---- the public API (the head service forwards these) ---------------------------------------
    def request_lease(self, data: LeaseRequest | Mapping[str, Any]) -> str:
        spec = LeaseRequest.parse(data)
        known = self.ledger.find(spec.lease_id)
        if known is not None:
            if known.spec != spec:
                raise InvalidRequestError("lease_request.lease_id", spec.lease_id, "an id not used before",
                                          detail="that id already names a different request")
            return spec.lease_id
        class_name, pclass = self.sched_config.priority_class(spec.priority_class or None)
        self.sched_config.queue(spec.queue)
        return self.enqueue(spec, class_name, pclass.priority)

    def enqueue(self, spec: LeaseRequest, class_name: str, priority: int) -> str:
        """Queue a request whose class and queue the caller already resolved (the job layer's admission did)."""
        known = self.ledger.find(spec.lease_id)
        if known is not None:
            return spec.lease_id
        now = self.clock()
        self.ledger.seq += 1
        self.ledger.put_meta()
        if spec.enqueued_at is not None:
            enqueued = spec.enqueued_at
        else:
            # The scheduler breaks priority ties by submission time, then id: keep arrival order strict.
            self._last_enqueued = enqueued = max(now, self._last_enqueued + 1e-6)
        entry = LedgerEntry(Lease.new(spec.lease_id, spec.request, now=now, owner=spec.owner,
                                      priority=spec.priority or priority, priority_class=class_name,
                                      queue=spec.queue, gang=spec.gang.gang_id if spec.gang else None),
                            spec, self.ledger.seq, enqueued)
        self.ledger.commit([entry])
        self._dirty = True
        return spec.lease_id

    def get_lease(self, lease_id: str, key: str | None = None) -> dict[str, Any]:
        """The lease's view; its fencing token only for the requester's ``key``."""
        e = self.ledger.get(lease_id)
        return e.to_dict(reveal=key_matches(e.spec.requester_digest, key))

    def current_attempt(self, lease_id: str) -> str:
        """Follow ``requeued_as`` from ``lease_id`` to its latest attempt."""
        return self.ledger.latest(lease_id).lease_id

    def activate(self, lease_id: str, token: int, holder: str | None = None,
                 workload: str | None = None) -> dict[str, Any]:
        """The holder started using its lease: ACTIVE (idempotent); the lease's public view, the token shown."""
        return self.activated(lease_id, token, holder, workload).to_dict(reveal=True)

    def activated(self, lease_id: str, token: int, holder: str | None = None,
                  workload: str | None = None) -> LedgerEntry:
        """:meth:`activate`, answering the lease's entry instead of its public view (for the job layer, which reads
        none of it: building the view cost as much as the change)."""
        e = self.ledger.get(lease_id)
        self._check_token(e, token)
        if workload is not None:
            why = revocation.protected_workload(workload, namespace=self.settings.namespace,
                                                head_name=self.settings.head_name)
            if why is not None:
                raise InvalidRequestError("workload", workload, "an actor, Ray job or process of the lease's holder",
                                          detail=f"a revocation never stops it: {why}")
        if e.lease.state is LeaseState.ACTIVE:
            if (holder and e.holder != holder) or (workload and e.workload != workload):
                self.ledger.commit([replace(e, holder=holder or e.holder, workload=workload or e.workload)])
            return self.ledger.get(lease_id)
        new = replace(e, lease=e.lease.transition(LeaseState.ACTIVE, now=self.clock(),
                                                  reason=f"activated by {holder or workload or 'its holder'}"),
                      holder=holder, workload=workload or e.workload)
        self.ledger.commit([new])
        return new

    def release(self, lease_id: str, token: int | None = None, reason: str = "released by its holder") -> dict[str, Any]:
        """End the lease as RELEASED and free its devices (idempotent: an ended lease is answered as it is); its
        public view, the token shown only to a caller that sent it."""
        e = self.ledger.get(lease_id)
        if e.lease.terminal:
            return e.to_dict()
        return self.released(lease_id, token, reason).to_dict(reveal=token is not None)

    def released(self, lease_id: str, token: int | None = None, reason: str = "released by its holder", *,
                 fence: bool = False) -> LedgerEntry:
        """:meth:`release`, answering the lease's entry instead of its public view (for the job layer).

        ``fence``: the lease's workload may still run (a job cancelled by its user, not ended by itself): like a
        preemption's victim, the lease ends but keeps its devices, revoking, until the node's agent has stopped
        the workload and confirmed (:func:`.revocation.must_confirm`); a card is never handed on under it."""
        e = self.ledger.get(lease_id)
        if e.lease.terminal:
            return e
        if e.lease.state is not LeaseState.PENDING:
            self._check_token(e, token)
        new = self._end(e, LeaseState.RELEASED, reason)
        node = e.lease.allocation.node_name if e.lease.allocation else ""
        fenced = fence and revocation.must_confirm(e, node in self.registered_nodes())
        if fenced:
            new = replace(new, revoking=True)
        self.ledger.commit([new])
        if fenced:
            self._dirty = True
        else:
            self._free(e)
        return new

    def register_agent(self, node_name: str, ray_node_id: str, incarnation: str,
                       inventory: NodeInventory | Mapping[str, Any]) -> dict[str, Any]:
        inv = inventory if isinstance(inventory, NodeInventory) else NodeInventory.model_validate(inventory)
        if inv.name != node_name:
            raise InvalidRequestError("inventory.name", inv.name, node_name, detail="inventory of another node")
        now = self.clock()
        old = self.nodes.get(node_name)
        if old is not None and old.incarnation == incarnation and old.state is NodeState.REGISTERED:
            self.nodes.touch(old, now)
            return self._ack(node_name)
        rec = NodeRecord(node_name, ray_node_id, incarnation, inv, NodeState.REGISTERED, now, now,
                         reason="registered" if old is None else f"re-registered (was {old.state.value})")
        self.nodes.commit(rec)
        self.nodes.starts.pop(node_name, None)
        self._topology_changed(node_name)
        self._dirty = True
        return self._ack(node_name)

    def update_inventory(self, node_name: str, incarnation: str, inventory: NodeInventory | Mapping[str, Any]) -> dict[str, Any]:
        """ListAndWatch: the agent pushes a changed inventory (health, XID events)."""
        rec = self.nodes.current(node_name, incarnation)
        if rec is None:
            return {"ok": False, "reregister": True}
        inv = inventory if isinstance(inventory, NodeInventory) else NodeInventory.model_validate(inventory)
        self.nodes.commit(replace(rec, inventory=inv, last_seen=self.clock()))
        self._topology_changed(node_name)
        self._dirty = True
        return {"ok": True}

    def heartbeat(self, node_name: str, incarnation: str, allocated: Sequence[str] = (),
                  rejected: Mapping[str, str] | None = None, mig_uuids: Mapping[str, str] | None = None,
                  utilization: Mapping[str, float] | None = None, revoked: Sequence[str] = (),
                  checkpointed: Mapping[str, str] | None = None,
                  reconfigure_failed: Mapping[str, str] | None = None) -> dict[str, Any]:
        """An agent's heartbeat: what it holds, stopped and checkpointed, and MIG layouts it could not apply;
        the reply carries what it should hold, what it must stop (:mod:`.revocation`) and the MIG layouts
        to apply (``reconfigure``, :mod:`.repartition`)."""
        rec = self.nodes.current(node_name, incarnation)
        if rec is None:
            return {"ok": False, "reregister": True}
        self.nodes.touch(rec, self.clock(), tuple(allocated))
        self.nodes.measure(node_name, utilization)
        self.repartitions.agent_failed(node_name, reconfigure_failed)
        for e in revocation.confirm(self.ledger, node_name, revoked):  # the agent stopped them: free now
            self._free(e)
        for lease_id, path in (checkpointed or {}).items():
            e = self._on_node(node_name, lease_id)
            if e is not None and e.lease.state is LeaseState.CHECKPOINTING:
                self.ack_preemption(lease_id, path, reason=f"checkpoint written through the agent of {node_name}")
        changed: list[LedgerEntry] = []
        for lease_id, uuid in (mig_uuids or {}).items():
            e = self._on_node(node_name, lease_id)
            if e is not None and e.lease.holding and e.handout is None and e.lease.allocation is not None:
                changed.append(replace(e, handout=lease_handout(e.lease, rec.ray_node_id, self.settings, mig_uuid=uuid,
                                                                node_gpu_uuids=_uuids(rec))))
        if changed:
            self.ledger.commit(changed)
        for lease_id, why in (rejected or {}).items():
            e = self._on_node(node_name, lease_id)
            if e is not None and e.lease.holding:
                self._lose([e], f"agent on {node_name} refused the devices: {why}", ReconcileReport())
        return {"ok": True, "assignments": revocation.node_assignments(self.ledger, node_name),
                "revocations": revocation.node_revocations(self.ledger, node_name),
                "reconfigure": self.repartitions.node_work(node_name)}

    def _on_node(self, node_name: str, lease_id: str) -> LedgerEntry | None:
        """Lease ``lease_id``'s entry when it is placed on ``node_name``: an agent's heartbeat acts on the leases of
        its own node only (another node's lease, or an unknown id, is ignored and logged)."""
        e = self.ledger.find(lease_id)
        a = e.lease.allocation if e is not None else None
        if a is None or a.node_name != node_name:
            log.warning("the agent of %s reported lease %s, which is not on its node: ignored", node_name, lease_id)
            return None
        return e

    def observe_ray_nodes(self, nodes: Iterable[RayNodeInfo]) -> None:
        """The live Ray nodes (the wrapper reads the GCS node table); used to decide where agents go."""
        self.nodes.observe(nodes)

    def agent_start_requested(self, node_name: str) -> None:
        self.nodes.starts[node_name] = self.clock()

    # ---- the reconcile cycle -------------------------------------------------------------------
    def reconcile(self) -> ReconcileReport:
        """One cycle; see the module docstring."""
        now = self.clock()
        report = ReconcileReport()
        if now - self._last_reconcile > self.settings.agent_ttl_s / 2:
            # The head itself was away (its loop blocked, a GC pause, a restart): it could not hear the agents
            # meanwhile, so their silence says nothing about them. A fresh TTL each, from now.
            self.nodes.heard_all(now)
        self._last_reconcile = now
        self._expire_agents(now, report)        # 1
        if now - self._last_holder_check >= HOLDER_CHECK_EVERY_S:  # 2, at most once a second
            self._last_holder_check = now
            self._release_dead_holders(report)
        self._expire_grants(now, report)        # 3
        self._end_overdue_checkpoints(now, report)  # 4
        if self.repartitions.live() and self.repartitions.step(self, now, report):  # 4b
            self._uncordon()
        # 5: schedule on change, and at least once a second while anything waits: time alone
        # makes work preemptible (minimum runtimes pass) and ages the queue.
        self._apply_window()
        if self._dirty or (now - self._last_schedule >= 1.0 and self.ledger.in_state(LeaseState.PENDING)):
            self._last_schedule = now
            self._schedule(now, report)
        report.start_agents.extend(self.nodes.agents_to_start(now, self.settings.agent_ttl_s))  # 6
        if now - self._last_prune >= 10.0:      # 7, every 10 s: nothing here is urgent
            self._last_prune = now
            self._prune_ended(now, report)
        warm(self._snapshot, self.policy)       # 8
        return report

    def _prune_ended(self, now: float, report: ReconcileReport) -> None:
        """Drop ended leases ``ended_retention_s`` after they ended (0 keeps them; :meth:`Ledger.prune_ended`)."""
        if self.settings.ended_retention_s:
            report.pruned_before = now - self.settings.ended_retention_s
            report.pruned.extend(self.ledger.prune_ended(report.pruned_before))

    def _expire_agents(self, now: float, report: ReconcileReport) -> None:
        for rec, why in self.nodes.silent(now, self.settings.agent_ttl_s):
            self.nodes.commit(replace(rec, state=NodeState.LOST, reason=why))
            report.lost_nodes.append(rec.name)
            # A silent agent on a Ray node that is still there: its holders may well run on. Their leases end,
            # but stay fenced (revoking) until the node's next agent stops them and confirms; only a node that
            # left Ray frees its devices at once.
            fence = self.nodes.ray_node_alive(rec)
            if not fence:
                for e in revocation.confirm(self.ledger, rec.name):  # a node gone frees what it was stopping
                    self._free(e)
            self._lose([e for e in self.ledger.occupying_on(rec.name) if e.lease.holding], f"node {rec.name} lost: {why}",
                       report, fence=fence)
            self._topology_changed(rec.name)
        for rec in self.nodes.gone_while_lost():  # fenced leases of a node that has since left Ray: free now
            for e in revocation.confirm(self.ledger, rec.name):
                self._free(e)

    def _lose(self, entries: list[LedgerEntry], reason: str, report: ReconcileReport, *, requeue: bool = True,
              fence: bool = False) -> None:
        """End ``entries`` as LOST (a retry for those asked with ``requeue_on_loss``). ``fence``: one whose
        workload may still run keeps its devices, revoking, until an agent confirms it stopped."""
        if not entries:
            return
        now = self.clock()
        out: list[LedgerEntry] = []
        fenced: set[str] = set()
        for e in entries:
            new_id = None
            if requeue and e.spec.requeue_on_loss:
                retry = preempting.retry_of(e, reason, now)
                new_id = retry.lease_id
                out.append(retry)
                report.requeued.append(new_id)
            lost = replace(self._end(e, LeaseState.LOST, reason), requeued_as=new_id)
            if fence and e.workload and e.lease.state in (LeaseState.ACTIVE, LeaseState.CHECKPOINTING):
                lost = replace(lost, revoking=True)
                fenced.add(e.lease_id)
            out.append(lost)
            report.lost_leases.append(e.lease_id)
        self.ledger.commit(out)  # the retry is written before the lost lease that points to it
        for e in entries:
            if e.lease_id not in fenced:
                self._free(e)
        self._dirty = True

    def _release_dead_holders(self, report: ReconcileReport) -> None:
        active = [e for e in self.ledger.in_state_any_order(LeaseState.ACTIVE) if e.holder]
        if not active:
            return
        alive = self.holder_probe([e.holder for e in active if e.holder])
        dead = self.ledger.in_order([e.lease_id for e in active if alive.get(e.holder or "", True) is False])
        # A dead holder is not requeued: what to do about a crashed workload is the job layer's call.
        self._lose(dead, "holder died", report, requeue=False)

    def _expire_grants(self, now: float, report: ReconcileReport) -> None:
        ttl = self.settings.grant_ttl_s
        for e in self.ledger.in_state(LeaseState.GRANTED):
            if now - (e.lease.entered(LeaseState.GRANTED) or now) > ttl:
                self.ledger.commit([self._end(e, LeaseState.EXPIRED, f"not activated within {ttl:g}s")])
                self._free(e)
                report.expired_leases.append(e.lease_id)

    def may_schedule(self) -> bool:
        """Whether a cycle now could grant something: a request waits and the queue may have become schedulable
        since the last plan (a request, freed devices, a node). Otherwise the next tick's cycle is as good."""
        return self._dirty and self.ledger.count(LeaseState.PENDING) > 0

    def schedule_now(self, most: int = 1) -> ReconcileReport:
        """The fast grant path: schedule at once, outside a cycle, when the queue holds at least one request
        and at most ``most`` (one; or the requests of the calls a client sent together, which are planned
        together).

        A request that finds nothing else waiting is placed in the call that brought it, instead of a
        cycle later. The same plan a cycle makes (:meth:`_schedule`, time windows applied first); with
        more requests waiting the next cycle schedules them together, so a burst costs one plan
        per cycle rather than one per request over the whole queue."""
        report = ReconcileReport()
        if 1 <= self.ledger.count(LeaseState.PENDING) <= most:
            self._apply_window()
            now = self.clock()
            self._last_schedule = now
            self._schedule(now, report)
        return report

    def _schedule(self, now: float, report: ReconcileReport) -> None:
        self._dirty = False
        pending = self.ledger.in_state(LeaseState.PENDING)
        if not pending:
            return
        started = time.perf_counter()
        plan = self._plan(pending, now)
        report.plan_seconds = time.perf_counter() - started
        grants: list[LedgerEntry] = []
        for g in plan.grants:  # all fit: the plan was made on the snapshot and took each in turn (Plan.after)
            e = self.ledger.get(g.item_id)
            self.ledger.fencing += 1
            lease = e.lease.grant(g.placement.allocation, self.ledger.make_token(e.lease_id), now=now,
                                  reason=str(g.reason))
            rec = self.nodes.records[g.placement.allocation.node_name]
            grants.append(replace(e, lease=lease, handout=lease_handout(lease, rec.ray_node_id, self.settings,
                                                                        node_gpu_uuids=_uuids(rec)),
                                  why_pending="", waiting=None))
        if grants:
            self.ledger.put_meta()  # the counter first: a restore never reissues a token
            self.ledger.commit(grants)
            self._snap = plan.after
            report.granted.extend(g.lease_id for g in grants)
        for w in plan.waiting:
            self.ledger.soft(self.ledger.get(w.item_id), why_pending=str(w.reason), waiting=w)
        if plan.preemptions:
            self._start_preemptions(plan, now, report)

    def _plan(self, pending: Sequence[LedgerEntry], now: float) -> Plan:
        """The one call site of the scheduler (``orchestrator.scheduling.cycle.schedule``)."""
        checkpointing = self.ledger.in_state(LeaseState.CHECKPOINTING)
        nominated = self.ledger.nominated()
        items = [PendingItem(e.lease_id, e.spec.request, e.lease.priority, e.lease.priority_class, e.enqueued_at,
                             queue=e.spec.queue, nominated=e.lease_id in nominated, gang=e.spec.gang)
                 for e in pending]
        in_flight = frozenset(e.lease_id for e in checkpointing)
        window = self.window() if self.sched_config.windows else None
        return schedule(self._snapshot, items, lambda: [e.lease for e in self.ledger.holding()], self._window_cfg,
                        now, self.policy, in_flight=in_flight, window=window, usage=self.ledger.queue_usage())

    # ---- time windows ----------------------------------------------------------------------------
    def capacity_gpus(self) -> float:
        """The cards of the registered nodes: what a window's ``quota_pct`` is a share of."""
        return float(self._snapshot.static.present.sum())

    def window(self) -> WindowStatus:
        """The time window in force now, its quotas and the next change (:func:`.windows.window_status`)."""
        return window_status(self.sched_config, self.day_clock.time_of_day_s(), self.capacity_gpus())

    def set_day_clock(self, clock: Clock) -> None:
        """Read the time of day from ``clock`` from now on; the next cycle applies the window in force."""
        self.day_clock = clock
        self._window_key = None
        self._dirty = True

    def _apply_window(self) -> None:
        """Step 5's config: the configured one with the quotas of the window in force. Rebuilt only when the
        window or the capacity changes, which marks the queue for scheduling."""
        if not self.sched_config.windows:
            return
        tod, capacity = self.day_clock.time_of_day_s(), self.capacity_gpus()
        cfg, w = effective_config(self.sched_config, tod, capacity)
        key = (w.name if w else None, capacity)
        if key != self._window_key:
            self._window_key, self._window_cfg = key, cfg
            self._dirty = True

    # ---- preemption ------------------------------------------------------------------------------
    def _start_preemptions(self, plan: Plan, now: float, report: ReconcileReport) -> None:
        """Carry out the plan's preemptions: ask checkpointing victims to checkpoint (grace period),
        stop the others at once. Written to the store before anyone is told."""
        victims = []
        for p in plan.preemptions:
            e = self.ledger.find(p.victim.lease_id)
            if e is None or not e.lease.holding or e.lease.state is LeaseState.CHECKPOINTING:
                continue
            by = self.ledger.find(p.for_item)
            for_owner = (by.spec.owner if by else p.for_item).removeprefix("job:")
            victims.append((e, p.for_item, p.reason.cause.value, f"preempted for {for_owner or p.for_item}: {p.reason}"))
        self._preempt(victims, now, report)

    def _preempt(self, victims: Sequence[tuple[LedgerEntry, str, str, str]], now: float,
                 report: ReconcileReport) -> None:
        """Preempt each ``(entry, for_item, cause, why)``: ask it to checkpoint or stop it (its class decides)."""
        asked: list[LedgerEntry] = []
        stopped: list[tuple[LedgerEntry, LedgerEntry]] = []
        for e, for_item, cause, why in victims:
            _, pclass = self.sched_config.priority_class(e.lease.priority_class or None)
            new = preempting.ask_or_stop(e, pclass, for_item=for_item, now=now, cause=cause, why=why)
            if new.state is LeaseState.CHECKPOINTING:
                asked.append(new)
            else:
                stopped.append((e, new))
        self.ledger.commit(asked)
        for e, new in stopped:
            self._settle_preempted(e, new)
        report.checkpoint_requested.extend(e.lease_id for e in asked)
        report.preempted.extend(e.lease_id for e, _ in stopped)

    def ack_preemption(self, lease_id: str, checkpoint_path: str | None, token: int | None = None,
                       reason: str = "checkpoint acknowledged") -> dict[str, Any]:
        """The victim checkpointed (or stopped): end the lease as PREEMPTED and free its devices. Idempotent."""
        e = self.ledger.get(lease_id)
        if e.lease.state is LeaseState.PREEMPTED:
            return e.to_dict()
        if token is not None:
            self._check_token(e, token)
        if e.lease.state is not LeaseState.CHECKPOINTING:
            raise InvalidRequestError("lease_id", lease_id, "a lease being preempted (checkpointing)",
                                      detail=f"lease is {e.lease.state.value}")
        new = preempting.acknowledged(e, checkpoint_path, reason, self.clock())
        return self._settle_preempted(e, new, checkpointed=checkpoint_path is not None).to_dict(reveal=token is not None)

    def _settle_preempted(self, e: LedgerEntry, new: LedgerEntry, *, checkpointed: bool = False) -> LedgerEntry:
        """Write a victim's PREEMPTED entry: requeued to resume if it asked, and its devices freed now
        or fenced until its agent confirms (:func:`.revocation.must_confirm`)."""
        node = e.lease.allocation.node_name if e.lease.allocation else ""
        fenced = revocation.must_confirm(e, node in self.registered_nodes(), checkpointed=checkpointed)
        out = preempting.requeued_if_asked(replace(new, revoking=fenced), self.clock())
        self.ledger.commit(out)  # the retry first: it is written before the entry that points to it
        new = out[-1]
        if not fenced:
            self._free(e)
        self._dirty = True
        return new

    def report_checkpoint(self, lease_id: str, checkpoint_path: str, at: float | None = None) -> dict[str, Any]:
        """A holder wrote a checkpoint (periodic or not): less work is lost if it is preempted now."""
        e = self.ledger.get(lease_id)
        if not e.lease.holding:
            return e.to_dict()
        new = preempting.checkpoint_reported(e, checkpoint_path, self.clock() if at is None else at)
        self.ledger.commit([new])
        return new.to_dict()

    def _end_overdue_checkpoints(self, now: float, report: ReconcileReport) -> None:
        for e in self.ledger.in_state(LeaseState.CHECKPOINTING):
            if e.preempt_deadline is not None and now > e.preempt_deadline:
                self.ack_preemption(e.lease_id, None, reason="grace period over without a checkpoint: stopped")
                report.preempted.append(e.lease_id)

    # ---- MIG repartitioning (control.repartition runs it; these are its hooks) ------------------------
    def request_repartition(self, target: MigTarget, *, dry_run: bool = False) -> dict[str, Any]:
        """Plan ``target`` over the current snapshot and the holding leases, and (unless ``dry_run``) start it:
        the chosen GPUs are cordoned now and drained, reconfigured and uncordoned by the next cycles."""
        plan: RepartitionPlan = plan_repartition(
            self._snapshot, [e.lease for e in self.ledger.holding()], target, self.sched_config.classes,
            default_class=self.sched_config.default_class, busy=self.repartitions.busy())
        started = [] if dry_run else self.repartitions.start(plan, self.clock())
        for rec in started:
            self._snap = self._snapshot.with_health(rec.change.node, rec.change.gpu_index, False)
        if started:
            self._dirty = True
        return {"plan": plan.to_json(), "started": [r.repartition_id for r in started], "dry_run": dry_run}

    def occupying_gpu(self, node: str, gpu_index: int, keep: Collection[MigSlot] = ()) -> list[LedgerEntry]:
        """The entries whose devices on ``node`` include GPU ``gpu_index`` (revoking ones included), but for
        those on an instance of ``keep`` (:func:`~orchestrator.scheduling.repartition.must_move`)."""
        return [e for e in self.ledger.occupying_on(node)
                if e.lease.allocation is not None and gpu_index in e.lease.allocation.gpu_indices
                and (not keep or must_move(e.lease, keep))]

    def drain(self, node: str, gpu_index: int, *, for_item: str, why: str, report: ReconcileReport,
              keep: Collection[MigSlot] = ()) -> list[str]:
        """Preempt every holding lease on one GPU through the checkpoint path (requeued if it asked), but for
        those on an instance of ``keep``; leases on other GPUs are not touched. Returns the ids asked or stopped."""
        victims = [(e, for_item, Cause.LEASE_DRAINED.value, why) for e in self.occupying_gpu(node, gpu_index, keep)
                   if e.lease.holding and e.lease.state is not LeaseState.CHECKPOINTING]
        self._preempt(victims, self.clock(), report)
        return [e.lease_id for e, *_ in victims]

    def _uncordon(self) -> None:
        """A repartition ended: rebuild the snapshot, which keeps only the live repartitions' cordons."""
        self._stale = True
        self._dirty = True

    # ---- read views ------------------------------------------------------------------------------
    @property
    def measured(self) -> dict[str, dict[int, float]]:
        """Per node, GPU index -> utilisation its agent measured (NVML) in its last heartbeat."""
        return self.nodes.measured

    def explain_lease(self, lease_id: str) -> dict[str, Any]:
        """Why a lease is where it is (:func:`orchestrator.control.views.explain_lease`)."""
        return views.explain_lease(self.ledger, lease_id)

    def status(self) -> dict[str, Any]:
        st = views.status(self.ledger, self.nodes, settings=self.settings, policy=self.sched_config.policy,
                          now=self.clock())
        if self.sched_config.windows:
            st["head"]["window"] = self.window().to_json()
        return st

    def snapshot(self) -> ClusterSnapshot:
        """The current cluster snapshot (immutable; the head's ledger applied to the registered nodes)."""
        return self._snapshot

    @property
    def _snapshot(self) -> ClusterSnapshot:
        if self._stale:
            self._rebuild_snapshot()
        return self._snap

    def registered_nodes(self) -> list[str]:
        return [r.name for r in self.nodes.registered()]

    # ---- helpers -------------------------------------------------------------------------------
    def check_token(self, e: LedgerEntry, token: int | None) -> None:
        """Raise ``StaleFencingTokenError`` unless ``token`` is the lease's (None never is)."""
        if token is None or int(token) != e.lease.fencing_token:
            raise StaleFencingTokenError(e.lease_id, -1 if token is None else int(token))

    _check_token = check_token

    def _end(self, e: LedgerEntry, state: LeaseState, reason: str) -> LedgerEntry:
        return replace(e, lease=e.lease.transition(state, now=self.clock(), reason=reason))

    def _free(self, e: LedgerEntry) -> None:
        """Give a formerly holding lease's devices back to the snapshot (no-op if it held none)."""
        a = e.lease.allocation
        if not ((e.lease.holding or e.revoking) and a is not None):
            return
        if self._stale:  # the rebuild reads the ledger, where the lease has ended already: nothing left to release
            self._rebuild_snapshot()
            self._dirty = True
        elif a.node_name in self._snap.static.index:
            self._snap = self._snap.release(a)
            self._dirty = True

    def _ack(self, node_name: str) -> dict[str, Any]:
        return {"ok": True, "heartbeat_interval_s": self.settings.heartbeat_interval_s,
                "agent_ttl_s": self.settings.agent_ttl_s, "assignments": revocation.node_assignments(self.ledger, node_name),
                "revocations": revocation.node_revocations(self.ledger, node_name)}

    def _topology_changed(self, node_name: str) -> None:
        """A node joined, left or changed its inventory: rebuild the snapshot now if leases occupy it
        (one whose devices vanished is lost at once), else before the snapshot's next use -- a thousand
        agents registering then cost one rebuild, not a thousand."""
        if self.ledger.occupying_on(node_name):
            self._rebuild_snapshot()
        else:
            self._stale = True

    def _node_spec(self, inv: NodeInventory) -> NodeSpec:
        """The engine's view of an inventory, kept while the node's inventory is the same object."""
        cached = self._specs.get(inv.name)
        if cached is None or cached[0] is not inv:
            cached = self._specs[inv.name] = (inv, NodeSpec.from_inventory(inv))
        return cached[1]

    def _rebuild_snapshot(self) -> None:
        """A fresh snapshot of the registered nodes with every holding lease applied again.

        Topology changes (a node joins, is lost, reports new health) are rare; rebuilding
        keeps the snapshot a pure function of (inventories, ledger). A holding lease that
        no longer fits (its GPU vanished from the inventory) is lost.
        """
        self._stale = False
        invs = [r.inventory for r in self.nodes.registered()]
        snap = ClusterSnapshot.build([self._node_spec(inv) for inv in invs],
                                     timeslice_capacity_milli=self.settings.timeslice_capacity_milli)
        misfits: list[tuple[int, LedgerEntry]] = []
        located: list[tuple[int, LedgerEntry, Allocation]] = []
        for k, e in enumerate(sorted(self.ledger.occupying(), key=lambda e: e.lease.fencing_token)):
            a = e.lease.allocation
            if a is None or a.node_name not in snap.static.index:
                continue
            try:
                located.append((k, e, snap.locate(a)))
            except (InvalidRequestError, IndexError):
                misfits.append((k, e))
        snap, failed = snap.apply_many([moved for _, _, moved in located])
        refused = set(failed)
        for n, (k, e, moved) in enumerate(located):
            if n in refused:
                misfits.append((k, e))
            elif moved != e.lease.allocation:  # column positions change when nodes come and go
                self.ledger.soft(e, lease=replace(e.lease, allocation=moved))
        for node, gpus in self.repartitions.cordoned().items():  # a GPU being repartitioned takes no new grant
            if node in snap.static.index:
                for idx in sorted(gpus):
                    snap = snap.with_health(node, idx, False)
        self._snap = snap
        if misfits:  # a revoking one has ended already: it just stops occupying
            self.ledger.commit([revocation.confirmed(e) if e.revoking else
                                self._end(e, LeaseState.LOST, "its devices are no longer in the node's inventory")
                                for _, e in sorted(misfits, key=lambda m: m[0])])


def _uuids(rec: Any) -> tuple[str, ...]:
    """A node record's GPU UUIDs by index (what a lease's hand-out names the node's cards with)."""
    return tuple(g.uuid for g in sorted(rec.inventory.gpus, key=lambda g: g.index))
