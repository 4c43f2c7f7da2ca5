"""The Ray workloads: the head's cluster file (a ConfigMap), the checkpoint claim, the RayCluster, the
training RayJob and the inference RayService, with the queue labels Kueue admits them by.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.deploy.k8s.config import HEAD_CONFIG_FILE, K8sConfig
from orchestrator.deploy.k8s.manifest import Obj, _claim, _meta, _pod_security, _resources, _security, to_yaml
from orchestrator.deploy.k8s.pods import _auth_env, _cluster_spec


def head_cluster_file(cfg: K8sConfig) -> Obj:
    """The head's cluster file (``orchestrator.core.config.ClusterConfig``): the config's ``head.settings`` (those
    it sets) with the deployment's own (``specs.DEPLOYMENT_SETTINGS``), and its policy file. One validated tree:
    both halves were checked by the same models the head loads them with."""
    settings = {**cfg.head.settings.model_dump(mode="json", exclude_unset=True),
                "discovery": "auto", "metrics_host": "0.0.0.0", "metrics_port": cfg.metrics_port}
    return {"settings": settings, "scheduler": cfg.head.scheduler.model_dump(mode="json")}


def _head_config(cfg: K8sConfig) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(cfg, f"{cfg.name}-head-config", "head"),
            "data": {Path(HEAD_CONFIG_FILE).name: to_yaml(head_cluster_file(cfg))}}


def _checkpoint_claim(cfg: K8sConfig) -> list[Obj]:
    ck = cfg.checkpoints
    if ck.claim_name:
        return []  # the operator's own claim (external_refs)
    return [_claim(cfg, cfg.checkpoint_claim, "checkpoints", ck.access_mode, ck.size, ck.storage_class)]


#: Kueue (>= 0.14, feature gate ElasticJobsViaWorkloadSlices) admits an autoscaling RayCluster only as an
#: elastic job: each scale-up is a new workload slice. Without the annotation its webhook refuses
#: enableInTreeAutoscaling.
KUEUE_ELASTIC_JOB = "kueue.x-k8s.io/elastic-job"


def _scheduled_meta(cfg: K8sConfig, name: str, component: str) -> Obj:
    meta = _meta(cfg, name, component, extra_labels=cfg.scheduler.labels())
    if cfg.scheduler.kind == "kueue" and cfg.autoscaling:
        meta["annotations"] = {KUEUE_ELASTIC_JOB: "true"}
    return meta


def _ray_cluster(cfg: K8sConfig) -> Obj:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": _scheduled_meta(cfg, cfg.name, "ray-cluster"),
        "spec": _cluster_spec(cfg, cfg.pools, serve=False),
    }


def _submitter_template(cfg: K8sConfig) -> Obj:
    # KubeRay fills in `ray job submit` when the container has no command; we
    # only make the submitter pod meet the namespace's restricted profile.
    return {"spec": {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": _pod_security(),
        "containers": [{
            "name": "ray-job-submitter",
            "image": cfg.image,
            "imagePullPolicy": cfg.image_pull_policy,
            "env": _auth_env(cfg),
            "resources": _resources("500m", "512Mi"),
            "securityContext": _security(cfg),
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        }],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }}


def _ray_job(cfg: K8sConfig) -> list[Obj]:
    job = cfg.training_job
    if not job.enabled:
        return []
    spec: Obj = {
        "entrypoint": job.entrypoint(cfg.checkpoints),
        # Submit to the long-running RayCluster: our queue schedules the job inside it.
        "clusterSelector": {"ray.io/cluster": cfg.name},
        "submissionMode": "K8sJobMode",
        "shutdownAfterJobFinishes": False,
        "submitterPodTemplate": _submitter_template(cfg),
    }
    if job.active_deadline_seconds:
        spec["activeDeadlineSeconds"] = job.active_deadline_seconds
    return [{"apiVersion": "ray.io/v1", "kind": "RayJob",
             "metadata": _meta(cfg, f"{cfg.name}-{job.name}", "ray-job"), "spec": spec}]


def _ray_service(cfg: K8sConfig) -> list[Obj]:
    inf = cfg.inference
    if not inf.enabled:
        return []
    serve = {"applications": [{"name": inf.name, "import_path": inf.import_path, "route_prefix": inf.route_prefix}]}
    return [{
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": _scheduled_meta(cfg, f"{cfg.name}-{inf.name}", "ray-service"),
        "spec": {
            "serveConfigV2": yaml.safe_dump(serve, sort_keys=False),
            "rayClusterConfig": _cluster_spec(cfg, cfg.inference_pools, serve=True),
        },
    }]
