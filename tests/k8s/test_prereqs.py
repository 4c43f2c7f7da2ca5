"""``orchestrator k8s render --check``'s prerequisites: offline each is listed unchecked with the reason;
against the fake API server (``fake_apiserver.py``, not a cluster) each is found or reported missing."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fake_apiserver import FakeApiServer
from orchestrator.cli.k8s import app

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "k8s.yaml"
runner = CliRunner()


def _check(*extra: str, env: dict | None = None):
    r = runner.invoke(app, ["render", "--config", str(CONFIG), "--out", str(REPO / "k8s"), "--check", "--json",
                            *extra], env=env)
    return r, json.loads(r.stdout.splitlines()[0])


def _obj(path: str, body: dict) -> tuple[str, dict]:
    """A stored object as the server returns it: ``path`` names its apiVersion, kind and name."""
    parts = path.strip("/").split("/")
    api_version = parts[1] if parts[0] == "api" else f"{parts[1]}/{parts[2]}"
    kind = {"storageclasses": "StorageClass", "secrets": "Secret", "localqueues": "LocalQueue",
            "deployments": "Deployment"}[parts[-2]]
    meta = {"name": parts[-1], **({"namespace": parts[-3]} if "namespaces" in parts else {})}
    return path, {"apiVersion": api_version, "kind": kind, "metadata": meta, **body}


def _seed_everything(server: FakeApiServer) -> None:
    ns = "gpu-orchestrator"
    server.store.update(_obj(k, v) for k, v in {
        "/apis/storage.k8s.io/v1/storageclasses/nfs-csi": {"provisioner": "nfs.csi.k8s.io"},
        "/apis/storage.k8s.io/v1/storageclasses/standard": {"provisioner": "rancher.io/local-path"},
        f"/api/v1/namespaces/{ns}/secrets/gpu-orchestrator-redis": {
            "data": {"password": base64.b64encode(b"x" * 64).decode()}},
        f"/api/v1/namespaces/{ns}/secrets/gpu-orchestrator-orchestrator": {
            "data": {"admin-key": base64.b64encode(b"a" * 43).decode(), "head-secret": base64.b64encode(b"b" * 64).decode()}},
        f"/apis/kueue.x-k8s.io/v1beta1/namespaces/{ns}/localqueues/gpu-team": {"spec": {"clusterQueue": "q"}},
        "/apis/apps/v1/namespaces/kueue-system/deployments/kueue-controller-manager": {"spec": {"template": {"spec": {
            "containers": [{"name": "manager", "image": "registry.k8s.io/kueue/kueue:v0.14.2",
                            "args": ["--config=/controller_manager_config.yaml",
                                     "--feature-gates=ElasticJobsViaWorkloadSlices=true"]}]}}}},
    }.items())


def test_offline_every_prerequisite_is_unchecked_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    r, got = _check()
    assert r.exit_code == 0, r.output
    keys = {p["key"] for p in got["prerequisites"]}
    assert {"kubernetes", "kuberay", "prometheus-operator", "storage-class:nfs-csi", "kueue",
            "redis-password", "head-admin-key", "head-head-secret"} <= keys
    assert {p["status"] for p in got["prerequisites"]} == {"unchecked"}
    assert all("KUBECONFIG" in p["detail"] for p in got["prerequisites"])
    (kueue,) = [p for p in got["prerequisites"] if p["key"] == "kueue"]
    assert kueue["needed_by"] == ["prod"] and "0.14" in kueue["what"]


def test_against_a_cluster_with_everything_all_prerequisites_are_met(api_server: FakeApiServer,
                                                                     kubeconfig: Path) -> None:
    _seed_everything(api_server)
    r, got = _check("--kubeconfig", str(kubeconfig))
    assert r.exit_code == 0, r.output
    assert {p["key"]: p["status"] for p in got["prerequisites"]} == dict.fromkeys(
        {p["key"] for p in got["prerequisites"]}, "ok"), got["prerequisites"]


@pytest.mark.parametrize("break_it, key, says", [
    (lambda s: s.store.pop("/apis/storage.k8s.io/v1/storageclasses/nfs-csi"), "storage-class:nfs-csi", "nfs-csi"),
    (lambda s: s.store.pop("/api/v1/namespaces/gpu-orchestrator/secrets/gpu-orchestrator-redis"),
     "redis-password", "no Secret"),
    (lambda s: s.store["/api/v1/namespaces/gpu-orchestrator/secrets/gpu-orchestrator-orchestrator"]["data"].pop(
        "head-secret"), "head-head-secret", "no key 'head-secret'"),
    (lambda s: setattr(s, "kinds", tuple(k for k in s.kinds if k.kind != "PodMonitor")),
     "prometheus-operator", "PodMonitor"),
    (lambda s: s.store["/apis/apps/v1/namespaces/kueue-system/deployments/kueue-controller-manager"]["spec"][
        "template"]["spec"]["containers"][0].update(image="registry.k8s.io/kueue/kueue:v0.13.4"), "kueue", "v0.13.4"),
    (lambda s: s.store["/apis/apps/v1/namespaces/kueue-system/deployments/kueue-controller-manager"]["spec"][
        "template"]["spec"]["containers"][0].update(args=[]), "kueue", "ElasticJobsViaWorkloadSlices"),
    (lambda s: s.store.pop("/apis/kueue.x-k8s.io/v1beta1/namespaces/gpu-orchestrator/localqueues/gpu-team"),
     "kueue", "gpu-team"),
])
def test_a_missing_prerequisite_fails_the_check_and_names_itself(api_server: FakeApiServer, kubeconfig: Path,
                                                                 break_it, key: str, says: str) -> None:
    _seed_everything(api_server)
    break_it(api_server)
    r, got = _check("--kubeconfig", str(kubeconfig))
    assert r.exit_code == 1, r.output
    bad = {p["key"]: p for p in got["prerequisites"] if p["status"] == "missing"}
    assert set(bad) == {key} and says in bad[key]["detail"], got["prerequisites"]


def test_overlay_limits_the_check_to_its_render(api_server: FakeApiServer, kubeconfig: Path) -> None:
    _seed_everything(api_server)
    api_server.store.pop("/apis/storage.k8s.io/v1/storageclasses/nfs-csi")  # prod's class, not dev's
    r, got = _check("--kubeconfig", str(kubeconfig), "--overlay", "dev")
    assert r.exit_code == 0, r.output
    assert {p["key"] for p in got["prerequisites"]} == {"kubernetes", "kuberay", "storage-class:standard",
                                                         "redis-password", "head-admin-key", "head-head-secret"}


def test_an_unreachable_cluster_leaves_them_unchecked_saying_why(tmp_path: Path, kubeconfig_for) -> None:
    r, got = _check("--kubeconfig", str(kubeconfig_for("http://127.0.0.1:9")))
    assert r.exit_code == 0, r.output
    assert {p["status"] for p in got["prerequisites"]} == {"unchecked"}
    assert all("not reachable" in p["detail"] for p in got["prerequisites"])
