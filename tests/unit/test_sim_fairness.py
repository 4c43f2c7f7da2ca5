"""``orchestrator sim fairness`` (sim.tenants, sim.fairness): the workload generator's rules, the driver's
bookkeeping (work lost, allocation, waits) and small declared scenarios -- two teams 3:1, a starving gang --
each run through the real scheduling cycle under ours and a baseline. No Ray; each test takes seconds at most."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from orchestrator.cli.sim import app
from orchestrator.core.errors import ConfigError, InvalidRequestError
from orchestrator.core.priorities import SchedulerConfig
from orchestrator.core.request import GpuRequest
from orchestrator.sim import fairness as F
from orchestrator.sim import tenants as T

CLASSES = {"interactive": {"priority": 100, "preemptible": False, "checkpoint": False},
           "training": {"priority": 100, "preemptible": True, "min_runtime_s": 60, "grace_period_s": 60,
                        "checkpoint": True}}


def config(queues: dict[str, Any], *, bound: float | None = 300.0,
           classes: dict[str, Any] = CLASSES) -> SchedulerConfig:
    return SchedulerConfig.parse({"classes": classes, "default_class": "training", "aging_per_minute": 0,
                                  "queues": {"default": {}, **queues},
                                  "fairness": {"enabled": True, "half_life_s": 600, "max_reclaims_per_cycle": 8,
                                               "starvation_bound_s": bound}})


def job(jid: str, team: str, at: float, gpus: int = 1, work_s: float = 3600.0, klass: str = "training",
        workers: int = 1) -> T.Job:
    return T.Job(jid, team, at, GpuRequest.whole(gpus, cpu_milli=4000, host_memory_mib=16384), klass, work_s,
                 workers=workers)


def workload(teams: tuple[str, ...], jobs: list[T.Job], hours: float,
             changes: tuple[float, ...] = (0.0,)) -> T.Workload:
    jobs = sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
    return T.Workload(teams, tuple(jobs), (teams,), changes, hours * 3600, hours * 3600, "test", 0)


def run(scheme: str, cfg: SchedulerConfig, w: T.Workload, gpus: int = 16, **params: Any) -> F.Figures:
    return F.Simulation(F.schemes(cfg)[scheme], w, cfg, gpus, F.FairnessParams(**params)).run()


# ---- the workload generator ------------------------------------------------------------------------------
def test_teams_come_from_a_stable_hash_of_the_pod_name() -> None:
    teams = ("a", "b", "c")
    assert T.stable_hash("openb-pod-0000") == zlib.crc32(b"openb-pod-0000")  # not hash(): salted per process
    assert T.team_of("openb-pod-0000", teams) == teams[zlib.crc32(b"openb-pod-0000") % 3]
    pool = [T.PodShape(f"openb-pod-{i:04d}", 4000, 16384, 1, 1000, "BE") for i in range(60)]
    w = T.generate(pool, teams, 16, 0, T.TenantParams(hours=1.0, busy_probability=1.0, min_busy=3))
    assert w.jobs and all(T.team_of(j.pod, teams) == j.team for j in w.jobs)


def test_qos_decides_the_class_and_runs_stay_in_their_ranges() -> None:
    p = T.TenantParams(hours=1.0)
    ls = T.PodShape("p-ls", 4000, 16384, 1, 1000, "LS", 100_000.0)
    be = T.PodShape("p-be", 4000, 16384, 1, 500, "BE", 5.0)
    w = T.generate([ls, be], ("t",), 16, 0, p)
    by_pod = {j.pod: j for j in w.jobs}
    assert by_pod["p-ls"].priority_class == T.INTERACTIVE and by_pod["p-ls"].work_s == p.interactive_s[1]
    assert by_pod["p-be"].priority_class == T.TRAINING and by_pod["p-be"].work_s == p.training_s[0]
    assert not any(j.gang for j in w.jobs if j.priority_class == T.INTERACTIVE)
    assert all(j.request.gpu_demand == 0.5 for j in w.jobs if j.pod == "p-be")  # a share stays a share


def test_gangs_are_whole_cards_of_training_4_to_8_cards() -> None:
    pool = [T.PodShape(f"p{i}", 8000, 32768, 1, 1000, "BE") for i in range(20)]
    w = T.generate(pool, ("a", "b"), 64, 3, T.TenantParams(hours=1.0, gang_fraction=1.0))
    assert w.jobs and all(j.gang for j in w.jobs)
    assert {(j.workers, j.request.count) for j in w.jobs} <= set(T.GANG_SHAPES)
    assert all(4 <= j.gpus <= 8 and j.request.cpu_milli == 8000 * j.request.count for j in w.jobs)


def test_demand_changes_at_every_epoch_and_the_workload_is_seeded() -> None:
    pool, _ = T.load_pool(None)
    teams = ("a", "b", "c", "d")
    p = T.TenantParams(hours=2.0, epoch_s=1800)
    w = T.generate(pool, teams, 64, 5, p)
    assert len(w.busy) == 4 and all(len(b) >= p.min_busy for b in w.busy)
    assert all(w.busy[i] != w.busy[i - 1] for i in range(1, 4))
    assert w.changes == (0.0, 1800.0, 3600.0, 5400.0)
    assert [j.submit_s for j in w.jobs] == sorted(j.submit_s for j in w.jobs)
    for j in w.jobs:  # a team submits only in its busy epochs
        assert j.team in w.busy[int(j.submit_s // 1800)]
    assert T.generate(pool, teams, 64, 5, p).jobs == w.jobs
    assert T.generate(pool, teams, 64, 6, p).jobs != w.jobs


@pytest.mark.parametrize("field,params", [("hours", {"hours": 0}), ("busy_load", {"busy_load": -1}),
                                          ("gang_fraction", {"gang_fraction": 2}),
                                          ("training_s", {"training_s": (10.0, 5.0)})])
def test_bad_parameters_name_their_field(field: str, params: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequestError) as e:
        T.generate(T.packaged_pool(), ("a",), 16, 0, T.TenantParams(**params))
    assert e.value.field == field


# ---- the driver's bookkeeping ----------------------------------------------------------------------------
def test_allocation_is_the_gpu_time_held_over_the_cluster_and_at_most_100() -> None:
    cfg = config({"a": {}})
    one = run("ours", cfg, workload(("a",), [job("j", "a", 0.0, gpus=2, work_s=600.0)], hours=0.5))
    assert one.jobs_done == 1 and one.allocation_pct == pytest.approx(100 * 2 * 600 / (16 * 1800), abs=0.05)
    full = run("fifo", cfg, workload(("a",), [job(f"j{i}", "a", 0.0, gpus=4) for i in range(8)], hours=0.25))
    assert 99.0 <= full.allocation_pct <= 100.0 and full.still_waiting == 4


def two_teams_3_to_1() -> tuple[SchedulerConfig, T.Workload]:
    """b fills the 16 cards with hour-long training at 0; a, weighing three times b, asks for as much a minute later."""
    cfg = config({"a": {"weight": 3}, "b": {"weight": 1}})
    jobs = [job(f"b{i}", "b", 0.0) for i in range(16)] + [job(f"a{i}", "a", 60.0) for i in range(16)]
    return cfg, workload(("a", "b"), jobs, hours=0.5, changes=(0.0, 60.0))


def test_two_teams_3_to_1_converge_to_12_and_4_within_ten_minutes_under_ours_not_fifo() -> None:
    cfg, w = two_teams_3_to_1()
    ours, fifo = run("ours", cfg, w), run("fifo", cfg, w)
    assert ours.settled_samples > 30
    assert ours.fairness_index_min_settled is not None and ours.fairness_index_min_settled >= 0.99
    used = {t: u for t, (u, _) in zip(w.teams, ours.series[-1][1])}
    assert used == {"a": 12.0, "b": 4.0}
    assert ours.preemptions == 12 and ours.work_lost_gpu_s == 0  # every victim checkpointed
    assert ours.checkpoint_gpu_s == pytest.approx(12 * 30.0) and ours.restore_gpu_s == 0  # none resumed yet
    assert fifo.fairness_index is not None and fifo.fairness_index < 0.6 and fifo.preemptions == 0
    # a's four requests beyond its 12 wait past the bound, but a holds its share meanwhile: not starving under ours
    assert ours.waits_over_bound_below_share == 0 < ours.waits_over_bound
    assert fifo.waits_over_bound_below_share == 16  # a holds nothing for half an hour


def test_victims_resume_from_their_checkpoint_after_the_restore_time_and_do_all_their_work() -> None:
    """b's 16 twenty-minute jobs start at 0; a (weight 3) asks 12 cards for 5 minutes at 60 s. Twelve of b's jobs
    checkpoint (30 s holding their cards), wait for a to finish, restore (46.4 s) and run what is left."""
    cfg = config({"a": {"weight": 3}, "b": {"weight": 1}})
    jobs = [job(f"b{i}", "b", 0.0, work_s=1200.0) for i in range(16)] + [job(f"a{i}", "a", 60.0, work_s=300.0)
                                                                          for i in range(12)]
    f = run("ours", cfg, workload(("a", "b"), jobs, hours=0.5, changes=(0.0, 60.0)))
    assert f.preemptions == 12 and f.work_lost_gpu_s == 0 and f.jobs_done == 28 and f.still_waiting == 0
    assert f.checkpoint_gpu_s == pytest.approx(12 * 30.0) and f.restore_gpu_s == pytest.approx(12 * F.RESTORE_S)
    busy = 16 * 1200 + 12 * 300 + 12 * 30.0 + 12 * F.RESTORE_S  # work, checkpoints, restores: GPU-seconds
    assert f.allocation_pct == pytest.approx(100 * busy / (16 * 1800), abs=0.5)  # ends are seen at 5 s cycles
    assert f.useful_pct == pytest.approx(f.allocation_pct - 100 * (12 * 30.0 + 12 * F.RESTORE_S) / (16 * 1800))


def test_a_victim_without_checkpoints_loses_its_progress_since_it_started() -> None:
    classes = {**CLASSES, "training": {**CLASSES["training"], "checkpoint": False}}
    cfg = config({"a": {"weight": 3}, "b": {"weight": 1}}, classes=classes)
    _, w = two_teams_3_to_1()
    f = run("ours", cfg, w)
    assert f.preemptions == 12 and f.checkpoint_gpu_s == 0
    # each of b's twelve victims had run from 0 to the cycle that took it (after a's minute plus b's minimum runtime)
    assert 12 * 60 <= f.work_lost_gpu_s <= 12 * 120


def test_a_gang_behind_a_stream_of_small_work_is_reserved_for_within_its_bound_under_ours_alone() -> None:
    """b fills the 16 cards at 0 with interactive work (not preemptible) ending one a quarter-minute apart, and
    sends a 4-minute job every 15 s, each just before a card frees; a's gang of two 4-card workers comes at 30 s.
    Each freed card goes to b's next job (backfill: the gang does not fit one card), so without a reservation
    the gang waits for two nodes to empty at once, which the stream never lets happen."""
    cfg = config({"a": {}, "b": {}}, bound=300.0)
    jobs = [job(f"b0-{i:02d}", "b", 0.0, work_s=60.0 + 15.0 * i, klass="interactive") for i in range(16)]
    jobs += [job(f"b1-{k:03d}", "b", 45.0 + 15.0 * k, work_s=240.0, klass="interactive") for k in range(110)]
    jobs.append(job("gang", "a", 30.0, gpus=4, work_s=600.0, workers=2))
    w = workload(("a", "b"), jobs, hours=0.5)
    ours = run("ours", cfg, w)
    assert 300.0 < ours.max_gang_wait_s <= 300.0 + 240.0 + 2 * 5.0  # the bound, then the reserved nodes drain
    for baseline in ("flat_quota", "fifo"):  # no reservations: still waiting at the end, half an hour on
        assert run(baseline, cfg, w).max_gang_wait_s >= 1800.0 - 30.0 - 5.0


def test_same_seed_same_figures() -> None:
    cfg = F.load_config(None)
    pool, _ = T.load_pool(None)
    w = T.generate(pool, T.teams_of(cfg), 32, 1, T.TenantParams(hours=0.25, epoch_s=300))
    a, b = (F.Simulation(F.schemes(cfg)["ours"], w, cfg, 32).run() for _ in range(2))
    assert {**a.to_json(), "wall_s": 0} == {**b.to_json(), "wall_s": 0} and a.series == b.series


# ---- schemes, config, CLI --------------------------------------------------------------------------------
def test_the_baselines_are_flat_quotas_and_one_fifo_queue() -> None:
    cfg = F.load_config(None)
    s = F.schemes(cfg)
    teams = T.teams_of(cfg)
    assert teams and "default" not in teams and all(cfg.queues[t].parent is not None or t == "platform" for t in teams)
    flat = s["flat_quota"].config
    assert not flat.fairness.enabled and set(flat.queues) == {"default", *teams}
    assert all(flat.queues[t].parent is None and flat.queues[t].borrowing for t in teams)
    assert flat.queues["research-vision"].quota_gpus == cfg.queues["research-vision"].quota_gpus
    assert flat.queues["research-nlp"].quota_gpus == 0
    fifo = s["fifo"]
    assert fifo.queue == "default" and fifo.klass == "fifo" and fifo.config.aging_per_minute == 0
    assert s["ours"].config is cfg and cfg.fairness.enabled and cfg.fairness.starvation_bound_s


def test_a_config_without_fairness_is_refused_naming_the_field(tmp_path: Path) -> None:
    off = tmp_path / "off.yaml"
    off.write_text("queues: {default: {}, a: {}}\n")
    with pytest.raises(ConfigError) as e:
        F.load_config(off)
    assert e.value.field == "fairness.enabled"


runner = CliRunner()


@pytest.mark.parametrize("args,field", [(["--hours", "0"], "hours"), (["--schemes", "ours,lottery"], "schemes"),
                                        (["--config", "/nonexistent.yaml"], "config")])
def test_cli_bad_input_exits_2_naming_the_field(args: list[str], field: str) -> None:
    res = runner.invoke(app, ["fairness", "--seeds", "1", "--hours", "0.1", "--cluster-gpus", "16", *args])
    assert res.exit_code == 2 and field in res.output


def test_cli_prints_one_json_object_for_every_scheme_and_draws_the_chart(tmp_path: Path) -> None:
    svg = tmp_path / "shares.svg"
    res = runner.invoke(app, ["fairness", "--seeds", "1", "--hours", "0.2", "--cluster-gpus", "16", "--workers", "1",
                              "--json", "--chart", str(svg)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert set(out["schemes"]) == set(F.SCHEMES) == set(out["worst"]) and out["seeds"] == [0]
    for s in F.SCHEMES:
        row = out["schemes"][s]
        for k in ("fairness_index", "max_gang_wait_s", "allocation_pct", "preemptions", "work_lost_gpu_s"):
            assert k in row and k in out["worst"][s]
        assert 0 <= row["allocation_pct"] <= 100
    assert set(out["targets"]) >= {"fairness_index_ge_0.95", "work_lost_zero"}
    text = svg.read_text()
    assert text.startswith("<svg") and text.count("<polyline") == 3 * 2 * len(out["workload"]["teams"])
