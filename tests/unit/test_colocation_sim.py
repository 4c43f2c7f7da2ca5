"""The co-location day in simulated time (``orchestrator sim colocation``), no Ray: the curve families, the
queue model's bounds and the spike maths. Whole simulated days (every scheme on a small cluster, and that the day
runs the real autoscaler) take seconds each: they are in tests/runtime/test_colocation_sim_days.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from orchestrator.core.colocation import DEFAULT_COLOCATION, load_colocation
from orchestrator.sim import colocation as sim
from orchestrator.sim import curves as K
from orchestrator.sim import queueing as Q
from orchestrator.sim.dayrun import SimParams, spike_absorb
from orchestrator.sim.perfmodel import InferenceModel, ShareSpeed

CFG = load_colocation(DEFAULT_COLOCATION)
PARAMS = SimParams()


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
