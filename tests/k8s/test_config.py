"""The deployment config: what it accepts, and errors that name the field and what is allowed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.errors import ConfigError
from orchestrator.core.quantity import parse_quantity
from orchestrator.core.catalogue import fit_mig
from orchestrator.deploy.k8s.config import deep_merge, load_config, parse_config

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "k8s.yaml"


def _cfg(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"pools": [{"name": "gpu", "sharing": "whole", "gpu_model": "H100-80GB", "gpus_per_node": 8}]}
    return deep_merge(base, over)


def _error(data: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as ei:
        parse_config(data)
    return ei.value


def test_the_committed_config_loads_with_its_overlays() -> None:
    base, overlays = load_config(CONFIG)
    assert sorted(overlays) == ["dev", "mig", "prod"]
    assert {p.sharing for p in base.pools} == {"whole", "mig", "time-slicing", "mps"}
    assert overlays["dev"].pools[0].sharing == "cpu" and not overlays["dev"].quota.enabled
    assert overlays["prod"].scheduler.kind == "kueue"
    # An overlay keeps what it does not mention.
    assert overlays["prod"].pools == base.pools


@pytest.mark.parametrize(
    ("data", "field", "in_allowed"),
    [
        (_cfg(pools=[{"name": "gpu", "sharing": "whole", "gpu_model": "B300"}]), "pools.0.gpu_model", "H100-80GB"),
        (_cfg(pools=[{"name": "gpu", "sharing": "wole", "gpu_model": "T4"}]), "pools.0.sharing", "time-slicing"),
        (_cfg(pools=[{"name": "GPU", "sharing": "whole", "gpu_model": "T4"}]), "pools.0.name", "DNS-1123"),
        (_cfg(pools=[{"name": "m", "sharing": "mig", "gpu_model": "A100-80GB", "mig_layout": ["1g.5gb"]}]),
         "pools.0.mig_layout", "1g.10gb"),
        (_cfg(pools=[{"name": "m", "sharing": "mig", "gpu_model": "A100-80GB",
                      "mig_layout": ["3g.40gb", "3g.40gb", "1g.10gb"]}]), "pools.0.mig_layout", "compute slices"),
        (_cfg(pools=[{"name": "m", "sharing": "mig", "gpu_model": "T4", "mig_layout": ["1g.10gb"]}]),
         "pools.0.gpu_model", "A100-80GB"),
        (_cfg(pools=[{"name": "s", "sharing": "mps", "gpu_model": "T4", "replicas_per_gpu": 4, "shares_per_pod": 2}]),
         "pools.0.shares_per_pod", "1"),
        (_cfg(pools=[{"name": "s", "sharing": "time-slicing", "gpu_model": "A10"}]), "pools.0.replicas_per_gpu", ">= 2"),
        (_cfg(pools=[{"name": "c", "sharing": "cpu", "gpu_model": "T4"}]), "pools.0.gpu_model", "unset"),
        (_cfg(pools=[{"name": "g", "sharing": "whole", "gpu_model": "T4", "min_replicas": 3, "max_replicas": 2}]),
         "pools.0.min_replicas", "max_replicas=2"),
        (_cfg(pools=[{"name": "g", "sharing": "whole", "gpu_model": "T4", "resources": {"cpu": "four"}}]),
         "pools.0.resources.cpu", "quantity"),
        (_cfg(image="rayproject/ray:2.50.0-py311-gpu"), "ray_version", "2.50.0"),
        (_cfg(head={"priority_class": "vip"}), "head.priority_class", "gpu-orchestrator-head"),
        (_cfg(metrics_port=8265), "metrics_port", "8081"),
        (_cfg(scheduler={"kind": "kai"}), "scheduler.queue", "KAI queue"),
        (_cfg(auth={"mode": "secret"}), "auth.secret_name", "auth_token"),
        (_cfg(quota={"mig": {"9g.99gb": 1}}), "quota.mig", "1g.10gb"),
        (_cfg(pools=[]), "pools", "at least one"),
    ],
)
def test_a_bad_config_names_the_field_and_what_is_allowed(data: dict[str, Any], field: str, in_allowed: str) -> None:
    e = _error(data)
    assert e.field == field, str(e)
    assert in_allowed in e.allowed, str(e)
    assert field in str(e) and "allowed" in str(e)


def test_the_quota_must_admit_the_minimum_cluster() -> None:
    # The head plus one 8-GPU pod at min_replicas=1 need 8 GPUs; a quota of 4 could never be met.
    e = _error(_cfg(pools=[{"name": "g", "sharing": "whole", "gpu_model": "H100-80GB", "min_replicas": 1}],
                    quota={"gpus": 4}))
    assert e.field == "quota.gpus" and e.value == 4 and "8" in e.allowed
    parse_config(_cfg(pools=[{"name": "g", "sharing": "whole", "gpu_model": "H100-80GB", "min_replicas": 1}],
                      quota={"gpus": 8}))


def test_overlay_errors_are_prefixed_and_may_not_rename() -> None:
    e = _error(_cfg(overlays={"prod": {"scheduler": {"kind": "kueue"}}}))
    assert e.field == "overlays.prod.scheduler.queue"
    e = _error(_cfg(overlays={"prod": {"namespace": "elsewhere"}}))
    assert e.field == "overlays.prod.namespace" and "name and namespace" in str(e)
    e = _error(_cfg(overlays={"Prod": {}}))
    assert e.field == "overlays"


def test_pydantics_own_errors_are_worded_as_every_models_are() -> None:
    e = _error(_cfg(no_such_field=1))
    assert (e.field, e.detail) == ("no_such_field", "no such field") and "Extra inputs" not in str(e)
    e = _error(_cfg(overlays={"prod": {"head": {"no_such_field": 1}}}))
    assert e.field == "overlays.prod.head.no_such_field" and "Extra inputs" not in str(e)


def test_deep_merge_merges_mappings_replaces_lists_and_null_resets() -> None:
    base = {"a": {"x": 1, "y": 2}, "l": [1, 2], "q": {"gpus": 4}}
    assert deep_merge(base, {"a": {"y": 3}, "l": [9], "q": None}) == {"a": {"x": 1, "y": 3}, "l": [9]}
    assert base == {"a": {"x": 1, "y": 2}, "l": [1, 2], "q": {"gpus": 4}}  # the base is not mutated


@pytest.mark.parametrize(
    ("layout", "fits"),
    [
        (["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"], True),  # all-balanced
        (["1g.10gb"] * 7, True),
        (["1g.10gb"] * 8, False),  # 8 memory slices but only 7 compute slices and placements 0..6
        (["4g.40gb", "3g.40gb"], True),
        (["4g.40gb", "4g.40gb"], False),  # 4g.40gb has a single placement
        (["7g.80gb"], True),
        (["1g.20gb"] * 4, True),
        (["1g.20gb"] * 4 + ["1g.10gb"], False),
    ],
)
def test_mig_layouts_fit_by_nvml_placements(layout: list[str], fits: bool) -> None:
    placed = fit_mig("A100-80GB", layout)
    assert (placed is not None) == fits
    if placed:
        assert sorted(p for p, _ in placed) == sorted(layout)


def test_load_config_reports_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        load_config(tmp_path / "missing.yaml")
    assert ei.value.field == "--config"
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [\n")
    with pytest.raises(ConfigError) as ei:
        load_config(bad)
    assert ei.value.allowed == "valid YAML"


@pytest.mark.parametrize(("q", "v"), [("4", 4), ("500m", 0.5), ("16Gi", 16 * 2**30), ("1k", 1000), ("3Ti", 3 * 2**40)])
def test_parse_quantity(q: str, v: float) -> None:
    assert parse_quantity(q) == v
