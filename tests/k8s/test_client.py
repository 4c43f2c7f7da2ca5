"""The KubeRay client against a stand-in for the API server (conftest.StandInApiServer), not a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.errors import NotConnectedError
from orchestrator.deploy.k8s.client import (
    ClusterStatus,
    CrdMissingError,
    KubeRayClient,
    KubernetesApiError,
    WaitTimeoutError,
)
from orchestrator.deploy.k8s.config import K8sConfig, load_config
from orchestrator.deploy.k8s.render import render_objects

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "k8s.yaml"


@pytest.fixture(scope="module")
def cfg() -> K8sConfig:
    return load_config(CONFIG)[0]


@pytest.fixture
def client(kubeconfig: Path) -> KubeRayClient:
    return KubeRayClient.from_kubeconfig(str(kubeconfig))


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def test_apply_is_server_side_apply_with_our_field_manager(client: KubeRayClient, api_server, cfg: K8sConfig) -> None:
    objs = render_objects(cfg)
    results = client.apply(objs)
    assert [r.action for r in results if r.action != "generated"] == ["applied"] * len(objs)
    patches = [r for r in api_server.calls("PATCH") if r.query["fieldManager"] == ["ray-gpu-orchestrator"]]
    assert len(patches) == len(objs)
    for req in patches:
        assert req.content_type == "application/apply-patch+yaml"
        assert req.query["fieldManager"] == ["ray-gpu-orchestrator"]
        assert req.query["force"] == ["true"]
        assert req.authorization == "Bearer stand-in-token"
    # Apply order: the namespace first, the Ray objects after what they use.
    paths = [r.path for r in patches]
    assert paths[0] == "/api/v1/namespaces/gpu-orchestrator"
    assert paths.index("/apis/ray.io/v1/namespaces/gpu-orchestrator/rayclusters/gpu-orchestrator") > paths.index(
        "/api/v1/namespaces/gpu-orchestrator/serviceaccounts/gpu-orchestrator-head")
    assert patches[0].body == objs[0]


def test_apply_twice_changes_nothing(client: KubeRayClient, api_server, cfg: K8sConfig) -> None:
    client.apply(render_objects(cfg))
    first = {p: {k: v for k, v in o.items() if k != "metadata"} for p, o in api_server.store.items()}
    client.apply(render_objects(cfg))
    assert {p: {k: v for k, v in o.items() if k != "metadata"} for p, o in api_server.store.items()} == first


SECRET = "/api/v1/namespaces/gpu-orchestrator/secrets/gpu-orchestrator-redis"


def test_apply_fills_the_redis_password_once_and_later_applies_keep_it(client: KubeRayClient, api_server,
                                                                       cfg: K8sConfig) -> None:
    import base64

    results = client.apply(render_objects(cfg))
    gen = [r for r in results if r.action == "generated"]
    assert [(r.kind, r.name, r.reason) for r in gen] == [("Secret", "gpu-orchestrator-redis", "random password")]
    # Right after the Secret, before the Redis Deployment that reads it.
    order = [(r.kind, r.action) for r in results]
    assert order.index(("Secret", "generated")) < order.index(("Deployment", "applied"))
    password = base64.b64decode(api_server.store[SECRET]["data"]["password"]).decode()
    assert len(password) == 64 and int(password, 16) >= 0
    (gen_patch,) = [r for r in api_server.calls("PATCH") if r.query["fieldManager"] == ["ray-gpu-orchestrator-generated"]]
    assert set(gen_patch.body) == {"apiVersion", "kind", "metadata", "data"}  # nothing else is that manager's
    # Applying again (our manager sets no data) keeps it, and says so.
    again = client.apply(render_objects(cfg))
    assert ("Secret", "kept") in [(r.kind, r.action) for r in again]
    assert base64.b64decode(api_server.store[SECRET]["data"]["password"]).decode() == password


def test_an_operator_made_password_is_kept(client: KubeRayClient, api_server, cfg: K8sConfig) -> None:
    import base64

    mine = base64.b64encode(b"operator-chosen").decode()
    api_server.applied[SECRET] = {"kubectl": {"apiVersion": "v1", "kind": "Secret", "data": {"password": mine},
                                              "metadata": {"name": "gpu-orchestrator-redis"}}}
    api_server.store[SECRET] = dict(api_server.applied[SECRET]["kubectl"])
    results = client.apply(render_objects(cfg))
    assert not [r for r in results if r.action == "generated"]
    assert api_server.store[SECRET]["data"]["password"] == mine


def test_dry_run_stores_nothing(client: KubeRayClient, api_server, cfg: K8sConfig) -> None:
    results = client.apply(render_objects(cfg), dry_run=True)
    assert all(r.reason == "dry run" for r in results)
    assert api_server.store == {}
    assert all(r.query["dryRun"] == ["All"] for r in api_server.calls("PATCH"))


def test_pod_monitor_is_skipped_when_the_prometheus_operator_is_absent(kubeconfig: Path, api_server, cfg: K8sConfig) -> None:
    api_server.kinds = tuple(k for k in api_server.kinds if k.kind != "PodMonitor")
    results = KubeRayClient.from_kubeconfig(str(kubeconfig)).apply(render_objects(cfg))
    skipped = [r for r in results if r.action == "skipped"]
    assert [(r.kind, "install its operator's CRD" in r.reason) for r in skipped] == [("PodMonitor", True)]


def test_missing_kuberay_is_fatal_with_the_install_hint(kubeconfig: Path, api_server, cfg: K8sConfig) -> None:
    api_server.kinds = tuple(k for k in api_server.kinds if k.group != "ray.io")
    with pytest.raises(CrdMissingError) as ei:
        KubeRayClient.from_kubeconfig(str(kubeconfig)).apply(render_objects(cfg))
    assert ei.value.kind == "RayCluster" and "helm install kuberay-operator" in str(ei.value)


def test_a_refusal_carries_status_and_reason(client: KubeRayClient, api_server, cfg: K8sConfig) -> None:
    path = "/apis/ray.io/v1/namespaces/gpu-orchestrator/rayclusters/gpu-orchestrator"
    api_server.fail[("PATCH", path)] = 422
    with pytest.raises(KubernetesApiError) as ei:
        client.apply(render_objects(cfg))
    e = ei.value
    assert (e.status, e.reason, e.kind, e.retryable) == (422, "Invalid", "RayCluster", False)
    api_server.fail[("PATCH", path)] = 503
    with pytest.raises(KubernetesApiError) as ei:
        client.apply(render_objects(cfg))
    assert ei.value.retryable


def test_wait_ready_polls_until_ready_without_sleeping(client: KubeRayClient, api_server, cfg: K8sConfig) -> None:
    client.apply(render_objects(cfg))
    api_server.raycluster_states = ["", "", "ready"]
    clock, seen = FakeClock(), []
    st = client.wait_ready(cfg.name, cfg.namespace, timeout_s=60, poll_s=2, on_poll=seen.append,
                           clock=clock, sleep=clock.sleep)
    assert st.ready and st.head_pod_ip == "10.0.0.7" and (st.ready_workers, st.desired_workers) == (2, 2)
    assert [s.state for s in seen] == ["", "", "ready"]
    assert clock.sleeps == [2, 2]


def test_wait_ready_times_out_with_the_last_status(client: KubeRayClient, api_server, cfg: K8sConfig) -> None:
    client.apply(render_objects(cfg))
    api_server.raycluster_states = [""]
    clock = FakeClock()
    with pytest.raises(WaitTimeoutError) as ei:
        client.wait_ready(cfg.name, cfg.namespace, timeout_s=5, poll_s=2, clock=clock, sleep=clock.sleep)
    assert ei.value.retryable and ei.value.last.state == "" and "workers=0/2" in str(ei.value)
    assert clock.now == 5  # the last sleep is cut to the deadline


def test_a_failed_cluster_is_not_waited_on(client: KubeRayClient, api_server, cfg: K8sConfig) -> None:
    client.apply(render_objects(cfg))
    api_server.raycluster_states = ["failed"]
    clock = FakeClock()
    with pytest.raises(KubernetesApiError, match="state=failed"):
        client.wait_ready(cfg.name, cfg.namespace, timeout_s=60, clock=clock, sleep=clock.sleep)
    assert clock.sleeps == []


def test_status_of_an_absent_cluster(client: KubeRayClient, cfg: K8sConfig) -> None:
    st = client.cluster_status(cfg.name, cfg.namespace)
    assert st.state is None and not st.ready and st.summary() == "not found"
    assert {r.action for r in client.objects_status(render_objects(cfg))} == {"absent"}


def test_delete_is_reverse_order_idempotent_and_keeps_the_namespace(client: KubeRayClient, api_server,
                                                                    cfg: K8sConfig) -> None:
    objs = render_objects(cfg)
    client.apply(objs)
    results = client.delete(objs)
    assert results[0].kind == objs[-1]["kind"]
    assert results[-1].kind == "Namespace" and results[-1].action == "kept"
    assert list(api_server.store) == ["/api/v1/namespaces/gpu-orchestrator"]
    again = client.delete(objs, include_namespace=True)
    assert all(r.action == "deleted" for r in again)
    assert sum(r.reason == "already absent" for r in again) == len(objs) - 1
    assert api_server.store == {}


def test_list_nodes(client: KubeRayClient, api_server) -> None:
    api_server.nodes = [{"metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.count": "8"}}}]
    nodes = client.list_nodes()
    assert [n["metadata"]["name"] for n in nodes] == ["gpu-1"]


def test_an_unreachable_server_is_not_connected(kubeconfig_for, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import socket
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = kubeconfig_for(f"http://127.0.0.1:{port}")
    with pytest.raises(NotConnectedError, match=f"127.0.0.1:{port}") as ei:
        KubeRayClient.from_kubeconfig(str(path))
    assert ei.value.retryable
    with pytest.raises(NotConnectedError, match="cannot load kubeconfig"):
        KubeRayClient.from_kubeconfig(str(tmp_path / "nope"))


def test_cluster_status_summary_names_failing_conditions() -> None:
    st = ClusterStatus.from_object({"metadata": {"name": "c", "namespace": "n"}, "status": {
        "state": "", "desiredWorkerReplicas": 3, "readyWorkerReplicas": 1,
        "conditions": [{"type": "HeadPodReady", "status": "False", "reason": "ContainersNotReady"},
                       {"type": "RayClusterProvisioned", "status": "True", "reason": "AllPodsReady"}]}})
    assert st.summary() == "state=pending workers=1/3 conditions: HeadPodReady=False(ContainersNotReady)"
