"""The co-location day in simulated time (``orchestrator sim colocation``), no Ray: the curve families, the
queue model's bounds, every scheme on a small cluster, and that the day runs the real autoscaler."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from orchestrator.core.colocation import DEFAULT_COLOCATION, load_colocation
from orchestrator.core.config import DEMO_CONFIG, load_config
from orchestrator.scenarios.colocation.schemes import MIG_TARGETS, SCHEMES, WINDOWS
from orchestrator.sim import colocation as sim
from orchestrator.sim import curves as K
from orchestrator.sim import queueing as Q
from orchestrator.sim.dayrun import DayRun, SimParams, spike_absorb
from orchestrator.sim.perfmodel import InferenceModel, ShareSpeed

CFG = load_colocation(DEFAULT_COLOCATION)
PARAMS = SimParams()
GPUS = 16


def card_rps(gpus: int = 64) -> float:
    return sim.card_rps(sim.service_for(CFG.service, gpus, sim.services_for(gpus)), PARAMS)


# ---- the curves ----------------------------------------------------------------------------------------
def test_the_generator_is_seeded_and_deterministic() -> None:
    rps = card_rps()
    for kind in K.KINDS:
        a, b = K.generate(kind, 3, 64, rps), K.generate(kind, 3, 64, rps)
        assert a.points == b.points and a.name == f"{kind}-s3"
        assert K.generate(kind, 4, 64, rps).points != a.points
        assert a.points[0][0] == 0 and a.points[-1][0] == K.DAY_S
        assert all(r >= 0 and math.isfinite(r) for _, r in a.points)


@pytest.mark.parametrize("seed", range(5))
def test_every_member_of_the_standard_family_peaks_at_30_to_70_percent_of_the_cluster(seed: int) -> None:
    for gpus in (64, 1000):
        rps = card_rps(gpus)
        for nc in K.family("standard", [seed], gpus, rps):
            assert K.NEED_RANGE[0] <= K.peak_need(nc.curve, gpus, rps) <= K.NEED_RANGE[1], nc.name


@pytest.mark.parametrize("seed", range(5))
def test_a_step_spike_really_triples_within_5_s(seed: int) -> None:
    c = K.generate("spike", seed, 64, card_rps())
    fc = K.FastCurve(c)
    starts = K.spikes(c, factor=2.0, within_s=5.0)
    assert len(starts) == 3
    for at in starts:
        assert fc.rate(at + 5.0) == pytest.approx(3 * fc.rate(at))
        assert fc.rate(at + 5.0 + 60) == pytest.approx(3 * fc.rate(at))  # and holds (at least 2 min)


def test_the_kinds_have_their_shapes() -> None:
    rps = card_rps()
    d = K.FastCurve(K.generate("diurnal", 1, 64, rps))
    assert max(d.r) / min(d.r) >= 5  # trough at most a fifth of the peak
    r = K.generate("ramp", 1, 64, rps)
    assert len(r.points) == 6 and not K.spikes(r)  # a ramp climbs over hours: no spike
    b = K.generate("bursty", 1, 64, rps)
    assert len(b.points) > 50 and K.spikes(b)  # levels change often; bursts of 2-3x within 2 s are spikes


def test_curves_load_from_a_csv_as_the_scenario_reads_them(tmp_path: Path) -> None:
    p = tmp_path / "mine.csv"
    p.write_text("# a comment\nseconds,requests_per_s\n0,10\n3600,30\n86400,10\n")
    (nc,) = K.resolve([str(p)], [0], 64, card_rps())
    assert nc.name == "mine" and nc.source == str(p) and K.FastCurve(nc.curve).rate(1800) == pytest.approx(20)
    bad = tmp_path / "bad.csv"
    bad.write_text("seconds,requests_per_s\n0,10\n5,x\n")
    with pytest.raises(K.loadgen().CurveError, match="bad.csv line 3: requests_per_s"):
        K.resolve([str(bad)], [0], 64, card_rps())
    with pytest.raises(Exception, match="curve"):
        K.generate("sawtooth", 0, 64, card_rps())


def test_the_fast_curve_agrees_with_the_scenarios_rate() -> None:
    c = K.generate("bursty", 2, 64, card_rps())
    fc = K.FastCurve(c)
    for s in (0.0, 1.5, 999.0, 40_000.3, 86_399.0):
        assert fc.rate(s) == pytest.approx(c.rate(s))
    assert fc.integral() == pytest.approx(c.expected_requests())


# ---- the queue model ----------------------------------------------------------------------------------
KINDS = [Q.ReplicaKind(s, InferenceModel(100, 25, 0.04), 8)
         for s in (ShareSpeed.mig("1g.10gb"), ShareSpeed.whole(), ShareSpeed.timeslice(250))]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.share.kind)
def test_a_replica_is_never_busier_than_the_time_and_every_request_is_accounted_for(kind: Q.ReplicaKind) -> None:
    backlog = 0.0
    for c, lam, dt in [(1, 0.0, 1.0), (1, 1e6, 10.0), (3, kind.mu * 3, 0.5), (5, kind.mu * 5 * 0.999, 10.0),
                       (5, 0.1, 10.0), (2, kind.mu * 50, 30.0), (2, 0.0, 30.0), (7, kind.mu, 0.001)]:
        out = Q.step(kind, c, lam, dt, backlog, 30.0)
        assert 0 <= out.busy_replica_s <= c * dt * (1 + 1e-12)
        assert out.sm_s <= out.busy_replica_s * kind.card_share + 1e-12  # SM-time within the share's busy time
        assert 0 <= out.backlog <= c * kind.mu * 30.0 + 1e-9
        assert out.answered + out.dropped == pytest.approx(out.arrived)  # counted when they arrive
        backlog = out.backlog


def test_halfin_whitt_is_within_001_of_the_exact_wait_probability() -> None:
    def exact(c: int, a: float) -> float:
        b = 1.0
        for k in range(1, c + 1):
            b = a * b / (k + a * b)
        return b / (1 - a / c + a / c * b)

    for c in (101, 200, 500, 1000):
        for rho in (0.5, 0.8, 0.9, 0.95, 0.99, 0.999):
            assert Q.erlang_c(c, rho * c) == pytest.approx(exact(c, rho * c), abs=0.01)


def test_spike_absorb_reads_the_p99_series() -> None:
    series = [(10.0, 0.1), (20.0, 0.9), (30.0, 0.8), (40.0, 0.2), (80.0, 0.2), (200.0, 0.9)]
    assert spike_absorb(series, [10.0, 0.0, 150.0], 0.5, 30.0) == [
        {"at_s": 10.0, "absorb_s": 20.0}, {"at_s": 0.0, "absorb_s": 30.0}, {"at_s": 150.0, "absorb_s": None}]


# ---- the day ------------------------------------------------------------------------------------------
def day(scheme: str, curve, *, service=None, gpus: int = GPUS) -> DayRun:
    svc = service or sim.service_for(CFG.service, gpus, 1)
    nodes = sim.inventory(gpus, MIG_TARGETS["day"]["layout"])
    s = SCHEMES[scheme]
    cluster = sim.scheme_cluster(nodes, s, load_config(DEMO_CONFIG).scheduler, WINDOWS, MIG_TARGETS)
    fixed = None if s.load_driven else sim.baseline_replicas(
        sim.replica_kind(s.inference_request, svc, PARAMS), s.inference_request, curve, svc, 1, cluster)
    return DayRun(cluster, s, svc, 1, curve, PARAMS, training=sim.training_backlog(nodes),
                  mig_targets=MIG_TARGETS if s.mig == "live" else {}, control_s=CFG.control_interval_s, fixed=fixed)


def adversarial() -> object:
    """Nothing, then far more than the cluster serves, in a square wave with sub-second edges."""
    pts, t = [(0.0, 0.0)], 0.0
    while t < K.DAY_S - 7200:
        t += 3000
        pts += [(t, 0.0), (t + 0.2, 1e5), (t + 900, 1e5), (t + 900.2, 0.0)]
        t += 900.2
    return K.make_curve(pts + [(K.DAY_S, 0.0)], "adversarial")


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_utilisation_never_exceeds_100_percent_on_an_adversarial_curve(scheme: str) -> None:
    f = day(scheme, adversarial()).run()
    assert 0 < f["utilisation_pct"] <= 100.0
    assert f["max_sample_utilisation_pct"] <= 100.0
    assert f["sm_utilisation_pct"] <= f["utilisation_pct"] + 1e-9
    assert f["slo_attainment_pct"] < 100.0 and f["failed_requests"] > 0  # 1e5 req/s cannot be served here


def test_every_scheme_on_a_small_cluster_in_one_evaluation() -> None:
    rps = card_rps(GPUS)
    curves = K.resolve(["spike"], [0], GPUS, rps)
    out = sim.evaluate(GPUS, curves, SCHEMES, WINDOWS, MIG_TARGETS, service=CFG.service,
                       scheduler=load_config(DEMO_CONFIG).scheduler, control_s=CFG.control_interval_s)
    rows = out["curves"]["spike-s0"]["schemes"]
    assert list(rows) == list(SCHEMES) and set(out["worst_case"]) == set(SCHEMES)
    for name, r in rows.items():
        assert 0 < r["utilisation_pct"] <= 100 and r["max_sample_utilisation_pct"] <= 100
        assert 0 <= r["slo_attainment_pct"] <= 100 and r["p99_latency_ms"] > 0
        assert len(r["spikes"]) == 3 and r["requests"] > 0
        assert r["wall_s"] < 60
    assert rows["ours"]["mig_reconfigurations"] > 0 and rows["static_mig"]["mig_reconfigurations"] == 0
    assert rows["ours"]["preemptions"] == rows["ours"]["checkpoints"] and rows["ours"]["steps_lost"] == 0
    assert rows["timeslice"]["slo_attainment_pct"] == 0  # a quarter time-slice: one request takes 543 ms > 500
    w = out["worst_case"]["ours"]
    assert w["slo_attainment_pct"] == {"value": rows["ours"]["slo_attainment_pct"], "curve": "spike-s0"}


def test_the_replica_timeline_follows_the_real_autoscalers_upscale_delay() -> None:
    """Breaks if the day stops asking scheduling.autoscale.decide: the config's upscale delay moves the
    replica timeline (a slower delay reaches the spike's replica count later)."""
    curve = K.make_curve([(0, 20.0), (9 * 3600, 20.0), (9 * 3600 + 5, 60.0), (K.DAY_S, 60.0)], "step")

    def timeline(delay: float) -> list[tuple[float, int]]:
        auto = CFG.service.autoscale.model_copy(update={"upscale_delay_s": delay, "max_replicas": 40})
        run = day("ours", curve, service=CFG.service.model_copy(update={"autoscale": auto}))
        run.run()
        t0 = run.clock.monotonic() - K.DAY_S
        return [(t - t0, n) for t, n in run.replica_timeline]

    fast, slow = timeline(3.0), timeline(30.0)
    assert fast != slow

    def reached(tl: list[tuple[float, int]], n: int) -> float:
        return next(t for t, k in tl if t > 9 * 3600 and k >= n)

    top = min(max(k for t, k in tl if t > 9 * 3600) for tl in (fast, slow))
    assert top >= 3
    assert reached(slow, top) > reached(fast, top) + 27  # at least one 30 s delay where 3 s would do
