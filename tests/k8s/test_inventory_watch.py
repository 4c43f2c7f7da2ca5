"""The inventory cross-check wired end to end, without a cluster: Node objects from the stand-in API server
(real HTTP through the real client), the agents' inventories from the real head in-process, the report back
into the head -- the metric, ``status`` and the ``orchestrator nodes`` column."""

from __future__ import annotations

import re
import threading

import pytest
from headless import InProcessHead
from rich.console import Console
from test_inventory import node  # tests/k8s is on sys.path (no package)

from orchestrator.cli.jobs import nodes_table
from orchestrator.core.errors import InvalidRequestError
from orchestrator.deploy.k8s.client import KubeRayClient
from orchestrator.deploy.kuberay import inventory_round, watch_inventory


def _labelled(name: str, product: str, count: int) -> dict:
    return node(name, {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count),
                       "nvidia.com/gpu.memory": "81920"}, {"nvidia.com/gpu": str(count)})


def _gauge(text: str, labels: str) -> float:
    m = re.search(r"^orchestrator_inventory_disagreements\{" + labels + r"\} (\S+)$", text, re.M)
    assert m, text
    return float(m.group(1))


def test_a_node_labelled_as_another_model_is_reported_in_the_metric_status_and_nodes(
        head: InProcessHead, api_server, kubeconfig) -> None:
    client = KubeRayClient.from_kubeconfig(str(kubeconfig))
    # the demo's h100-0 is labelled an A100 by "GPU feature discovery"; a100-0 agrees
    api_server.nodes = [_labelled("h100-0", "NVIDIA-A100-SXM4-80GB", 2), _labelled("a100-0", "NVIDIA-A100-SXM4-80GB", 4)]
    got = inventory_round(head, client.list_nodes)
    assert got["errors"] >= 1
    st = head.status()
    assert st["inventory_check"]["errors"] == got["errors"]
    lines = {n["name"]: n["k8s_inventory"] for n in st["nodes"]}
    assert "model" in lines["h100-0"] and lines["a100-0"] == ""
    text = head.service.metrics.text().decode()
    assert _gauge(text, 'field="gpu.model",node="h100-0",severity="error"') == 1
    out = Console(width=250, record=True)
    out.print(nodes_table(st["nodes"]))
    rendered = out.export_text()
    assert "K8S LABELS" in rendered and "error: gpu.model" in rendered and "agrees" in rendered
    # the labels are fixed: the next round clears the disagreement, and the gauge reads 0, not 1
    api_server.nodes[0] = _labelled("h100-0", "NVIDIA-H100-80GB-HBM3", 2)
    inventory_round(head, client.list_nodes)
    assert _gauge(head.service.metrics.text().decode(), 'field="gpu.model",node="h100-0",severity="error"') == 0
    assert {n["name"]: n["k8s_inventory"] for n in head.status()["nodes"]}["h100-0"] == ""


def test_the_watcher_keeps_going_when_a_round_fails(head: InProcessHead) -> None:
    calls = {"n": 0}

    def flaky() -> list:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("API server restarting")
        if calls["n"] >= 3:
            stop.set()
        return []

    stop = threading.Event()
    assert watch_inventory(head, flaky, 0.01, stop) == 2 and calls["n"] == 3


def test_a_malformed_report_is_refused_naming_the_field_and_the_last_check_stays(head: InProcessHead) -> None:
    head.report_inventory_check({"nodes": ["x"], "disagreements": []})
    with pytest.raises(InvalidRequestError) as e:
        head.report_inventory_check({"disagreements": [{"node": "x", "field": "model", "severity": "fatal"}]})
    assert e.value.field == "report.disagreements.0.severity"
    assert head.status()["inventory_check"]["nodes"] == 1
