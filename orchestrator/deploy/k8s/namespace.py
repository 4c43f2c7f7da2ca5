"""The objects that govern the namespace the orchestrator runs in: the Namespace itself, the
PriorityClasses, the RBAC the head needs, the ResourceQuota, and the NetworkPolicy that opens the Ray pods'
ports to one another only (``app.kubernetes.io/instance: <cfg.name>``).
"""

from __future__ import annotations

from orchestrator.deploy.k8s.config import K8sConfig
from orchestrator.deploy.k8s.manifest import (
    CLIENT_PORT, DASHBOARD_AGENT_PORT, DASHBOARD_PORT, SERVE_PORT, Obj, _meta, _tcp,
)


def _namespace(cfg: K8sConfig) -> Obj:
    meta = _meta(cfg, cfg.namespace, "namespace", namespaced=False)
    # Pod Security Admission: our containers meet `restricted`; warn and audit at that
    # level always, enforce at the configured one (KubeRay adds containers of its own).
    meta["labels"].update({
        "pod-security.kubernetes.io/enforce": cfg.pod_security,
        "pod-security.kubernetes.io/warn": "restricted",
        "pod-security.kubernetes.io/audit": "restricted",
    })
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def _priority_classes(cfg: K8sConfig) -> list[Obj]:
    return [{
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": _meta(cfg, pc.name, "priority", namespaced=False),
        "value": pc.value,
        "globalDefault": False,
        "preemptionPolicy": "PreemptLowerPriority" if pc.preempting else "Never",
        "description": pc.description,
    } for pc in cfg.priority_classes]


def _rbac(cfg: K8sConfig) -> list[Obj]:
    role = f"{cfg.name}-{cfg.namespace}-node-reader"  # cluster-scoped: the namespace keeps two deployments apart
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(cfg, f"{cfg.name}-head", "rbac"),
         "automountServiceAccountToken": True},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(cfg, f"{cfg.name}-worker", "rbac"),
         "automountServiceAccountToken": False},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta(cfg, role, "rbac", namespaced=False),
            # All the head reads: node labels (GPU feature discovery) and allocatable resources.
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": _meta(cfg, role, "rbac", namespaced=False),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": f"{cfg.name}-head", "namespace": cfg.namespace}],
        },
    ]


def _quota(cfg: K8sConfig) -> list[Obj]:
    q = cfg.quota
    if not q.enabled:
        return []
    hard: dict[str, str] = {}
    if q.cpu is not None:
        hard.update({"requests.cpu": q.cpu, "limits.cpu": q.cpu})
    if q.memory is not None:
        hard.update({"requests.memory": q.memory, "limits.memory": q.memory})
    if q.gpus is not None:
        hard["requests.nvidia.com/gpu"] = str(q.gpus)  # extended resources take only requests.*
    for profile, n in sorted(q.mig.items()):
        hard[f"requests.nvidia.com/mig-{profile}"] = str(n)
    return [{"apiVersion": "v1", "kind": "ResourceQuota", "metadata": _meta(cfg, f"{cfg.name}-quota", "quota"),
             "spec": {"hard": hard}}]


def _network_policy(cfg: K8sConfig) -> Obj:
    ours = {"matchLabels": {"app.kubernetes.io/instance": cfg.name}}
    serve = (SERVE_PORT,) if cfg.inference.enabled else ()  # open only a port some container serves
    ingress: list[Obj] = [
        # Ray's own traffic (GCS, raylets, object transfer) between the pods of a cluster: every port.
        {"from": [{"podSelector": ours}]},
        # Dashboard, job API, Ray client, our dashboard and Serve: only from pods of this namespace.
        {"from": [{"podSelector": {}}],
         "ports": _tcp(DASHBOARD_PORT, CLIENT_PORT, cfg.dashboard_port, *serve)},
    ]
    if cfg.network.operator_namespace:
        # The one exception: KubeRay submits RayJobs and reads RayService status through the dashboard.
        ingress.append({
            "from": [{"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": cfg.network.operator_namespace}}}],
            "ports": _tcp(DASHBOARD_PORT, *serve, DASHBOARD_AGENT_PORT),
        })
    if cfg.network.monitoring_namespace:
        ingress.append({
            "from": [{"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": cfg.network.monitoring_namespace}}}],
            "ports": _tcp(cfg.metrics_port, cfg.ray_metrics_port),
        })
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(cfg, f"{cfg.name}-ingress", "network"),
        "spec": {"podSelector": ours, "policyTypes": ["Ingress"], "ingress": ingress},
    }
