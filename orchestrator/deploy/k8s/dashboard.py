"""The Grafana dashboard shipped as a ConfigMap (the dashboard sidecar loads it).

Built as a plain dict so ``render`` stays deterministic and needs no data file.
The metric names are the head's Prometheus names (``orchestrator_*`` on the
head's ``/metrics``) plus Ray's own; ``METRICS`` lists the ones the panels use
so a test can check them against what the head exports.
"""

from __future__ import annotations

import json
from typing import Any

METRICS: tuple[str, ...] = (
    "orchestrator_gpus_total",
    "orchestrator_gpus_allocated",
    "orchestrator_queue_length",
    "orchestrator_leases_active",
    "orchestrator_preemptions_total",
    "orchestrator_lease_wait_seconds_bucket",
    "orchestrator_inventory_disagreements",
    "ray_node_gpus_utilization",
)

_PANELS: tuple[tuple[str, str, str], ...] = (
    # (title, PromQL, unit)
    ("GPUs allocated / total", 'sum(orchestrator_gpus_allocated{namespace="$namespace"}) '
     '/ sum(orchestrator_gpus_total{namespace="$namespace"})', "percentunit"),
    ("Queued jobs by priority", 'sum by (priority) (orchestrator_queue_length{namespace="$namespace"})', "short"),
    ("Active leases by kind", 'sum by (kind) (orchestrator_leases_active{namespace="$namespace"})', "short"),
    ("Preemptions by reason (5m rate)",
     'sum by (reason) (rate(orchestrator_preemptions_total{namespace="$namespace"}[5m]))', "ops"),
    ("Lease wait p95", 'histogram_quantile(0.95, sum by (le) '
     '(rate(orchestrator_lease_wait_seconds_bucket{namespace="$namespace"}[5m])))', "s"),
    ("Inventory disagreements (Kubernetes labels vs agents)",
     'sum by (severity) (orchestrator_inventory_disagreements{namespace="$namespace"})', "short"),
    ("GPU utilisation by node", 'avg by (instance) (ray_node_gpus_utilization{namespace="$namespace"})', "percent"),
)


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
