"""The head's Prometheus metric families (``/metrics``): their names, labels and registry.

Names follow Prometheus' conventions (``tests/unit/test_metrics_conventions.py`` runs
``promtool check metrics`` and the same rules in Python over every family): ``orchestrator_``
prefix, base units as suffixes (``_seconds``, ``_bytes``; GPU compute in GPUs, 1 = one card,
has no suffix), ``_total`` on counters and only there, ``_ratio`` on 0..1 gauges, snake_case
labels. Labels are bounded: a node, a GPU, a share kind, a priority class, a queue, a
declared inference service -- never a lease id, a driver, a token or a process id (a
label per lease made a series per lease attempt, kept forever by Prometheus). The Grafana
dashboard (:mod:`orchestrator.deploy.k8s.dashboard`) has a panel for every family, and the
live page (:mod:`orchestrator.dashboard`) reads some of them.

``priority_class`` is the lease's class (``none`` where it names none), ``queue`` its queue;
both are declared in the scheduler config (an unknown one is refused at the request), so
their values are bounded.

Queue and leases

* ``orchestrator_queue_length{priority_class,queue}`` -- pending leases;
* ``orchestrator_lease_wait_seconds{priority_class,queue}`` -- histogram of time pending
  (request to grant);
* ``orchestrator_leases{kind,state}`` -- leases by share kind (``any`` while a pending
  request names none) and state; ``orchestrator_leases_active{kind}`` -- those holding devices;
* ``orchestrator_leases_granted_total{kind,priority_class,queue}`` -- grants (the pipeline's
  throughput).

Capacity, per GPU (``node``, ``gpu`` = device index, ``gpu_uuid`` = the card's UUID, ``GPU-...``)

``gpu_uuid`` is what NVIDIA's DCGM exporter calls ``UUID`` (its series carry ``gpu``, ``UUID``,
``Hostname``, ``modelName``); a join renames one side, e.g.
``label_replace(DCGM_FI_DEV_GPU_UTIL, "gpu_uuid", "$1", "UUID", "(.+)")``. Ours is snake_case
as Prometheus' naming rules ask, and ``gpu`` stays the index as in DCGM's series.

* ``orchestrator_gpus`` / ``orchestrator_gpus_allocated`` -- cluster-wide, fractions counted;
* ``orchestrator_gpu_compute_capacity`` / ``orchestrator_gpu_compute_committed`` -- in GPUs;
* ``orchestrator_gpu_memory_capacity_bytes`` / ``orchestrator_gpu_memory_committed_bytes``;
* ``orchestrator_gpu_utilization_ratio{node,gpu,gpu_uuid,source}`` -- busy fraction of the card.
  ``source="model"``: the workload model on simulated GPUs (an active lease keeps its share
  busy: a whole card 1, an MPS or time-slice share its fraction, a MIG slice its compute
  slices / 7; a granted lease not yet started 0); ``source="nvml"``: what the agent measured
  (``nvmlDeviceGetUtilizationRates``), per GPU, shared out to its leases by their shares.

Leases' GPU compute, per node and the leases' kind, class and queue (in GPUs)

* ``orchestrator_leases_gpu_compute_committed{node,kind,priority_class,queue}`` -- what the
  holding leases were given (summed over kinds, a node's ``orchestrator_gpu_compute_committed``);
* ``orchestrator_leases_gpu_compute_busy{node,kind,priority_class,queue,source}`` -- the part of
  it they keep busy (``source`` as above: ``nvml`` when every card of a lease was measured).
  Busy over committed is how well a class uses what it holds: what the per-lease
  ``orchestrator_lease_gpu_utilization_ratio{lease,owner}`` said, without a series per lease.

Preemption and latency

* ``orchestrator_preemptions_total{reason,cause,priority_class,queue}`` -- victims (of that
  class and queue) asked to checkpoint (``reason="checkpoint"``) or stopped at once or at their
  deadline (``stopped``); ``cause`` is why they were chosen (``victim.priority``,
  ``victim.reclaim``) or ``deadline`` for a checkpoint that never came;
* ``orchestrator_checkpoint_seconds`` -- a victim's checkpoint request to its yield;
* ``orchestrator_decision_to_grant_seconds`` -- a preemption decision to the grant of
  the lease it was made for;
* ``orchestrator_placement_seconds`` -- one scheduling pass over the queue (the engine's
  placement and preemption planning), per pass that had work;
* ``orchestrator_mig_reconfigurations_total{result}`` -- live MIG repartitions of one GPU
  that ended (``done``: the agent shows the new layout; ``failed``: the old one kept);
  the leases drained for them count in ``orchestrator_preemptions_total{cause="lease.drained"}``;

The head itself

* ``orchestrator_reconcile_cycles_total``; ``orchestrator_channel_calls_total``,
  ``orchestrator_channel_batches_total``, ``orchestrator_channel_calls_in_flight`` (the head's gRPC
  channel, docs/load.md); ``orchestrator_state_commits_total``,
  ``orchestrator_state_commit_records_total``, ``orchestrator_state_commit_failures_total``,
  ``orchestrator_state_commit_seconds`` (the group commit of hard state to the GCS).

Agents, inventory, inference

* ``orchestrator_agent_heartbeat_age_seconds{node}`` -- computed when scraped, from the head's clock;
* ``orchestrator_inventory_disagreements{node,field,severity}`` -- the latest Kubernetes
  cross-check (node labels vs the agents' NVML inventory, ``HeadApi.report_inventory_check``);
  one series per severity with empty ``node`` and ``field`` (which Prometheus stores
  without those labels) reads 0, so the panel shows 0 rather than "no data" where no
  check runs or nothing disagrees;
* ``orchestrator_inference_requests_total{service}``,
  ``orchestrator_inference_latency_seconds{service}``,
  ``orchestrator_inference_slo_misses_total{service}`` -- reported by a running service
  through ``HeadApi.record_inference``. ``service`` is a name registered beforehand
  (``settings.inference_services``, :meth:`MetricFamilies.register_inference_service`);
  reports under any other name count as ``service="other"``, so a caller cannot add series.

:class:`~orchestrator.control.metrics.HeadMetrics` holds its own registry (several heads in one test process
never collide) and is updated once per reconcile cycle; it imports no Ray. The
per-GPU and per-node families are :class:`SeriesTable` s (a dict of
series read at scrape time), not labelled gauges: a cluster has hundreds of
thousands of those series.
:meth:`MetricFamilies.serve` starts the HTTP endpoint; :meth:`MetricFamilies.samples`
is the same data as JSON for the head's API.

This module holds the families and their registry (:class:`MetricFamilies`: each family declared once,
with its labels and buckets; what is recorded from outside the cycle; the exposition), and the two
collectors read at scrape time (:class:`SeriesTable`, :class:`HeartbeatAges`). Working the values out of
the ledger and the node registry once per reconcile cycle is :mod:`orchestrator.control.metrics`'
(:class:`~orchestrator.control.metrics.HeadMetrics`, a :class:`MetricFamilies`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import start_http_server

from orchestrator.control.nodes import NodeRegistry, NodeState
from orchestrator.core.reasons import Cause

MIB = 1024 * 1024
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
SEVERITIES = ("error", "warning")
#: The ``service`` label of inference reports from a name that was not registered.
OTHER_SERVICE = "other"
#: The ``priority_class`` label of a lease that names none.
NO_CLASS = "none"


class SeriesTable:
    """A gauge family whose series live in one plain dict, ``values`` (label values -> value), read
    at scrape time.

    A labelled :class:`~prometheus_client.Gauge` keeps a child object, a lock and a value holder
    per series: 40,000 GPUs x 5 per-GPU gauges were 600,000 objects for the garbage collector to
    walk on every full collection, and a lock taken per set. Here a series is a dict entry.
    ``values`` is changed only by the head's thread; a scrape (another thread) copies it first,
    in one C call, so it sees the dict as it was between two changes."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry,
                 unit: str = "") -> None:
        self.name, self.documentation, self.labelnames, self.unit = name, documentation, tuple(labelnames), unit
        self.values: dict[tuple[str, ...], float] = {}
        registry.register(self)

    def describe(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames, unit=self.unit)]

    def collect(self) -> list[GaugeMetricFamily]:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames, unit=self.unit)
        for labels, v in self.values.copy().items():
            family.add_metric(labels, v)
        return [family]


class HeartbeatAges:
    """``orchestrator_agent_heartbeat_age_seconds{node}``, computed when scraped: each registered node's time since
    its agent's last heartbeat, on the head's clock, from the registry it follows (:meth:`follow`).

    Every node's age changes all the time, so a table kept up on the head's loop cost a pass over every node
    (5,000 at the scale bench, once a second) for a value read every 15 s or so. A scrape (another thread) copies
    the registry's records in one C call, so it sees them as they were between two changes; records are
    immutable."""

    NAME = "orchestrator_agent_heartbeat_age_seconds"
    HELP = "Since the agent's last heartbeat"

    def __init__(self, registry: CollectorRegistry) -> None:
        self._source: tuple[Callable[[], float], NodeRegistry] | None = None
        registry.register(self)

    def follow(self, clock: Callable[[], float], nodes: NodeRegistry) -> None:
        """Read ``nodes``' records and ``clock`` at each scrape from now on."""
        self._source = (clock, nodes)

    def describe(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily(self.NAME, self.HELP, labels=["node"], unit="seconds")]

    def collect(self) -> list[GaugeMetricFamily]:
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=["node"], unit="seconds")
        if self._source is not None:
            clock, nodes = self._source
            now = clock()
            for rec in sorted(list(nodes.records.values()), key=lambda r: r.name):
                if rec.state is NodeState.REGISTERED:
                    family.add_metric((rec.name,), max(0.0, now - rec.last_seen))
        return [family]


class MetricFamilies:
    """Every family of the head's metrics in its own registry (several heads in one test process never
    collide), what is recorded into them from outside the reconcile cycle, and their exposition."""

    def __init__(self, *, priority_classes: Iterable[str] = (), queues: Iterable[str] = ("default",),
                 inference_services: Iterable[str] = ()) -> None:
        """``priority_classes`` and ``queues`` (the scheduler config's): their preemption counters read 0 before the
        first preemption, not "no data". ``inference_services``: the names inference reports keep as their
        ``service`` label (:meth:`register_inference_service`); any other counts as ``other``."""
        r = self.registry = CollectorRegistry()
        self.gpus = Gauge("orchestrator_gpus", "GPUs of the registered nodes", registry=r)
        self.gpus_allocated = Gauge("orchestrator_gpus_allocated", "GPUs allocated to leases (fractions counted)",
                                    registry=r)
        self.queue_length = Gauge("orchestrator_queue_length", "Pending leases", ["priority_class", "queue"],
                                  registry=r)
        self.leases = Gauge("orchestrator_leases", "Leases by share kind and state", ["kind", "state"], registry=r)
        self.leases_active = Gauge("orchestrator_leases_active", "Leases holding devices", ["kind"], registry=r)
        self.granted = Counter("orchestrator_leases_granted", "Leases granted", ["kind", "priority_class", "queue"],
                               registry=r)
        self.preemptions = Counter("orchestrator_preemptions", "Preemption victims",
                                   ["reason", "cause", "priority_class", "queue"], registry=r)
        for cls in priority_classes:  # known label values read 0 before the first event, not "no data"
            for queue in queues:
                for reason in ("checkpoint", "stopped"):
                    self.preemptions.labels(reason, Cause.VICTIM_PRIORITY.value, cls, queue)
        self.mig_reconfigurations = Counter("orchestrator_mig_reconfigurations",
                                            "Live MIG repartitions of one GPU that ended", ["result"], registry=r)
        for result in ("done", "failed"):
            self.mig_reconfigurations.labels(result)
        self.lease_wait = Histogram("orchestrator_lease_wait_seconds", "Time pending: request to grant",
                                    ["priority_class", "queue"], registry=r, unit="seconds",
                                    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900))
        self.checkpoint = Histogram("orchestrator_checkpoint_seconds", "A victim's checkpoint request to its yield",
                                    registry=r, unit="seconds", buckets=LATENCY_BUCKETS)
        self.decision_to_grant = Histogram("orchestrator_decision_to_grant_seconds",
                                           "A preemption decision to the grant it was made for", registry=r,
                                           unit="seconds", buckets=LATENCY_BUCKETS)
        self.placement = Histogram("orchestrator_placement_seconds", "One scheduling pass (placement and planning)",
                                   registry=r, unit="seconds", buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                                        0.05, 0.1, 0.25, 0.5, 1, 2.5))
        self.cycles = Counter("orchestrator_reconcile_cycles", "Reconcile cycles the head ran (on its timer, or woken "
                              "by a call or an answer that left it work)", registry=r)
        self.channel_calls = Counter("orchestrator_channel_calls", "Client calls (each a batch of one client's quick "
                                     "calls) carried out over the head's gRPC channel", registry=r)
        self.channel_batches = Counter("orchestrator_channel_batches", "Batches the head made of those calls (the "
                                       "calls that reached it together)", registry=r)
        self.channel_in_flight = Gauge("orchestrator_channel_calls_in_flight", "Calls on the head's channel being "
                                       "answered now", registry=r)
        self.commits = Counter("orchestrator_state_commits", "Batches of hard state written to the GCS (group commit)",
                               registry=r)
        self.commit_records = Counter("orchestrator_state_commit_records", "Records in the batches written", registry=r)
        self.commit_failures = Counter("orchestrator_state_commit_failures",
                                       "Batch writes that failed (each retried with the next batch)", registry=r)
        self.commit_seconds = Histogram("orchestrator_state_commit_seconds", "Writing one batch to the GCS", registry=r,
                                        unit="seconds", buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                                 0.25, 1))
        gpu = ["node", "gpu", "gpu_uuid"]
        self.compute_capacity = SeriesTable("orchestrator_gpu_compute_capacity", "GPU compute capacity (GPUs)", gpu, r)
        self.compute_committed = SeriesTable("orchestrator_gpu_compute_committed",
                                             "GPU compute committed to leases (GPUs)", gpu, r)
        self.memory_capacity = SeriesTable("orchestrator_gpu_memory_capacity_bytes", "GPU memory", gpu, r, "bytes")
        self.memory_committed = SeriesTable("orchestrator_gpu_memory_committed_bytes",
                                            "GPU memory committed to leases", gpu, r, "bytes")
        self.gpu_util = SeriesTable("orchestrator_gpu_utilization_ratio", "Busy fraction of the card",
                                    gpu + ["source"], r, "ratio")
        held = ["node", "kind", "priority_class", "queue"]
        self.leases_committed = SeriesTable("orchestrator_leases_gpu_compute_committed",
                                            "GPU compute committed to the holding leases of a kind, class and queue "
                                            "(GPUs)", held, r)
        self.leases_busy = SeriesTable("orchestrator_leases_gpu_compute_busy",
                                       "GPU compute the holding leases of a kind, class and queue keep busy (GPUs)",
                                       held + ["source"], r)
        self.heartbeat_age = HeartbeatAges(r)
        self.inventory_disagreements = Gauge(
            "orchestrator_inventory_disagreements",
            "Disagreements between Kubernetes node labels (GPU feature discovery) and the agents' NVML inventory",
            ["node", "field", "severity"], registry=r)
        for s in SEVERITIES:
            self.inventory_disagreements.labels("", "", s).set(0)
        self._inventory_keys: set[tuple[str, str, str]] = set()
        self.inference_requests = Counter("orchestrator_inference_requests", "Inference requests served",
                                          ["service"], registry=r)
        self.inference_latency = Histogram("orchestrator_inference_latency_seconds", "Inference request latency",
                                           ["service"], registry=r, unit="seconds", buckets=LATENCY_BUCKETS)
        self.slo_misses = Counter("orchestrator_inference_slo_misses", "Inference requests slower than the SLO",
                                  ["service"], registry=r)
        self.inference_services: set[str] = set()
        for service in inference_services:
            self.register_inference_service(service)
        self._server: Any = None

    # ---- from elsewhere ---------------------------------------------------------------------------------
    def set_inventory_disagreements(self, counts: Mapping[tuple[str, str, str], int]) -> None:
        """The latest cross-check's counts per (node, field, severity); one that went away reads 0."""
        for key in self._inventory_keys - set(counts):
            self.inventory_disagreements.labels(*key).set(0)
        for key, n in counts.items():
            self.inventory_disagreements.labels(*key).set(n)
        self._inventory_keys |= set(counts)

    def register_inference_service(self, service: str) -> None:
        """Give ``service`` its own ``service`` label from now on (its series read 0 until it reports)."""
        if not isinstance(service, str) or not service or service == OTHER_SERVICE:
            raise ValueError(f"an inference service name other than {OTHER_SERVICE!r}, not {service!r}")
        self.inference_services.add(service)
        self.inference_requests.labels(service)
        self.slo_misses.labels(service)

    def record_inference(self, service: str, latencies_s: Sequence[float], slo_s: float | None = None) -> int:
        """Count requests a service served, with their latencies; returns how many missed the SLO. A service
        not registered (:meth:`register_inference_service`) counts as ``other``: the callers choose the name,
        and each name would otherwise be a new series for as long as the head runs."""
        if service not in self.inference_services:
            service = OTHER_SERVICE
        misses = 0
        for lat in latencies_s:
            self.inference_latency.labels(service).observe(lat)
            if slo_s is not None and lat > slo_s:
                misses += 1
        self.inference_requests.labels(service).inc(len(latencies_s))
        self.slo_misses.labels(service).inc(misses)
        return misses

    # ---- out --------------------------------------------------------------------------------------------
    def text(self) -> bytes:
        return generate_latest(self.registry)

    def samples(self) -> list[list[Any]]:
        """Every sample as ``[name, labels, value]`` (JSON-safe; NaN and infinities as strings)."""
        out: list[list[Any]] = []
        for family in self.registry.collect():
            for s in family.samples:
                v = s.value
                out.append([s.name, dict(s.labels), v if math.isfinite(v) else str(v)])
        return out

    def committed(self, records: int, seconds: float) -> None:
        """One batch of hard state written (the head actor's group commit reports each)."""
        self.commits.inc()
        self.commit_records.inc(records)
        self.commit_seconds.observe(seconds)

    def commit_failed(self) -> None:
        self.commit_failures.inc()

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``host:port`` (port 0: a free one); returns the port."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        return int(server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
