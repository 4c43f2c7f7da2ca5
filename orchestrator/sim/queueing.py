"""The inference service's queue, per step of simulated time: M/M/c while it keeps up, a fluid queue when not.

Pure (no clock, no I/O). One call of :func:`step` advances one service over ``dt`` seconds at a constant
arrival rate ``lam`` with ``c`` replicas serving, all of one :class:`ReplicaKind`:

* **a replica** batches (``max_batch_size``, ``InferenceModel.batch_s`` on its share,
  :mod:`orchestrator.sim.perfmodel`): at ``b`` requests a batch it serves ``thr(b) = b / batch_s(b)``
  requests per second. Its capacity ``mu`` is the best ``thr(b)``; under a per-replica rate ``r`` it runs
  the smallest batch that keeps up (``b_eff``: ``thr(b_eff) >= r``), so a request's service time is
  ``batch_s(b_eff)`` and the replica is busy ``r / thr(b_eff)`` of the time.
* **keeping up** (no backlog, ``lam < c x mu``): M/M/c with rate ``mu`` per server for the wait
  (Erlang C; exact up to 100 servers, the Halfin-Whitt approximation above: within 0.01 of the exact
  wait probability there, see the tests). A request's latency is ``batch_s(b_eff) + W`` with
  ``P(W > t) = C x exp(-(c mu - lam) t)``.
* **not keeping up** (``lam >= c mu``, or a backlog left from before): a fluid queue. The backlog ``Q``
  grows (or drains) at ``lam - c mu``; every replica is busy at its best batch; a request arriving with
  ``Q`` queued waits ``Q / (c mu)``. A request that would wait longer than ``timeout_s`` is dropped (it
  fails, as the load generator's client times out at 30 s): ``Q <= c mu x timeout_s``. A step whose
  backlog drains part-way is split at that instant into a fluid part and an M/M/c part.

Each part of a step is a :class:`Segment`: how many requests arrived and were answered, and the inverse
CDF of their latency. The caller draws stratified representatives from segments (the day's p99 is
``core.stats.quantile`` over them) and reads SLO attainment from :meth:`Segment.within`.

Requests are counted when they arrive: answered (with the latency they will have) or dropped.

Invariants: ``0 <= busy fraction <= 1`` for every replica; answered + dropped = arrived; the backlog is
never negative and never above ``c x mu x timeout_s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from orchestrator.sim.perfmodel import InferenceModel, ShareSpeed

#: Above this many servers the wait probability uses the Halfin-Whitt approximation (O(1), not O(c)).
EXACT_ERLANG_UP_TO = 100


@dataclass(frozen=True)
class ReplicaKind:
    """One replica's serving figures on its share; see the module docstring."""

    share: ShareSpeed
    model: InferenceModel
    max_batch: int

    @property
    def card_share(self) -> float:
        """The cards the replica holds (a 1g slice 1/7, a quarter time-slice 0.25)."""
        return min(1.0, self.share.card_share)

    def batch_s(self, b: int) -> float:
        return _batch_s(self, b)

    def thr(self, b: int) -> float:
        return b / self.batch_s(b)

    @property
    def best_batch(self) -> int:
        return _best(self)[0]

    @property
    def mu(self) -> float:
        """Requests per second one replica serves at its best batch."""
        return _best(self)[1]

    def batch_for(self, rate: float) -> int:
        """The smallest batch that keeps up with ``rate`` requests per second (the best batch if none does)."""
        for b in range(1, self.best_batch + 1):
            if self.thr(b) >= rate:
                return b
        return self.best_batch

    def useful_per_request_s(self, b: int) -> float:
        """SM-seconds one request is worth at batch ``b`` (``InferenceModel.useful_gpu_s``, per request)."""
        return self.model.useful_gpu_s(b) / b


@lru_cache(maxsize=4096)
def _batch_s(kind: ReplicaKind, b: int) -> float:
    return kind.model.batch_s(b, kind.share)


@lru_cache(maxsize=256)
def _best(kind: ReplicaKind) -> tuple[int, float]:
    best = max(range(1, kind.max_batch + 1), key=lambda b: (b / _batch_s(kind, b), -b))
    return best, best / _batch_s(kind, best)


def erlang_c(c: int, a: float) -> float:
    """The probability that an arrival waits in M/M/c with offered load ``a = lam / mu`` (< c)."""
    if c <= 0:
        return 1.0
    if a <= 0:
        return 0.0
    if a >= c:
        return 1.0
    if c <= EXACT_ERLANG_UP_TO:
        b = 1.0
        for k in range(1, c + 1):
            b = a * b / (k + a * b)
        rho = a / c
        return b / (1 - rho + rho * b)
    beta = (c - a) / math.sqrt(c)  # Halfin-Whitt: P(wait) ~ 1 / (1 + beta Phi(beta) / phi(beta))
    phi = math.exp(-beta * beta / 2) / math.sqrt(2 * math.pi)
    big_phi = 0.5 * (1 + math.erf(beta / math.sqrt(2)))
    if phi < 1e-300:
        return 0.0
    return min(1.0, 1.0 / (1.0 + beta * big_phi / phi))


@dataclass(frozen=True)
class Segment:
    """Requests answered in one part of a step and their latency (seconds).

    ``kind`` is ``"mmc"`` (latency ``s + W``, ``P(W > t) = pw exp(-gap t)``) or ``"fluid"`` (uniform on
    ``[lo, hi]``)."""

    answered: float
    kind: str
    s: float = 0.0
    pw: float = 0.0
    gap: float = 1.0
    lo: float = 0.0
    hi: float = 0.0

    def quantile(self, p: float) -> float:
        """The ``p``-quantile of this segment's latency."""
        if self.kind == "fluid":
            return self.lo + (self.hi - self.lo) * p
        if p <= 1 - self.pw or self.pw <= 0:
            return self.s
        return self.s + math.log(self.pw / max(1e-300, 1 - p)) / self.gap

    def cdf(self, x: float) -> float:
        if self.kind == "fluid":
            if x >= self.hi:
                return 1.0
            if x < self.lo:
                return 0.0
            return (x - self.lo) / (self.hi - self.lo) if self.hi > self.lo else 1.0
        if x < self.s:
            return 0.0
        return 1.0 - self.pw * math.exp(-self.gap * (x - self.s))

    def within(self, slo_s: float) -> float:
        """Answered requests of this segment within ``slo_s``."""
        return self.answered * self.cdf(slo_s)


@dataclass
class StepOut:
    """One service over one step; see the module docstring."""

    arrived: float = 0.0
    dropped: float = 0.0
    segments: list[Segment] = field(default_factory=list)
    busy_replica_s: float = 0.0  # replica-seconds busy (each replica's busy fraction times the time)
    sm_s: float = 0.0  # useful SM-seconds of the answered requests
    ongoing_s: float = 0.0  # integral of requests in the system over the step (mean ongoing x dt)
    backlog: float = 0.0  # the fluid backlog at the step's end

    @property
    def answered(self) -> float:
        return sum(g.answered for g in self.segments)

    def within(self, slo_s: float) -> float:
        return sum(g.within(slo_s) for g in self.segments)

    def quantile(self, p: float) -> float | None:
        """The ``p``-quantile of the step's answered latencies (bisection over the segments' mixture)."""
        segs = [g for g in self.segments if g.answered > 0]
        if not segs:
            return None
        if len(segs) == 1:
            return segs[0].quantile(p)
        total = sum(g.answered for g in segs)
        lo = min(g.quantile(0.0) for g in segs)
        hi = max(g.quantile(min(p + (1 - p) / 2, 1 - 1e-12)) for g in segs) + 1e-9
        for _ in range(40):
            mid = (lo + hi) / 2
            if sum(g.answered * g.cdf(mid) for g in segs) / total >= p:
                hi = mid
            else:
                lo = mid
        return hi


def step(kind: ReplicaKind, c: int, lam: float, dt: float, backlog: float, timeout_s: float) -> StepOut:
    """Advance one service by ``dt`` seconds; see the module docstring."""
    out = StepOut(arrived=lam * dt)
    cap = c * kind.mu
    q0 = backlog
    if cap <= 0:  # nothing serves: every arrival times out (a backlog left was counted when it arrived)
        out.dropped = out.arrived
        return out
    qmax = cap * timeout_s
    fluid_dt = 0.0
    if q0 > 0 or lam >= cap:
        net = lam - cap
        fluid_dt = dt if net >= 0 else min(dt, q0 / -net)
        q1_raw = q0 + net * fluid_dt
        q1 = min(max(0.0, q1_raw), qmax)
        over = max(0.0, q1_raw - q1)
        b = kind.best_batch
        s = kind.batch_s(b)
        answered = lam * fluid_dt - over
        out.dropped += over
        if answered > 0:
            out.segments.append(Segment(answered, "fluid", lo=s + q0 / cap, hi=s + q1 / cap))
        out.busy_replica_s += c * fluid_dt
        out.sm_s += cap * fluid_dt * kind.useful_per_request_s(b)
        out.ongoing_s += ((q0 + q1) / 2 + c * b) * fluid_dt
        out.backlog = q1
        if fluid_dt >= dt:
            return out
    stable_dt = dt - fluid_dt
    if lam <= 0:
        return out
    r = lam / c
    b = kind.batch_for(r)
    s = kind.batch_s(b)
    busy = min(1.0, r / kind.thr(b))
    pw = erlang_c(c, lam / kind.mu)
    gap = cap - lam
    out.segments.append(Segment(lam * stable_dt, "mmc", s=s, pw=pw, gap=gap))
    out.busy_replica_s += c * busy * stable_dt
    out.sm_s += lam * stable_dt * kind.useful_per_request_s(b)
    out.ongoing_s += lam * (s + pw / gap) * stable_dt
    out.backlog = 0.0
    return out


def rate_at_target(kind: ReplicaKind, target_ongoing: float) -> float:
    """The request rate at which one replica of ``kind`` carries ``target_ongoing`` requests on average
    (M/M/1 with batching, as :func:`step`): what the autoscaler's target means in requests per second.
    Bisection; the replica's capacity when even that leaves fewer ongoing."""
    lo, hi = 0.0, kind.mu * (1 - 1e-9)

    def ongoing(r: float) -> float:
        out = step(kind, 1, r, 1.0, 0.0, 30.0)
        return out.ongoing_s

    if ongoing(hi) <= target_ongoing:
        return hi
    for _ in range(60):
        mid = (lo + hi) / 2
        if ongoing(mid) < target_ongoing:
            lo = mid
        else:
            hi = mid
    return lo


def step_mixed(kinds: "dict[ReplicaKind, int]", lam: float, dt: float, backlog: float,
               timeout_s: float) -> tuple[StepOut, float]:
    """:func:`step` for a service whose replicas are of several kinds (a fallback chain's 1g slices, MPS shares
    and whole cards), and the replicas' busy card-seconds (each kind's busy replica-seconds times its card
    share). The load and the backlog split over the kinds in proportion to their capacity (``c x mu``: a
    router that balances by queue length gives each replica work in proportion to its speed), each kind an
    M/M/c pool of its own, the parts summed. With one kind it is exactly :func:`step`. Busy time stays per
    kind, so every replica's busy fraction stays within 1 whatever the mix."""
    live = {k: c for k, c in kinds.items() if c > 0}
    if not live:
        return StepOut(arrived=lam * dt, dropped=lam * dt), 0.0
    if len(live) == 1:
        ((kind, c),) = live.items()
        one = step(kind, c, lam, dt, backlog, timeout_s)
        return one, one.busy_replica_s * kind.card_share
    cap = sum(c * k.mu for k, c in live.items())
    out, card_s = StepOut(), 0.0
    for k, c in live.items():
        part = step(k, c, lam * c * k.mu / cap, dt, backlog * c * k.mu / cap, timeout_s)
        out.arrived += part.arrived
        out.dropped += part.dropped
        out.segments += part.segments
        out.busy_replica_s += part.busy_replica_s
        out.sm_s += part.sm_s
        out.ongoing_s += part.ongoing_s
        out.backlog += part.backlog
        card_s += part.busy_replica_s * k.card_share
    return out, card_s
