"""Fixtures for the Kubernetes tests: schema validation, a small kustomize, and a fake API server.

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
* ``fake_apiserver.FakeApiServer`` is a fake of the Kubernetes API server, not a cluster:
  it answers the calls ``orchestrator/deploy/k8s/client.py`` and ``kubectl apply --dry-run=client``
  make (discovery, server-side apply, get, delete, list nodes) on 127.0.0.1 and records them.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from fake_apiserver import FakeApiServer, handler_for
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


# --------------------------------------------------------------------------- the fake API server

@pytest.fixture
def api_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeApiServer]:
    """The fake API server on 127.0.0.1 (fake_apiserver.py; not a cluster), with discovery cached under tmp_path."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the dynamic client's discovery cache
    server = FakeApiServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(server))
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
def kubeconfig(api_server: FakeApiServer, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", api_server.url)


@pytest.fixture
def kubeconfig_for(tmp_path: Path) -> Any:
    """``kubeconfig_for(url) -> Path``: a kubeconfig pointing at ``url``."""
    return lambda url: write_kubeconfig(tmp_path / "kubeconfig-any", url)
