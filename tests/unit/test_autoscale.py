"""The inference autoscaler under an injected clock: delays, dead band, steps, bounds, SLO, reasons.

Every sequence is driven by a :class:`ManualClock`: a sample every ``TICK`` seconds, no sleeping.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.clock import ManualClock
from orchestrator.core.colocation import AutoscaleConfig
from orchestrator.core.reasons import Cause
from orchestrator.scheduling.autoscale import LoadSample, ScaleDecision, ScalerState, decide

TICK = 0.5
CFG = AutoscaleConfig(min_replicas=1, max_replicas=8, target_ongoing_per_replica=2.0, upscale_delay_s=3.0,
                      downscale_delay_s=30.0, tolerance=0.1, max_step_up=2, max_step_down=1)


class Loop:
    """A scaling loop over a ManualClock: feed it load, it keeps the state and every decision."""

    def __init__(self, cfg: AutoscaleConfig = CFG, replicas: int = 2) -> None:
        self.cfg, self.clock, self.state = cfg, ManualClock(), ScalerState()
        self.replicas = replicas
        self.decisions: list[ScaleDecision] = []

    def step(self, ongoing: float, p99_ms: float | None = None, *, floor: int = 0,
             ceiling: int | None = None) -> ScaleDecision:
        d = decide(self.cfg, self.state, LoadSample(self.clock.monotonic(), self.replicas, ongoing, p99_ms),
                   floor=floor, ceiling=ceiling)
        self.state, self.replicas = d.state, d.replicas
        self.decisions.append(d)
        self.clock.advance(TICK)
        return d

    def run(self, seconds: float, ongoing: float, **kw: object) -> list[ScaleDecision]:
        return [self.step(ongoing, **kw) for _ in range(round(seconds / TICK))]  # type: ignore[arg-type]

    @property
    def changes(self) -> int:
        return sum(d.changed for d in self.decisions)


def test_scale_up_waits_for_the_upscale_delay_then_steps_at_most_max_step_up() -> None:
    loop = Loop(replicas=2)
    held = loop.run(3.0, ongoing=9.0)  # t = 0 .. 2.5: the wish has not held 3 s yet
    assert [d.replicas for d in held] == [2] * 6
    assert all(d.reason.cause is Cause.SCALE_HOLD_DELAY and d.wanted == 5 for d in held)
    assert held[-1].reason.text == ("ongoing 9 over 2 replicas = 4.50 per replica > target 2 for 2.5 s "
                                    "< upscale_delay 3 s: 2 replicas kept, 5 wanted")
    up = loop.step(9.0)  # t = 3.0
    assert up.replicas == 4 and up.changed and up.reason.cause is Cause.SCALE_UP
    assert up.reason.text == ("ongoing 9 over 2 replicas = 4.50 per replica > target 2 for 3.0 s >= "
                              "upscale_delay 3 s: 2 -> 4 replicas (step limit 2, 5 wanted)")
    # the timer restarts after a move: the next step needs another full delay
    assert [d.replicas for d in loop.run(3.0, ongoing=9.0)] == [4] * 6
    assert loop.step(9.0).replicas == 5


def test_a_lapse_in_the_wish_restarts_the_delay() -> None:
    loop = Loop(replicas=2)
    loop.run(2.5, ongoing=9.0)               # 2.5 s of wanting 5
    assert loop.step(4.0).reason.cause is Cause.SCALE_HOLD_STEADY  # one sample at the target: the wish lapses
    assert [d.replicas for d in loop.run(3.0, ongoing=9.0)] == [2] * 6  # a fresh 3 s from here
    assert loop.step(9.0).replicas == 4


def test_scale_down_waits_for_the_downscale_delay_and_steps_one_at_a_time() -> None:
    loop = Loop(replicas=6)
    held = loop.run(30.0, ongoing=2.0)  # wants 1
    assert {d.replicas for d in held} == {6}
    assert all(d.reason.cause is Cause.SCALE_HOLD_DELAY for d in held)
    down = loop.step(2.0)
    assert down.replicas == 5 and down.reason.cause is Cause.SCALE_DOWN
    assert "< target 2 for 30.0 s >= downscale_delay 30 s: 6 -> 5 replicas (step limit 1, 1 wanted)" in down.reason.text
    loop.run(30.0, ongoing=2.0)  # the wish starts again at the sample after the move
    assert loop.replicas == 5
    loop.step(2.0)
    assert loop.replicas == 4
    loop.run(200.0, ongoing=2.0)
    assert loop.replicas == 1  # min_replicas: never lower
    assert loop.decisions[-1].reason.cause is Cause.SCALE_HOLD_STEADY


def test_the_target_not_the_running_count_is_compared() -> None:
    """Replicas take time to start: a sample still showing 2 running after the decision for 4 is no new wish."""
    loop = Loop(replicas=2)
    loop.run(3.5, ongoing=8.0)
    assert loop.replicas == 4
    for _ in range(10):  # the two new replicas are still starting: the sample says 2
        d = decide(CFG, loop.state, LoadSample(loop.clock.monotonic(), 2, 8.0))
        loop.state = d.state
        loop.clock.advance(TICK)
        assert d.replicas == 4 and d.reason.cause is Cause.SCALE_HOLD_STEADY


def test_inside_the_dead_band_nothing_moves() -> None:
    loop = Loop(replicas=4)  # target 2 per replica: 8 ongoing is exactly on target
    for d in loop.run(120.0, ongoing=8.7):  # 2.175 per replica: 8.75% over, inside 10%
        assert d.replicas == 4 and d.reason.cause is Cause.SCALE_HOLD_BAND
    assert "within 0.1 of target 2: 4 replicas kept (the load alone would ask 5)" in loop.decisions[-1].reason.text
    assert loop.run(3.5, ongoing=9.0)[-1].replicas == 5  # 12.5% over: out of the band


def test_floor_and_ceiling_apply_at_once() -> None:
    loop = Loop(replicas=2)
    d = loop.step(1.0, floor=5)  # a window guarantees 5: no delay
    assert d.replicas == 5 and d.reason.cause is Cause.SCALE_FLOOR
    assert d.reason.text == "2 replicas < floor 5: raised to 5 at once"
    for d in loop.run(120.0, ongoing=1.0, floor=5):  # the load would shrink it; the floor holds it
        assert d.replicas == 5
    d = loop.step(40.0, floor=5, ceiling=3)  # the window caps it at 3: at once, whatever the load
    assert d.replicas == 3 and d.reason.cause is Cause.SCALE_CEILING
    assert d.reason.text == "5 replicas > ceiling 3: lowered to 3 at once"
    assert all(x.replicas == 3 for x in loop.run(60.0, ongoing=40.0, ceiling=3))
    assert loop.decisions[-1].wanted == 3


def test_min_and_max_replicas_bound_every_decision() -> None:
    loop = Loop(replicas=1)
    loop.run(60.0, ongoing=1000.0)
    assert loop.replicas == CFG.max_replicas
    assert max(d.replicas for d in loop.decisions) == CFG.max_replicas


def test_p99_over_the_slo_scales_up_when_the_load_alone_would_not() -> None:
    cfg = CFG.model_copy(update={"slo_p99_ms": 200.0})
    plain = Loop(replicas=2)
    assert all(d.replicas == 2 for d in plain.run(10.0, ongoing=4.0, p99_ms=350.0))  # no SLO set: load alone
    loop = Loop(cfg, replicas=2)
    held = loop.run(3.0, ongoing=4.0, p99_ms=350.0)
    assert all(d.replicas == 2 and d.reason.cause is Cause.SCALE_HOLD_DELAY for d in held)
    d = loop.step(4.0, p99_ms=350.0)
    assert d.replicas == 3 and d.reason.cause is Cause.SCALE_SLO
    assert d.reason.text.startswith("p99 350 ms > SLO 200 ms (ongoing 4 over 2 replicas")
    assert loop.step(4.0, p99_ms=120.0).replicas == 3  # back under the SLO: a wish to shrink must wait 30 s


def test_cold_start_from_zero_is_immediate() -> None:
    cfg = CFG.model_copy(update={"min_replicas": 0})
    loop = Loop(cfg, replicas=0)
    assert loop.step(0.0).replicas == 0
    d = loop.step(7.0)
    assert d.replicas == 2 and d.reason.cause is Cause.SCALE_COLD_START  # at most max_step_up at once
    loop.run(31.0, ongoing=0.0)
    loop.run(31.0, ongoing=0.0)
    assert loop.replicas == 0  # min_replicas 0: the last one goes after the down delay


def test_every_decision_carries_a_scale_reason() -> None:
    loop = Loop(CFG.model_copy(update={"slo_p99_ms": 100.0}), replicas=3)
    for ongoing, p99 in [(0, None), (5, 50), (6.2, 50), (30, 500), (30, 500), (1, 20)] * 20:
        loop.step(float(ongoing), p99)
    assert loop.changes == 0  # the wish to grow never held 3 s in a row
    loop.run(4.0, ongoing=30.0)
    loop.run(31.0, ongoing=1.0, floor=2)
    causes = {d.reason.cause for d in loop.decisions}
    assert all(d.reason.text and d.reason.cause.group == "scale" for d in loop.decisions)
    assert {Cause.SCALE_HOLD_DELAY, Cause.SCALE_HOLD_STEADY, Cause.SCALE_HOLD_BAND, Cause.SCALE_UP,
            Cause.SCALE_DOWN} <= causes


# ---- no flapping on a noisy signal ------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(replicas=st.integers(1, 7), noise=st.lists(st.floats(-0.099, 0.099), min_size=60, max_size=400))
def test_a_signal_wandering_inside_the_band_never_moves_the_target(replicas: int, noise: list[float]) -> None:
    loop = Loop(replicas=replicas)
    for u in noise:  # within ±9.9% of exactly `replicas` replicas' worth of load
        loop.step(replicas * CFG.target_ongoing_per_replica * (1.0 + u))
    assert loop.changes == 0, [d.reason.text for d in loop.decisions if d.changed]


@settings(max_examples=60, deadline=None)
@given(level=st.floats(2.0, 14.0), noise=st.lists(st.floats(0.0, 1.0), min_size=200, max_size=600))
def test_noise_around_a_level_moves_the_target_a_bounded_number_of_times(level: float, noise: list[float]) -> None:
    """Any noise, however adversarial (amplitude ±60% of the level): a move down needs
    downscale_delay_s of unbroken wish since the last move, so there are at most
    duration / downscale_delay_s + 1 of them; each move up needs a move down to undo it except
    for the room between the start and max_replicas. Without the delays, this noise moves the
    target on most samples."""
    loop = Loop(replicas=3)
    for x in noise:
        loop.step(level * (1.0 + 1.2 * (x - 0.5)))
    duration = len(noise) * TICK
    downs = sum(d.changed and d.replicas < (d.previous or 0) for d in loop.decisions)
    ups = loop.changes - downs
    assert downs <= math.floor(duration / CFG.downscale_delay_s) + 1
    assert ups <= downs + (CFG.max_replicas - 3)
    assert loop.changes <= 2 * (duration / CFG.downscale_delay_s + 1) + CFG.max_replicas


def test_latency_over_the_slo_while_replicas_still_start_does_not_ratchet_the_service_up() -> None:
    """The target moved to 3; two replicas serve while the third starts and p99 stays high: no fourth is
    asked for until the third serves, then (still over the SLO) one more after the delay."""
    cfg = CFG.model_copy(update={"slo_p99_ms": 200.0, "upscale_delay_s": 1.0})
    clock, state = ManualClock(), ScalerState(target=3)
    seen = []
    for _ in range(20):  # 10 s of slow requests, the third replica not up yet
        d = decide(cfg, state, LoadSample(clock.monotonic(), 2, 4.0, 900.0))
        state = d.state
        seen.append(d)
        clock.advance(TICK)
    assert {d.replicas for d in seen} == {3} and {d.reason.cause for d in seen} == {Cause.SCALE_HOLD_STARTING}
    assert "1 of 3 replicas still starting" in seen[0].reason.text
    ups = []
    for _ in range(4):  # it serves now, and p99 is still over: the SLO rule acts again, after its delay
        d = decide(cfg, state, LoadSample(clock.monotonic(), 3, 4.0, 900.0))
        state = d.state
        ups.append(d.replicas)
        clock.advance(TICK)
    assert ups == [3, 3, 4, 4]
    # a load that asks for more on its own is not held back by replicas starting
    d = decide(cfg, ScalerState(target=3), LoadSample(0.0, 2, 20.0, 900.0))
    assert d.reason.cause is Cause.SCALE_HOLD_DELAY and d.wanted == 8


# ---- #36: multiplicative steps and warm spares ---------------------------------------------------------------

def test_upscale_factor_lets_a_move_grow_the_target_by_its_factor() -> None:
    """A tripled load (backlog counted in ongoing) is met in one move of x2 then one more, not in 2-replica steps."""
    cfg = CFG.model_copy(update={"max_replicas": 200, "upscale_factor": 2.0})
    loop = Loop(cfg, replicas=20)
    loop.run(3.0, ongoing=120.0)  # wants 60: held for the delay
    d = loop.step(120.0)
    assert d.replicas == 40 and d.reason.cause is Cause.SCALE_UP_FACTOR
    assert "upscale_factor 2 allows +20" in d.reason.text and "20 -> 40 replicas (step limit 20, 60 wanted)" in d.reason.text
    loop.run(3.0, ongoing=120.0)
    assert loop.step(120.0).replicas == 60  # the second move reaches what the load asks, no further
    # additive steps alone (factor 1): the same load takes 20 moves
    plain = Loop(CFG.model_copy(update={"max_replicas": 200}), replicas=20)
    plain.run(3.5, ongoing=120.0)
    assert plain.replicas == 22 and plain.decisions[-1].reason.cause is Cause.SCALE_UP


def test_upscale_factor_never_passes_the_bounds_nor_a_small_move() -> None:
    cfg = CFG.model_copy(update={"max_replicas": 30, "upscale_factor": 3.0})
    loop = Loop(cfg, replicas=20)
    loop.run(3.5, ongoing=400.0)
    assert loop.replicas == 30  # max_replicas bounds the factor's move
    small = Loop(cfg, replicas=4)
    small.run(3.5, ongoing=10.0)  # wants 5: one replica more, max_step_up's move, cause scale.up
    assert small.replicas == 5 and small.decisions[-1].reason.cause is Cause.SCALE_UP


def test_warm_spares_keep_processes_up_to_the_recent_peak_then_forget_it() -> None:
    from orchestrator.scheduling.autoscale import warm_spares

    cfg = CFG.model_copy(update={"max_replicas": 100, "upscale_factor": 4.0, "warm_window_s": 600.0,
                                 "max_warm_spares": 50, "downscale_delay_s": 1.0, "max_step_down": 100})
    loop = Loop(cfg, replicas=10)
    assert warm_spares(cfg, loop.state).count == 0  # before the first decision
    loop.run(4.0, ongoing=80.0)
    assert loop.replicas == 40 and loop.state.peak == 40
    loop.run(3.0, ongoing=20.0)  # the load falls: the target goes back to 10, the peak stays
    assert loop.replicas == 10
    w = warm_spares(cfg, loop.state)
    assert w.count == 30 and w.reason.cause is Cause.SCALE_WARM_SPARES
    assert w.reason.text == "peak 40 of the last 600 s, target 10: 30 processes kept started"
    assert warm_spares(cfg.model_copy(update={"max_warm_spares": 8}), loop.state).count == 8
    assert warm_spares(cfg.model_copy(update={"warm_window_s": 0.0}), loop.state).count == 0
    loop.run(600.0, ongoing=20.0)  # the peak is older than warm_window_s: forgotten
    assert loop.state.peak == 0 and warm_spares(cfg, loop.state).count == 0


def test_a_scale_down_stops_at_the_held_fraction_of_the_recent_peak() -> None:
    cfg = CFG.model_copy(update={"max_replicas": 100, "upscale_factor": 4.0, "warm_window_s": 600.0,
                                 "peak_hold_fraction": 0.5, "downscale_delay_s": 1.0, "max_step_down": 100})
    loop = Loop(cfg, replicas=10)
    loop.run(4.0, ongoing=80.0)
    assert loop.replicas == 40
    loop.run(10.0, ongoing=2.0)  # the load asks 1: the scale-down stops at half the peak
    assert loop.replicas == 20
    d = loop.decisions[-1]
    assert d.reason.cause is Cause.SCALE_HOLD_PEAK
    assert d.reason.text.endswith("the load asks 1, but 20 replicas kept: peak_hold_fraction 0.5 of the peak 40 of "
                                  "the last 600 s")
    loop.run(600.0, ongoing=2.0)  # the peak is forgotten: down to what the load asks
    assert loop.replicas == 1
    plain = Loop(cfg.model_copy(update={"peak_hold_fraction": 0.0}), replicas=10)
    plain.run(4.0, ongoing=80.0)
    plain.run(10.0, ongoing=2.0)
    assert plain.replicas == 1
