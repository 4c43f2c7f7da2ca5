"""`orchestrator bench placement` runs the reference policy in the same run and reports the ratio."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app


def test_bench_placement_json_has_reference_and_ratio() -> None:
    res = CliRunner().invoke(app, ["bench", "placement", "--nodes", "12", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["policy"] == "default" and d["reference_policy"] == "random"
    assert d["placements"] > 0 and d["reference_placements_per_s"] > 0
    assert d["ratio_to_reference"] == pytest.approx(d["placements_per_s"] / d["reference_placements_per_s"], rel=1e-3)
