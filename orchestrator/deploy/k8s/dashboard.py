"""The Grafana dashboard shipped as a ConfigMap (the dashboard sidecar loads it).

Built as a plain dict so ``render`` stays deterministic and needs no data file.
Every panel queries the head's own Prometheus names (``orchestrator_*`` on the
head's ``/metrics``, :mod:`orchestrator.control.metrics`); the ``namespace`` label
is the one Prometheus adds from the PodMonitor's target. Every family the head
exports has a panel (``tests/unit/test_metrics_conventions.py`` checks it against
the head's registry); ``METRICS`` lists the names the panels use, and a
real-cluster test scrapes the head into Prometheus and runs every panel's query
(``tests/integration/test_dashboard.py``).
"""

from __future__ import annotations

import json
import re
from typing import Any

_NS = '{namespace="$namespace"}'


def _q(expr: str) -> str:
    return expr.replace("{NS}", _NS)


def _p(q: float, metric: str, by: str = "le") -> str:
    return _q(f"histogram_quantile({q}, sum by ({by}) (rate({metric}_bucket{{NS}}[5m])))")


def _rate(metric: str, by: str = "") -> str:
    return _q(f"sum{f' by ({by})' if by else ''} (rate({metric}{{NS}}[5m]))")


#: (title, PromQL queries, unit) of every panel, in order.
_PANELS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("GPUs allocated / total", (_q("sum(orchestrator_gpus_allocated{NS}) / sum(orchestrator_gpus{NS})"),),
     "percentunit"),
    ("Queued leases by priority class and queue",
     (_q("sum by (priority_class, queue) (orchestrator_queue_length{NS})"),), "short"),
    ("Leases by kind and state", (_q("sum by (kind, state) (orchestrator_leases{NS})"),), "short"),
    ("Active leases by kind", (_q("sum by (kind) (orchestrator_leases_active{NS})"),), "short"),
    ("Leases granted by priority class and queue (5m rate)",
     (_rate("orchestrator_leases_granted_total", "priority_class, queue"),), "ops"),
    ("Preemptions by reason and cause (5m rate)", (_rate("orchestrator_preemptions_total", "reason, cause"),), "ops"),
    ("Preemption victims by priority class and queue (5m rate)",
     (_rate("orchestrator_preemptions_total", "priority_class, queue"),), "ops"),
    ("Time pending p95 by priority class",
     (_p(0.95, "orchestrator_lease_wait_seconds", "le, priority_class"),), "s"),
    ("GPU compute committed / capacity by node",
     (_q("sum by (node) (orchestrator_gpu_compute_committed{NS}) "
         "/ sum by (node) (orchestrator_gpu_compute_capacity{NS})"),), "percentunit"),
    ("GPU memory committed / capacity by node",
     (_q("sum by (node) (orchestrator_gpu_memory_committed_bytes{NS}) "
         "/ sum by (node) (orchestrator_gpu_memory_capacity_bytes{NS})"),), "percentunit"),
    ("GPU utilisation by node", (_q("avg by (node) (orchestrator_gpu_utilization_ratio{NS})"),), "percentunit"),
    ("Lease GPU utilisation by kind and priority class (busy / committed)",
     (_q("sum by (kind, priority_class) (orchestrator_leases_gpu_compute_busy{NS}) "
         "/ sum by (kind, priority_class) (orchestrator_leases_gpu_compute_committed{NS})"),), "percentunit"),
    ("Checkpoint duration p95", (_p(0.95, "orchestrator_checkpoint_seconds"),), "s"),
    ("Preemption decision to grant p95", (_p(0.95, "orchestrator_decision_to_grant_seconds"),), "s"),
    ("Placement latency p99 (one scheduling pass)", (_p(0.99, "orchestrator_placement_seconds"),), "s"),
    ("MIG repartitions by result (5m rate)", (_rate("orchestrator_mig_reconfigurations_total", "result"),), "ops"),
    ("Agent heartbeat age", (_q("max by (node) (orchestrator_agent_heartbeat_age_seconds{NS})"),), "s"),
    ("Inventory disagreements (Kubernetes labels vs agents)",
     (_q("sum by (severity) (orchestrator_inventory_disagreements{NS})"),), "short"),
    ("Inference requests (5m rate)", (_rate("orchestrator_inference_requests_total", "service"),), "reqps"),
    ("Inference latency p99", (_p(0.99, "orchestrator_inference_latency_seconds", "le, service"),), "s"),
    ("Inference SLO misses (5m rate)", (_rate("orchestrator_inference_slo_misses_total", "service"),), "ops"),
    ("Head reconcile cycles (5m rate)", (_rate("orchestrator_reconcile_cycles_total"),), "ops"),
    ("Direct channel: frames and batches (5m rate), clients connected",
     (_rate("orchestrator_channel_calls_total"), _rate("orchestrator_channel_batches_total"),
      _q("sum(orchestrator_channel_calls_in_flight{NS})")), "short"),
    ("State commits to the GCS: batches, records and failures (5m rate)",
     (_rate("orchestrator_state_commits_total"), _rate("orchestrator_state_commit_records_total"),
      _rate("orchestrator_state_commit_failures_total")), "ops"),
    ("State commit latency p99", (_p(0.99, "orchestrator_state_commit_seconds"),), "s"),
)

#: Every metric a panel queries (a test checks the head exports each, and that each panel has data).
METRICS: tuple[str, ...] = tuple(dict.fromkeys(
    m for _, exprs, _ in _PANELS for expr in exprs for m in re.findall(r"\b(orchestrator_[a-z_]+)\{", expr)))


def panels() -> tuple[tuple[str, str, str], ...]:
    """(title, PromQL with ``$namespace``, unit) of every query, in order; a panel of several queries gives a row
    for each."""
    return tuple((title, expr, unit) for title, exprs, unit in _PANELS for expr in exprs)


def dashboard(title: str) -> dict[str, Any]:
    """The dashboard model (Grafana schema 39), one time-series panel per row of ``_PANELS``."""
    panels = []
    for i, (name, exprs, unit) in enumerate(_PANELS):
        panels.append({
            "id": i + 1,
            "type": "timeseries",
            "title": name,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(ord("A") + j), "expr": expr, "legendFormat": "__auto"}
                        for j, expr in enumerate(exprs)],
        })
    return {
        "title": title,
        "uid": "ray-gpu-orchestrator",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "tags": ["ray", "gpu", "orchestrator"],
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus"},
            {"name": "namespace", "type": "query", "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": "label_values(orchestrator_gpus, namespace)", "refresh": 2},
        ]},
        "panels": panels,
    }


def dashboard_json(title: str) -> str:
    return json.dumps(dashboard(title), indent=2, sort_keys=True) + "\n"
