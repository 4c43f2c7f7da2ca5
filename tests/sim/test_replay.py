"""Arrival and timeline replays: the tiny trace's known answer, resampling, determinism, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from orchestrator.sim.arrival import PAPER_POLICIES, arrival_sequence, replay, run_arrival
from orchestrator.cli.sim import app
from orchestrator.sim.openb import load_nodes, load_pods
from orchestrator.sim.timeline import replay_timeline

# orchestrator/resources/openb_tiny/README.md derives these by hand.
TINY_ALLOCATION = [0, 0, 0, 0, 40, 40, 40, 40, 40, 40, 52, 60, 60, 60]


@pytest.mark.parametrize("policy", PAPER_POLICIES)
def test_tiny_trace_known_answer(tiny: tuple[Path, Path], policy: str) -> None:
    nodes, pods = load_nodes(tiny[0]), load_pods(tiny[1])
    for seed in (0, 1):
        r = replay(nodes, pods, policy, seed, order="trace", step_pct=10)
        assert r.checkpoints == tuple(range(0, 131, 10))
        assert r.allocation_pct == pytest.approx(TINY_ALLOCATION)
        assert (r.unallocated_gpus, r.failed, r.placed, r.pods) == (2.0, 3, 4, 7)


@pytest.mark.parametrize("policy", ["bestfit", "fgd", "default"])
def test_tiny_timeline_known_answer(tiny: tuple[Path, Path], policy: str) -> None:
    t = replay_timeline(load_nodes(tiny[0]), load_pods(tiny[1]), policy, 0)
    assert t.gpu_time_utilisation_pct == pytest.approx(100 * 374000 / 600000)
    assert t.demanded_gpu_time_pct == pytest.approx(64.0)
    assert (t.waited, t.ls_pods, t.ls_waited, t.never_placed, t.span_s) == (2, 2, 2, 1, 120)
    assert t.delay_s["p50"] == pytest.approx(45.0) and t.delay_s["max"] == 60.0


def test_resampling_reaches_but_never_passes_the_target(tiny: tuple[Path, Path]) -> None:
    pods = load_pods(tiny[1])
    for seed in range(5):
        seq = arrival_sequence(pods, 5000, np.random.default_rng(seed), target_pct=200)
        total = int(pods.gpu_request_milli[seq].sum())
        assert 6500 <= total <= 10000
        assert sorted(seq[:7].tolist()) == list(range(7))  # every pod of the list, then draws
    down = arrival_sequence(pods, 5000, np.random.default_rng(0), target_pct=100)
    assert int(pods.gpu_request_milli[down].sum()) <= 5000
    same = arrival_sequence(pods, 5000, np.random.default_rng(3), target_pct=200)
    assert same.tolist() == arrival_sequence(pods, 5000, np.random.default_rng(3), target_pct=200).tolist()
    with pytest.raises(ValueError):
        arrival_sequence(pods, 5000, np.random.default_rng(0), order="sideways")


def test_same_seed_same_result(tiny: tuple[Path, Path]) -> None:
    nodes, pods = load_nodes(tiny[0]), load_pods(tiny[1])
    for policy in ("random", "fgd"):
        a = replay(nodes, pods, policy, 11, target_pct=300)
        b = replay(nodes, pods, policy, 11, target_pct=300)
        assert a.allocation_pct == b.allocation_pct and a.fragmentation_pct == b.fragmentation_pct
        assert (a.pods, a.failed) == (b.pods, b.failed)


def test_parallel_runs_equal_serial_runs(tiny: tuple[Path, Path]) -> None:
    kw = dict(target_pct=250.0)
    serial = run_arrival(str(tiny[0]), str(tiny[1]), ["fgd", "random"], range(3), workers=1, **kw)
    parallel = run_arrival(str(tiny[0]), str(tiny[1]), ["fgd", "random"], range(3), workers=2, **kw)
    strip = lambda d: {k: v for k, v in d.items() if k != "cpu_s"}  # noqa: E731 (timing differs)
    assert [strip(s.to_dict()) for s in serial] == [strip(p.to_dict()) for p in parallel]


runner = CliRunner()


def test_cli_json_single_policy(tiny: tuple[Path, Path]) -> None:
    res = runner.invoke(app, ["openb", "--nodes", str(tiny[0]), "--pods", str(tiny[1]), "--policy", "fgd",
                              "--seeds", "2", "--order", "trace", "--json", "--workers", "1"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["policy"] == "fgd" and d["seeds"] == 2
    assert list(d["allocation_pct"]) == [str(k) for k in range(0, 131, 10)]
    assert d["allocation_pct"]["130"] == 60.0 and d["unallocated_gpus_at_130"] == 2.0
    assert set(d["fragmentation_pct"]) == set(d["allocation_pct"])


def test_cli_all_policies_table_json_and_plot(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    chart = tmp_path / "chart.png"
    res = runner.invoke(app, ["openb", "--nodes", str(tiny[0]), "--pods", str(tiny[1]), "--policy", "all",
                              "--seeds", "1", "--json", "--plot", str(chart), "--workers", "1"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert [d["policy"] for d in out] == list(PAPER_POLICIES)
    assert chart.stat().st_size > 1000
    table = runner.invoke(app, ["openb", "--nodes", str(tiny[0]), "--pods", str(tiny[1]), "--policy", "bestfit",
                                "--seeds", "1", "--workers", "1"])
    assert table.exit_code == 0 and "bestfit" in table.output and "130%" in table.output


def test_cli_timeline_json(tiny: tuple[Path, Path]) -> None:
    res = runner.invoke(app, ["openb", "--nodes", str(tiny[0]), "--pods", str(tiny[1]), "--policy", "default",
                              "--seeds", "1", "--mode", "timeline", "--json", "--workers", "1"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["mode"] == "timeline" and d["waited"] == 2 and d["ls_waited"] == 2


def test_cli_bad_row_exits_2_naming_file_line_column(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    bad = tmp_path / "pods.csv"
    lines = tiny[1].read_text().splitlines()
    lines[3] = lines[3].replace(",2,1000,", ",2,10x0,")
    bad.write_text("\n".join(lines) + "\n")
    res = runner.invoke(app, ["openb", "--nodes", str(tiny[0]), "--pods", str(bad), "--policy", "fgd", "--seeds", "1"])
    assert res.exit_code == 2
    assert f"{bad}, line 4, column 5 (gpu_milli)" in res.output


def test_cli_unknown_policy_and_timeline_without_times(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    res = runner.invoke(app, ["openb", "--nodes", str(tiny[0]), "--pods", str(tiny[1]), "--policy", "magic"])
    assert res.exit_code == 2 and "policy" in res.output and "fgd" in res.output
    five = tmp_path / "five.csv"
    five.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1024,1,1000\n")
    res = runner.invoke(app, ["openb", "--nodes", str(tiny[0]), "--pods", str(five), "--mode", "timeline", "--seeds", "1"])
    assert res.exit_code == 2 and "creation_time" in res.output


@pytest.mark.slow
def test_openb_default_one_seed_is_in_the_papers_range(openb: Path) -> None:
    nodes = load_nodes(openb / "openb_node_list_gpu_node.csv")
    pods = load_pods(openb / "openb_pod_list_default.csv")
    r = replay(nodes, pods, "fgd", 0, step_pct=10)
    assert 94.5 <= r.allocation_pct[-1] <= 96.0  # the paper: 95.39 (mean of 10 seeds)
    assert r.allocation_pct[:9] == pytest.approx([0, 10, 20, 30, 40, 50, 60, 70, 80], abs=0.2)


@pytest.mark.slow
def test_openb_default_beats_fgd_on_the_same_seed(openb: Path) -> None:
    """Same arrivals, same node order: ours leaves fewer GPUs idle than FGD (seed 0: ~42 GPUs fewer,
    95.96% against 95.28%; the 10-seed means are in docs/trace-evaluation.md)."""
    nodes = load_nodes(openb / "openb_node_list_gpu_node.csv")
    pods = load_pods(openb / "openb_pod_list_default.csv")
    fgd, ours = (replay(nodes, pods, p, 0, step_pct=10) for p in ("fgd", "default"))
    assert fgd.pods == ours.pods
    assert ours.allocation_pct[-1] >= 95.9
    assert ours.unallocated_gpus <= fgd.unallocated_gpus - 25
