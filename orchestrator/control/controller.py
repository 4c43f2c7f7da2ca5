"""The head's control logic: the lease ledger, the queue and the agents, as a plain class.

:class:`HeadController` imports no Ray. The head actor
(:mod:`orchestrator.rayport.head`) is a thin wrapper that owns one, calls
:meth:`HeadController.reconcile` in a loop and carries out the
:class:`ReconcileReport` it returns (start agents). Unit tests drive it with a
:class:`~orchestrator.control.store.MemoryStore`, an injected clock and fake
agents that call :meth:`register_agent` and :meth:`heartbeat` themselves.

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

A reconcile cycle reads as a numbered script (:meth:`reconcile`):

1. **expire agents** silent for longer than the TTL: their nodes become
   *lost*, the leases on them *lost*, and those asked to be requeued get a
   new pending attempt (``<id>#<n>``) that keeps its place in the queue;
2. **release dead holders**: an active lease whose holder actor died is lost
   and its devices freed;
3. **expire grants** never activated within ``grant_ttl_s``;
4. **end overdue checkpoints**: a preemption victim that has not yielded by
   its deadline is stopped;
5. **schedule** the queue over a snapshot of the registered nodes
   (:meth:`_plan`, the one call site of :func:`orchestrator.scheduling.cycle.schedule`)
   and grant what fits;
6. **desired agents**: every live Ray node without a registered agent gets
   one started (unless a start is already in flight);
7. **prune** (every 10 s) ended leases ``ended_retention_s`` after they ended,
   from the store first; one stays while the attempt it was requeued as is
   live. Until then a retried ``request_lease`` with the same id returns it.

Names: a *node* is one GPU node (one raylet); its *agent* is our device
plugin on it; an *incarnation* is one life of an agent (a fresh id each
start), so heartbeats of an agent the head has replaced are refused.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence


from orchestrator.core.errors import (
    CapacityError,
    InvalidRequestError,
    StaleFencingTokenError,
    UnknownObjectError,
)
from orchestrator.core.ids import next_attempt
from orchestrator.core.lease import Lease, LeaseRequest, LeaseState
from orchestrator.core.inventory import NodeInventory
from orchestrator.core.request import ShareKind
from orchestrator.scheduling.policies import get_policy
from orchestrator.core.allocation import Allocation
from orchestrator.scheduling.snapshot import ClusterSnapshot
from orchestrator.core.priorities import SchedulerConfig
from orchestrator.core.config import RuntimeSettings
from orchestrator.control.handout import make_handout
from orchestrator.control.store import StateStore
from orchestrator.scheduling.cycle import PendingItem, Plan, schedule
from orchestrator.core.statemachine import Transition



class NodeState(str, enum.Enum):
    REGISTERED = "registered"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """What the head knows of one node and its agent."""

    name: str
    ray_node_id: str
    incarnation: str
    inventory: NodeInventory
    state: NodeState
    last_seen: float
    registered_at: float
    reason: str = ""
    allocated: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ray_node_id": self.ray_node_id, "incarnation": self.incarnation,
                "inventory": self.inventory.model_dump(mode="json"), "state": self.state.value,
                "registered_at": self.registered_at, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One lease in the ledger, with what the head needs beside the lease value itself."""

    lease: Lease
    spec: LeaseRequest
    seq: int
    enqueued_at: float
    handout: dict[str, Any] | None = None
    holder: str | None = None
    attempt_of: str | None = None
    requeued_as: str | None = None
    why_pending: str = ""
    preempt_for: str | None = None
    preempt_reason: str = ""
    preempt_deadline: float | None = None
    waiting: Any = None  # soft state: the scheduler's Waiting for a pending lease, recomputed every cycle

    @property
    def lease_id(self) -> str:
        return self.lease.lease_id

    def to_json(self) -> dict[str, Any]:
        a = self.lease.allocation
        return {
            "spec": self.spec.model_dump(mode="json"), "seq": self.seq, "enqueued_at": self.enqueued_at,
            "priority": self.lease.priority, "priority_class": self.lease.priority_class,
            "state": self.lease.state.value, "fencing_token": self.lease.fencing_token,
            "allocation": a.to_json() if a else None,
            "history": [t.to_dict() for t in self.lease.history],
            "handout": self.handout, "holder": self.holder, "attempt_of": self.attempt_of,
            "requeued_as": self.requeued_as, "checkpoint_path": self.lease.checkpoint_path,
            "last_checkpoint_at": self.lease.last_checkpoint_at, "preempt_for": self.preempt_for,
            "preempt_reason": self.preempt_reason, "preempt_deadline": self.preempt_deadline,
        }

    def to_dict(self) -> dict[str, Any]:
        """The public view (``get_lease``, ``status``)."""
        d = self.lease.to_dict()
        d.update(request_spec=self.spec.request.model_dump(mode="json", exclude_defaults=True),
                 handout=self.handout, holder=self.holder, attempt_of=self.attempt_of,
                 requeued_as=self.requeued_as, why_pending=self.why_pending or None,
                 preempt_for=self.preempt_for, preempt_reason=self.preempt_reason or None,
                 preempt_deadline=self.preempt_deadline)
        return d


@dataclass(frozen=True, slots=True)
class AgentStart:
    """A node that needs an agent started on it."""

    node_name: str
    ray_node_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class RayNodeInfo:
    """A live Ray node as the head's wrapper sees it (from the GCS node table)."""

    ray_node_id: str
    name: str
    is_head: bool = False


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


class _Keys:
    def __init__(self, namespace: str) -> None:
        self.root = f"{namespace}/"
        self.meta = f"{namespace}/meta"
        self.lease_prefix = f"{namespace}/lease/"
        self.node_prefix = f"{namespace}/node/"

    def lease(self, lease_id: str) -> str:
        return self.lease_prefix + lease_id

    def node(self, name: str) -> str:
        return self.node_prefix + name


HolderProbe = Callable[[Sequence[str]], Mapping[str, bool]]


def _all_alive(holders: Sequence[str]) -> Mapping[str, bool]:
    return {h: True for h in holders}


class HeadController:
    """The head's state and decisions; see the module docstring for the contract."""

    def __init__(self, settings: RuntimeSettings, store: StateStore, *, clock: Callable[[], float],
                 holder_probe: HolderProbe = _all_alive, sched_config: SchedulerConfig | None = None) -> None:
        self.settings = settings
        self.sched_config = sched_config or SchedulerConfig()
        self.store = store
        self.clock = clock
        self.holder_probe = holder_probe
        self.policy = get_policy(self.sched_config.policy)
        self._keys = _Keys(settings.namespace)
        self._leases: dict[str, LedgerEntry] = {}
        self._nodes: dict[str, NodeRecord] = {}
        self._ray_nodes: dict[str, RayNodeInfo] = {}
        self._agent_starts: dict[str, float] = {}
        self._fencing = 0
        self._seq = 0
        self._last_enqueued = 0.0
        self._snapshot = ClusterSnapshot.build([], timeslice_capacity_milli=settings.timeslice_capacity_milli)
        self._dirty = False  # the queue may have become schedulable (new request, freed devices, new node)
        self._last_schedule = float("-inf")
        self._last_prune = float("-inf")

    # ---- persistence ---------------------------------------------------------------------------
    def restore(self) -> int:
        """Load the ledger, queue, counter and node inventories from the store; returns the leases loaded.

        Restored nodes count as just seen: their agents kept running while the head
        restarted and get a full TTL to heartbeat to the new head.
        """
        now = self.clock()
        meta = self.store.get(self._keys.meta) or {}
        self._fencing = int(meta.get("fencing", 0))
        self._seq = int(meta.get("seq", 0))
        for key in self.store.keys(self._keys.node_prefix):
            d = self.store.get(key)
            if d is None:
                continue
            self._nodes[d["name"]] = NodeRecord(
                name=d["name"], ray_node_id=d["ray_node_id"], incarnation=d["incarnation"],
                inventory=NodeInventory.model_validate(d["inventory"]), state=NodeState(d["state"]),
                last_seen=now, registered_at=d["registered_at"], reason=d.get("reason", ""))
        entries = []
        for key in self.store.keys(self._keys.lease_prefix):
            d = self.store.get(key)
            if d is not None:
                entries.append(d)
        self._rebuild_snapshot()
        for d in entries:
            spec = LeaseRequest.parse(d["spec"])
            history = tuple(Transition(h["at"], LeaseState(h["state"]), h["reason"]) for h in d["history"])
            alloc = Allocation.from_json(d["allocation"]) if d.get("allocation") else None
            lease = Lease(spec.lease_id, spec.request, spec.owner, d["priority"], d["priority_class"],
                          state=LeaseState(d["state"]), allocation=alloc, fencing_token=d["fencing_token"],
                          history=history, checkpoint_path=d.get("checkpoint_path"),
                          last_checkpoint_at=d.get("last_checkpoint_at"), queue=spec.queue)
            self._leases[spec.lease_id] = LedgerEntry(
                lease, spec, d["seq"], d["enqueued_at"], handout=d.get("handout"), holder=d.get("holder"),
                attempt_of=d.get("attempt_of"), requeued_as=d.get("requeued_as"),
                preempt_for=d.get("preempt_for"), preempt_reason=d.get("preempt_reason", ""),
                preempt_deadline=d.get("preempt_deadline"))
            self._seq = max(self._seq, d["seq"])
            self._last_enqueued = max(self._last_enqueued, d["enqueued_at"])
            self._fencing = max(self._fencing, d["fencing_token"])
        self._rebuild_snapshot()
        self._dirty = True
        return len(entries)

    def _put_meta(self) -> None:
        self.store.put(self._keys.meta, {"fencing": self._fencing, "seq": self._seq})

    def _commit(self, entries: Iterable[LedgerEntry]) -> None:
        """Write entries to the store, then make them current in memory (hard state first)."""
        entries = list(entries)
        for e in entries:
            self.store.put(self._keys.lease(e.lease_id), e.to_json())
        for e in entries:
            self._leases[e.lease_id] = e

    def _commit_node(self, rec: NodeRecord) -> None:
        self.store.put(self._keys.node(rec.name), rec.to_json())
        self._nodes[rec.name] = rec

    # ---- the public API (the head actor forwards these) ----------------------------------------
    def request_lease(self, data: LeaseRequest | Mapping[str, Any]) -> str:
        spec = LeaseRequest.parse(data)
        known = self._leases.get(spec.lease_id)
        if known is not None:
            if known.spec != spec:
                raise InvalidRequestError("lease_request.lease_id", spec.lease_id, "an id not used before",
                                          detail="that id already names a different request")
            return spec.lease_id
        class_name, pclass = self.sched_config.priority_class(spec.priority_class or None)
        self.sched_config.queue(spec.queue)
        now = self.clock()
        self._seq += 1
        self._put_meta()
        if spec.enqueued_at is not None:
            enqueued = spec.enqueued_at
        else:
            # The scheduler breaks priority ties by submission time, then id: keep arrival order strict.
            self._last_enqueued = enqueued = max(now, self._last_enqueued + 1e-6)
        entry = LedgerEntry(Lease.new(spec.lease_id, spec.request, now=now, owner=spec.owner,
                                      priority=spec.priority or pclass.priority, priority_class=class_name,
                                      queue=spec.queue),
                            spec, self._seq, enqueued)
        self._commit([entry])
        self._dirty = True
        return spec.lease_id

    def get_lease(self, lease_id: str) -> dict[str, Any]:
        return self._entry(lease_id).to_dict()

    def current_attempt(self, lease_id: str) -> str:
        """Follow ``requeued_as`` from ``lease_id`` to its latest attempt."""
        e = self._entry(lease_id)
        while e.requeued_as and e.requeued_as in self._leases:
            e = self._leases[e.requeued_as]
        return e.lease_id

    def activate(self, lease_id: str, token: int, holder: str | None = None) -> dict[str, Any]:
        e = self._entry(lease_id)
        self._check_token(e, token)
        if e.lease.state is LeaseState.ACTIVE:
            if holder and e.holder != holder:
                self._commit([replace(e, holder=holder)])
            return self._leases[lease_id].to_dict()
        new = replace(e, lease=e.lease.transition(LeaseState.ACTIVE, now=self.clock(),
                                                  reason=f"activated by {holder or 'its holder'}"), holder=holder)
        self._commit([new])
        return new.to_dict()

    def release(self, lease_id: str, token: int | None = None, reason: str = "released by its holder") -> dict[str, Any]:
        e = self._entry(lease_id)
        if e.lease.terminal:
            return e.to_dict()
        if e.lease.state is not LeaseState.PENDING:
            self._check_token(e, token)
        new = self._end(e, LeaseState.RELEASED, reason)
        self._commit([new])
        self._free(e)
        return new.to_dict()

    def register_agent(self, node_name: str, ray_node_id: str, incarnation: str,
                       inventory: NodeInventory | Mapping[str, Any]) -> dict[str, Any]:
        inv = inventory if isinstance(inventory, NodeInventory) else NodeInventory.model_validate(inventory)
        if inv.name != node_name:
            raise InvalidRequestError("inventory.name", inv.name, node_name, detail="inventory of another node")
        now = self.clock()
        old = self._nodes.get(node_name)
        if old is not None and old.incarnation == incarnation and old.state is NodeState.REGISTERED:
            self._nodes[node_name] = replace(old, last_seen=now)
            return self._ack(node_name)
        rec = NodeRecord(node_name, ray_node_id, incarnation, inv, NodeState.REGISTERED, now, now,
                         reason="registered" if old is None else f"re-registered (was {old.state.value})")
        self._commit_node(rec)
        self._agent_starts.pop(node_name, None)
        self._rebuild_snapshot()
        self._dirty = True
        return self._ack(node_name)

    def update_inventory(self, node_name: str, incarnation: str, inventory: NodeInventory | Mapping[str, Any]) -> dict[str, Any]:
        """ListAndWatch: the agent pushes a changed inventory (health, XID events)."""
        rec = self._current(node_name, incarnation)
        if rec is None:
            return {"ok": False, "reregister": True}
        inv = inventory if isinstance(inventory, NodeInventory) else NodeInventory.model_validate(inventory)
        self._commit_node(replace(rec, inventory=inv, last_seen=self.clock()))
        self._rebuild_snapshot()
        self._dirty = True
        return {"ok": True}

    def heartbeat(self, node_name: str, incarnation: str, allocated: Sequence[str] = (),
                  rejected: Mapping[str, str] | None = None, mig_uuids: Mapping[str, str] | None = None) -> dict[str, Any]:
        """An agent's heartbeat: what it has handed out; the reply carries what it should hand out."""
        rec = self._current(node_name, incarnation)
        if rec is None:
            return {"ok": False, "reregister": True}
        now = self.clock()
        self._nodes[node_name] = replace(rec, last_seen=now, allocated=tuple(allocated))
        changed: list[LedgerEntry] = []
        for lease_id, uuid in (mig_uuids or {}).items():
            e = self._leases.get(lease_id)
            if e is not None and e.lease.holding and e.handout is None and e.lease.allocation is not None:
                changed.append(replace(e, handout=self._handout(e.lease, rec, mig_uuid=uuid)))
        if changed:
            self._commit(changed)
        for lease_id, why in (rejected or {}).items():
            e = self._leases.get(lease_id)
            if e is not None and e.lease.holding:
                self._lose([e], f"agent on {node_name} refused the devices: {why}", ReconcileReport())
        return {"ok": True, "assignments": self._assignments(node_name)}

    def observe_ray_nodes(self, nodes: Iterable[RayNodeInfo]) -> None:
        """The live Ray nodes (the wrapper reads the GCS node table); used to decide where agents go."""
        self._ray_nodes = {n.name: n for n in nodes}

    def agent_start_requested(self, node_name: str) -> None:
        self._agent_starts[node_name] = self.clock()

    # ---- the reconcile cycle -------------------------------------------------------------------
    def reconcile(self) -> ReconcileReport:
        """One cycle; see the module docstring for its seven steps."""
        now = self.clock()
        report = ReconcileReport()
        self._expire_agents(now, report)        # 1
        self._release_dead_holders(report)      # 2
        self._expire_grants(now, report)        # 3
        self._end_overdue_checkpoints(now, report)  # 4
        # 5: schedule on change, and at least once a second while anything waits: time alone
        # makes work preemptible (minimum runtimes pass) and ages the queue.
        if self._dirty or (now - self._last_schedule >= 1.0 and any(
                e.lease.state is LeaseState.PENDING for e in self._leases.values())):
            self._last_schedule = now
            self._schedule(now, report)
        self._desired_agents(now, report)       # 6
        if now - self._last_prune >= 10.0:      # 7, every 10 s: nothing here is urgent
            self._last_prune = now
            self._prune_ended(now, report)
        return report

    def _prune_ended(self, now: float, report: ReconcileReport) -> None:
        """Drop ended leases ``ended_retention_s`` after they ended, from the store first.

        A lease stays while a later attempt it was requeued as is still live, so
        ``current_attempt`` keeps leading a client holding the first id to the
        running one. 0 keeps everything."""
        keep = self.settings.ended_retention_s
        if not keep:
            return
        cutoff = now - keep
        for e in list(self._leases.values()):
            if not e.lease.terminal or e.lease.history[-1].at > cutoff:
                continue
            if not self._leases[self.current_attempt(e.lease_id)].lease.terminal:
                continue
            self.store.delete(self._keys.lease(e.lease_id))
            del self._leases[e.lease_id]
            report.pruned.append(e.lease_id)

    def _expire_agents(self, now: float, report: ReconcileReport) -> None:
        ttl = self.settings.agent_ttl_s
        for rec in list(self._nodes.values()):
            if rec.state is not NodeState.REGISTERED:
                continue
            silent = now - rec.last_seen
            ray_node = self._ray_nodes.get(rec.name)
            gone = bool(self._ray_nodes) and (ray_node is None or ray_node.ray_node_id != rec.ray_node_id)
            if silent <= ttl and not gone:
                continue
            why = (f"agent silent for {silent:.1f}s > ttl {ttl:g}s" if silent > ttl
                   else "its Ray node left the cluster")
            self._commit_node(replace(rec, state=NodeState.LOST, reason=why))
            report.lost_nodes.append(rec.name)
            on_node = [e for e in self._leases.values() if e.lease.holding and e.lease.allocation
                       and e.lease.allocation.node_name == rec.name]
            self._lose(on_node, f"node {rec.name} lost: {why}", report)
            self._rebuild_snapshot()

    def _lose(self, entries: list[LedgerEntry], reason: str, report: ReconcileReport, *, requeue: bool = True) -> None:
        if not entries:
            return
        now = self.clock()
        out: list[LedgerEntry] = []
        for e in entries:
            new_id = None
            if requeue and e.spec.requeue_on_loss:
                new_id = next_attempt(e.lease_id)
                spec = e.spec.model_copy(update={"lease_id": new_id})
                retry = LedgerEntry(Lease.new(new_id, spec.request, now=now, owner=spec.owner, priority=e.lease.priority,
                                              priority_class=e.lease.priority_class, reason=f"requeued: {reason}"),
                                    spec, e.seq, e.enqueued_at, attempt_of=e.lease_id)
                out.append(retry)
                report.requeued.append(new_id)
            out.append(replace(self._end(e, LeaseState.LOST, reason), requeued_as=new_id))
            report.lost_leases.append(e.lease_id)
        self._commit(out)  # the retry is written before the lost lease that points to it
        for e in entries:
            self._free(e)
        self._dirty = True

    def _release_dead_holders(self, report: ReconcileReport) -> None:
        active = [e for e in self._leases.values() if e.lease.state is LeaseState.ACTIVE and e.holder]
        if not active:
            return
        alive = self.holder_probe([e.holder for e in active if e.holder])
        dead = [e for e in active if alive.get(e.holder or "", True) is False]
        # A dead holder is not requeued: what to do about a crashed workload is the job layer's call.
        self._lose(dead, "holder died", report, requeue=False)

    def _expire_grants(self, now: float, report: ReconcileReport) -> None:
        ttl = self.settings.grant_ttl_s
        for e in list(self._leases.values()):
            if e.lease.state is LeaseState.GRANTED and now - (e.lease.entered(LeaseState.GRANTED) or now) > ttl:
                self._commit([self._end(e, LeaseState.EXPIRED, f"not activated within {ttl:g}s")])
                self._free(e)
                report.expired_leases.append(e.lease_id)

    def _schedule(self, now: float, report: ReconcileReport) -> None:
        self._dirty = False
        pending = [e for e in self._leases.values() if e.lease.state is LeaseState.PENDING]
        if not pending:
            return
        plan = self._plan(pending, now)
        grants: list[LedgerEntry] = []
        snap = self._snapshot
        for g in plan.grants:
            e = self._leases[g.item_id]
            try:
                snap = snap.apply(g.placement.allocation)
            except CapacityError:
                continue  # a stale plan; the next cycle plans again
            self._fencing += 1
            lease = e.lease.grant(g.placement.allocation, self._fencing, now=now, reason=g.reason)
            rec = self._nodes[g.placement.allocation.node_name]
            grants.append(replace(e, lease=lease, handout=self._handout(lease, rec), why_pending=""))
        if grants:
            self._put_meta()  # the counter first: a restore never reissues a token
            self._commit(grants)
            self._snapshot = snap
            report.granted.extend(g.lease_id for g in grants)
        for w in plan.waiting:
            e = self._leases[w.item_id]
            self._leases[w.item_id] = replace(e, why_pending=w.reason, waiting=w)  # soft state: recomputed every cycle
        if plan.preemptions:
            self._start_preemptions(plan, now, report)

    def _plan(self, pending: Sequence[LedgerEntry], now: float) -> Plan:
        """The one call site of the scheduler (``orchestrator.scheduling.cycle.schedule``)."""
        nominated = {e.preempt_for for e in self._leases.values()
                     if e.lease.state is LeaseState.CHECKPOINTING and e.preempt_for}
        items = [PendingItem(e.lease_id, e.spec.request, e.lease.priority, e.lease.priority_class, e.enqueued_at,
                             queue=e.spec.queue, nominated=e.lease_id in nominated)
                 for e in pending]
        holding = [e.lease for e in self._leases.values() if e.lease.holding]
        in_flight = frozenset(e.lease_id for e in self._leases.values() if e.lease.state is LeaseState.CHECKPOINTING)
        return schedule(self._snapshot, items, holding, self.sched_config, now, self.policy, in_flight=in_flight)

    # ---- preemption ------------------------------------------------------------------------------
    def _start_preemptions(self, plan: Plan, now: float, report: ReconcileReport) -> None:
        """Carry out the plan's preemptions: ask checkpointing victims to checkpoint (grace period),
        stop the others at once. Written to the store before anyone is told."""
        asked: list[LedgerEntry] = []
        stopped: list[LedgerEntry] = []
        freed: list[LedgerEntry] = []
        for p in plan.preemptions:
            e = self._leases.get(p.victim.lease_id)
            if e is None or not e.lease.holding or e.lease.state is LeaseState.CHECKPOINTING:
                continue
            _, pclass = self.sched_config.priority_class(e.lease.priority_class or None)
            for_owner = self._leases[p.for_item].spec.owner if p.for_item in self._leases else p.for_item
            for_owner = for_owner.removeprefix("job:")
            why = f"preempted for {for_owner or p.for_item}: {p.reason}"
            if e.lease.state is LeaseState.ACTIVE and pclass.checkpoint:
                asked.append(replace(e, lease=e.lease.transition(
                    LeaseState.CHECKPOINTING, now=now, reason=f"asked to checkpoint within {pclass.grace_period_s:g}s; {why}"),
                    preempt_for=p.for_item, preempt_reason=why, preempt_deadline=now + pclass.grace_period_s))
            else:
                stopped.append(replace(e, lease=e.lease.transition(
                    LeaseState.PREEMPTED, now=now,
                    reason=why + ("" if e.lease.state is LeaseState.ACTIVE else " (not started: nothing to checkpoint)")),
                    preempt_for=p.for_item, preempt_reason=why))
                freed.append(e)
        self._commit(asked + stopped)
        for e in freed:
            self._free(e)
        report.checkpoint_requested.extend(e.lease_id for e in asked)
        report.preempted.extend(e.lease_id for e in stopped)

    def ack_preemption(self, lease_id: str, checkpoint_path: str | None, token: int | None = None,
                       reason: str = "checkpoint acknowledged") -> dict[str, Any]:
        """The victim checkpointed (or stopped): end the lease as PREEMPTED and free its devices. Idempotent."""
        e = self._entry(lease_id)
        if e.lease.state is LeaseState.PREEMPTED:
            return e.to_dict()
        if token is not None:
            self._check_token(e, token)
        if e.lease.state is not LeaseState.CHECKPOINTING:
            raise InvalidRequestError("lease_id", lease_id, "a lease being preempted (checkpointing)",
                                      detail=f"lease is {e.lease.state.value}")
        now = self.clock()
        lease = e.lease.transition(LeaseState.PREEMPTED, now=now, reason=f"{reason}; {e.preempt_reason}",
                                   checkpoint_path=checkpoint_path or e.lease.checkpoint_path,
                                   last_checkpoint_at=now if checkpoint_path else e.lease.last_checkpoint_at)
        new = replace(e, lease=lease)
        self._commit([new])
        self._free(e)
        return new.to_dict()

    def report_checkpoint(self, lease_id: str, checkpoint_path: str, at: float | None = None) -> dict[str, Any]:
        """A holder wrote a checkpoint (periodic or not): less work is lost if it is preempted now."""
        e = self._entry(lease_id)
        if not e.lease.holding:
            return e.to_dict()
        new = replace(e, lease=replace(e.lease, checkpoint_path=checkpoint_path,
                                       last_checkpoint_at=self.clock() if at is None else at))
        self._commit([new])
        return new.to_dict()

    def _end_overdue_checkpoints(self, now: float, report: ReconcileReport) -> None:
        overdue = [e for e in self._leases.values() if e.lease.state is LeaseState.CHECKPOINTING
                   and e.preempt_deadline is not None and now > e.preempt_deadline]
        for e in overdue:
            self.ack_preemption(e.lease_id, None, reason="grace period over without a checkpoint: stopped")
            report.preempted.append(e.lease_id)

    def explain_lease(self, lease_id: str) -> dict[str, Any]:
        """Why a lease is where it is: pending reasons and would-be victims, or its placement reason."""
        e = self._entry(lease_id)
        out: dict[str, Any] = {"lease_id": e.lease_id, "state": e.lease.state.value, "reason": e.lease.history[-1].reason}
        w = e.waiting
        if e.lease.state is LeaseState.PENDING and w is not None:
            out["pending"] = {
                "position": w.position, "reason": w.reason,
                "reasons": [{"alternative": a, "reason": r, "nodes": c} for a, r, c in
                            (w.unschedulable.reasons if w.unschedulable else ())],
                "would_preempt": [{"lease_id": v, "owner": self._leases[v].spec.owner if v in self._leases else ""}
                                  for v in w.would_preempt],
                "being_preempted": [{"lease_id": x.lease_id, "owner": x.spec.owner} for x in self._leases.values()
                                    if x.preempt_for == e.lease_id and x.lease.state is LeaseState.CHECKPOINTING],
                "preemption_blocked": w.preemption_blocked,
            }
        granted = next((t for t in e.lease.history if t.state is LeaseState.GRANTED), None)
        if granted is not None and e.lease.allocation is not None:
            a = e.lease.allocation
            out["placement"] = {"node": a.node_name, "gpu_indices": list(a.gpu_indices), "kind": a.kind.value,
                                "reason": granted.reason}
        if e.preempt_for:
            by = self._leases.get(e.preempt_for)
            out["preempted"] = {"for": e.preempt_for, "for_owner": by.spec.owner if by else "",
                                "reason": e.preempt_reason, "checkpoint_path": e.lease.checkpoint_path}
        return out

    def _desired_agents(self, now: float, report: ReconcileReport) -> None:
        for name, rn in sorted(self._ray_nodes.items()):
            rec = self._nodes.get(name)
            if rec is not None and rec.state is NodeState.REGISTERED:
                continue
            asked = self._agent_starts.get(name)
            if asked is not None and now - asked < self.settings.agent_ttl_s:
                continue  # a start is in flight; give it one TTL to register
            why = "new node" if rec is None else f"agent lost ({rec.reason})"
            report.start_agents.append(AgentStart(name, rn.ray_node_id, why))

    # ---- status --------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        now = self.clock()
        holding_by_gpu: dict[tuple[str, int], list[str]] = {}
        holding_by_mig: dict[tuple[str, int, int], str] = {}
        for e in self._leases.values():
            a = e.lease.allocation
            if e.lease.holding and a is not None:
                for idx in a.gpu_indices:
                    holding_by_gpu.setdefault((a.node_name, idx), []).append(e.lease_id)
                if a.kind is ShareKind.MIG:
                    holding_by_mig[(a.node_name, a.gpu_indices[0], a.mig_start or 0)] = e.lease_id
        nodes = []
        for rec in sorted(self._nodes.values(), key=lambda r: r.name):
            gpus = []
            for g in rec.inventory.gpus:
                gpus.append({
                    "index": g.index, "uuid": g.uuid, "model": g.model, "memory_mib": g.total_memory_mib,
                    "healthy": g.healthy, "health_reason": g.health_reason, "mig_enabled": g.mig_enabled,
                    "mig": [{"uuid": m.uuid, "profile": m.profile, "start": m.start,
                             "memory_mib": g.spec.profile(m.profile).memory_mib,
                             "lease": holding_by_mig.get((rec.name, g.index, m.start))} for m in g.mig_devices],
                    "nvlink_peers": list(g.nvlink_peers),
                    "leases": holding_by_gpu.get((rec.name, g.index), []),
                })
            nodes.append({"name": rec.name, "state": rec.state.value, "reason": rec.reason,
                          "ray_node_id": rec.ray_node_id, "incarnation": rec.incarnation,
                          "heartbeat_age_s": round(now - rec.last_seen, 3), "model": rec.inventory.model,
                          "gpus": gpus})
        live = [e for e in self._leases.values() if not e.lease.terminal]
        ended = sorted((e for e in self._leases.values() if e.lease.terminal),
                       key=lambda e: e.lease.history[-1].at, reverse=True)[:50]
        queue = sorted((e for e in live if e.lease.state is LeaseState.PENDING), key=lambda e: (-e.lease.priority, e.seq))
        return {
            "nodes": nodes,
            "leases": [e.to_dict() for e in sorted(live, key=lambda e: e.seq)],
            "ended_leases": [e.to_dict() for e in ended],
            "queue": [{"lease_id": e.lease_id, "request": e.spec.request.describe(), "priority": e.lease.priority,
                       "owner": e.spec.owner, "why_pending": e.why_pending or None} for e in queue],
            "head": {"namespace": self.settings.namespace, "policy": self.sched_config.policy,
                     "fencing_counter": self._fencing, "agent_ttl_s": self.settings.agent_ttl_s,
                     "heartbeat_interval_s": self.settings.heartbeat_interval_s},
        }

    def ledger(self) -> list[LedgerEntry]:
        """Every lease entry, in no particular order (read-only use: metrics, status)."""
        return list(self._leases.values())

    def snapshot(self) -> ClusterSnapshot:
        """The current cluster snapshot (immutable; the head's ledger applied to the registered nodes)."""
        return self._snapshot

    def registered_nodes(self) -> list[str]:
        return sorted(n for n, r in self._nodes.items() if r.state is NodeState.REGISTERED)

    # ---- helpers -------------------------------------------------------------------------------
    def _entry(self, lease_id: str) -> LedgerEntry:
        try:
            return self._leases[lease_id]
        except KeyError:
            raise UnknownObjectError("lease", lease_id) from None

    def _check_token(self, e: LedgerEntry, token: int | None) -> None:
        if token is None or int(token) != e.lease.fencing_token:
            raise StaleFencingTokenError(e.lease_id, -1 if token is None else int(token), e.lease.fencing_token)

    def _end(self, e: LedgerEntry, state: LeaseState, reason: str) -> LedgerEntry:
        return replace(e, lease=e.lease.transition(state, now=self.clock(), reason=reason))

    def _free(self, e: LedgerEntry) -> None:
        """Give a formerly holding lease's devices back to the snapshot (no-op if it held none)."""
        a = e.lease.allocation
        if e.lease.holding and a is not None and a.node_name in self._snapshot.static.index:
            self._snapshot = self._snapshot.release(a)
            self._dirty = True

    def _current(self, node_name: str, incarnation: str) -> NodeRecord | None:
        rec = self._nodes.get(node_name)
        if rec is None or rec.incarnation != incarnation or rec.state is not NodeState.REGISTERED:
            return None
        return rec

    def _handout(self, lease: Lease, rec: NodeRecord, *, mig_uuid: str | None = None) -> dict[str, Any] | None:
        a = lease.allocation
        assert a is not None
        if a.kind is ShareKind.MIG and not (mig_uuid or a.mig_uuid):
            return None  # made on demand: the agent creates the instance and reports its UUID
        return make_handout(a, ray_node_id=rec.ray_node_id, lease_id=lease.lease_id, fencing_token=lease.fencing_token,
                            mps_pipe_root=self.settings.mps_pipe_root,
                            timeslice_capacity_milli=self.settings.timeslice_capacity_milli,
                            mig_uuid=mig_uuid).to_dict()

    def _assignments(self, node_name: str) -> dict[str, Any]:
        out = {}
        for e in self._leases.values():
            a = e.lease.allocation
            if e.lease.holding and a is not None and a.node_name == node_name:
                out[e.lease_id] = {"allocation": a.to_json(), "fencing_token": e.lease.fencing_token,
                                   "env": (e.handout or {}).get("env_vars")}
        return out

    def _ack(self, node_name: str) -> dict[str, Any]:
        return {"ok": True, "heartbeat_interval_s": self.settings.heartbeat_interval_s,
                "agent_ttl_s": self.settings.agent_ttl_s, "assignments": self._assignments(node_name)}

    def _rebuild_snapshot(self) -> None:
        """A fresh snapshot of the registered nodes with every holding lease applied again.

        Topology changes (a node joins, is lost, reports new health) are rare; rebuilding
        keeps the snapshot a pure function of (inventories, ledger). A holding lease that
        no longer fits (its GPU vanished from the inventory) is lost.
        """
        invs = [r.inventory for r in sorted(self._nodes.values(), key=lambda r: r.name)
                if r.state is NodeState.REGISTERED]
        snap = ClusterSnapshot.build(invs, timeslice_capacity_milli=self.settings.timeslice_capacity_milli)
        misfits: list[LedgerEntry] = []
        for e in sorted(self._leases.values(), key=lambda e: e.lease.fencing_token):
            a = e.lease.allocation
            if not (e.lease.holding and a is not None) or a.node_name not in snap.static.index:
                continue
            try:
                moved = snap.locate(a)
                snap = snap.apply(moved)
            except (CapacityError, InvalidRequestError, IndexError):
                misfits.append(e)
                continue
            if moved != a:  # column positions change when nodes come and go
                self._leases[e.lease_id] = replace(e, lease=replace(e.lease, allocation=moved))
        self._snapshot = snap
        if misfits:
            self._commit([self._end(e, LeaseState.LOST, "its devices are no longer in the node's inventory")
                          for e in misfits])
