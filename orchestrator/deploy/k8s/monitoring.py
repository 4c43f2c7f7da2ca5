"""Monitoring objects: the Grafana dashboard's ConfigMap (:mod:`.dashboard` builds its JSON) and the
PodMonitor that scrapes the Ray pods' metrics.
"""

from __future__ import annotations

from orchestrator.deploy.k8s.config import K8sConfig
from orchestrator.deploy.k8s.dashboard import dashboard_json
from orchestrator.deploy.k8s.manifest import Obj, _meta


def _dashboard(cfg: K8sConfig) -> list[Obj]:
    if not cfg.monitoring.dashboard:
        return []
    meta = _meta(cfg, f"{cfg.name}-grafana-dashboard", "monitoring", extra_labels=cfg.monitoring.dashboard_labels)
    return [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
             "data": {"ray-gpu-orchestrator.json": dashboard_json("Ray GPU orchestrator")}}]


def _pod_monitor(cfg: K8sConfig) -> list[Obj]:
    if not cfg.monitoring.pod_monitor:
        return []
    meta = _meta(cfg, cfg.name, "monitoring", extra_labels=cfg.monitoring.pod_monitor_labels)
    endpoint = {"path": "/metrics", "interval": cfg.monitoring.scrape_interval}
    return [{
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/instance": cfg.name}},
            "namespaceSelector": {"matchNames": [cfg.namespace]},
            # The orchestrator head's metrics (head pod only) and Ray's (every pod).
            "podMetricsEndpoints": [{"port": "orch-metrics", **endpoint}, {"port": "metrics", **endpoint}],
        },
    }]
