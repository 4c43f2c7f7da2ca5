"""The cluster file: the demo loads; every error names the field and shows the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.errors import ConfigError
from orchestrator.core.config import (
    DEMO_CONFIG,
    MODEL_LABEL,
    NODE_LABEL,
    ClusterConfig,
    load_config,
    parse_config,
)


def test_the_demo_cluster(demo: ClusterConfig) -> None:
    assert [(n.name, n.model, n.gpus) for n in demo.nodes] == [
        ("a100-0", "A100-80GB", 4), ("a100-1", "A100-80GB", 4), ("h100-0", "H100-80GB", 2)]
    assert demo.gpu_count == 10
    a1 = demo.node("a100-1").inventory()  # type: ignore[union-attr]
    assert [g.index for g in a1.gpus if g.mig_enabled] == [2, 3]
    assert {d.profile for g in a1.gpus for d in g.mig_devices} == {"3g.40gb", "2g.20gb", "1g.10gb", "4g.40gb", "1g.20gb"}
    h = demo.node("h100-0").inventory()  # type: ignore[union-attr]
    assert h.nvlink_islands() == [frozenset({0, 1})]
    assert demo.node("h100-0").ray_labels()[NODE_LABEL] == "h100-0"  # type: ignore[union-attr]
    assert demo.node("h100-0").ray_labels()[MODEL_LABEL] == "H100-80GB"  # type: ignore[union-attr]


def test_simulated_uuids_are_stable(demo: ClusterConfig) -> None:
    again = load_config(DEMO_CONFIG)
    assert [g.uuid for n in demo.nodes for g in n.inventory().gpus] == [g.uuid for n in again.nodes for g in n.inventory().gpus]
    assert len({g.uuid for n in demo.nodes for g in n.inventory().gpus}) == 10


@pytest.mark.parametrize("data, field, shown", [
    ({"settings": {"agent_ttl_s": -1}}, "settings.agent_ttl_s", "-1"),
    ({"settings": {"agent_ttl_s": 0.5}}, "settings.agent_ttl_s", "0.5"),
    ({"settings": {"policy": "default"}}, "settings.policy", "default"),  # the policy is scheduler.policy only
    ({"scheduler": {"policy": "fastest"}}, "scheduler.policy", "fastest"),
    ({"settings": {"discovery": "magic"}}, "settings.discovery", "magic"),
    ({"settings": {"ended_retention_s": 5}}, "settings.ended_retention_s", "0 (keep forever) or >= 60"),
    ({"settings": {"ended_retention_s": -1}}, "settings.ended_retention_s", "-1"),
    ({"nodes": [{"name": "x", "model": "Z80", "gpus": 1}]}, "nodes.0.model", "Z80"),
    ({"nodes": [{"name": "Bad_Name", "model": "T4"}]}, "nodes.0.name", "Bad_Name"),
    ({"nodes": [{"name": "x", "model": "T4", "gpus": 1, "mig": {0: []}}]}, "nodes[x].mig", "T4 does not support MIG"),
    ({"nodes": [{"name": "x", "model": "A100-80GB", "gpus": 2, "mig": {5: []}}]}, "nodes[x].mig", "5"),
    ({"nodes": [{"name": "x", "model": "A100-80GB", "gpus": 1, "mig": {0: [{"profile": "9g", "start": 0}]}}]},
     "nodes[x].mig", "9g"),
    ({"nodes": [{"name": "x", "model": "A100-80GB", "gpus": 1,
                 "mig": {0: [{"profile": "1g.10gb", "start": 0}, {"profile": "2g.20gb", "start": 0}]}}]},
     "nodes[x].mig", "overlaps"),
    ({"nodes": [{"name": "x", "model": "T4"}, {"name": "x", "model": "T4"}]}, "nodes.name", "x"),
    ({"nodes": [{"name": "x", "model": "T4", "gpus": 1, "nvlink": [[0, 3]]}]}, "nodes[x].nvlink", "3"),
    ({"colour": "blue"}, "colour", "blue"),
    ({"settings": {"inference_services": ["chat", "other"]}}, "settings.inference_services", "other"),
    ({"settings": {"inference_services": ["Chat Bot"]}}, "settings.inference_services.0", "Chat Bot"),
])
def test_errors_name_the_field_and_show_the_value(data: dict, field: str, shown: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(data)
    assert e.value.field == field
    assert shown in str(e.value)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "absent.yaml")
    assert e.value.field == "config"
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [unclosed\n")
    with pytest.raises(ConfigError) as e:
        load_config(bad)
    assert "valid YAML" in str(e.value)
