"""What a cluster must have before the rendered manifests can come up, and a check of each.

``orchestrator k8s render --check`` lists these for every render it checks (the base and each overlay):
against the cluster when one is reachable through the kubeconfig, else each one ``unchecked`` with the
reason. Nothing here changes the cluster; every probe is a discovery call or a GET.

The list is derived from the rendered objects, so a render that drops an object drops its prerequisite:

* ``kubernetes``: an API server >= 1.29, which runs the head's ``restartPolicy: Always`` init container
  as a native sidecar (beta and on by default since 1.29);
* ``kuberay``: the KubeRay CRDs of every Ray kind rendered; with ``auth.mode: kuberay`` a RayCluster CRD
  that knows ``spec.authOptions`` (KubeRay >= 1.5.1);
* ``prometheus-operator``: the ``monitoring.coreos.com/v1`` PodMonitor CRD, when a PodMonitor is rendered;
* ``storage-class:<name>``: each StorageClass a rendered claim names (the checkpoint claim's must serve
  ReadWriteMany: a class cannot say so, the check shows its provisioner);
* ``kueue``: with ``scheduler.kind: kueue``, Kueue's LocalQueue CRD and the queue in the namespace; with
  ``autoscaling: true`` as well, Kueue >= 0.14 with the ``ElasticJobsViaWorkloadSlices`` feature gate on
  (older Kueue, or the gate off, refuses an autoscaling RayCluster), read from its controller Deployment;
* ``redis-password``: the Secret with the Redis password (key ``password``), when Redis is rendered.
  ``orchestrator k8s apply`` fills it; plain ``kubectl apply -k`` needs it created first (docs/kubernetes.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Protocol

from orchestrator.deploy.k8s.config import K8sConfig
from orchestrator.deploy.k8s.render import ADMIN_KEY_KEY, HEAD_SECRET_KEY, REDIS_PASSWORD_KEY, Obj

Status = Literal["ok", "missing", "unchecked"]

#: The oldest Kubernetes that runs an init container with restartPolicy Always as a sidecar by default.
MIN_KUBERNETES = (1, 29)
#: The first Kueue that admits a RayCluster with enableInTreeAutoscaling (as an elastic job).
MIN_KUEUE = (0, 14, 0)
KUEUE_GATE = "ElasticJobsViaWorkloadSlices"
#: Where Kueue's own manifests and Helm chart put its controller.
KUEUE_DEPLOYMENT = ("kueue-system", "kueue-controller-manager")


class Cluster(Protocol):
    """The read-only calls a check makes (``client.KubeRayClient`` has them)."""

    def served(self, api_version: str, kind: str) -> bool: ...
    def server_version(self) -> tuple[int, int]: ...
    def get(self, api_version: str, kind: str, name: str, namespace: str | None) -> Obj | None: ...


@dataclass(frozen=True)
class Prerequisite:
    key: str
    what: str
    how: str  # how to meet it
    check: Callable[[Cluster], tuple[Status, str]]


@dataclass(frozen=True)
class Finding:
    key: str
    what: str
    needed_by: tuple[str, ...]
    status: Status
    detail: str
    how: str

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "what": self.what, "needed_by": list(self.needed_by), "status": self.status,
                "detail": self.detail, "how": self.how}


def _version(text: str) -> tuple[int, ...] | None:
    m = re.search(r"v?(\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(x) for x in m.groups()) if m else None


def _kubernetes(c: Cluster) -> tuple[Status, str]:
    major, minor = c.server_version()
    ok = (major, minor) >= MIN_KUBERNETES
    return ("ok" if ok else "missing"), f"API server {major}.{minor}"


def _crds(kinds: list[tuple[str, str]]) -> Callable[[Cluster], tuple[Status, str]]:
    def check(c: Cluster) -> tuple[Status, str]:
        absent = [f"{v} {k}" for v, k in kinds if not c.served(v, k)]
        return ("missing", f"not served: {', '.join(absent)}") if absent else ("ok", "served")
    return check


def _kuberay(kinds: list[tuple[str, str]], auth_options: bool) -> Callable[[Cluster], tuple[Status, str]]:
    def check(c: Cluster) -> tuple[Status, str]:
        status, detail = _crds(kinds)(c)
        if status != "ok" or not auth_options:
            return status, detail
        crd = c.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", "rayclusters.ray.io", None)
        versions = (crd or {}).get("spec", {}).get("versions", [])
        spec = next((v.get("schema", {}).get("openAPIV3Schema", {}).get("properties", {}).get("spec", {})
                     for v in versions if v.get("name") == "v1"), {})
        if crd is not None and "authOptions" not in spec.get("properties", {}):
            return "missing", "the RayCluster CRD has no spec.authOptions: KubeRay older than 1.5.1"
        return "ok", "served" + ("" if crd is None else ", with spec.authOptions")
    return check


def _storage_class(name: str) -> Callable[[Cluster], tuple[Status, str]]:
    def check(c: Cluster) -> tuple[Status, str]:
        sc = c.get("storage.k8s.io/v1", "StorageClass", name, None)
        if sc is None:
            return "missing", f"no StorageClass {name!r}"
        return "ok", f"provisioner {sc.get('provisioner', '?')}"
    return check


def _kueue(queue: str, namespace: str, elastic: bool) -> Callable[[Cluster], tuple[Status, str]]:
    def check(c: Cluster) -> tuple[Status, str]:
        if not c.served("kueue.x-k8s.io/v1beta1", "LocalQueue"):
            return "missing", "Kueue's CRDs are not served (kueue.x-k8s.io/v1beta1 LocalQueue)"
        problems = []
        if c.get("kueue.x-k8s.io/v1beta1", "LocalQueue", queue, namespace) is None:
            problems.append(f"no LocalQueue {queue!r} in namespace {namespace!r}")
        detail = ""
        if elastic:
            ns, name = KUEUE_DEPLOYMENT
            dep = c.get("apps/v1", "Deployment", name, ns)
            containers = (dep or {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
            if dep is None or not containers:
                problems.append(f"no Deployment {ns}/{name} to read Kueue's version from")
            else:
                image = containers[0].get("image", "")
                version = _version(image.rsplit(":", 1)[-1])
                args = " ".join(containers[0].get("args", []) + containers[0].get("command", []))
                detail = f"controller image {image}"
                if version is None or version < MIN_KUEUE:
                    problems.append(f"Kueue {image.rsplit(':', 1)[-1]} refuses an autoscaling RayCluster; "
                                    f"needs >= v{'.'.join(map(str, MIN_KUEUE))}")
                if f"{KUEUE_GATE}=true" not in args:
                    problems.append(f"feature gate {KUEUE_GATE}=true not in the controller's arguments")
        if problems:
            return "missing", "; ".join(problems)
        return "ok", detail or f"LocalQueue {namespace}/{queue}"
    return check


def _secret_key(name: str, namespace: str, key: str) -> Callable[[Cluster], tuple[Status, str]]:
    def check(c: Cluster) -> tuple[Status, str]:
        secret = c.get("v1", "Secret", name, namespace)
        if secret is None:
            return "missing", f"no Secret {namespace}/{name}"
        if not (secret.get("data") or {}).get(key):
            return "missing", f"Secret {namespace}/{name} has no key {key!r}"
        return "ok", f"Secret {namespace}/{name} has {key!r}"
    return check


def prerequisites(cfg: K8sConfig, objs: Iterable[Obj]) -> list[Prerequisite]:
    """What one render (``objs``, of ``cfg``) needs from the cluster."""
    objs = list(objs)
    kinds = sorted({(o["apiVersion"], o["kind"]) for o in objs})
    out = [Prerequisite(
        "kubernetes", f"Kubernetes >= {MIN_KUBERNETES[0]}.{MIN_KUBERNETES[1]} (the head's native sidecar)",
        "upgrade the cluster; older servers run the sidecar as an init container that never ends", _kubernetes)]
    ray = [(v, k) for v, k in kinds if v.startswith("ray.io/")]
    if ray:
        out.append(Prerequisite(
            "kuberay", "the KubeRay operator's CRDs" + (" (>= 1.5.1: auth.mode kuberay)"
                                                         if cfg.auth.mode == "kuberay" else ""),
            "helm install kuberay-operator kuberay/kuberay-operator --version 1.5.1",
            _kuberay(ray, cfg.auth.mode == "kuberay")))
    monitoring = [(v, k) for v, k in kinds if v.startswith("monitoring.coreos.com/")]
    if monitoring:
        out.append(Prerequisite(
            "prometheus-operator", "the Prometheus operator's CRDs (" + ", ".join(k for _, k in monitoring) + ")",
            "helm install prometheus prometheus-community/kube-prometheus-stack -n monitoring --create-namespace",
            _crds(monitoring)))
    classes: dict[str, list[str]] = {}
    for o in objs:
        if o["kind"] == "PersistentVolumeClaim" and o["spec"].get("storageClassName"):
            classes.setdefault(o["spec"]["storageClassName"], []).extend(o["spec"].get("accessModes", []))
    for name, modes in sorted(classes.items()):
        out.append(Prerequisite(
            f"storage-class:{name}", f"StorageClass {name!r} serving {', '.join(sorted(set(modes)))}",
            "install its CSI driver" + (" (ReadWriteMany: e.g. csi-driver-nfs with a class named nfs-csi)"
                                        if "ReadWriteMany" in modes else ""),
            _storage_class(name)))
    if cfg.scheduler.kind == "kueue" and cfg.scheduler.queue:
        elastic = cfg.autoscaling
        out.append(Prerequisite(
            "kueue", f"Kueue with the LocalQueue {cfg.scheduler.queue!r}" + (
                f" (>= v{'.'.join(map(str, MIN_KUEUE))}, feature gate {KUEUE_GATE}: an autoscaling RayCluster)"
                if elastic else ""),
            "install Kueue with the ray.io/raycluster integration"
            + (f" and --feature-gates={KUEUE_GATE}=true" if elastic else "") + "; create the LocalQueue",
            _kueue(cfg.scheduler.queue, cfg.namespace, elastic)))
    secret = cfg.head_secret_name
    for key in (ADMIN_KEY_KEY, HEAD_SECRET_KEY):
        out.append(Prerequisite(
            f"head-{key}", f"Secret {secret!r} with key {key!r} (the orchestrator head's credentials)",
            f"kubectl -n {cfg.namespace} create secret generic {secret} "
            f"--from-literal={ADMIN_KEY_KEY}=\"$(openssl rand -base64 32)\" "
            f"--from-literal={HEAD_SECRET_KEY}=\"$(openssl rand -hex 32)\"",
            _secret_key(secret, cfg.namespace, key)))
    if cfg.redis_deployed and cfg.redis_password_secret:
        secret = cfg.redis_password_secret
        out.append(Prerequisite(
            "redis-password", f"Secret {secret!r} with key {REDIS_PASSWORD_KEY!r} (the GCS' Redis)",
            f"kubectl -n {cfg.namespace} create secret generic {secret} "
            f"--from-literal={REDIS_PASSWORD_KEY}=\"$(openssl rand -hex 32)\" (or orchestrator k8s apply)",
            _secret_key(secret, cfg.namespace, REDIS_PASSWORD_KEY)))
    return out


def check_all(renders: dict[str, tuple[K8sConfig, list[Obj]]], cluster: Cluster | None,
              unchecked_because: str = "") -> list[Finding]:
    """Every render's prerequisites, merged by key (``needed_by`` names the renders), each checked against
    ``cluster``, or ``unchecked`` with ``unchecked_because`` when there is none. A check that raises is
    ``unchecked`` with its error."""
    merged: dict[str, tuple[Prerequisite, list[str]]] = {}
    for label, (cfg, objs) in renders.items():
        for p in prerequisites(cfg, objs):
            if p.key in merged and merged[p.key][0].what == p.what:
                merged[p.key][1].append(label)
            else:
                key = p.key if p.key not in merged else f"{p.key}@{label}"
                merged[key] = (p, [label])
    out = []
    for key, (p, labels) in merged.items():
        if cluster is None:
            status, detail = "unchecked", unchecked_because
        else:
            try:
                status, detail = p.check(cluster)
            except Exception as e:  # noqa: BLE001  (one probe failing says so; the others still run)
                status, detail = "unchecked", f"{type(e).__name__}: {e}"
        out.append(Finding(key, p.what, tuple(labels), status, detail, p.how))
    return out
