"""The inference service's autoscaler, pure: ``decide(cfg, state, sample) -> ScaleDecision``.

One call per load sample; the caller (the scaling loop) keeps the returned
:class:`ScalerState` and passes it back with the next sample. Time is the
sample's ``t_s`` (an injected clock's ``monotonic``): nothing here reads a
clock, sleeps or does I/O, so a test drives a day of decisions in
microseconds.

The rules, in order (each decision's :class:`~orchestrator.core.reasons.Reason`
says which one decided and with which figures):

1. **bounds, at once.** ``lo = max(min_replicas, floor)`` and
   ``hi = min(max_replicas, ceiling)`` (``floor``: what the time window in force
   guarantees the service; ``ceiling``: what it may have). A target below
   ``lo`` is raised to it and one above ``hi`` lowered to it *without delay*
   (cause ``scale.floor`` / ``scale.ceiling``); when they cross, ``hi`` wins
   (a lease that cannot be had is not asked for). A window change thus acts
   within one sample.
2. **cold start.** With no replica and requests arriving, one replica (up to
   ``max_step_up`` if the load asks for more) at once (``scale.cold_start``).
3. **what the load asks.** ``wanted = ceil(ongoing / target_ongoing_per_replica)``,
   except inside the **dead band**: while ``ongoing / (target x
   target_ongoing_per_replica)`` is within ``1 ± tolerance`` the target stays
   (``scale.hold_band``). When ``slo_p99_ms`` is set and the sample's p99 is
   above it, ``wanted >= target + 1`` whatever the load says (``scale.slo``),
   but only once every replica already decided serves (``sample.replicas >=
   target``): latency measured while the last move's replicas still start says
   nothing about the capacity they will add, and counting it again would
   ratchet the service to its maximum on one slow spell
   (``scale.hold_starting``). ``wanted`` is clamped to ``[lo, hi]``.
4. **delays.** A wish to go up must have held, without a break, for
   ``upscale_delay_s``; a wish to go down for ``downscale_delay_s``
   (``scale.hold_delay`` meanwhile). The timer starts at the first sample
   that wishes that direction and restarts whenever the wish lapses (a sample
   wanting the current count, or the other direction).
5. **steps.** A move changes the target by at most ``max_step_up`` /
   ``max_step_down`` towards ``wanted`` (``scale.up`` / ``scale.down``); after
   a move the timer restarts, so a ramp goes at most ``max_step_up`` replicas
   per ``upscale_delay_s``. With ``upscale_factor`` above 1 a move up may also
   reach ``ceil(target x upscale_factor)`` (Ray Serve's ``upscaling_factor``):
   when that allows more than ``max_step_up`` and the move uses it, the cause
   is ``scale.up_factor``. ``wanted`` counts the backlog (``ongoing`` is
   requests in flight *or queued*), so a tripled load is met in one or two
   moves, not in ``wanted / max_step_up`` of them.

**Warm spares** (:func:`warm_spares`). The state remembers the highest
target a move up reached (``peak``), for ``warm_window_s`` after it was
reached; the scaling loop keeps ``peak - target`` replica
processes started, their model loaded, holding no lease (host memory and
CPU, at most ``max_warm_spares``), so a replica granted again attaches to
its lease in about a second instead of starting cold (cause
``scale.warm_spares``). The GPUs of a scale-down go back to training at
once; only the processes wait for the next peak.

**Holding the peak** (:func:`held_at_peak`). With ``peak_hold_fraction`` above
0 a scale-down stops at ``ceil(peak x peak_hold_fraction)`` while the peak is
at most ``warm_window_s`` old (cause ``scale.hold_peak``): capacity that took a
training preemption to get (30 s of checkpoint) is kept through the lull
between bursts, as HPA's downscale stabilisation window keeps its highest
recommendation. It costs what the held replicas' cards would have trained.

**Target, not running.** ``ScalerState.target`` is the count last decided.
Replicas take seconds to start (a lease to be granted, a model to load); the
rules compare with the target, not with the replicas running, so a slow
start-up is not taken for a new wish (Ray Serve compares with its
``target_num_replicas`` for the same reason). The first sample's
``replicas`` seeds the target.

**As Ray Serve and Kubernetes HPA do, and where this differs.** The delay
rule is Ray Serve's (``ray/serve/autoscaling_policy.py``,
``_apply_delay_logic``): a timestamp taken at the first consecutive decision
in one direction, reset on a change of direction, on a "do nothing" and after
acting; and its bounds are applied after the delay
(``AutoscalingState.apply_bounds``), at once, as here. Its desired count is
``total ongoing / target_ongoing_requests`` as here. Differences:

* Ray Serve has **no dead band**; ours is Kubernetes HPA's tolerance
  (``--horizontal-pod-autoscaler-tolerance``, 0.1): without it a load
  hovering at ``k x target`` flips between ``k`` and ``k + 1``, each flip
  costing a lease and possibly a training preemption;
* Ray Serve limits a move with **multiplicative** ``upscaling_factor`` /
  ``downscaling_factor``; ours are **additive** steps (HPA's ``behavior``
  policies of type ``Pods``), easier to reason about when each replica is a
  lease and each lease may preempt training;
* Ray Serve averages its metric over ``look_back_period_s`` itself; here the
  sample is taken as given (the caller smooths);
* HPA's **downscale stabilisation** takes the highest recommendation of the
  last window (300 s); here the wish must hold without a break (Ray Serve's
  rule), which is at least as conservative on a noisy signal;
* neither scales on **latency**; ours may, on p99 against the SLO;
* Ray Serve has a separate delay for 1 -> 0 (``downscale_to_zero_delay_s``);
  here 0 is reached only with ``min_replicas: 0``, after ``downscale_delay_s``;
* ``floor`` / ``ceiling`` are ours: the time windows' guarantee and cap.

**The ceiling a loop passes.** :func:`reachable_replicas` is what the cards could hold of the replicas'
request, its whole fallback chain counted in order (1g slices, then larger slices, MPS shares, whole
cards) within the queue's quota in force: a loop that passes it as ``ceiling`` never asks for a lease that
cannot be had, and is not capped at the first choice's slices when later choices reach more.

Invariants: ``decide`` is a pure function of its arguments; the returned
``replicas`` is always within ``[lo, hi]`` and differs from the target by at
most ``max_step_up`` / ``max_step_down`` except when a bound (rule 1) moves it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from orchestrator.core.catalogue import MIG_COMPUTE_SLICES, gpu_model, is_known, mig_compute_slices
from orchestrator.core.colocation import AutoscaleConfig
from orchestrator.core.inventory import GpuDevice
from orchestrator.core.reasons import Cause, Reason
from orchestrator.core.request import GpuRequest, ShareKind

#: Tolerance of the delay comparison (Ray Serve's ``_DELAY_ELAPSED_EPS_S``): 3.0 - 0.0 may read 2.9999999.
DELAY_EPS_S = 1e-6
#: ``ceil`` of an ``ongoing / target`` that is a whole number up to float noise stays that number.
_CEIL_EPS = 1e-9


@dataclass(frozen=True)
class LoadSample:
    """What the scaling loop measured at ``t_s`` (monotonic seconds): ``replicas`` running,
    ``ongoing`` requests in flight or queued over all of them, and p99 latency (ms) when known."""

    t_s: float
    replicas: int
    ongoing: float
    p99_ms: float | None = None


@dataclass(frozen=True)
class ScalerState:
    """What hysteresis remembers between samples. ``ScalerState()`` is the initial state.

    ``target``: the replica count last decided (None before the first sample);
    ``wish``: the direction wanted but not yet acted on (+1 up, -1 down, 0 none);
    ``since_s``: when that wish began; ``last_change_s``: when the target last moved;
    ``peak``: the highest target a move up reached, at ``peak_s`` (0 and None once ``warm_window_s`` old)."""

    target: int | None = None
    wish: int = 0
    since_s: float | None = None
    last_change_s: float | None = None
    peak: int = 0
    peak_s: float | None = None


@dataclass(frozen=True)
class ScaleDecision:
    """The replica count to aim for, why, and the state to pass to the next call.
    ``wanted``: what the load asked for (clamped to the bounds) before delays and steps;
    ``previous``: the target before this decision."""

    replicas: int
    reason: Reason
    state: ScalerState
    wanted: int | None = None
    previous: int | None = None

    @property
    def changed(self) -> bool:
        """Whether this decision moved the target."""
        return self.previous is not None and self.replicas != self.previous

    def to_json(self) -> dict[str, object]:
        # By hand: keys out of field order and the scaler's state left out (what the serve status shows).
        return {"replicas": self.replicas, "previous": self.previous, "wanted": self.wanted, **self.reason.fields()}


def bounds(cfg: AutoscaleConfig, *, floor: int = 0, ceiling: int | None = None) -> tuple[int, int]:
    """``(lo, hi)``: ``max(min_replicas, floor)`` and ``min(max_replicas, ceiling)``, ``hi`` winning when they cross."""
    hi = cfg.max_replicas if ceiling is None else max(0, min(cfg.max_replicas, ceiling))
    lo = min(max(cfg.min_replicas, floor), hi)
    return lo, hi


def decide(cfg: AutoscaleConfig, state: ScalerState, sample: LoadSample, *, floor: int = 0,
           ceiling: int | None = None) -> ScaleDecision:
    """The replica count for ``sample``; see the module docstring for the rules."""
    now = sample.t_s
    current = state.target if state.target is not None else max(0, sample.replicas)
    lo, hi = bounds(cfg, floor=floor, ceiling=ceiling)

    def moved(n: int, cause: Cause, text: str, wanted: int) -> ScaleDecision:
        return ScaleDecision(n, Reason(cause, text), ScalerState(n, 0, None, now, *_peak(cfg, state, n, n > current, now)),
                             wanted, current)

    def held(cause: Cause, text: str, wanted: int, wish: int = 0, since: float | None = None) -> ScaleDecision:
        return ScaleDecision(current, Reason(cause, text), ScalerState(current, wish, since, state.last_change_s,
                                                                       *_peak(cfg, state, current, False, now)),
                             wanted, current)

    # 1. bounds, at once
    if current < lo:
        why = f"floor {floor}" if floor > cfg.min_replicas else f"min_replicas {cfg.min_replicas}"
        return moved(lo, Cause.SCALE_FLOOR, f"{current} replicas < {why}: raised to {lo} at once", lo)
    if current > hi:
        why = f"ceiling {ceiling}" if ceiling is not None and ceiling < cfg.max_replicas else f"max_replicas {cfg.max_replicas}"
        return moved(hi, Cause.SCALE_CEILING, f"{current} replicas > {why}: lowered to {hi} at once", hi)

    t = cfg.target_ongoing_per_replica
    by_load = math.ceil(sample.ongoing / t - _CEIL_EPS) if sample.ongoing > 0 else 0
    # 2. cold start: requests and no replica
    if current == 0:
        if sample.ongoing > 0 and hi > 0:
            n = min(hi, max(1, lo, min(by_load, cfg.max_step_up)))
            return moved(n, Cause.SCALE_COLD_START, f"ongoing {sample.ongoing:g} with no replica: {n} at once", n)
        return held(Cause.SCALE_HOLD_STEADY, "no requests and no replica", 0)

    # 3. what the load asks
    per = sample.ongoing / current
    ratio = per / t
    in_band = abs(ratio - 1.0) <= cfg.tolerance
    load_text = f"ongoing {sample.ongoing:g} over {current} replicas = {per:.2f} per replica"
    wanted = current if in_band else by_load
    slo_over = cfg.slo_p99_ms is not None and sample.p99_ms is not None and sample.p99_ms > cfg.slo_p99_ms
    if slo_over and sample.replicas < current and by_load <= current:
        return held(Cause.SCALE_HOLD_STARTING, f"p99 {sample.p99_ms:g} ms > SLO {cfg.slo_p99_ms:g} ms with "
                    f"{current - sample.replicas} of {current} replicas still starting: {current} kept until "
                    f"they serve", max(lo, min(hi, current)))
    if slo_over:
        wanted = max(wanted, current + 1)
    wanted = max(lo, min(hi, wanted))
    keep = held_at_peak(cfg, state, now)
    if wanted < current and wanted < keep:
        asked, wanted = wanted, min(current, keep)
        if wanted == current:
            return held(Cause.SCALE_HOLD_PEAK, f"{load_text}: the load asks {by_load}, but {current} replicas kept: "
                        f"peak_hold_fraction {cfg.peak_hold_fraction:g} of the peak {state.peak} of the last "
                        f"{cfg.warm_window_s:g} s", asked)
    if wanted == current:
        if in_band and by_load != current:
            return held(Cause.SCALE_HOLD_BAND, f"{load_text}, within {cfg.tolerance:g} of target {t:g}: "
                        f"{current} replicas kept (the load alone would ask {by_load})", wanted)
        bound = "" if (by_load == wanted or slo_over) else f" (the load asks {by_load}; bounds [{lo}, {hi}])"
        return held(Cause.SCALE_HOLD_STEADY, f"{load_text}, target {t:g}: {current} replicas{bound}", wanted)

    # 4. delays
    up = wanted > current
    direction = 1 if up else -1
    since = state.since_s if state.wish == direction and state.since_s is not None else now
    waited = now - since
    delay = cfg.upscale_delay_s if up else cfg.downscale_delay_s
    if slo_over and up and by_load <= current:
        cause, why = Cause.SCALE_SLO, f"p99 {sample.p99_ms:g} ms > SLO {cfg.slo_p99_ms:g} ms ({load_text})"
    elif up:
        cause, why = Cause.SCALE_UP, f"{load_text} > target {t:g}"
    else:
        cause, why = Cause.SCALE_DOWN, f"{load_text} < target {t:g}"
    name = "upscale_delay" if up else "downscale_delay"
    if waited + DELAY_EPS_S < delay:
        return held(Cause.SCALE_HOLD_DELAY, f"{why} for {waited:.1f} s < {name} {delay:g} s: "
                    f"{current} replicas kept, {wanted} wanted", wanted, direction, since)
    # 5. steps
    up_step = max(cfg.max_step_up, up_by_factor(cfg, current))
    n = min(wanted, current + up_step) if up else max(wanted, current - cfg.max_step_down)
    step = f" (step limit {up_step if up else cfg.max_step_down}, {wanted} wanted)" if n != wanted else ""
    if up and n - current > cfg.max_step_up:
        cause, why = Cause.SCALE_UP_FACTOR, f"{why}; upscale_factor {cfg.upscale_factor:g} allows +{up_step}"
    return moved(n, cause, f"{why} for {waited:.1f} s >= {name} {delay:g} s: {current} -> {n} replicas{step}", wanted)


def up_by_factor(cfg: AutoscaleConfig, current: int) -> int:
    """Replicas a move up may add by ``upscale_factor`` alone: ``ceil(current x factor) - current``."""
    return max(0, math.ceil(current * cfg.upscale_factor - _CEIL_EPS) - current)


def _peak(cfg: AutoscaleConfig, state: ScalerState, target: int, rose: bool, now: float) -> tuple[int, float | None]:
    """``(peak, peak_s)`` after deciding ``target`` at ``now`` (``rose``: by a move up): a move up to at least the
    peak makes it the new peak; a peak ``warm_window_s`` old is forgotten (``(0, None)``). Only moves up set it,
    so a target held up by the peak never renews it."""
    if rose and target >= state.peak:
        return target, now
    if state.peak_s is not None and now - state.peak_s > cfg.warm_window_s + DELAY_EPS_S:
        return 0, None
    return state.peak, state.peak_s


def held_at_peak(cfg: AutoscaleConfig, state: ScalerState, now: float) -> int:
    """The fewest replicas a scale-down may leave: ``ceil(peak x peak_hold_fraction)`` while the peak is at most
    ``warm_window_s`` old (0 otherwise): replicas held through the lull between bursts, as HPA's downscale
    stabilisation window holds its highest recommendation."""
    if cfg.peak_hold_fraction <= 0 or state.peak_s is None or now - state.peak_s > cfg.warm_window_s + DELAY_EPS_S:
        return 0
    return math.ceil(state.peak * cfg.peak_hold_fraction - _CEIL_EPS)


@dataclass(frozen=True)
class WarmSpares:
    """How many replica processes to keep started without a lease, and why."""

    count: int
    reason: Reason


def warm_spares(cfg: AutoscaleConfig, state: ScalerState) -> WarmSpares:
    """Warm spares (see the module docstring): ``min(max_warm_spares, peak - target)``, 0 when
    ``warm_window_s`` or ``max_warm_spares`` is 0 or before the first decision. Pure."""
    target = state.target or 0
    if cfg.warm_window_s <= 0 or cfg.max_warm_spares <= 0 or state.peak_s is None:
        return WarmSpares(0, Reason(Cause.SCALE_WARM_SPARES, "no warm spares (warm_window_s or max_warm_spares 0)"))
    n = max(0, min(cfg.max_warm_spares, state.peak - target))
    cap = " (max_warm_spares)" if n < state.peak - target else ""
    return WarmSpares(n, Reason(Cause.SCALE_WARM_SPARES, f"peak {state.peak} of the last {cfg.warm_window_s:g} s, "
                                                         f"target {target}: {n} processes kept started{cap}"))


def reachable_replicas(request: GpuRequest, gpus: Iterable[GpuDevice], quota_gpus: float | None = None) -> int | None:
    """The most replicas asking ``request`` that the cards ``gpus`` could hold at once, within a queue quota of
    ``quota_gpus`` (None: none): a ceiling for the scaling loop ("a lease that cannot be had is not asked
    for") that follows the request's whole fallback chain, as the engine tries it.

    Each MIG instance of the layouts now counts for the first choice naming its profile (a MIG card without
    a fixed layout: the instances of the chain's smallest profile a card); each card without MIG for the first choice
    that fits one (MPS shares ``100 // sm_percent`` on models with MPS, time-slices ``1 // fraction``,
    whole cards ``1 / count`` a card). Whatever holds them now counts as freeable: this is what exists, not
    what is free. Then the choices in order, each with what it adds to the queue (its ``gpu_demand``), while
    the queue is within ``quota_gpus`` when a choice begins (the last one counted may pass it: what the
    queue then holds beyond its quota it can only borrow, as the cycle lets it). None when a choice only
    states what it needs (the engine picks its share): no ceiling. Pure."""
    choices = request.choices
    if any(c.kind is None for c in choices):
        return None
    first_mig = {}
    for k, c in enumerate(choices):
        if c.kind is ShareKind.MIG:
            first_mig.setdefault(c.profile, k)
    counts = [0.0] * len(choices)
    for g in gpus:
        if g.mig_enabled:
            if g.mig_devices:
                for d in g.mig_devices:
                    if d.profile in first_mig:
                        counts[first_mig[d.profile]] += 1
            elif first_mig:  # instances made on demand: as many as the chain's smallest profile makes
                per, k = max((MIG_COMPUTE_SLICES // max(1, mig_compute_slices(p or "")), k) for p, k in first_mig.items())
                counts[k] += per
            continue
        for k, c in enumerate(choices):
            per_card = _per_plain_card(c, g.model)
            if per_card:
                counts[k] += per_card
                break
    total, used = 0, 0.0
    for c, n in zip(choices, counts):
        if quota_gpus is not None and used >= quota_gpus - _CEIL_EPS:
            break
        got = math.floor(n + _CEIL_EPS)
        total += got
        used += got * c.gpu_demand
    return total


def _per_plain_card(c: GpuRequest, model: str) -> float:
    """Replicas of choice ``c`` one card without MIG holds (0: it takes none there)."""
    if c.kind is ShareKind.WHOLE and c.count:
        return 1 / c.count
    if c.kind is ShareKind.MPS and c.sm_percent and _mps_ok(model):
        return 100 // c.sm_percent
    if c.kind is ShareKind.TIMESLICE and c.fraction:
        return math.floor(1 / c.fraction + _CEIL_EPS)
    return 0.0


def _mps_ok(model: str) -> bool:
    return is_known(model) and gpu_model(model).mps  # a model the catalogue does not know: no MPS, as the engine
