"""Inventory from GPU feature discovery labels, and the cross-check against agent inventories."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from orchestrator.core.errors import InvalidRequestError
from orchestrator.deploy.k8s.inventory import (
    METRIC,
    METRIC_LABELS,
    NODE_NAME_LABEL,
    InventoryReport,
    compare_nodes,
    cross_check,
    node_inventory,
    resolve_product,
)
from orchestrator.core.inventory import GpuDevice, MigDevice, NodeInventory


def node(name: str, labels: dict[str, str], allocatable: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "96", "memory": "1056Gi", **(allocatable or {})}}}


H100 = node("h100-1", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
                       "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.sharing-strategy": "none"},
            {"nvidia.com/gpu": "8"})
A100_MIXED = node("a100-1", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "8",
                             "nvidia.com/gpu.memory": "81920", "nvidia.com/mig.strategy": "mixed",
                             "nvidia.com/mig.config": "all-balanced"},
                  {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "16", "nvidia.com/mig-2g.20gb": "8",
                   "nvidia.com/mig-3g.40gb": "8"})
T4_MPS = node("t4-1", {"nvidia.com/gpu.product": "Tesla-T4-SHARED", "nvidia.com/gpu.count": "1",
                       "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "mps"},
              {"nvidia.com/gpu": "4"})
CPU = node("cpu-1", {"kubernetes.io/os": "linux"})


def mig_counts(inv: NodeInventory) -> Counter[str]:
    return Counter(d.profile for g in inv.gpus for d in g.mig_devices)


def test_whole_gpu_node() -> None:
    inv = node_inventory(H100)
    assert inv.model == "H100-80GB" and len(inv.gpus) == 8
    assert all(not g.mig_enabled and g.total_memory_mib == 81559 for g in inv.gpus)
    assert (inv.cpu_milli, inv.memory_mib) == (96_000, 1056 * 1024)
    assert inv.labels["nvidia.com/gpu.sharing-strategy"] == "none"


def test_mixed_mig_node_lays_out_every_allocatable_device() -> None:
    inv = node_inventory(A100_MIXED)
    assert len(inv.gpus) == 8 and all(g.mig_enabled for g in inv.gpus)
    assert mig_counts(inv) == Counter({"1g.10gb": 16, "2g.20gb": 8, "3g.40gb": 8})
    # Spread evenly: every card carries the all-balanced layout (NodeInventory validated the placements).
    assert {tuple(sorted(d.profile for d in g.mig_devices)) for g in inv.gpus} == {
        ("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb")}


def test_mixed_node_with_some_whole_cards() -> None:
    n = node("a100-2", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "4",
                        "nvidia.com/mig.strategy": "mixed"},
             {"nvidia.com/gpu": "2", "nvidia.com/mig-1g.10gb": "14"})
    inv = node_inventory(n)
    assert [g.mig_enabled for g in inv.gpus] == [True, True, False, False]
    assert mig_counts(inv) == Counter({"1g.10gb": 14})


def test_single_strategy_mig_node() -> None:
    n = node("a100-3", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", "nvidia.com/gpu.count": "14",
                        "nvidia.com/mig.strategy": "single"}, {"nvidia.com/gpu": "14"})
    inv = node_inventory(n)
    assert len(inv.gpus) == 2 and mig_counts(inv) == Counter({"1g.10gb": 14})


def test_shared_node_counts_physical_gpus() -> None:
    inv = node_inventory(T4_MPS)
    assert inv.model == "T4" and len(inv.gpus) == 1 and not inv.gpus[0].mig_enabled


def test_a_node_without_gpu_labels_has_no_gpus() -> None:
    assert node_inventory(CPU).gpus == ()


def test_labels_that_contradict_the_catalogue_name_the_label() -> None:
    with pytest.raises(InvalidRequestError) as ei:
        node_inventory(node("x", {"nvidia.com/gpu.product": "NVIDIA-B300", "nvidia.com/gpu.count": "8"}))
    assert "nvidia.com/gpu.product" in ei.value.field and "NVIDIA-H100-80GB-HBM3" in ei.value.allowed
    too_many = node("y", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "1",
                          "nvidia.com/mig.strategy": "mixed"}, {"nvidia.com/mig-3g.40gb": "3"})
    with pytest.raises(InvalidRequestError, match="left over"):
        node_inventory(too_many)


@pytest.mark.parametrize(("product", "model", "profile"), [
    ("NVIDIA-A100-SXM4-80GB", "A100-80GB", None),
    ("NVIDIA-A100-SXM4-80GB-MIG-3g.40gb", "A100-80GB", "3g.40gb"),
    ("Tesla-T4-SHARED", "T4", None),
    ("NVIDIA-H200", "H200-141GB", None),
])
def test_resolve_product(product: str, model: str, profile: str | None) -> None:
    m, p = resolve_product(product)
    assert (m.name, p) == (model, profile)


# ---------------------------------------------------------------- cross-check

def agent(name: str, model: str, n: int, *, start: int = 0, k8s_node: str | None = None,
          mig: list[tuple[str, int]] | None = None, memory: int | None = None) -> NodeInventory:
    gpus = []
    for i in range(start, start + n):
        devices = tuple(MigDevice(uuid=f"MIG-{name}-{i}-{p}-{s}", profile=p, start=s) for p, s in (mig or []))
        gpus.append(GpuDevice(index=i, uuid=f"GPU-{i}", model=model, memory_mib=memory, mig_enabled=bool(mig),
                              mig_devices=devices))
    labels = {NODE_NAME_LABEL: k8s_node} if k8s_node else {}
    return NodeInventory(name=name, gpus=tuple(gpus), labels=labels)


BALANCED = [("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3)]


def test_agreement_is_silent() -> None:
    k8s = [node_inventory(H100), node_inventory(A100_MIXED)]
    agents = [agent("h100-1", "H100-80GB", 8, memory=81559), agent("a100-1", "A100-80GB", 8, mig=BALANCED)]
    assert cross_check(k8s, agents) == []


def test_pods_on_one_node_pool_their_gpus_by_uuid() -> None:
    # Two Ray pods on h100-1 with 4 cards each, plus an MPS node where four pods see the same card.
    agents = [agent("pod-a", "H100-80GB", 4, k8s_node="h100-1", memory=81559),
              agent("pod-b", "H100-80GB", 4, start=4, k8s_node="h100-1", memory=81559),
              *[agent(f"mps-{i}", "T4", 1, k8s_node="t4-1") for i in range(4)]]
    assert cross_check([node_inventory(H100), node_inventory(T4_MPS)], agents) == []


def test_disagreements_are_named_with_severity_and_reason() -> None:
    k8s = [node_inventory(H100), node_inventory(A100_MIXED), node_inventory(T4_MPS)]
    agents = [
        agent("h100-1", "H100-80GB", 6, memory=81559),                     # fewer cards held by Ray: warning
        agent("a100-1", "A100-80GB", 8, mig=[("7g.80gb", 0)]),             # another MIG layout: error
        agent("ghost", "T4", 1),                                           # a node Kubernetes does not list
        agent("t4-1", "A10", 1),                                           # another model: error
    ]
    got = {(d.node, d.field, d.severity) for d in cross_check(k8s, agents)}
    assert got == {
        ("h100-1", "gpu.count", "warning"),
        ("a100-1", "mig", "error"),
        ("ghost", "node", "error"),
        ("t4-1", "gpu.model", "error"),
    }
    msgs = [d.message for d in cross_check(k8s, agents)]
    assert any("Kubernetes labels say 16x 1g.10gb, 8x 2g.20gb, 8x 3g.40gb, agents report 8x 7g.80gb" in m for m in msgs)


def test_more_gpus_than_labelled_is_an_error_and_a_node_without_agents_a_warning() -> None:
    k8s = [node_inventory(H100), node_inventory(A100_MIXED), node_inventory(CPU)]
    agents = [agent("h100-1", "H100-80GB", 9, memory=81559)]
    got = {(d.node, d.field, d.severity) for d in cross_check(k8s, agents)}
    assert got == {("h100-1", "gpu.count", "error"), ("a100-1", "agents", "warning")}  # cpu-1 has no GPUs


def test_partial_mig_coverage_is_fine_unless_it_exceeds_the_labels() -> None:
    k8s = [node_inventory(A100_MIXED)]
    half = agent("a100-1", "A100-80GB", 4, mig=BALANCED)
    assert [d.field for d in cross_check(k8s, [half])] == ["gpu.count"]
    over = agent("a100-1", "A100-80GB", 5, mig=[("3g.40gb", 0), ("3g.40gb", 4)])  # 10 > 8 labelled
    assert {d.field for d in cross_check(k8s, [over])} == {"gpu.count", "mig"}


def test_memory_differences_beyond_tolerance_warn() -> None:
    d = cross_check([node_inventory(H100)], [agent("h100-1", "H100-80GB", 8, memory=40960)])
    assert [(x.field, x.severity) for x in d] == [("gpu.memory", "warning")]
    assert d[0].to_dict()["kubernetes"] == "81559 MiB"


# ---------------------------------------------------------------- the report the head exports

def test_compare_nodes_reports_unreadable_labels_instead_of_raising() -> None:
    odd = node("odd-1", {"nvidia.com/gpu.product": "NVIDIA-B999", "nvidia.com/gpu.count": "8"}, {"nvidia.com/gpu": "8"})
    report = compare_nodes([H100, odd, CPU], [agent("h100-1", "H100-80GB", 8, memory=81559),
                                              agent("odd-pod", "H100-80GB", 8, k8s_node="odd-1")])
    assert report.nodes == ("cpu-1", "h100-1", "odd-1")
    assert [(d.node, d.field, d.severity, d.kubernetes) for d in report.disagreements] == [
        ("odd-1", "labels", "error", "NVIDIA-B999")]  # and its agent is not "on a node Kubernetes does not list"
    assert report.errors == 1


def test_report_samples_drop_resolved_keys_to_zero_and_count_repeats() -> None:
    k8s = [H100, A100_MIXED]
    bad = compare_nodes(k8s, [agent("h100-1", "H100-80GB", 9, memory=81559)])
    first = bad.samples()
    assert first == {("a100-1", "agents", "warning"): 1, ("h100-1", "gpu.count", "error"): 1}
    assert METRIC_LABELS == ("node", "field", "severity") and METRIC == "orchestrator_inventory_disagreements"
    good = compare_nodes(k8s, [agent("h100-1", "H100-80GB", 8, memory=81559),
                               agent("a100-1", "A100-80GB", 8, mig=BALANCED)])
    assert good.disagreements == ()
    assert good.samples(previous=first) == {k: 0 for k in first}
    twice = InventoryReport((*bad.disagreements, bad.disagreements[0]), bad.nodes)
    assert twice.samples()[("a100-1", "agents", "warning")] == 2


def test_report_lines_for_orchestrator_nodes_and_its_wire_form() -> None:
    report = compare_nodes([H100, T4_MPS], [agent("h100-1", "H100-80GB", 6, memory=40960), agent("t4-1", "A10", 1)])
    assert report.node_line("h100-1") == ("warning: gpu.count: labels 8, agents 6; "
                                          "warning: gpu.memory: labels 81559 MiB, agents 40960 MiB")
    assert report.node_line("t4-1") == "error: gpu.model: labels T4, agents A10"
    assert report.node_line("nowhere") == ""
    assert InventoryReport.from_dict(report.to_dict()) == report


def test_the_dashboard_panel_reads_the_metric_by_its_severity_label() -> None:
    from orchestrator.deploy.k8s.dashboard import METRICS, dashboard

    assert METRIC in METRICS
    exprs = [t["expr"] for p in dashboard("t")["panels"] for t in p["targets"] if METRIC in t["expr"]]
    assert exprs and all("by (severity)" in e for e in exprs) and "severity" in METRIC_LABELS
