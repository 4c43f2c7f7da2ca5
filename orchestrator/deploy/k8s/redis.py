"""The Redis that backs the GCS (KubeRay's GCS fault tolerance keeps the lease ledger, queue and fencing
counter there): its Secret, claim, StatefulSet, Service and NetworkPolicy. It carries
``app.kubernetes.io/instance: <cfg.name>-redis``, not the Ray pods' instance label, so its own policy can
admit only the heads.
"""

from __future__ import annotations

from orchestrator.deploy.k8s.config import K8sConfig
from orchestrator.deploy.k8s.manifest import (
    GENERATE_KEYS_ANNOTATION, REDIS_GID, REDIS_PASSWORD_KEY, REDIS_PORT, REDIS_UID, Obj, _claim, _meta, _port,
    _resources, _security, _tcp,
)


def _redis_labels(cfg: K8sConfig) -> dict[str, str]:
    # Not app.kubernetes.io/instance=<name>: the Ray pods' NetworkPolicy must not select Redis.
    return {"app.kubernetes.io/name": "redis", "app.kubernetes.io/instance": cfg.redis_service,
            "app.kubernetes.io/component": "gcs-store", "app.kubernetes.io/part-of": "ray-gpu-orchestrator"}


def _redis(cfg: K8sConfig) -> list[Obj]:
    """The GCS's Redis: Secret (no data), claim, Deployment, Service and a NetworkPolicy admitting only the heads.

    One replica with an append-only file on a ReadWriteOnce claim (``Recreate``, so an update never runs
    two Redis on one file). Replace it by a managed Redis with ``gcs_fault_tolerance.redis.deploy: false``.
    """
    if not cfg.redis_deployed:
        return []
    r = cfg.gcs_fault_tolerance.redis
    name, secret = cfg.redis_service, cfg.redis_password_secret
    assert secret is not None  # deploy: true always has one (config.redis_password_secret)
    password = {"valueFrom": {"secretKeyRef": {"name": secret, "key": REDIS_PASSWORD_KEY}}}
    # The password goes into a config file on the pod's own emptyDir, never onto redis-server's command
    # line; exec makes redis-server PID 1, so SIGTERM flushes the append-only file before the pod stops.
    # REDISCLI_AUTH lets the readiness probe in.
    start = (f'umask 077 && printf \'requirepass "%s"\\n\' "$REDIS_PASSWORD" > /tmp/redis.conf && '
             f"exec redis-server /tmp/redis.conf --port {REDIS_PORT} --dir /data --appendonly yes "
             "--appendfsync everysec --save '' --protected-mode no")
    container: Obj = {
        "name": "redis",
        "image": r.image,
        "imagePullPolicy": "IfNotPresent",  # a public image, not ours: `image_pull_policy: Never` is for ours
        "command": ["/bin/sh", "-c", start],
        "env": [{"name": "REDIS_PASSWORD", **password}, {"name": "REDISCLI_AUTH", **password}],
        "ports": [_port("redis", REDIS_PORT)],
        "readinessProbe": {"exec": {"command": ["redis-cli", "-p", str(REDIS_PORT), "ping"]},
                           "periodSeconds": 5, "timeoutSeconds": 2},
        "livenessProbe": {"tcpSocket": {"port": "redis"}, "initialDelaySeconds": 10, "periodSeconds": 10},
        "resources": _resources(r.resources.cpu, r.resources.memory),
        "securityContext": {**_security(cfg), "readOnlyRootFilesystem": True},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "tmp", "mountPath": "/tmp"}],
    }
    labels = _redis_labels(cfg)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(cfg, name, "gcs-store"),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "serviceAccountName": f"{cfg.name}-worker",  # no token, no RBAC
                    "automountServiceAccountToken": False,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": REDIS_UID, "runAsGroup": REDIS_GID,
                                        "fsGroup": REDIS_GID, "seccompProfile": {"type": "RuntimeDefault"}},
                    **({"priorityClassName": cfg.head.priority_class} if cfg.head.priority_class else {}),
                    "containers": [container],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": f"{name}-data"}},
                                {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(cfg, name, "gcs-store"),
        "spec": {"type": "ClusterIP", "selector": dict(labels),
                 "ports": [{"name": "redis", "port": REDIS_PORT, "targetPort": "redis", "protocol": "TCP"}]},
    }
    heads = {"matchLabels": {"app.kubernetes.io/instance": cfg.name, "app.kubernetes.io/component": "ray-head"}}
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(cfg, f"{name}-ingress", "network"),
        "spec": {"podSelector": {"matchLabels": dict(labels)}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"podSelector": heads}], "ports": _tcp(REDIS_PORT)}]},
    }
    # Rendered without data: server-side apply never touches a key it does not set, so the
    # password `orchestrator k8s apply` (or the operator) put there survives every later apply.
    secret_meta = _meta(cfg, secret, "gcs-store")
    secret_meta["annotations"] = {GENERATE_KEYS_ANNOTATION: REDIS_PASSWORD_KEY}
    secret_obj = {"apiVersion": "v1", "kind": "Secret", "metadata": secret_meta, "type": "Opaque"}
    claim = _claim(cfg, f"{name}-data", "gcs-store", "ReadWriteOnce", r.size, r.storage_class)
    return [secret_obj, claim, deployment, service, policy]
