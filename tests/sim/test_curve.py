"""The whole curve: checkpoints 50-130%, the AUC, the paired comparison, and how the CLI and bench print them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli.sim import app
from orchestrator.sim.arrival import replay, run_arrival
from orchestrator.sim.curve import auc, compare, curve_of, curve_stats, format_comparison
from orchestrator.sim.openb import load_nodes, load_pods

# orchestrator/resources/openb_tiny/README.md: 40% from 40 to 90, 52 at 100, 60 from 110 on (10% checkpoints).
TINY_CURVE = {50: 40.0, 60: 40.0, 70: 40.0, 80: 40.0, 90: 40.0, 100: 52.0, 110: 60.0, 120: 60.0, 130: 60.0}
# Trapezoids: 4 x 10 x 40 + 10 x 46 + 10 x 56 + 2 x 10 x 60 = 3820 over 80 points of arrival.
TINY_AUC = 3820 / 80


@dataclass(frozen=True)
class Run:
    policy: str
    seed: int
    checkpoints: tuple[int, ...]
    allocation_pct: tuple[float, ...]


CPS = tuple(range(0, 131, 10))


def flat(policy: str, seed: int, bump: float = 0.0, at: int | None = None) -> Run:
    """Allocates all that arrives up to 100%, flat after; ``bump`` added at checkpoint ``at`` (or everywhere)."""
    return Run(policy, seed, CPS, tuple(min(k, 100) + (bump if at in (None, k) else 0.0) for k in CPS))


def test_tiny_curve_and_auc(tiny: tuple[Path, Path]) -> None:
    r = replay(load_nodes(tiny[0]), load_pods(tiny[1]), "fgd", 0, order="trace", step_pct=10)
    assert curve_of(r.checkpoints, r.allocation_pct) == pytest.approx(TINY_CURVE)
    assert auc(r.checkpoints, r.allocation_pct) == pytest.approx(TINY_AUC)


def test_auc_is_the_mean_height_and_needs_two_points() -> None:
    r = flat("a", 0)
    assert auc(r.checkpoints, r.allocation_pct) == pytest.approx((75 * 50 + 100 * 30) / 80)
    assert auc((0, 10, 20, 30, 40, 50), (0, 10, 20, 30, 40, 50)) is None  # ends at 50: one point in range
    short = Run("a", 0, tuple(range(0, 101, 10)), tuple(range(0, 101, 10)))
    assert curve_of(short.checkpoints, short.allocation_pct) == {k: float(k) for k in range(50, 101, 10)}
    assert auc(short.checkpoints, short.allocation_pct) == pytest.approx(75.0)


def test_compare_is_paired_by_seed_with_spread() -> None:
    a = [flat("a", 0, +1.0, at=70), flat("a", 1, -0.5, at=70), flat("a", 2, 0.0), flat("a", 9, 5.0)]
    b = [flat("b", 2), flat("b", 1), flat("b", 0)]  # seed 9 has no partner: left out
    c = compare(a, b)
    assert c.seeds == (0, 1, 2)
    assert c.points[70].mean == pytest.approx(0.5 / 3) and (c.points[70].lo, c.points[70].hi) == (-0.5, 1.0)
    assert all(c.points[k].mean == 0 and c.points[k].sd == 0 for k in c.points if k != 70)
    assert c.auc is not None and c.auc.mean == pytest.approx(0.5 / 3 * 20 / 2 / 80)
    assert c.dominates() and c.worst[0] == 50
    worse = compare([flat("a", 0, -0.3, at=90)], [flat("b", 0)])
    assert not worse.dominates() and worse.worst == (90, pytest.approx(-0.3))
    assert worse.dominates(tolerance=0.3)
    text = format_comparison(worse)
    assert "90%" in text and "-0.30" in text and "every checkpoint: no" in text
    with pytest.raises(ValueError):
        compare([flat("a", 3)], [flat("b", 4)])


def test_curve_stats_over_seeds() -> None:
    s = curve_stats("a", [flat("a", 0, 1.0), flat("a", 1, -1.0)])
    assert s.points[100].mean == pytest.approx(100) and s.points[100].sd == pytest.approx(1.0)
    assert s.auc is not None and s.auc.sd == pytest.approx(1.0)
    assert list(s.to_dict()["curve"]) == [str(k) for k in range(50, 131, 10)]


def test_summary_json_carries_curve_and_auc(tiny: tuple[Path, Path]) -> None:
    [s] = run_arrival(str(tiny[0]), str(tiny[1]), ["bestfit"], range(2), workers=1, order="trace", step_pct=10)
    d = s.to_dict()
    assert d["curve"] == pytest.approx({str(k): v for k, v in TINY_CURVE.items()})
    assert d["auc_50_130"] == pytest.approx(TINY_AUC) and d["auc_std"] == 0
    assert s.auc == pytest.approx(TINY_AUC)


runner = CliRunner()


def test_cli_compare_json_and_table(tiny: tuple[Path, Path]) -> None:
    args = ["openb", "--nodes", str(tiny[0]), "--pods", str(tiny[1]), "--compare", "default", "fgd",
            "--seeds", "2", "--order", "trace", "--workers", "1"]
    res = runner.invoke(app, args + ["--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert [d["policy"] for d in out["results"]] == ["default", "fgd"]
    cmp = out["compare"]
    assert (cmp["a"], cmp["b"], cmp["seeds"]) == ("default", "fgd", [0, 1])
    assert list(cmp["diff"]) == [str(k) for k in range(50, 131, 10)]
    assert all(v["mean"] == 0 and v["sd"] == 0 for v in cmp["diff"].values())  # every placement is forced
    assert cmp["auc_diff"]["mean"] == 0
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "AUC 50-130" in table.output and "default - fgd" in table.output and "every checkpoint: yes" in table.output
    same = runner.invoke(app, ["openb", "--nodes", str(tiny[0]), "--pods", str(tiny[1]), "--compare", "fgd", "fgd"])
    assert same.exit_code == 2
