"""The Ray pods: the pod template of a head or a worker group, and the ``rayClusterConfig`` both Ray
clusters (the RayCluster and the RayService's) are made of.

A pod carries what the orchestrator reads on the node: its GPU pool's labels and affinity (the GPU
feature discovery's ``nvidia.com/gpu.product``), the env that names the cluster and the sharing, the
cards as Ray resources. The head pod adds the orchestrator head's supervisor as a native sidecar and its
credentials from the head's Secret (never in the manifests).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Iterable

from orchestrator.core.catalogue import gpu_model
from orchestrator.core.config import (
    ACCELERATOR_RESOURCE_PREFIX, MODEL_LABEL, NODE_LABEL, NODE_RESOURCE_PREFIX, SimNode,
    card_resources, ray_accelerator_type, raylet_native_env,
)
from orchestrator.deploy.k8s.config import (
    GPU_PRODUCT_LABEL, HEAD_CONFIG_DIR, MIG_CONFIG_LABEL, SHARING_STRATEGY_LABEL, K8sConfig, NodePool,
)
from orchestrator.deploy.k8s.manifest import (
    CLIENT_PORT, DASHBOARD_AGENT_PORT, DASHBOARD_PORT, GCS_PORT, REDIS_PASSWORD_KEY, SERVE_PORT, Obj, _pod_security,
    _port, _resources, _security,
)


def gfd_products(pool: NodePool) -> list[str]:
    """``nvidia.com/gpu.product`` values for the pool's model.

    GPU feature discovery writes the NVML name with spaces turned into dashes
    (``NVIDIA-A100-SXM4-80GB``) and appends ``-SHARED`` on nodes it shares by
    MPS or time-slicing.
    """
    if pool.products:
        return list(pool.products)
    spec = gpu_model(pool.gpu_model or "")
    nvml = [a for a in spec.aliases if " " in a or a.startswith(("NVIDIA", "Tesla"))] or [spec.name]
    names = sorted({a.replace(" ", "-") for a in nvml})
    if pool.sharing in ("mps", "time-slicing"):
        names = sorted({*names, *(n + "-SHARED" for n in names)})
    return names


def _affinity(pool: NodePool) -> Obj | None:
    if pool.sharing == "cpu":
        return None
    exprs: list[Obj] = [{"key": GPU_PRODUCT_LABEL, "operator": "In", "values": gfd_products(pool)}]
    if pool.sharing == "whole":
        # Nodes without the label (older feature discovery) are unshared too.
        exprs.append({"key": SHARING_STRATEGY_LABEL, "operator": "NotIn", "values": ["mps", "time-slicing"]})
    elif pool.sharing in ("mps", "time-slicing"):
        exprs.append({"key": SHARING_STRATEGY_LABEL, "operator": "In", "values": [pool.sharing]})
    elif pool.sharing == "mig":
        exprs.append({"key": "nvidia.com/mig.strategy", "operator": "In", "values": ["mixed"]})
        if pool.mig_config:
            exprs.append({"key": MIG_CONFIG_LABEL, "operator": "In", "values": [pool.mig_config]})
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": exprs}]}}}


def _volumes(cfg: K8sConfig, *, checkpoints: bool) -> tuple[list[Obj], list[Obj]]:
    """Writable places for a read-only root: Ray's session dir under /tmp, the object store in /dev/shm;
    and, in the training cluster, the checkpoint claim."""
    vols: list[Obj] = [
        {"name": "tmp", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "cache", "emptyDir": {}},
    ]
    mounts: list[Obj] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "cache", "mountPath": "/home/ray/.cache"},
    ]
    if checkpoints:
        vols.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": cfg.checkpoint_claim}})
        mounts.append({"name": "checkpoints", "mountPath": cfg.checkpoints.mount_path})
    return vols, mounts


_NAMED = ("ORCHESTRATOR_NAMESPACE", "ORCHESTRATOR_HEAD_NAME")


def _env(cfg: K8sConfig, pool: NodePool | None) -> list[Obj]:
    env: list[Obj] = [
        # The agents name their inventory after the Kubernetes node, so the head can
        # cross-check it against the node's labels (orchestrator/deploy/k8s/inventory.py).
        {"name": "ORCHESTRATOR_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        # The Ray namespace and name of the orchestrator head (what `orchestrator` and the SDK look up), not
        # the Kubernetes namespace: the head's own settings (head.settings, also in its cluster file).
        {"name": "ORCHESTRATOR_NAMESPACE", "value": cfg.head.settings.namespace},
        {"name": "ORCHESTRATOR_HEAD_NAME", "value": cfg.head.settings.head_name},
    ]
    if pool is None:
        env += [
            {"name": "ORCHESTRATOR_METRICS_PORT", "value": str(cfg.metrics_port)},
            {"name": "ORCHESTRATOR_METRICS_HOST", "value": "0.0.0.0"},
            # The head's own dashboard (issue #13) serves here; the container port and the
            # NetworkPolicy below take the same config field.
            {"name": "ORCHESTRATOR_DASHBOARD_PORT", "value": str(cfg.dashboard_port)},
        ]
    else:
        env += [
            {"name": "ORCHESTRATOR_POOL", "value": pool.name},
            {"name": "ORCHESTRATOR_SHARING", "value": pool.sharing},
        ]
        if _pool_cards(pool):
            # Ray's own GPU API on leases (docs/ray-native.md): the raylet runs the orchestrator's hook in every
            # driver it starts, and a simulated pool's raylet names its cards as a real node's would.
            native = {**raylet_native_env(cfg.head.settings), **(_sim_node(pool).ray_env() if pool.simulated else {})}
            env += [{"name": k, "value": v} for k, v in sorted(native.items()) if k not in _NAMED]
    env += _auth_env(cfg)
    return env


def _auth_env(cfg: K8sConfig) -> list[Obj]:
    if cfg.auth.mode != "secret":
        return []  # kuberay mode: the operator injects RAY_AUTH_MODE and RAY_AUTH_TOKEN itself
    return [
        {"name": "RAY_AUTH_MODE", "value": "token"},
        {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": cfg.auth.secret_name, "key": "auth_token"}}},
    ]


#: Where the ray-head container hands KubeRay's token to the sidecar (the shared /tmp emptyDir, mode 0600).
TOKEN_HANDOFF = "/tmp/rgo-auth/ray-token"
HEAD_SIDECAR = "orchestrator-head"


def _token_handoff_hook() -> Obj:
    # Under auth.mode kuberay the operator injects RAY_AUTH_TOKEN into the Ray container only (containers[0]),
    # from a Secret named after the RayCluster -- which a RayService's generated cluster makes unknowable here.
    # This hook starts no process: it copies the token to a 0600 file the sidecar reads (RAY_AUTH_TOKEN_PATH).
    script = (f'umask 077 && mkdir -p {shlex.quote(str(Path(TOKEN_HANDOFF).parent))} && '
              f'printf %s "$RAY_AUTH_TOKEN" > {TOKEN_HANDOFF}.new && mv {TOKEN_HANDOFF}.new {TOKEN_HANDOFF}')
    return {"postStart": {"exec": {"command": ["/bin/sh", "-c", script]}}}


def _head_sidecar(cfg: K8sConfig, mounts: list[Obj]) -> Obj:
    """The orchestrator head's supervisor as a restartable native sidecar (an init container with
    ``restartPolicy: Always``, Kubernetes >= 1.29): its stdout and stderr are the container's logs
    (``kubectl logs -c orchestrator-head``), and the kubelet restarts it whenever it exits -- which the
    supervisor does when the head actor is lost (``deploy/kuberay.py``, ``--supervise``), so the restart
    starts the head again. A sidecar, not a second container: it restarts whatever the pod's own
    restartPolicy says, and KubeRay judges the pod by its Ray container only."""
    wait = ""
    if cfg.auth.mode == "kuberay":
        wait = (f"until [ -s {TOKEN_HANDOFF} ]; do sleep 1; done; "
                f"export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={TOKEN_HANDOFF}; ")
    script = f"{wait}until ray health-check >/dev/null 2>&1; do sleep 2; done; exec {shlex.join(cfg.head.command)}"
    r = cfg.head.supervisor_resources
    return {
        "name": HEAD_SIDECAR,
        "image": cfg.image,
        "imagePullPolicy": cfg.image_pull_policy,
        "restartPolicy": "Always",
        "command": ["/bin/sh", "-c", script],
        "env": _env(cfg, None) + _head_secret_env(cfg),
        "resources": _resources(r.cpu, r.memory),
        "securityContext": _security(cfg),
        "volumeMounts": [*(m for m in mounts if m["name"] in ("tmp", "cache")),
                         {"name": "head-config", "mountPath": HEAD_CONFIG_DIR, "readOnly": True}],
    }


#: The keys of the head's Secret (``K8sConfig.head_secret_name``): the administrator key (who shows it may repartition,
#: set the day clock, cancel any job: docs/security.md) and the secret the head's fencing tokens are made from
#: (kept outside the GCS, so a head its supervisor makes again derives the same tokens from the journal).
ADMIN_KEY_KEY, HEAD_SECRET_KEY = "admin-key", "head-secret"


def _head_secret_env(cfg: K8sConfig) -> list[Obj]:
    """The head's credentials, from its Secret (never in the manifests): ``ORCHESTRATOR_ADMIN_KEY`` and
    ``ORCHESTRATOR_HEAD_SECRET`` (core.credentials). Required: a head without them would have no administrator
    and would hand out tokens a restarted head could not derive again."""
    return [{"name": var, "valueFrom": {"secretKeyRef": {"name": cfg.head_secret_name, "key": key}}}
            for var, key in (("ORCHESTRATOR_ADMIN_KEY", ADMIN_KEY_KEY), ("ORCHESTRATOR_HEAD_SECRET", HEAD_SECRET_KEY))]


def _pod_template(cfg: K8sConfig, pool: NodePool | None, *, serve: bool) -> Obj:
    """The pod template of the head (``pool`` None) or of one worker group.

    The training cluster (``serve`` False) mounts the checkpoint claim in every pod: a job's
    attempts may run on any node and must all find the same directory.
    """
    vols, mounts = _volumes(cfg, checkpoints=not serve)
    head = pool is None
    ports = [_port("metrics", cfg.ray_metrics_port)]
    if head:
        ports = [
            _port("gcs-server", GCS_PORT), _port("dashboard", DASHBOARD_PORT), _port("client", CLIENT_PORT),
            *ports, _port("orch-metrics", cfg.metrics_port), _port("orch-dashboard", cfg.dashboard_port),
            # KubeRay's name for it: the operator checks RayService health through it.
            _port("dashboard-agent", DASHBOARD_AGENT_PORT),
        ]
    if serve:
        ports.append(_port("serve", SERVE_PORT))
    if head:
        res = _resources(cfg.head.resources.cpu, cfg.head.resources.memory)
    else:
        assert pool is not None
        res = _resources(pool.resources.cpu, pool.resources.memory, pool.gpu_requests())
    container: Obj = {
        "name": "ray-head" if head else "ray-worker",
        "image": cfg.image,
        "imagePullPolicy": cfg.image_pull_policy,
        "env": _env(cfg, pool),
        "ports": ports,
        "resources": res,
        "securityContext": _security(cfg),
        "volumeMounts": mounts,
    }
    if head and cfg.auth.mode == "kuberay":
        container["lifecycle"] = _token_handoff_hook()
    component = "ray-head" if head else "ray-worker"
    labels = {"app.kubernetes.io/instance": cfg.name, "app.kubernetes.io/part-of": "ray-gpu-orchestrator",
              "app.kubernetes.io/component": component}
    if pool is not None:
        labels["orchestrator.io/pool"] = pool.name
    spec: Obj = {
        "serviceAccountName": f"{cfg.name}-head" if head else f"{cfg.name}-worker",
        "automountServiceAccountToken": head,  # only the head talks to the API server
        "securityContext": _pod_security(),
        "containers": [container],
        "volumes": vols,
    }
    if head:
        spec["initContainers"] = [_head_sidecar(cfg, mounts)]
        spec["volumes"] = [*vols, {"name": "head-config", "configMap": {"name": f"{cfg.name}-head-config"}}]
    priority = cfg.head.priority_class if head else (pool.priority_class if pool else None)
    if priority:
        spec["priorityClassName"] = priority
    selector = cfg.head.node_selector if head else (pool.node_selector if pool else {})
    if selector:
        spec["nodeSelector"] = dict(sorted(selector.items()))
    if pool is not None and pool.sharing != "cpu":
        spec["affinity"] = _affinity(pool)
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {"metadata": {"labels": labels}, "spec": spec}


def _cards(n: int) -> dict[str, str]:
    return {k: "1" for k in card_resources(n)}


def _sim_node(pool: NodePool) -> SimNode:
    """The node the head's cluster file lists for a simulated pool (same name, model and count)."""
    assert pool.simulated is not None
    return SimNode(name=pool.name, model=pool.simulated.model, gpus=pool.simulated.gpus)


def _pool_cards(pool: NodePool) -> int:
    return pool.simulated.gpus if pool.simulated is not None else pool.ray_cards()



def _worker_group(cfg: K8sConfig, pool: NodePool, *, serve: bool) -> Obj:
    group: Obj = {
        "groupName": pool.name,
        "replicas": pool.start_replicas,
        "minReplicas": pool.min_replicas,
        "maxReplicas": pool.max_replicas,
        "rayStartParams": {"metrics-export-port": str(cfg.ray_metrics_port)},
    }
    if pool.simulated is not None:
        # As `orchestrator up` starts a simulated node's raylet (core.config.SimNode.ray_labels and
        # ray_resources). KubeRay refuses labels in rayStartParams and resources in both places, so
        # these go in the group's own fields (KubeRay >= 1.5), which it turns into --labels,
        # --num-gpus and --resources.
        sim = pool.simulated
        group["labels"] = {NODE_LABEL: pool.name, MODEL_LABEL: sim.model}
        # Ray's accelerator_type resource, which its NVIDIA accelerator manager declares on a real GPU pod.
        group["resources"] = {"GPU": str(sim.gpus), f"{NODE_RESOURCE_PREFIX}{pool.name}": "1", **_cards(sim.gpus),
                              ACCELERATOR_RESOURCE_PREFIX + ray_accelerator_type(sim.model): "1"}
    elif pool.ray_cards():
        # Ray's GPU count is the cards the pod sees, as Ray would detect them; the node's agent holds every
        # unit no lease covers in placement groups of its own, so nothing outside the orchestrator takes a
        # card (docs/ray-native.md). Each card is also its own resource (core.config.card_resource).
        group["rayStartParams"]["num-gpus"] = str(pool.ray_cards())
        group["resources"] = _cards(pool.ray_cards())
    group["template"] = _pod_template(cfg, pool, serve=serve)
    return group


def _cluster_spec(cfg: K8sConfig, pools: Iterable[NodePool], *, serve: bool) -> Obj:
    spec: Obj = {"rayVersion": cfg.ray_version, "enableInTreeAutoscaling": cfg.autoscaling}
    if cfg.autoscaling:
        # The autoscaler sidecar KubeRay adds to the head gets no securityContext of its own otherwise.
        spec["autoscalerOptions"] = {"securityContext": _security(cfg)}
    if cfg.auth.mode == "kuberay":
        spec["authOptions"] = {"mode": "token"}
        if cfg.auth.secret_name:
            spec["authOptions"]["secretName"] = cfg.auth.secret_name
    if cfg.redis_address:
        # KubeRay sets RAY_REDIS_ADDRESS and RAY_external_storage_namespace (default: the RayCluster's
        # UID, so the RayService's clusters and ours never share tables) on the head, and a long GCS
        # reconnect timeout on the workers: they wait for a restarted head instead of dying.
        ft: Obj = {"redisAddress": cfg.redis_address}
        if cfg.redis_password_secret:
            ft["redisPassword"] = {"valueFrom": {"secretKeyRef": {
                "name": cfg.redis_password_secret, "key": REDIS_PASSWORD_KEY}}}
        spec["gcsFaultToleranceOptions"] = ft
    spec["headGroupSpec"] = {
        "serviceType": "ClusterIP",
        "rayStartParams": {
            "dashboard-host": "0.0.0.0",
            "metrics-export-port": str(cfg.ray_metrics_port),
            "num-gpus": "0",  # the head schedules; GPUs are the workers'
        },
        "template": _pod_template(cfg, None, serve=serve),
    }
    spec["workerGroupSpecs"] = [_worker_group(cfg, p, serve=serve) for p in pools]
    return spec
