"""The head's Prometheus metrics (``/metrics``), worked out from its own ledger and node registry once per
reconcile cycle.

The families -- their names, labels, conventions and registry -- are
:mod:`orchestrator.control.metric_families` (its docstring lists every one). :class:`HeadMetrics` is those
families plus the update logic: each cycle it counts the report's events, keeps the live lease counts as the
ledger changes (:class:`LeaseCounts`, instead of walking every live lease), and refreshes the per-GPU and
per-node series only for the nodes whose inventory, leases or measurements may have changed. It imports no
Ray. Every name of the families module is importable from here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from prometheus_client import Counter, Gauge

from orchestrator.control.controller import HeadController, ReconcileReport
from orchestrator.control.curves import CurveHistory, Reading
from orchestrator.control.ledger import Ledger
from orchestrator.control.metric_families import (
    LATENCY_BUCKETS, MIB, NO_CLASS, OTHER_SERVICE, SEVERITIES, HeartbeatAges, MetricFamilies, SeriesTable,
)
from orchestrator.control.nodes import NodeRegistry, NodeState
from orchestrator.core.allocation import Allocation
from orchestrator.core.lease import LEASE_TRANSITIONS, LeaseState
from orchestrator.core.reasons import Cause

__all__ = ["HeadMetrics", "HeartbeatAges", "LATENCY_BUCKETS", "LeaseCounts", "MIB", "MetricFamilies", "NO_CLASS",
           "OTHER_SERVICE", "SEVERITIES", "SeriesTable", "count_live", "share_of_card"]


@dataclass(frozen=True, slots=True)
class _CapacityMark:
    """Where :meth:`HeadMetrics._capacity` last looked: the ledger and registry it read (another one, after a
    restore, is read whole), their change counts then, and the nodes measured then."""

    ledger: Ledger
    registry: NodeRegistry
    ledger_changes: int
    registry_changes: int
    measured: frozenset[str]


def share_of_card(a: Allocation) -> float:
    """The fraction of each of its cards an allocation keeps busy in the workload model."""
    return min(1.0, a.gpu_demand / max(1, len(a.gpu_indices)))


class HeadMetrics(MetricFamilies):
    """See the module docstring."""

    def __init__(self, gauges_every_s: float = 0.0, *, priority_classes: Iterable[str] = (),
                 queues: Iterable[str] = ("default",), inference_services: Iterable[str] = (),
                 curves: CurveHistory | None = None) -> None:
        """``gauges_every_s``: the GPU gauges (totals, per GPU, per node and class) are refreshed at most this
        often (head clock seconds). They are worked out from every lease holding a card of a changed node: under
        load, when a cycle runs after nearly every call, refreshing them each cycle was most of the cycle's
        work (docs/load.md). 0: every update. Counters, histograms and lease counts are kept every update.

        ``priority_classes`` and ``queues`` (the scheduler config's): their preemption counters read 0 before the
        first preemption, not "no data". ``inference_services``: the names inference reports keep as their
        ``service`` label (:meth:`register_inference_service`); any other counts as ``other``."""
        super().__init__(priority_classes=priority_classes, queues=queues, inference_services=inference_services)
        self.gauges_every_s = gauges_every_s
        self._gauges_at = float("-inf")  # head clock time of the last refresh of the GPU gauges
        self._counts: tuple[Any, LeaseCounts] | None = None  # (the ledger watched, its live lease counts)
        self._ended_seen: set[str] = set()
        self._synced: dict[str, dict[tuple[str, ...], float]] = {}  # per gauge: the values it was last set to
        self._node_series: dict[str, tuple[Any, dict[SeriesTable, dict[tuple[str, ...], float]]]] = {}  # node -> (key, series)
        self._children: dict[tuple[str, tuple[str, ...]], Any] = {}  # (gauge, labels) -> its child, to set it cheaply
        self._gpu_caps: dict[str, tuple[Any, dict[tuple[str, str], Any]]] = {}  # node -> (inventory, its GPUs)
        self._capacity_mark: _CapacityMark | None = None  # where _capacity last looked
        self._node_util: dict[str, float] = {}  # node -> mean utilisation of its cards (the curves' util)
        #: The live page's curves (:mod:`.curves`): a point every ``curves.every_s``, from the first update on.
        self.curves = curves if curves is not None else CurveHistory(origin=None)

    # ---- from the controller, once per cycle ----------------------------------------------------------
    def update(self, ctl: HeadController, report: ReconcileReport | None = None,
               measured: Mapping[str, Mapping[int, float]] | None = None) -> None:
        """Refresh from the controller; count one cycle's events from its report.

        ``measured``: per node, GPU index -> utilisation the agent measured (NVML); GPUs
        without a measurement use the workload model.
        """
        self.cycles.inc()
        now = ctl.clock()
        if now - self._gauges_at >= self.gauges_every_s:
            self._gauges_at = now
            snap = ctl.snapshot()
            self.gpus.set(snap.capacity_milli() / 1000)
            self.gpus_allocated.set(snap.allocated_milli() / 1000)
            self._capacity(ctl, measured or {})
        # Live leases are counted as the ledger changes (LeaseCounts), not walked each cycle; the preempted
        # ones are read through its state index: the other ended leases it keeps for a day cost nothing here.
        ledger = ctl.ledger
        counts = self._lease_counts(ledger)
        preempted = ledger.in_state_any_order(LeaseState.PREEMPTED)
        entered, counts.entered = counts.entered, set()
        for lid in entered:
            e = ledger.find(lid)
            if e is None or not (e.lease.holding and e.lease.allocation is not None):
                continue  # gone again before this cycle looked: a scan would not have seen it hold
            self._first_held(e, [t.at for v in ledger.victims_for(e.lease_id) for t in v.lease.history
                                 if t.state in (LeaseState.CHECKPOINTING, LeaseState.PREEMPTED)])
        for e in preempted:
            if e.lease.lease_id not in self._ended_seen:
                self._ended_seen.add(e.lease.lease_id)
                asked, yielded = e.lease.entered(LeaseState.CHECKPOINTING), e.lease.entered(LeaseState.PREEMPTED)
                if asked is not None and yielded is not None and e.lease.checkpoint_path:
                    self.checkpoint.observe(max(0.0, yielded - asked))
        self._ended_seen &= {e.lease_id for e in preempted}
        self._sync(self.queue_length, counts.queued, keep_zero=True)
        self._sync(self.leases, counts.by_state, keep_zero=True)
        self._sync(self.leases_active, counts.active, keep_zero=True)
        self.heartbeat_age.follow(ctl.clock, ctl.nodes)
        if report is not None:
            self._count(ctl, report)
        if self.curves.origin is None:
            self.curves.origin = now
        if self.curves.due(now):
            self.curves.record(self._reading(now, sum(counts.queued.values())))

    def _reading(self, now: float, queued: float) -> Reading:
        """What a point of the curves is made of, read from the families the page draws (each with bounded labels,
        so a reading costs the same at any cluster size; utilisation comes from :meth:`_set_node`'s means)."""
        buckets: dict[float, float] = {}
        for s in _samples(self.inference_latency):
            if s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
        return Reading(at=now, granted=_summed(self.granted), inference=_summed(self.inference_requests),
                       inference_buckets=buckets, preemptions=_summed(self.preemptions), queue=int(queued),
                       util=dict(self._node_util))

    def _lease_counts(self, ledger: Any) -> "LeaseCounts":
        """The counts of ``ledger``'s live leases, kept by watching it (:meth:`Ledger.watch`) from the
        first update on; a head restarted over a new ledger with these metrics gets new counts."""
        if self._counts is None or self._counts[0] is not ledger:
            if self._counts is not None:
                self._counts[0].unwatch(self._counts[1].change)
            counts = LeaseCounts()
            ledger.watch(counts.change)
            self._counts = (ledger, counts)
        return self._counts[1]

    def _first_held(self, e: Any, decided: list[float]) -> None:
        """A lease seen holding for the first time (each lease begins holding once: :class:`LeaseCounts`
        reports it once); ``decided``: when victims were chosen for it."""
        lease = e.lease
        granted = lease.entered(LeaseState.GRANTED)
        if granted is None:
            return
        cls, queue = _class_and_queue(e)
        self.lease_wait.labels(cls, queue).observe(max(0.0, granted - lease.history[0].at))
        self.curves.granted(granted, granted - lease.history[0].at)
        self.granted.labels(lease.allocation.kind.value, cls, queue).inc()
        if decided:
            self.decision_to_grant.observe(max(0.0, granted - min(decided)))

    def _count(self, ctl: HeadController, report: ReconcileReport) -> None:
        overdue = {lid for lid in report.preempted if (e := ctl.ledger.find(lid)) is not None
                   and e.lease.checkpoint_path is None and e.lease.entered(LeaseState.CHECKPOINTING) is not None}
        for lease_id in report.checkpoint_requested:
            self.preemptions.labels("checkpoint", *self._victim(ctl, lease_id)).inc()
        for lease_id in report.preempted:
            cause, cls, queue = self._victim(ctl, lease_id)
            self.preemptions.labels("stopped", "deadline" if lease_id in overdue else cause, cls, queue).inc()
        if report.plan_seconds is not None:
            self.placement.observe(report.plan_seconds)
        if report.reconfigured:
            self.mig_reconfigurations.labels("done").inc(len(report.reconfigured))
        if report.reconfigure_failed:
            self.mig_reconfigurations.labels("failed").inc(len(report.reconfigure_failed))

    @staticmethod
    def _victim(ctl: HeadController, lease_id: str) -> tuple[str, str, str]:
        """A victim's labels: why it was chosen, its priority class and its queue."""
        e = ctl.ledger.find(lease_id)
        if e is None:
            return Cause.VICTIM_PRIORITY.value, NO_CLASS, "default"
        return (e.preempt_cause or Cause.VICTIM_PRIORITY.value, *_class_and_queue(e))

    def _capacity(self, ctl: HeadController, measured: Mapping[str, Mapping[int, float]]) -> None:
        """The per-GPU gauges and the leases' compute per node, node by node. A node's series depend only on its
        inventory (while it is registered), the leases on it and what its agent measured, so only the nodes one of
        those may have changed for since the last call are looked at: the ledger's and the registry's change feeds
        (:meth:`Ledger.nodes_changed_since`, :meth:`NodeRegistry.changed_since`) and the nodes measured then or
        now; each is recomputed if its key (inventory, :meth:`Ledger.node_version`, measurements) moved. A call
        costs what changed, not the nodes (at 5,000 nodes the walk over every node had been half a cycle); the
        first one, or one over another ledger or registry (a restore), looks at every node."""
        ledger, registry = ctl.ledger, ctl.nodes
        last = self._capacity_mark
        now = _CapacityMark(ledger, registry, ledger.node_changes, registry.changes, frozenset(measured))
        if last is None or last.ledger is not ledger or last.registry is not registry:
            nodes = {r.name for r in registry.registered()} | ledger.nodes_occupied() | set(self._node_series)
        else:
            nodes = {*ledger.nodes_changed_since(last.ledger_changes), *registry.changed_since(last.registry_changes),
                     *last.measured, *now.measured}
        self._capacity_mark = now
        for node in nodes:
            rec = registry.get(node)
            inv = rec.inventory if rec is not None and rec.state is NodeState.REGISTERED else None
            if inv is None and not ledger.node_occupied(node):  # gone, and nothing on it: its series go too
                if node in self._node_series:
                    self._set_node(node, {})
                    del self._node_series[node]
                continue
            m = measured.get(node)
            key = (inv, ledger.node_version(node), None if m is None else tuple(m.items()))
            cached = self._node_series.get(node)
            if cached is not None and cached[0] == key:
                continue
            values = self._node_values(node, inv, [e for e in ledger.occupying_on(node) if e.lease.holding], m or {})
            self._set_node(node, values)
            self._node_series[node] = (key, values)

    def _node_values(self, node: str, inv: Any, holding: list[Any], measured: Mapping[int, float]
                     ) -> dict[SeriesTable, dict[tuple[str, ...], float]]:
        """One node's series of the per-GPU gauges and of its leases' compute by kind, class and queue. Cards
        are keyed (node, index) while summing; a per-GPU series' labels add the card's UUID."""
        gpus = self._gpus(node, inv) if inv is not None else {}
        committed = dict.fromkeys(gpus, 0.0)
        mem = dict.fromkeys(gpus, 0.0)
        busy = dict.fromkeys(gpus, 0.0)
        per_lease: list[tuple[Any, tuple[tuple[str, str], ...], float]] = []
        for e in holding:
            a = e.lease.allocation
            share = share_of_card(a)
            keys = tuple(k for i in a.gpu_indices if (k := (a.node_name, str(i))) in gpus)
            for k in keys:
                committed[k] += share
                mem[k] += float(a.memory_mib * MIB)  # per card, as the snapshot counts it
                if e.lease.state is LeaseState.ACTIVE:
                    busy[k] += share
            per_lease.append((e, keys, share if e.lease.state is LeaseState.ACTIVE else 0.0))
        util: dict[tuple[str, ...], float] = {}
        nvml: set[tuple[str, str]] = set()
        for k, b in busy.items():
            m = measured.get(int(k[1]))
            if m is not None:
                nvml.add(k)
            util[(*gpus[k][0], "nvml" if m is not None else "model")] = min(1.0, b) if m is None else m
        leases_committed: dict[tuple[str, ...], float] = {}
        leases_busy: dict[tuple[str, ...], float] = {}
        for e, keys, share in per_lease:
            if not keys:
                continue
            kept = 0.0  # in GPUs: each card's measurement shared out by the leases' shares, or the share (model)
            for k in keys:
                kept += measured[int(k[1])] * (share / (busy[k] or 1.0)) if k in nvml else share
            a = e.lease.allocation
            labels = (a.node_name, a.kind.value, *_class_and_queue(e))
            _add(leases_committed, labels, share_of_card(a) * len(keys))
            _add(leases_busy, (*labels, "nvml" if all(k in nvml for k in keys) else "model"), kept)
        return {self.compute_capacity: {g[0]: 1.0 for g in gpus.values()},
                self.compute_committed: {gpus[k][0]: v for k, v in committed.items()},
                self.memory_capacity: {g[0]: g[1] for g in gpus.values()},
                self.memory_committed: {gpus[k][0]: min(v, gpus[k][1]) for k, v in mem.items()},
                self.gpu_util: util, self.leases_committed: leases_committed, self.leases_busy: leases_busy}

    def _set_node(self, node: str, values: dict[SeriesTable, dict[tuple[str, ...], float]]) -> None:
        """Set one node's series to ``values``; those it no longer has go."""
        before = self._node_series.get(node, (None, {}))[1]
        for table in set(before) | set(values):
            old, new = before.get(table, {}), values.get(table, {})
            table.values.update(new)
            for labels in old.keys() - new.keys():
                del table.values[labels]
        util = values.get(self.gpu_util)
        if util:
            self._node_util[node] = sum(util.values()) / len(util)
        else:
            self._node_util.pop(node, None)

    def _child(self, gauge: Gauge, labels: tuple[str, ...]) -> Any:
        key = (gauge._name, labels)  # noqa: SLF001 - the gauge's own name, unique in the registry
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = gauge.labels(*labels)
        return child

    def _remove(self, gauge: Gauge, labels: tuple[str, ...]) -> None:
        self._children.pop((gauge._name, labels), None)  # noqa: SLF001
        gauge.remove(*labels)

    def _gpus(self, node: str, inventory: Any) -> dict[tuple[str, str], tuple[tuple[str, str, str], float]]:
        """(node, gpu) -> (the card's per-GPU labels: node, index, UUID; its memory in bytes) of one node's GPUs,
        kept while its inventory is the same object."""
        cached = self._gpu_caps.get(node)
        if cached is None or cached[0] is not inventory:
            cached = self._gpu_caps[node] = (inventory, {
                (node, str(g.index)): ((node, str(g.index), g.uuid), float(g.total_memory_mib * MIB))
                for g in inventory.gpus})
        return cached[1]

    def _sync(self, gauge: Gauge, values: Mapping[tuple[str, ...], float], *, keep_zero: bool = False) -> None:
        """:func:`_sync`, touching only the children whose value changed since this gauge's last sync
        (every gauge synced here is set nowhere else, so what it was set to is what it holds)."""
        last = self._synced.get(gauge._name)  # noqa: SLF001 - the gauge's own name, unique in the registry
        if last is None:
            _sync(gauge, values, keep_zero=keep_zero)
        else:
            for labels, v in values.items():
                if last.get(labels) != v:
                    self._child(gauge, labels).set(v)
            for labels in last:
                if labels not in values:
                    if keep_zero:
                        if last[labels] != 0:
                            self._child(gauge, labels).set(0)
                    else:
                        self._remove(gauge, labels)
        now = dict(values)
        if keep_zero:  # children not in values stay, at 0
            for labels in (gauge._metrics if last is None else last):  # noqa: SLF001 - see _sync
                now.setdefault(labels, 0)
        self._synced[gauge._name] = now  # noqa: SLF001



def _samples(metric: Any) -> list[Any]:
    return [s for family in metric.collect() for s in family.samples]


def _summed(counter: Counter) -> float:
    """A counter's ``_total`` summed over its labels."""
    return sum(s.value for s in _samples(counter) if s.name.endswith("_total"))


def _class_and_queue(e: Any) -> tuple[str, str]:
    """A ledger entry's ``priority_class`` and ``queue`` labels (both declared in the scheduler config)."""
    return e.lease.priority_class or NO_CLASS, e.spec.queue or "default"


def _add(d: dict[tuple[str, ...], float], key: tuple[str, ...], v: float) -> None:
    d[key] = d.get(key, 0.0) + v


def _inc(d: dict[tuple[str, ...], float], key: tuple[str, ...], n: int = 1) -> None:
    v = d.get(key, 0) + n
    if v:
        d[key] = v
    else:
        del d[key]  # as a count from scratch would not have the key


class LeaseCounts:
    """The live (not ended) leases of a ledger, counted as they change (a :meth:`Ledger.watch` er).

    Invariant: after any sequence of changes, ``by_state``, ``queued`` and ``active`` equal
    :func:`count_live` over the ledger's entries (no zero entries), so a cycle reads them in
    O(1) instead of walking every live lease; ``entered`` holds the ids that began holding
    devices since the reader last emptied it (the reader checks they still hold)."""

    __slots__ = ("by_state", "queued", "active", "entered")

    def __init__(self) -> None:
        self.by_state: dict[tuple[str, ...], float] = {}  # (kind, state) -> live leases
        self.queued: dict[tuple[str, ...], float] = {}  # (priority class, queue) -> pending leases
        self.active: dict[tuple[str, ...], float] = {}  # (kind,) -> leases holding devices
        self.entered: set[str] = set()

    def change(self, old: Any, new: Any) -> None:
        was = _live_keys(old) if old is not None else None
        now = _live_keys(new) if new is not None else None
        if was == now:
            return
        for keys, n in ((was, -1), (now, 1)):
            if keys is None:
                continue
            state_key, queue_key, active_key = keys
            _inc(self.by_state, state_key, n)
            if queue_key is not None:
                _inc(self.queued, queue_key, n)
            if active_key is not None:
                _inc(self.active, active_key, n)
        if now is not None and now[2] is not None and (was is None or was[2] is None):
            self.entered.add(new.lease_id)


def _live_keys(e: Any) -> tuple[tuple[str, ...], tuple[str, ...] | None, tuple[str, ...] | None] | None:
    """What one entry adds to the counts: (kind, state), (class, queue) if pending, (kind,) if holding;
    None for an ended lease."""
    lease = e.lease
    if lease.state in LEASE_TRANSITIONS.terminal:
        return None
    kind = lease.allocation.kind.value if lease.allocation else (e.spec.request.kind or "any")
    state_key = (str(getattr(kind, "value", kind)), lease.state.value)
    if lease.state is LeaseState.PENDING:
        return state_key, _class_and_queue(e), None
    if lease.holding and lease.allocation is not None:
        return state_key, None, (lease.allocation.kind.value,)
    return state_key, None, None


def count_live(entries: Iterable[Any]) -> LeaseCounts:
    """:class:`LeaseCounts` from scratch, by walking ``entries`` (what the kept counts must equal)."""
    counts = LeaseCounts()
    for e in entries:
        counts.change(None, e)
    counts.entered.clear()
    return counts


def _sync(gauge: Gauge, values: Mapping[tuple[str, ...], float], *, keep_zero: bool = False) -> None:
    """Set every labelled child in ``values``; children not in it read 0 (``keep_zero``) or go.

    Setting before removing means a scrape never sees a series missing for a moment.
    """
    for labels, v in values.items():
        gauge.labels(*labels).set(v)
    for labels in list(gauge._metrics):  # noqa: SLF001 - prometheus_client keeps children here
        if labels not in values:
            if keep_zero:
                gauge.labels(*labels).set(0)
            else:
                gauge.remove(*labels)
