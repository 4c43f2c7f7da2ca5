"""The head's control logic: the lease ledger, the queue and the agents, as a plain class.

:class:`HeadController` imports no Ray: the head service
(:mod:`orchestrator.control.service`) owns one, calls :meth:`reconcile` and
carries out the :class:`ReconcileReport` it returns (start agents). Its state
lives beside it -- the ledger (:mod:`.ledger`), the node registry
(:mod:`.nodes`), the MIG repartitions (:mod:`.repartition`) -- and so do its
pure rules: the read views (:mod:`.views`), the preemption rules
(:mod:`.preempting`), the revocations (:mod:`.revocation`), the hand-out
(:mod:`.handout`) and the snapshot's rebuild (:mod:`.snapshot_rebuild`).

It is the one class that owns that state: every attribute is set in its
``__init__``. The calls that change it are its methods, written in this
module or, one part a module, as plain functions its class body binds by
name: a caller's lease calls and the cycle's lease steps (:mod:`.leasing`),
the agents' calls and their silence (:mod:`.agent_link`), the preemption
victims (:mod:`.victims`) and the MIG repartition hooks
(:mod:`.repartition_hooks`). This module keeps the cycle, the scheduling
pass, the time windows, the snapshot and the read views.

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
of dead holders (at most every ``tuning.holder_check_every_s``); (3) expire grants never activated within
``grant_ttl_s``; (4) stop preemption victims past their grace deadline; (4b) move MIG repartitions on
(:mod:`.repartition`: cordon, drain, apply, uncordon); (5) schedule the queue over the snapshot (:meth:`_plan`, the
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

import time
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

from orchestrator.control import agent_link, leasing, repartition_hooks, revocation, victims, views
from orchestrator.control.agent_link import node_gpu_uuids
from orchestrator.control.demand import demand_of
from orchestrator.control.handout import lease_handout
from orchestrator.control.ledger import Ledger, LedgerEntry
from orchestrator.control.nodes import NodeRegistry
from orchestrator.control.reconcile_report import ReconcileReport
from orchestrator.control.repartition import Repartitions
from orchestrator.control.snapshot_rebuild import NodeSpecs, rebuild
from orchestrator.control.store import StateStore
from orchestrator.core.clock import Clock, SystemClock
from orchestrator.core.config import RuntimeSettings, Tuning
from orchestrator.core.errors import StaleFencingTokenError
from orchestrator.core.lease import LeaseState, key_matches
from orchestrator.core.priorities import SchedulerConfig
from orchestrator.scheduling.cycle import PendingItem, Plan, schedule
from orchestrator.scheduling.engine import warm
from orchestrator.scheduling.fair_cycle import capacity_of
from orchestrator.scheduling.fairshare import DecayedUsage, FairShares, Resources, compute, usage_by_queue
from orchestrator.scheduling.policies import get_policy
from orchestrator.scheduling.snapshot import ClusterSnapshot
from orchestrator.scheduling.windows import WindowStatus, effective_config, queue_demand, surges, window_status

__all__ = ["HOLDER_CHECK_EVERY_S", "HeadController", "HolderProbe", "ReconcileReport"]


HolderProbe = Callable[[Sequence[str]], Mapping[str, bool]]

#: Step 2 (dead holders) runs at most this often (head clock): it walks every active lease and asks the
#: probe (the head's: a read of Ray's actor table) about their holders, ~10 ms at 12,000 active leases
#: besides the read, so every cycle was too often. The one throttle of that read: a holder's death is seen
#: within this. The default of ``settings.tuning.holder_check_every_s``, which the controller reads.
HOLDER_CHECK_EVERY_S = Tuning().holder_check_every_s


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
        self._specs = NodeSpecs()  # per node: its inventory as the engine sees it
        self._dirty = False  # the queue may have become schedulable (new request, freed devices, new node)
        self._last_schedule = float("-inf")
        self._last_reconcile = float("inf")  # no cycle yet: nothing to forgive
        self._last_prune = float("-inf")
        self._last_holder_check = float("-inf")
        self._decayed = DecayedUsage()  # each queue's usage history, for the fair-share order (fairness on)
        self.restore_seen: dict[str, float] = {}  # per priority class: measured resume seconds (leasing.note_restore)
        self.last_shares: FairShares | None = None  # the last cycle's fair shares (fairness on)

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

    # ---- the parts: plain functions of the controller, bound here as its methods -----------------------
    # A caller's lease calls, and the cycle's lease steps 2 and 3 (:mod:`.leasing`).
    request_lease = leasing.request_lease
    enqueue = leasing.enqueue
    activate = leasing.activate
    activated = leasing.activated
    release = leasing.release
    released = leasing.released
    _lose = leasing.lose
    _release_dead_holders = leasing.release_dead_holders
    _expire_grants = leasing.expire_grants
    # The agents' calls, and step 1: their silence (:mod:`.agent_link`).
    register_agent = agent_link.register_agent
    update_inventory = agent_link.update_inventory
    heartbeat = agent_link.heartbeat
    observe_ray_nodes = agent_link.observe_ray_nodes
    agent_start_requested = agent_link.agent_start_requested
    _expire_agents = agent_link.expire_agents
    # Preemption victims, and step 4: their grace running out (:mod:`.victims`).
    ack_preemption = victims.ack_preemption
    report_checkpoint = victims.report_checkpoint
    _start_preemptions = victims.start_preemptions
    _preempt = victims.preempt
    _end_overdue_checkpoints = victims.end_overdue_checkpoints
    # MIG repartitions: starting one, and the hooks step 4b drives (:mod:`.repartition_hooks`).
    request_repartition = repartition_hooks.request_repartition
    occupying_gpu = repartition_hooks.occupying_gpu
    drain = repartition_hooks.drain
    _uncordon = repartition_hooks.uncordon

    # ---- the public API's reads of one lease (the head service forwards these) -------------------------
    def get_lease(self, lease_id: str, key: str | None = None) -> dict[str, Any]:
        """The lease's view; its fencing token only for the requester's ``key``."""
        e = self.ledger.get(lease_id)
        return e.to_dict(reveal=key_matches(e.spec.requester_digest, key))

    def current_attempt(self, lease_id: str) -> str:
        """Follow ``requeued_as`` from ``lease_id`` to its latest attempt."""
        return self.ledger.latest(lease_id).lease_id

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
        if now - self._last_holder_check >= self.settings.tuning.holder_check_every_s:  # 2, at most once a second
            self._last_holder_check = now
            self._release_dead_holders(report)
        self._expire_grants(now, report)        # 3
        self._end_overdue_checkpoints(now, report)  # 4
        if self.repartitions.live() and self.repartitions.step(self, now, report):  # 4b
            self._uncordon()
        # 5: schedule on change, and at least once a second while anything waits: time alone
        # makes work preemptible (minimum runtimes pass) and ages the queue.
        self._apply_window()
        if self._dirty or (now - self._last_schedule >= 1.0 and (self.ledger.in_state(LeaseState.PENDING)
                                                                 or self._may_grow())):
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

    def _may_grow(self) -> bool:
        """An elastic gang runs and growing is on: a cycle with nothing pending may still grow one."""
        return self.sched_config.elastic.grow and self.ledger.any_elastic

    def _schedule(self, now: float, report: ReconcileReport) -> None:
        self._dirty = False
        pending = self.ledger.in_state(LeaseState.PENDING)
        if not pending and not self._may_grow():
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
                                                                        node_gpu_uuids=node_gpu_uuids(rec)),
                                  why_pending="", waiting=None))
        # An elastic gang's workers beyond the size it runs at: withdrawn, in the same commit as its grants.
        trims = [replace(e, lease=e.lease.transition(LeaseState.RELEASED, now=now, reason=str(t.reason)),
                         why_pending="", waiting=None) for t in plan.trims for e in (self.ledger.get(t.item_id),)]
        if grants or trims:
            self.ledger.put_meta()  # the counter first: a restore never reissues a token
            self.ledger.commit(grants + trims)
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
        fairness = self.sched_config.fairness
        if fairness.enabled:  # usage since the last cycle, as dominant shares of the cluster's GPUs
            cap = max(self.capacity_gpus(), 1e-9)
            self._decayed = self._decayed.advance(now, {q: g / cap for q, g in self.ledger.queue_usage().items()},
                                                  fairness.half_life_s)
        movable = ({e.lease_id: e.enqueued_at for e in self.ledger.holding() if e.spec.requeue_on_preempt}
                   if self.sched_config.consolidation.enabled else None)
        plan = schedule(self._snapshot, items, lambda: [e.lease for e in self.ledger.holding()], self._window_cfg,
                        now, self.policy, in_flight=in_flight, window=window, usage=self.ledger.queue_usage(),
                        decayed=self._decayed.usage if fairness.enabled else None, movable=movable,
                        elastic=(lambda: [e.lease for e in self.ledger.elastic_holding()]) if self._may_grow() else None)
        if plan.shares is not None:
            self.last_shares = plan.shares
        return plan

    def queue_tree(self) -> list[dict[str, Any]]:
        """Every queue of the tree with its guarantee, weight, limit, what it holds and asks, its fair share and
        why it stands where it does (fairness off: the same rows, the fair share computed as if it were on)."""
        holding = [e.lease for e in self.ledger.holding()]
        used = usage_by_queue(holding)
        asked = dict(used)
        for e in self.ledger.in_state(LeaseState.PENDING):
            r = e.spec.request
            asked[e.spec.queue] = asked.get(e.spec.queue, Resources()) + Resources(r.gpu_demand, float(r.cpu_milli),
                                                                                    float(r.host_memory_mib))
        shares = compute(self._window_cfg, capacity_of(self._snapshot), used, asked, self._decayed.usage)
        return [line.to_json() for line in shares.lines.values()]

    # ---- time windows ----------------------------------------------------------------------------
    def capacity_gpus(self) -> float:
        """The cards of the registered nodes: what a window's ``quota_pct`` is a share of."""
        return float(self._snapshot.static.present.sum())

    def window(self) -> WindowStatus:
        """The time window in force now, its quotas and the next change (:func:`.windows.window_status`)."""
        return window_status(self.sched_config, self.day_clock.time_of_day_s(), self.capacity_gpus(),
                             self._queue_demand())

    def _queue_demand(self) -> dict[str, float] | None:
        """What each queue holds and asks (:func:`.windows.queue_demand`), when a window's quota follows it."""
        if not surges(self.sched_config):
            return None
        return queue_demand((e.lease for e in self.ledger.holding()),
                            (e.lease for e in self.ledger.in_state(LeaseState.PENDING)))

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
        cfg, w = effective_config(self.sched_config, tod, capacity, self._queue_demand())
        key = (w.name if w else None, capacity, tuple((q, c.quota_gpus) for q, c in sorted(cfg.queues.items())))
        if key != self._window_key:
            self._window_key, self._window_cfg = key, cfg
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
        st["queues"] = self.queue_tree()
        st["head"]["fairness"] = self.sched_config.fairness.enabled
        st["autoscaler_demand"] = demand_of(self.ledger, self.settings.tuning.autoscaler_demand_max_bundles).to_json()
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

    def _topology_changed(self, node_name: str) -> None:
        """A node joined, left or changed its inventory: rebuild the snapshot now if leases occupy it
        (one whose devices vanished is lost at once), else before the snapshot's next use -- a thousand
        agents registering then cost one rebuild, not a thousand."""
        if self.ledger.occupying_on(node_name):
            self._rebuild_snapshot()
        else:
            self._stale = True

    def _rebuild_snapshot(self) -> None:
        """A fresh snapshot of the registered nodes with every holding lease applied again
        (:func:`.snapshot_rebuild.rebuild`); the leases it moved or could not place are written back here.

        Topology changes (a node joins, is lost, reports new health) are rare; rebuilding
        keeps the snapshot a pure function of (inventories, ledger). A holding lease that
        no longer fits (its GPU vanished from the inventory) is lost.
        """
        self._stale = False
        done = rebuild([self._specs.of(r.inventory) for r in self.nodes.registered()], self.ledger.occupying(),
                       self.repartitions.cordoned(), timeslice_capacity_milli=self.settings.timeslice_capacity_milli)
        for e, moved in done.moved:  # column positions change when nodes come and go
            self.ledger.soft(e, lease=replace(e.lease, allocation=moved))
        self._snap = done.snapshot
        if done.misfits:  # a revoking one has ended already: it just stops occupying
            self.ledger.commit([revocation.confirmed(e) if e.revoking else
                                self._end(e, LeaseState.LOST, "its devices are no longer in the node's inventory")
                                for e in done.misfits])
