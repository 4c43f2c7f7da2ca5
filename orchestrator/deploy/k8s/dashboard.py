"""The Grafana dashboard shipped as a ConfigMap (the dashboard sidecar loads it).

Built as a plain dict so ``render`` stays deterministic and needs no data file.
Every panel queries the head's own Prometheus names (``orchestrator_*`` on the
head's ``/metrics``, :mod:`orchestrator.control.metrics`); the ``namespace`` label
is the one Prometheus adds from the PodMonitor's target. ``METRICS`` lists the
names the panels use, so a test can check them against what the head exports,
and a real-cluster test scrapes the head into Prometheus and runs every
panel's query (``tests/integration/test_dashboard.py``).
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


_PANELS: tuple[tuple[str, str, str], ...] = (
    # (title, PromQL, unit)
    ("GPUs allocated / total", _q("sum(orchestrator_gpus_allocated{NS}) / sum(orchestrator_gpus_total{NS})"),
     "percentunit"),
    ("Queued leases by priority class and queue",
     _q("sum by (priority, queue) (orchestrator_queue_length{NS})"), "short"),
    ("Leases by kind and state", _q("sum by (kind, state) (orchestrator_leases{NS})"), "short"),
    ("Active leases by kind", _q("sum by (kind) (orchestrator_leases_active{NS})"), "short"),
    ("Preemptions by reason and cause (5m rate)",
     _q("sum by (reason, cause) (rate(orchestrator_preemptions_total{NS}[5m]))"), "ops"),
    ("Time pending p95", _p(0.95, "orchestrator_lease_wait_seconds"), "s"),
    ("GPU compute committed / capacity by node",
     _q("sum by (node) (orchestrator_gpu_compute_committed{NS}) / sum by (node) (orchestrator_gpu_compute_capacity{NS})"),
     "percentunit"),
    ("GPU memory committed / capacity by node",
     _q("sum by (node) (orchestrator_gpu_memory_committed_bytes{NS}) "
        "/ sum by (node) (orchestrator_gpu_memory_capacity_bytes{NS})"), "percentunit"),
    ("GPU utilisation by node", _q("avg by (node) (orchestrator_gpu_utilization_ratio{NS})"), "percentunit"),
    ("GPU utilisation by lease", _q("avg by (lease, kind) (orchestrator_lease_gpu_utilization_ratio{NS})"),
     "percentunit"),
    ("Checkpoint duration p95", _p(0.95, "orchestrator_checkpoint_seconds"), "s"),
    ("Preemption decision to grant p95", _p(0.95, "orchestrator_decision_to_grant_seconds"), "s"),
    ("Placement latency p99 (one scheduling pass)", _p(0.99, "orchestrator_placement_seconds"), "s"),
    ("Agent heartbeat age", _q("max by (node) (orchestrator_agent_heartbeat_age_seconds{NS})"), "s"),
    ("Inventory disagreements (Kubernetes labels vs agents)",
     _q("sum by (severity) (orchestrator_inventory_disagreements{NS})"), "short"),
    ("Inference requests (5m rate)",
     _q("sum by (service) (rate(orchestrator_inference_requests_total{NS}[5m]))"), "reqps"),
    ("Inference latency p99", _p(0.99, "orchestrator_inference_latency_seconds", "le, service"), "s"),
    ("Inference SLO misses (5m rate)",
     _q("sum by (service) (rate(orchestrator_inference_slo_misses_total{NS}[5m]))"), "ops"),
)

#: Every metric a panel queries (a test checks the head exports each, and that each panel has data).
METRICS: tuple[str, ...] = tuple(dict.fromkeys(
    m for _, expr, _ in _PANELS for m in re.findall(r"\b(orchestrator_[a-z_]+)\{", expr)))


def panels() -> tuple[tuple[str, str, str], ...]:
    """(title, PromQL with ``$namespace``, unit) of every panel, in order."""
    return _PANELS


def dashboard(title: str) -> dict[str, Any]:
    """The dashboard model (Grafana schema 39), one time-series panel per row of ``_PANELS``."""
    panels = []
    for i, (name, expr, unit) in enumerate(_PANELS):
        panels.append({
            "id": i + 1,
            "type": "timeseries",
            "title": name,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": "A", "expr": expr, "legendFormat": "__auto"}],
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
             "query": "label_values(orchestrator_gpus_total, namespace)", "refresh": 2},
        ]},
        "panels": panels,
    }


def dashboard_json(title: str) -> str:
    return json.dumps(dashboard(title), indent=2, sort_keys=True) + "\n"
