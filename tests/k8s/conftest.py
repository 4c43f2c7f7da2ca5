"""Fixtures for the Kubernetes tests: schema validation, a small kustomize, and a stand-in API server.

No Kubernetes API server can run on these machines, so:

* manifests are validated against the Kubernetes built-in schemas with
  ``kubernetes-validate`` (strict: unknown fields fail; pod templates inside
  the Ray CRDs too, wrapped as a ``PodTemplate``), and against the KubeRay
  CRDs' ``openAPIV3Schema`` from ``../shared/kuberay/crds`` with
  ``jsonschema`` plus an unknown-field walk (what the API server's strict
  field validation does); without ``../shared`` the CRD part skips with that
  reason;
* the PodMonitor is checked against a hand-written subset of the Prometheus
  operator's schema (the fields we render, unknown fields rejected);
* :class:`StandInApiServer` is a stand-in for the API server, not a cluster:
  it answers the few calls ``orchestrator/deploy/k8s/client.py`` makes (discovery,
  server-side apply, get, delete, list nodes) on 127.0.0.1 and records them.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from orchestrator.deploy.k8s.references import pod_templates
from orchestrator.deploy.k8s.render import apply_json_patch, object_key

REPO = Path(__file__).resolve().parents[2]
K8S_DIR = REPO / "k8s"
CONFIG = REPO / "configs" / "k8s.yaml"
CRD_DIR = REPO.parent / "shared" / "kuberay" / "crds"
# The oldest Kubernetes we claim (docs/kubernetes.md); fields newer than it would fail here.
K8S_VERSION = "1.30.0"

try:
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover
    _Loader = yaml.SafeLoader


# --------------------------------------------------------------------------- schemas

POD_MONITOR_SCHEMA: dict[str, Any] = {
    # The fields of monitoring.coreos.com/v1 PodMonitor that we render, as the
    # Prometheus operator's CRD declares them; anything else is rejected.
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "selector": {"type": "object", "additionalProperties": False, "properties": {
                    "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "matchExpressions": {"type": "array"},
                }},
                "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                    "any": {"type": "boolean"},
                    "matchNames": {"type": "array", "items": {"type": "string"}},
                }},
                "jobLabel": {"type": "string"},
                "podMetricsEndpoints": {"type": "array", "items": {
                    "type": "object", "additionalProperties": False, "properties": {
                        "port": {"type": "string"},
                        "path": {"type": "string"},
                        "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                        "interval": {"type": "string",
                                     "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?"
                                                r"(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                    }}},
            },
            "required": ["selector"],
        },
    },
}


def load_crds() -> dict[str, dict[str, Any]]:
    """kind -> the served v1 openAPIV3Schema of the KubeRay CRDs in ../shared."""
    out = {}
    for f in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.load(f.read_text(), Loader=_Loader)
        for v in crd["spec"]["versions"]:
            if v["name"] == "v1":
                out[crd["spec"]["names"]["kind"]] = v["schema"]["openAPIV3Schema"]
    return out


def unknown_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Paths in ``obj`` the structural schema does not declare (the API server would prune or reject them)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out: list[str] = []
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for k, v in obj.items():
            if props is not None and k in props:
                out += unknown_fields(v, props[k], f"{path}.{k}")
            elif isinstance(extra, dict):
                out += unknown_fields(v, extra, f"{path}.{k}")
            elif props is not None or extra is False:
                out.append(f"{path}.{k}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(obj):
            out += unknown_fields(v, schema["items"], f"{path}[{i}]")
    return out


def _builtin(obj: dict[str, Any]) -> list[str]:
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{obj['kind']}/{obj['metadata'].get('name')}: {str(e).splitlines()[0]}"]
    return []


def manifest_problems(obj: dict[str, Any], crds: dict[str, dict[str, Any]] | None) -> list[str]:
    """Why the API server would refuse ``obj``; empty when it validates.

    ``crds`` None: the Ray kinds are checked only through their pod templates
    (the caller skips the CRD part with a reason).
    """
    import jsonschema

    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    name = (obj.get("metadata") or {}).get("name")
    if api_version.startswith("ray.io/"):
        problems = []
        for t in pod_templates(obj):
            wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": t.template}
            problems += [f"{kind}/{name} {t.path}: {p}" for p in _builtin(wrapped)]
        if crds is not None:
            schema = crds[kind]
            problems += [f"{kind}/{name}: {e.message} at {list(e.absolute_path)}"
                         for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]
            problems += [f"{kind}/{name}: unknown field {p}" for p in unknown_fields(obj, schema)
                         if not p.startswith(".metadata.")]
        return problems
    if kind == "PodMonitor":
        return [f"PodMonitor/{name}: {e.message} at {list(e.absolute_path)}"
                for e in jsonschema.Draft7Validator(POD_MONITOR_SCHEMA).iter_errors(obj)]
    return _builtin(obj)


@pytest.fixture(scope="session")
def validate() -> Any:
    """``validate(obj, crds=None) -> list[str]``: why the API server would refuse ``obj``."""
    return manifest_problems


@pytest.fixture(scope="session")
def crds() -> dict[str, dict[str, Any]]:
    if not CRD_DIR.is_dir():
        pytest.skip(f"needs the KubeRay CRDs in {CRD_DIR} (../shared is absent in a fresh clone)")
    return load_crds()


# --------------------------------------------------------------------------- kustomize

def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(path.read_text(), Loader=_Loader) if d]


def _matches(obj: dict[str, Any], target: dict[str, Any]) -> bool:
    api_version, kind, namespace, name = object_key(obj)
    group, _, version = api_version.rpartition("/")
    return (kind == target.get("kind") and name == target.get("name") and group == target.get("group", "")
            and version == target.get("version", version) and namespace == target.get("namespace", namespace))


def kustomize_lite(directory: Path) -> list[dict[str, Any]]:
    """The part of ``kustomize build`` our tree uses: resources (files and bases),
    JSON 6902 patches from files, and ``$patch: delete``. Anything else fails loudly."""
    k = yaml.load((directory / "kustomization.yaml").read_text(), Loader=_Loader)
    allowed = {"apiVersion", "kind", "resources", "patches"}
    assert set(k) <= allowed, f"kustomize_lite does not implement {set(k) - allowed}"
    objs: list[dict[str, Any]] = []
    for res in k.get("resources", []):
        p = (directory / res).resolve()
        objs += kustomize_lite(p) if p.is_dir() else load_yaml_docs(p)
    for patch in k.get("patches", []):
        target = patch["target"]
        hits = [i for i, o in enumerate(objs) if _matches(o, target)]
        assert len(hits) == 1, f"patch target {target} matches {len(hits)} objects"
        if "path" in patch:
            ops = yaml.load((directory / patch["path"]).read_text(), Loader=_Loader)
            objs[hits[0]] = apply_json_patch(objs[hits[0]], ops)
        else:
            doc = yaml.load(patch["patch"], Loader=_Loader)
            assert doc.get("$patch") == "delete", f"kustomize_lite only deletes inline: {doc}"
            del objs[hits[0]]
    return objs


def kubectl_kustomize(directory: Path) -> list[dict[str, Any]] | None:
    """``kubectl kustomize DIR`` parsed, or None when kubectl is not installed."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None
    out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.load_all(out.stdout, Loader=_Loader) if d]


@pytest.fixture(scope="session")
def kustomize() -> Any:
    """``kustomize.lite(dir)`` always; ``kustomize.kubectl(dir)`` None without kubectl."""
    from types import SimpleNamespace

    return SimpleNamespace(lite=kustomize_lite, kubectl=kubectl_kustomize, load=load_yaml_docs)


# --------------------------------------------------------------------------- stand-in API server

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
KUBERAY_KINDS = (
    Kind("ray.io", "v1", "RayCluster", "rayclusters", True),
    Kind("ray.io", "v1", "RayJob", "rayjobs", True),
    Kind("ray.io", "v1", "RayService", "rayservices", True),
)
PROMETHEUS_KINDS = (Kind("monitoring.coreos.com", "v1", "PodMonitor", "podmonitors", True),)


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str
    authorization: str
    body: Any


@dataclass
class StandInApiServer:
    """A stand-in for the Kubernetes API server (not a cluster): discovery, apply, get, delete, list nodes.

    ``raycluster_states`` scripts what ``status.state`` successive GETs of a
    RayCluster return (the last one repeats); ``fail`` maps (method, path) to
    an HTTP status to answer with instead.
    """

    kinds: tuple[Kind, ...] = BUILTIN_KINDS + KUBERAY_KINDS + PROMETHEUS_KINDS
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
            return {"major": "1", "minor": "30", "gitVersion": "v1.30.0-stand-in"}
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"]}
        if path == "/apis":
            groups: dict[str, set[str]] = {}
            for k in self.kinds:
                if k.group:
                    groups.setdefault(k.group, set()).add(k.version)
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in sorted(vs)],
                 "preferredVersion": {"groupVersion": f"{g}/{sorted(vs)[-1]}", "version": sorted(vs)[-1]}}
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
                                        f"stand-in refuses {method} {path}")
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


def _handler_for(server: StandInApiServer) -> type[BaseHTTPRequestHandler]:
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


@pytest.fixture
def api_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StandInApiServer]:
    """A stand-in API server on 127.0.0.1 (not a cluster), with discovery cached under tmp_path."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the dynamic client's discovery cache
    server = StandInApiServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(server))
    server.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def write_kubeconfig(path: Path, url: str, token: str = "stand-in-token") -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
        "clusters": [{"name": "stand-in", "cluster": {"server": url}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "admin"}}],
    }))
    return path


@pytest.fixture
def kubeconfig(api_server: StandInApiServer, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", api_server.url)


@pytest.fixture
def kubeconfig_for(tmp_path: Path) -> Any:
    """``kubeconfig_for(url) -> Path``: a kubeconfig pointing at ``url``."""
    return lambda url: write_kubeconfig(tmp_path / "kubeconfig-any", url)
