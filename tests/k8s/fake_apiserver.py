"""A *fake* Kubernetes API server for the tests (not a cluster): the one boundary no machine here has.

It serves, on 127.0.0.1, what ``orchestrator/deploy/k8s/client.py`` and ``kubectl apply --dry-run=client``
ask of an API server: ``/version``; legacy discovery (``/api``, ``/apis``, ``/api/v1``,
``/apis/<group>/<version>``; no aggregated discovery, which makes client-go fall back to these) for every
kind the rendered overlays use -- the built-in kinds, the KubeRay CRDs (read from ``../shared/kuberay/crds``
when present), the Prometheus operator's PodMonitor, Kueue's queues -- and for the kinds the prerequisite
check reads (StorageClass, CustomResourceDefinition); server-side apply (per field manager), GET (404 for
an object it does not hold), DELETE and lists. It validates nothing: the schema checks are the tests'
own (``conftest.manifest_problems``), and ``kubectl`` runs with ``--validate=false``.

``FakeApiServer`` records every request; ``raycluster_states`` scripts a RayCluster's ``status.state``;
``fail`` answers (method, path) with an error; ``store`` may be seeded with objects by path.
"""

from __future__ import annotations

import copy
import functools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

#: libyaml's loader where PyYAML has it: the three CRDs are 3.3 MB, which the pure-Python loader takes seconds to read.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
CRD_DIR = Path(__file__).resolve().parents[3] / "shared" / "kuberay" / "crds"


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"


BUILTIN_KINDS = (
    Kind("", "v1", "Namespace", "namespaces", False),
    Kind("", "v1", "Node", "nodes", False),
    Kind("", "v1", "ServiceAccount", "serviceaccounts", True),
    Kind("", "v1", "ConfigMap", "configmaps", True),
    Kind("", "v1", "ResourceQuota", "resourcequotas", True),
    Kind("", "v1", "Secret", "secrets", True),
    Kind("", "v1", "Service", "services", True),
    Kind("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", True),
    Kind("apps", "v1", "Deployment", "deployments", True),
    Kind("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", False),
    Kind("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", False),
    Kind("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", False),
    Kind("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", True),
)


def crd_kinds(crd_dir: Path = CRD_DIR) -> tuple[Kind, ...]:
    """The served versions of the CustomResourceDefinitions in ``crd_dir`` (the KubeRay CRDs)."""
    out = []
    for f in sorted(crd_dir.glob("*.yaml")):
        crd = yaml.load(f.read_text(), Loader=_LOADER)
        spec = crd["spec"]
        for v in spec["versions"]:
            if v.get("served", True):
                out.append(Kind(spec["group"], v["name"], spec["names"]["kind"], spec["names"]["plural"],
                                spec["scope"] == "Namespaced"))
    return tuple(out)


@functools.cache
def kuberay_kinds() -> tuple[Kind, ...]:
    """The KubeRay kinds: read from the CRDs once, when a server is first made -- not at import, which every
    xdist worker's collection does."""
    return crd_kinds() or (  # the same three, where ../shared is absent
        Kind("ray.io", "v1", "RayCluster", "rayclusters", True),
        Kind("ray.io", "v1", "RayJob", "rayjobs", True),
        Kind("ray.io", "v1", "RayService", "rayservices", True),
    )


PROMETHEUS_KINDS = (Kind("monitoring.coreos.com", "v1", "PodMonitor", "podmonitors", True),
                    Kind("monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors", True))
KUEUE_KINDS = (Kind("kueue.x-k8s.io", "v1beta1", "LocalQueue", "localqueues", True),
               Kind("kueue.x-k8s.io", "v1beta1", "ClusterQueue", "clusterqueues", False),
               Kind("kueue.x-k8s.io", "v1beta1", "Workload", "workloads", True))
#: What the prerequisite check (orchestrator/deploy/k8s/prereqs.py) reads besides the above.
CLUSTER_KINDS = (Kind("storage.k8s.io", "v1", "StorageClass", "storageclasses", False),
                 Kind("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", False))


def _preferred(versions: set[str]) -> str:
    """A stable version before any alpha or beta (v1 over v1alpha1), as the API server prefers."""
    return sorted(versions, key=lambda v: ("alpha" in v or "beta" in v, v))[0]


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str
    authorization: str
    body: Any


@dataclass
class FakeApiServer:
    """A fake Kubernetes API server (not a cluster): discovery, apply, get, delete, lists.

    ``raycluster_states`` scripts what ``status.state`` successive GETs of a
    RayCluster return (the last one repeats); ``fail`` maps (method, path) to
    an HTTP status to answer with instead.
    """

    kinds: tuple[Kind, ...] = field(default_factory=lambda: BUILTIN_KINDS + kuberay_kinds() + PROMETHEUS_KINDS
                                    + KUEUE_KINDS + CLUSTER_KINDS)
    store: dict[str, Any] = field(default_factory=dict)
    applied: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> field manager -> last applied
    requests: list[Request] = field(default_factory=list)
    raycluster_states: list[str] = field(default_factory=lambda: ["ready"])
    nodes: list[dict[str, Any]] = field(default_factory=list)
    fail: dict[tuple[str, str], int] = field(default_factory=dict)
    url: str = ""
    _gets: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- routing
    def _discovery(self, path: str) -> Any | None:
        if path == "/version":
            return {"major": "1", "minor": "30", "gitVersion": "v1.30.0-fake"}
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"]}
        if path == "/apis":
            groups: dict[str, set[str]] = {}
            for k in self.kinds:
                if k.group:
                    groups.setdefault(k.group, set()).add(k.version)
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in sorted(vs)],
                 "preferredVersion": {"groupVersion": f"{g}/{_preferred(vs)}", "version": _preferred(vs)}}
                for g, vs in sorted(groups.items())]}
        for gv_prefix in {k.prefix for k in self.kinds}:
            if path == gv_prefix:
                ks = [k for k in self.kinds if k.prefix == path]
                return {"kind": "APIResourceList", "groupVersion": ks[0].group_version, "resources": [
                    {"name": k.plural, "singularName": k.kind.lower(), "namespaced": k.namespaced, "kind": k.kind,
                     "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]} for k in ks]}
        return None

    def _object_path(self, path: str) -> tuple[Kind, str | None, str | None] | None:
        for k in self.kinds:
            if not path.startswith(k.prefix + "/"):
                continue
            rest = path[len(k.prefix) + 1:].split("/")
            if k.namespaced and len(rest) >= 3 and rest[0] == "namespaces" and rest[2] == k.plural:
                return k, rest[1], rest[3] if len(rest) > 3 else None
            if not k.namespaced and rest[0] == k.plural:
                return k, None, rest[1] if len(rest) > 1 else None
        return None

    def handle(self, method: str, raw_path: str, headers: Any, body: bytes) -> tuple[int, Any]:
        parts = urlsplit(raw_path)
        path, query = parts.path, parse_qs(parts.query)
        parsed = yaml.safe_load(body.decode()) if body else None
        with self._lock:
            self.requests.append(Request(method, path, query, headers.get("Content-Type", ""),
                                         headers.get("Authorization", ""), parsed))
        if (method, path) in self.fail:
            status = self.fail[(method, path)]
            return status, _status_body(status, "Invalid" if status == 422 else "InternalError",
                                        f"fake API server refuses {method} {path}")
        if method == "GET":
            doc = self._discovery(path)
            if doc is not None:
                return 200, doc
        target = self._object_path(path)
        if target is None:
            return 404, _status_body(404, "NotFound", f"the server could not find the requested resource {path}")
        kind, namespace, name = target
        if name is None and method == "GET":
            items = self.nodes if kind.kind == "Node" else [
                o for p, o in sorted(self.store.items()) if p.startswith(path + "/")]
            return 200, {"kind": f"{kind.kind}List", "apiVersion": kind.group_version, "items": items,
                         "metadata": {"resourceVersion": "1"}}
        if method == "PATCH":
            if headers.get("Content-Type") != "application/apply-patch+yaml":
                return 415, _status_body(415, "UnsupportedMediaType", headers.get("Content-Type", ""))
            if not query.get("fieldManager"):
                return 422, _status_body(422, "Invalid", "fieldManager is required for apply patch")
            if query.get("dryRun") == ["All"]:
                return 200, parsed
            # Server-side apply per field manager: each manager's last applied config, merged in the
            # order the managers first applied. A manager's re-apply drops only what it set before.
            managers = self.applied.setdefault(path, {})
            managers[query["fieldManager"][0]] = copy.deepcopy(parsed)
            stored: dict[str, Any] = {}
            for applied in managers.values():
                stored = _merge(stored, applied)
            stored.setdefault("metadata", {})["resourceVersion"] = str(len(self.requests))
            self.store[path] = stored
            return 200, stored
        if method == "GET":
            if path not in self.store:
                return 404, _status_body(404, "NotFound", f'{kind.plural} "{name}" not found')
            obj = copy.deepcopy(self.store[path])
            if kind.kind == "RayCluster":
                with self._lock:
                    state = self.raycluster_states[min(self._gets, len(self.raycluster_states) - 1)]
                    self._gets += 1
                obj["status"] = {"state": state, "desiredWorkerReplicas": 2,
                                 "readyWorkerReplicas": 2 if state == "ready" else 0,
                                 "head": {"podIP": "10.0.0.7"}}
            return 200, obj
        if method == "DELETE":
            if path not in self.store:
                return 404, _status_body(404, "NotFound", f'{kind.plural} "{name}" not found')
            del self.store[path]
            self.applied.pop(path, None)
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
        return 405, _status_body(405, "MethodNotAllowed", method)

    def calls(self, method: str) -> list[Request]:
        """The requests of ``method`` other than discovery, in order."""
        return [r for r in self.requests if r.method == method and self._discovery(r.path) is None]

    def paths(self, method: str) -> list[str]:
        return [r.path for r in self.calls(method)]


def _merge(a: Any, b: Any) -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        return {**a, **{k: _merge(a[k], v) if k in a else copy.deepcopy(v) for k, v in b.items()}}
    return copy.deepcopy(b)


def _status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason,
            "code": code}


def handler_for(server: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            code, doc = server.handle(self.command, self.path, self.headers, body)
            data = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = do_DELETE = do_POST = do_PUT = _serve

        def log_message(self, *args: Any) -> None:  # keep pytest output clean
            pass

    return Handler


StandInApiServer = FakeApiServer  # the name the older tests use
