"""The head's Prometheus metrics (``/metrics``), from its own ledger.

Names (the Grafana dashboard in :mod:`orchestrator.deploy.k8s.dashboard` queries them):

* ``orchestrator_gpus_total`` / ``orchestrator_gpus_allocated`` -- GPUs of the
  registered nodes, and those allocated (MIG slices and shares in fractions);
* ``orchestrator_queue_length{priority}`` -- pending leases by priority class;
* ``orchestrator_leases_active{kind}`` -- holding leases by share kind;
* ``orchestrator_preemptions_total{reason}`` -- victims asked to checkpoint
  (``checkpoint``) or stopped at once / at their deadline (``stopped``);
* ``orchestrator_lease_wait_seconds`` -- histogram of request-to-grant time;
* ``orchestrator_inventory_disagreements{node,field,severity}`` -- the latest
  Kubernetes cross-check (node labels vs the agents' NVML inventory).

:class:`HeadMetrics` holds its own registry (several heads in one test
process never collide) and is updated once per reconcile cycle; it imports
no Ray. :meth:`HeadMetrics.serve` starts the HTTP endpoint.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import start_http_server

from orchestrator.control.controller import HeadController, ReconcileReport
from orchestrator.core.lease import LeaseState


class HeadMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.gpus_total = Gauge("orchestrator_gpus_total", "GPUs of the registered nodes", registry=r)
        self.gpus_allocated = Gauge("orchestrator_gpus_allocated", "GPUs allocated to leases (fractions counted)",
                                    registry=r)
        self.queue_length = Gauge("orchestrator_queue_length", "Pending leases", ["priority"], registry=r)
        self.leases_active = Gauge("orchestrator_leases_active", "Leases holding devices", ["kind"], registry=r)
        self.preemptions = Counter("orchestrator_preemptions", "Preemption victims", ["reason"], registry=r)
        for reason in ("checkpoint", "stopped"):  # known label values read 0 before the first event, not "no data"
            self.preemptions.labels(reason)
        self.lease_wait = Histogram("orchestrator_lease_wait_seconds", "Time from request to grant", registry=r,
                                    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900))
        self.inventory_disagreements = Gauge(
            "orchestrator_inventory_disagreements",
            "Disagreements between Kubernetes node labels (GPU feature discovery) and the agents' NVML inventory",
            ["node", "field", "severity"], registry=r)
        self._inventory_keys: set[tuple[str, str, str]] = set()
        self._observed: set[str] = set()
        self._server: Any = None

    def update(self, ctl: HeadController, report: ReconcileReport | None = None) -> None:
        """Refresh from the controller (and count one cycle's preemptions from its report)."""
        snap = ctl.snapshot()
        self.gpus_total.set(snap.capacity_milli() / 1000)
        self.gpus_allocated.set(snap.allocated_milli() / 1000)
        queued: dict[str, int] = {}
        active: dict[str, int] = {}
        holding: set[str] = set()
        for e in ctl.ledger:
            lease = e.lease
            if lease.state is LeaseState.PENDING:
                queued[lease.priority_class or "none"] = queued.get(lease.priority_class or "none", 0) + 1
            elif lease.holding and lease.allocation is not None:
                kind = lease.allocation.kind.value
                active[kind] = active.get(kind, 0) + 1
                holding.add(lease.lease_id)
                if lease.lease_id not in self._observed:
                    self._observed.add(lease.lease_id)
                    granted = lease.entered(LeaseState.GRANTED)
                    if granted is not None:
                        self.lease_wait.observe(max(0.0, granted - lease.history[0].at))
        self._observed &= holding  # a lease is observed once, when it first holds; ended ones can go
        _set_all(self.queue_length, queued)
        _set_all(self.leases_active, active)
        if report is not None:
            if report.checkpoint_requested:
                self.preemptions.labels("checkpoint").inc(len(report.checkpoint_requested))
            if report.preempted:
                self.preemptions.labels("stopped").inc(len(report.preempted))

    def set_inventory_disagreements(self, counts: dict[tuple[str, str, str], int]) -> None:
        """The latest cross-check's counts; a disagreement that went away reads 0, not its last value."""
        for key in self._inventory_keys - set(counts):
            self.inventory_disagreements.labels(*key).set(0)
        for key, n in counts.items():
            self.inventory_disagreements.labels(*key).set(n)
        self._inventory_keys |= set(counts)

    def text(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``host:port`` (port 0: a free one); returns the port."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        return int(server.server_port)


def _set_all(gauge: Gauge, values: dict[str, int]) -> None:
    # Labels that went to zero must read 0, not keep their last value.
    for labels in list(gauge._metrics):  # noqa: SLF001 - prometheus_client keeps children here
        if labels[0] not in values:
            gauge.labels(*labels).set(0)
    for k, v in values.items():
        gauge.labels(k).set(v)
