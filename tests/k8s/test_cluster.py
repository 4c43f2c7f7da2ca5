"""Against a real cluster (kind plus the KubeRay operator, docs/kubernetes.md): `k8s` marker.

Runs when ``KUBECONFIG`` points at a reachable cluster that serves ray.io/v1;
skips with the reason otherwise. Uses the ``dev`` overlay (CPU only, so kind
needs no GPU) in its own namespace, and deletes everything it made.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.core.errors import NotConnectedError
from orchestrator.deploy.k8s.config import load_config
from orchestrator.deploy.k8s.render import render_objects

pytestmark = pytest.mark.k8s

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "k8s.yaml"


@pytest.fixture(scope="module")
def real_client():  # -> KubeRayClient
    from orchestrator.deploy.k8s.client import KubeRayClient

    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig:
        pytest.skip("needs a real cluster: set KUBECONFIG (kind plus the KubeRay operator, docs/kubernetes.md)")
    try:
        client = KubeRayClient.from_kubeconfig(kubeconfig)
    except NotConnectedError as e:
        pytest.skip(f"KUBECONFIG={kubeconfig} does not reach a cluster: {e}")
    if client.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", "rayclusters.ray.io", None) is None:
        pytest.skip("the cluster does not serve ray.io/v1 RayCluster: install the KubeRay operator")
    return client


def test_dev_overlay_becomes_ready_and_is_deleted(real_client) -> None:
    cfg = load_config(CONFIG)[1]["dev"]
    objs = render_objects(cfg)
    try:
        real_client.apply(objs, dry_run=True)
        results = real_client.apply(objs)
        assert {r.action for r in results} <= {"applied", "skipped", "generated", "kept"}
        st = real_client.wait_ready(cfg.name, cfg.namespace, timeout_s=float(os.environ.get("K8S_READY_TIMEOUT", 900)))
        assert st.ready and st.head_pod_ip
        nodes = real_client.list_nodes()
        assert nodes, "a cluster has nodes"
    finally:
        real_client.delete(objs, include_namespace=True)
