"""Render a :class:`K8sConfig` into Kubernetes objects, then into a kustomize tree.

The objects, one module per family, each a few pure functions sharing the
vocabulary of :mod:`.manifest` (labels, metadata, ports, YAML): :mod:`.namespace`
(Namespace, PriorityClasses, RBAC, quota, NetworkPolicy), :mod:`.redis` (the GCS's
Redis), :mod:`.monitoring` (dashboard, PodMonitor), :mod:`.pods` (the Ray pods and
worker groups), :mod:`.workloads` (head config, checkpoint claim, RayCluster, RayJob,
RayService); the kustomize tree's patches and files are :mod:`.kustomize`. This
module puts them in apply order and checks the references (:mod:`.references`);
every name is still importable from here.

Pure functions from config to plain dicts: no I/O until :func:`write_tree`.
Rendering is deterministic (same config, same bytes), which is what lets a
test compare the committed ``k8s/`` with a fresh render.

The tree (``--out DIR``):

* ``base/``: one file per object of the base config, and a
  ``kustomization.yaml`` listing them in apply order;
* ``overlays/<name>/``: ``resources: [../../base]`` plus, for each overlay
  config, the objects it adds, a ``$patch: delete`` for each it drops, and a
  JSON 6902 patch for each it changes. :func:`overlay_ops` computes the
  patches as a structural diff and :func:`render_tree` checks that applying
  them to the base gives back the overlay's own render, so an overlay never
  means something other than its config.

Names: every object is prefixed by ``cfg.name``; the pods of both Ray
clusters (the RayCluster and the RayService's) carry
``app.kubernetes.io/instance: <cfg.name>``, which the NetworkPolicy and the
PodMonitor select on. The Redis that backs the GCS carries
``app.kubernetes.io/instance: <cfg.name>-redis`` instead, so the Ray pods'
policy does not open it to every Ray pod: its own policy admits only the heads.

Durable state, and where it lives:

* the lease ledger, queue and fencing counter: the GCS KV store, whose
  tables KubeRay's GCS fault tolerance keeps in Redis (``gcsFaultToleranceOptions``);
  Redis keeps an append-only file on its own claim;
* checkpoints: one claim (ReadWriteMany) mounted at ``checkpoints.mount_path``
  in every pod of the training cluster; the RayJob's ``--checkpoint-dir`` lies
  below it, the same path for every attempt.
"""

from __future__ import annotations

from orchestrator.deploy.k8s.config import K8sConfig
from orchestrator.deploy.k8s.kustomize import (
    _kustomization, _target, apply_json_patch, overlay_ops, stale_files, write_tree,
)
from orchestrator.deploy.k8s.manifest import (
    CLIENT_PORT, DASHBOARD_AGENT_PORT, DASHBOARD_PORT, FIELD_MANAGER, GCS_PORT, GENERATE_KEYS_ANNOTATION, HEADER,
    RAY_GID, RAY_UID, REDIS_GID, REDIS_PASSWORD_KEY, REDIS_PORT, REDIS_UID, SERVE_PORT, Obj, file_name, object_key,
    to_yaml, to_yaml_stream,
)
from orchestrator.deploy.k8s.monitoring import _dashboard, _pod_monitor
from orchestrator.deploy.k8s.namespace import _namespace, _network_policy, _priority_classes, _quota, _rbac
from orchestrator.deploy.k8s.pods import ADMIN_KEY_KEY, HEAD_SECRET_KEY, HEAD_SIDECAR, TOKEN_HANDOFF, gfd_products
from orchestrator.deploy.k8s.redis import _redis
from orchestrator.deploy.k8s.references import DanglingReferenceError, dangling_references
from orchestrator.deploy.k8s.workloads import (
    KUEUE_ELASTIC_JOB, _checkpoint_claim, _head_config, _ray_cluster, _ray_job, _ray_service, head_cluster_file,
)

__all__ = ["ADMIN_KEY_KEY", "CLIENT_PORT", "DASHBOARD_AGENT_PORT", "DASHBOARD_PORT", "FIELD_MANAGER", "GCS_PORT",
    "GENERATE_KEYS_ANNOTATION", "HEADER", "HEAD_SECRET_KEY", "HEAD_SIDECAR", "KUEUE_ELASTIC_JOB", "Obj", "RAY_GID",
    "RAY_UID", "REDIS_GID", "REDIS_PASSWORD_KEY", "REDIS_PORT", "REDIS_UID", "SERVE_PORT", "TOKEN_HANDOFF",
    "apply_json_patch", "file_name", "gfd_products", "head_cluster_file", "object_key", "overlay_ops",
    "render_checked", "render_objects", "render_tree", "stale_files", "to_yaml", "to_yaml_stream", "write_tree"]


def render_objects(cfg: K8sConfig) -> list[Obj]:
    """Every object of one config, in apply order (what others depend on first)."""
    return [
        _namespace(cfg),
        *_priority_classes(cfg),
        *_rbac(cfg),
        *_quota(cfg),
        _network_policy(cfg),
        *_dashboard(cfg),
        _head_config(cfg),
        *_checkpoint_claim(cfg),
        *_redis(cfg),
        _ray_cluster(cfg),
        *_ray_job(cfg),
        *_ray_service(cfg),
        *_pod_monitor(cfg),
    ]


def render_checked(cfg: K8sConfig, label: str = "the config") -> list[Obj]:
    """:func:`render_objects`, refused with :class:`DanglingReferenceError` when an object refers to one
    the render lacks (``references.py``): what ``render`` writes and ``apply`` sends."""
    objs = render_objects(cfg)
    bad = dangling_references(objs, cfg.external_refs())
    if bad:
        raise DanglingReferenceError(label, bad)
    return objs


def render_tree(base: K8sConfig, overlays: dict[str, K8sConfig]) -> dict[str, str]:
    """Relative path -> file content of the whole kustomize tree."""
    tree: dict[str, str] = {}
    base_objs = render_checked(base, "the base")
    for obj in base_objs:
        tree[f"base/{file_name(obj)}"] = HEADER + to_yaml(obj)
    tree["base/kustomization.yaml"] = _kustomization([file_name(o) for o in base_objs])
    by_key = {object_key(o): o for o in base_objs}
    for name, cfg in sorted(overlays.items()):
        objs = render_checked(cfg, f"overlay {name}")
        keys = {object_key(o) for o in objs}
        resources, patches = ["../../base"], []
        for obj in objs:
            old = by_key.get(object_key(obj))
            if old is None:
                tree[f"overlays/{name}/{file_name(obj)}"] = HEADER + to_yaml(obj)
                resources.append(file_name(obj))
                continue
            ops = overlay_ops(old, obj)
            if ops:
                if apply_json_patch(old, ops) != obj:  # the invariant in the module docstring
                    raise AssertionError(f"overlay {name}: patch of {file_name(obj)} does not reproduce it")
                path = f"patches/{file_name(obj)}"
                tree[f"overlays/{name}/{path}"] = HEADER + to_yaml(ops)
                patches.append({"path": path, "target": _target(obj)})
        for key, old in by_key.items():
            if key not in keys:
                meta = {"name": old["metadata"]["name"]}
                if old["metadata"].get("namespace"):
                    meta["namespace"] = old["metadata"]["namespace"]
                delete = {"$patch": "delete", "apiVersion": old["apiVersion"], "kind": old["kind"], "metadata": meta}
                patches.append({"patch": to_yaml(delete), "target": _target(old)})
        tree[f"overlays/{name}/kustomization.yaml"] = _kustomization(resources, patches)
    return tree
