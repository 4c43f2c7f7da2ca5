"""The co-location scenario's pure parts (no Ray): how each scheme sees the cluster and the service, how a
training run's attempts turn into preemptions and lost steps, and the chart of the day."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.colocation import DEFAULT_COLOCATION, load_colocation
from orchestrator.core.config import DEMO_CONFIG, load_config
from orchestrator.scenarios import colocation as sc


def replay(scheme: str) -> sc.Replay:
    return sc.Replay(load_config(DEMO_CONFIG), sc.SCHEMES[scheme], sc.DayConfig(), load_colocation(DEFAULT_COLOCATION).service,
                     "127.0.0.1:1", Path("/nonexistent"), lambda s: None)


def mig_layouts(cfg) -> dict[str, dict[int, list[str]]]:
    return {n.name: {i: [m.profile for m in ms] for i, ms in n.mig.items()} for n in cfg.nodes if n.mig}


def test_each_scheme_has_its_own_namespace_and_the_same_cards() -> None:
    cfgs = {name: replay(name).cluster_config() for name in sc.SCHEMES}
    assert len({c.settings.namespace for c in cfgs.values()}) == len(sc.SCHEMES)
    assert {sum(n.gpus for n in c.nodes) for c in cfgs.values()} == {10}
    assert all(c.settings.agent_ttl_s >= 30 for c in cfgs.values())


def test_mig_is_off_for_whole_cards_and_time_slicing_fixed_for_static_mig_and_the_night_layout_for_ours() -> None:
    assert mig_layouts(replay("whole_card").cluster_config()) == {}
    assert mig_layouts(replay("timeslice").cluster_config()) == {}
    static = mig_layouts(replay("static_mig").cluster_config())
    assert static == mig_layouts(load_config(DEMO_CONFIG))  # the administrator's layout, untouched
    ours = mig_layouts(replay("ours").cluster_config())
    assert ours == {"a100-1": {2: ["4g.40gb", "2g.20gb", "1g.10gb"], 3: ["4g.40gb", "2g.20gb", "1g.10gb"]}}


def test_only_ours_has_time_windows_and_every_scheme_has_the_inference_and_training_queues() -> None:
    for name in sc.SCHEMES:
        sched = replay(name).cluster_config().scheduler
        assert {"inference", "training"} <= set(sched.queues)
        assert bool(sched.windows) == (name == "ours")
    assert [w.name for w in replay("ours").cluster_config().scheduler.windows] == ["day", "night"]


def test_the_service_asks_for_the_schemes_share_and_its_delays_fit_a_compressed_day() -> None:
    reqs = {name: replay(name).service_config() for name in sc.SCHEMES}
    assert reqs["whole_card"].gpu_request().kind.value == "whole"
    assert reqs["static_mig"].gpu_request().kind.value == "mig"
    assert reqs["timeslice"].gpu_request().kind.value == "timeslice"
    assert reqs["ours"].gpu_request().kind.value == "mig"  # 1g slices, which the day's relayout makes
    assert reqs["ours"].gpu_request().profile == "1g.10gb"
    day = sc.DayConfig()
    assert all(r.autoscale.downscale_delay_s <= day.downscale_delay_s for r in reqs.values())
    assert all(r.autoscale.target_ongoing_per_replica <= day.target_ongoing_per_replica for r in reqs.values())


def test_the_day_layout_keeps_the_training_slice_and_the_night_floor_slice_so_only_the_2g_run_drains() -> None:
    from orchestrator.scheduling.repartition import validate_layout

    night = set(validate_layout("A100-80GB", sc.MIG_TARGETS["night"]["layout"]))
    day = set(validate_layout("A100-80GB", sc.MIG_TARGETS["day"]["layout"]))
    assert {str(x) for x in night & day} == {"4g.40gb@0", "1g.10gb@6"}
    assert sum(1 for x in day if x.profile == "1g.10gb") == 3  # x 2 MIG cards: six slices for the service


def _attempt(lease: str, resumed_at: int, last: int) -> sc._Attempt:
    return sc._Attempt(lease, "whole", 1.0, 0.1, resumed_at, 1, last, 0.0)


def test_preemptions_and_lost_steps_come_from_the_attempts() -> None:
    backlog = sc.TrainingBacklog.__new__(sc.TrainingBacklog)  # the bookkeeping only: no head, no Ray
    import threading

    backlog._lock = threading.Lock()
    cooperative = sc._Run(sc.TrainingJob(1, "1"), attempts=[_attempt("a", 0, 100), _attempt("a.2", 100, 250)],
                          checkpoints=[100])
    lost = sc._Run(sc.TrainingJob(2, "1"), attempts=[_attempt("b", 0, 80), _attempt("b.s2", 50, 90)],
                   checkpoints=[])
    waiting = sc._Run(sc.TrainingJob(3, "1"), attempts=[_attempt("c", 0, 40)], checkpoints=[40], waiting_since=1.0)
    backlog.runs = [cooperative, lost, waiting]
    assert backlog.steps() == 250 + 90 + 40
    assert backlog.lost_steps() == 30  # trained to 80, resumed from a checkpoint at 50
    assert backlog.preemptions() == 3  # two resumed, one still waiting
    assert backlog.checkpoints() == 2


def test_the_chart_of_the_day_has_load_leases_utilisation_and_latency(tmp_path: Path) -> None:
    timeline = [{"hour": h, "offered_rps": 2.0 + h, "served_rps": 2.0 + h, "replicas": 1 + h // 12,
                 "inference_kinds": {"mig": 1.0 + h // 12}, "training_cards": 9.0, "utilization_pct": 88.0,
                 "p99_ms": 150.0, "slo_ms": 500.0} for h in range(24)]
    specs = sc.day_charts(timeline, "ours")
    assert [s.key for s in specs] == ["colocation_load", "colocation_leases", "colocation_utilisation",
                                      "colocation_latency"]
    assert [s.name for s in specs[1].series] == ["training", "inference (mig)"]
    files = sc.write_day_charts(tmp_path, timeline, "ours")
    assert all(p.stat().st_size > 1000 for p in files)


def test_a_scheme_that_does_not_exist_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="scheme 'mps_only'"):
        sc.run_colocation(sc.DayConfig(), load_colocation(DEFAULT_COLOCATION).service, lambda s: None,
                          schemes=("ours", "mps_only"))


def test_static_mig_is_provisioned_with_no_more_replicas_than_its_layout_has_slices() -> None:
    # The demo's fixed layout has three 1g.10gb instances (a 1g.20gb is another profile): a fourth replica
    # would wait out its lease timeout (120 s of the scenario's 10 minutes) for a slice that cannot exist.
    cfg = replay("static_mig").cluster_config()
    assert sc.static_slices(cfg, sc.SCHEMES["static_mig"].inference_request) == 3
    assert sc.static_slices(cfg, "mig:1g.20gb") == 1 and sc.static_slices(cfg, "1") == 0
    assert sc.baseline_replicas(sc.SCHEMES["static_mig"], 5, cfg) == 3
    assert sc.baseline_replicas(sc.SCHEMES["static_mig"], 2, cfg) == 2
    assert sc.baseline_replicas(sc.SCHEMES["whole_card"], 5, cfg) == 5
    assert sc.baseline_replicas(sc.SCHEMES["ours"], 5, cfg) is None


def test_inference_is_charted_in_cards_held_and_utilisation_as_its_trend() -> None:
    # A replica on a 1g slice holds a seventh of a card, not a card; a tick's steps arrive whole, so the
    # raw per-tick utilisation alternates above and below 100 % and the chart shows its 2 s mean.
    from orchestrator.serve.manager import LeasedReplicaInfo, card_share_of

    mig = {"handout": {"env_vars": {"ORCHESTRATOR_SHARE_KIND": "mig", "ORCHESTRATOR_MIG_PROFILE": "1g.10gb"}},
           "allocation": {"mig_uuids": ["MIG-1"], "gpu_uuids": ["GPU-1"]}}
    two = {"handout": {"env_vars": {"ORCHESTRATOR_SHARE_KIND": "whole"}}, "allocation": {"gpu_uuids": ["a", "b"]}}
    assert card_share_of(mig) == pytest.approx(1 / 7) and card_share_of(two) == 2.0 and card_share_of({}) == 1.0
    replica = LeasedReplicaInfo("r", "serve-x-r", "mig", "n", "MIG-1", 1.0, 0.5, 0.0, card_share=card_share_of(mig))
    assert sc.replica_cards(replica) == pytest.approx(1 / 7)
    assert sc.rolling_mean([120.0, 80.0, None, 100.0, 60.0], 2) == [120.0, 100.0, 80.0, 100.0, 80.0]
    timeline = [{"hour": h, "utilization_pct": [130.0, 70.0][h % 2]} for h in range(8)]
    util = sc.day_charts(timeline, "ours")[2].series[0]
    assert util.y[3:] == [100.0] * 5
