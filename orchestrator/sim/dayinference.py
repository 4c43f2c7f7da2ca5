"""The inference services' side of the simulated day: replicas as leases, the scaling loop, the queue.

:class:`InferenceSide` is a part of :class:`~orchestrator.sim.dayrun.DayRun` and holds no state of its own:
it reads and writes the day's (set by ``DayRun.__init__``, annotated below) and asks the head through the
day's ``head``. What it models is described in :mod:`orchestrator.sim.dayrun` (**inference replicas**, **the
scaling loop**).

Invariants:

* every replica is one lease asked with the scheme's request in the service's class and queue, under the day's
  :data:`~orchestrator.sim.dayrecords.KEY`; it is in ``replicas`` and in its service's ``mine`` from its request
  until the autoscaler removes it (``_remove`` is the only place that drops one);
* ``serving[svc]`` counts the service's serving replicas by kind, with no zero entries; ``n_serving`` is their
  sum over the services and ``starting`` the replicas granted and not yet serving; ``replica_timeline`` gets
  an entry at every change of ``n_serving``;
* a scale-down withdraws pending requests first, then replicas starting, then serving ones, each time those on
  the largest share first (what a fallback took from training goes back first), then the newest;
* a step's inference busy time is each replica's busy time from :func:`orchestrator.sim.queueing.step` times
  its card share, so it never exceeds ``replicas x share x dt``.
"""

from __future__ import annotations

import math
from typing import Callable

from orchestrator.control.service import HeadService
from orchestrator.core.allocation import Allocation
from orchestrator.core.clock import ManualClock
from orchestrator.core.colocation import ServiceConfig
from orchestrator.core.lease import LeaseState
from orchestrator.core.request import GpuRequest
from orchestrator.scheduling.autoscale import LoadSample, ScalerState, decide, reachable_replicas, warm_spares
from orchestrator.scheduling.windows import surge_caps
from orchestrator.sim.curves import FastCurve
from orchestrator.sim.dayrecords import KEY, Replica, SchemeLike, SimParams, Tally, share_of
from orchestrator.sim.queueing import ReplicaKind, StepOut, step_mixed as queue_step_mixed


class InferenceSide:
    """The inference services' part of :class:`~orchestrator.sim.dayrun.DayRun`; see the module docstring."""

    # all set by DayRun.__init__
    head: HeadService
    clock: ManualClock
    scheme: SchemeLike
    cfg: ServiceConfig
    p: SimParams
    curve: FastCurve
    services: int
    digest: str
    seq: int
    changed: bool
    replicas: dict[str, Replica]
    mine: list[dict[str, Replica]]
    serving: list[dict[ReplicaKind, int]]
    starting: int
    n_serving: int
    replica_timeline: list[tuple[float, int]]
    scalers: list[ScalerState]
    backlog: list[float]
    ongoing: list[float]
    last_p99: list[float | None]
    last_sample: float
    ceiling: int | None
    warm: list[int]
    warm_coming: list[int]
    tally: Tally
    per_rep: float
    rep_acc: float
    _timer: Callable[..., None]  # DayRun's: (at, what, ident[, version])

    # ---- replicas -----------------------------------------------------------------------------------
    def _add(self, svc: int, n: int) -> None:
        for _ in range(n):
            self.seq += 1
            lid = f"svc{svc}-r{self.seq}"
            self.head.request_lease({"lease_id": lid, "request": self.scheme.inference_request, "owner": f"svc{svc}",
                                     "priority_class": self.cfg.priority_class, "queue": self.cfg.queue,
                                     "requester_digest": self.digest})
            self.replicas[lid] = self.mine[svc][lid] = Replica(lid, svc, self.seq)
        self.changed = self.changed or n > 0

    def _remove(self, svc: int, n: int) -> None:
        """Withdraw pending requests first, then the replicas starting, then those serving -- each time those on
        the largest share first (a fallback's MPS share or whole card, taken from training, goes back before a
        1g slice that nothing else asks for), then the newest."""
        order = {"pending": 0, "starting": 1, "serving": 2}
        for r in sorted(self.mine[svc].values(),
                        key=lambda r: (order[r.state], -(r.kind.card_share if r.kind else 0.0), -r.seq))[:n]:
            e = self.head.ctl.ledger.get(r.lease_id)
            token = None if e.lease.state is LeaseState.PENDING else e.lease.fencing_token
            self.head.release(r.lease_id, token, "the autoscaler removed the replica", key=KEY)
            if r.state in ("serving", "starting"):
                self.warm[svc] += 1  # its process stays started, model loaded: a warm spare if one is wanted
            if r.state == "serving":
                assert r.kind is not None
                self.serving[svc][r.kind] -= 1
                if not self.serving[svc][r.kind]:
                    del self.serving[svc][r.kind]
                self.n_serving -= 1
                self.replica_timeline.append((self.clock.monotonic(), self.n_serving))
            elif r.state == "starting":
                self.starting -= 1
            del self.replicas[r.lease_id], self.mine[svc][r.lease_id]
        self.changed = True

    def _replica_granted(self, r: Replica, a: Allocation, now: float) -> None:
        """``r``'s lease was granted (and activated) on ``a``: it starts, and serves ``replica_start_s`` later --
        ``warm_start_s`` when a warm spare process of its service attaches to the lease instead."""
        r.state, r.kind = "starting", ReplicaKind(share_of(a), self.p.inference, self.cfg.max_batch_size)
        self.starting += 1
        start = self.p.replica_start_s
        if self.warm[r.service] > 0:
            self.warm[r.service] -= 1
            start = min(start, self.p.warm_start_s)
            self.tally.warm_starts += 1
            self.tally.ready_saved_s += self.p.replica_start_s - start
            self._warm_refill(r.service, now)
        self._timer(now + start, "replica", r.lease_id)

    def _warm_refill(self, svc: int, now: float) -> None:
        """Keep the service's warm spares at what the autoscaler says (:func:`warm_spares`): stop those beyond
        it, start the missing ones (ready ``replica_start_s`` later; a timer ``warm`` of ident ``svc``)."""
        want = warm_spares(self.cfg.autoscale, self.scalers[svc]).count
        self.warm[svc] = min(self.warm[svc], want)
        missing = want - self.warm[svc] - self.warm_coming[svc]
        if missing > 0:
            self.warm_coming[svc] += missing
            self._timer(now + self.p.replica_start_s, "warm", str(svc), missing)

    def _warm_ready(self, svc: int, n: int, now: float) -> None:
        self.warm_coming[svc] -= n
        self.warm[svc] += n
        self._warm_refill(svc, now)

    def _replica_serving(self, r: Replica, now: float) -> None:
        r.state = "serving"
        self.starting -= 1
        assert r.kind is not None
        self.serving[r.service][r.kind] = self.serving[r.service].get(r.kind, 0) + 1
        self.n_serving += 1
        self.replica_timeline.append((now, self.n_serving))

    # ---- the scaling loop ---------------------------------------------------------------------------
    def _scale(self, now: float) -> None:
        span = max(1e-9, now - self.last_sample) if self.last_sample > -math.inf else 1.0
        ceiling = None if self.ceiling is None else math.ceil(self.ceiling / self.services)
        for svc in range(self.services):
            have = len(self.mine[svc])
            p99 = self.last_p99[svc]
            sample = LoadSample(now, sum(self.serving[svc].values()), self.ongoing[svc] / span,
                                None if p99 is None else 1000.0 * p99)
            d = decide(self.cfg.autoscale, self.scalers[svc], sample, ceiling=ceiling)
            self.scalers[svc] = d.state
            if d.replicas > have:
                self._add(svc, d.replicas - have)
            elif d.replicas < have:
                self._remove(svc, have - d.replicas)
            self.ongoing[svc] = 0.0
            self._warm_refill(svc, now)
        self.last_sample = now

    def _ceiling(self) -> None:
        """How many replicas of the service's request -- its whole fallback chain, in order -- the cluster's
        cards hold as laid out now, within the quota the time window in force gives the service's queue
        (:func:`~orchestrator.scheduling.autoscale.reachable_replicas`; None: a request the engine resolves):
        the scaling loop's ceiling, so it never asks for replicas that cannot be had. Made again at every
        relayout and window start. With a window whose quota follows the queue's demand (``surge_pct``), the quota
        counted is the surge cap: what the queue may reach when its load asks for it."""
        quota, _ = self.head.ctl.window().quotas.get(self.cfg.queue, (None, True))
        caps = surge_caps(self.head.ctl.sched_config, self.clock.time_of_day_s(), self.head.ctl.capacity_gpus())
        quota = caps.get(self.cfg.queue, quota)  # a quota that follows demand may reach its surge cap
        self.ceiling = reachable_replicas(GpuRequest.parse(self.scheme.inference_request),
                                          [g for r in self.head.ctl.nodes.registered() for g in r.inventory.gpus],
                                          quota_gpus=quota)

    # ---- the queue ----------------------------------------------------------------------------------
    def _serve(self, lam: float, dt: float, count: bool) -> tuple[float, float, float | None, float, float]:
        """Every service's queue over a step of ``dt`` at ``lam`` requests/s each. Returns the replicas' busy
        card-seconds, their SM-seconds, the worst service's p99 (inf where requests failed; None: nothing
        answered; counted steps only), the replicas serving and the cards they hold."""
        inf_busy = inf_sm = 0.0
        worst: float | None = None
        live = cards = 0.0
        for svc in range(self.services):
            kinds = self.serving[svc]  # several kinds when replicas fell back (1g slices, MPS shares, cards)
            out, busy_card_s = queue_step_mixed(kinds, lam, dt, self.backlog[svc], self.p.timeout_s)
            inf_busy += busy_card_s
            live += sum(kinds.values())
            cards += sum(c * k.card_share for k, c in kinds.items())
            self.backlog[svc] = out.backlog
            self.ongoing[svc] += out.ongoing_s
            p99 = out.quantile(0.99)
            self.last_p99[svc] = p99
            inf_sm += out.sm_s
            if count:
                self._count_requests(out)
                if out.dropped > 0:
                    p99 = math.inf  # requests failed: the service is not absorbing its load
                if p99 is not None:
                    worst = p99 if worst is None else max(worst, p99)
        return inf_busy, inf_sm, worst, live, cards

    def _count_requests(self, out: StepOut) -> None:
        slo_s = self.cfg.slo_p99_ms / 1000.0
        tl = self.tally
        tl.arrived += out.arrived
        tl.dropped += out.dropped
        tl.within += out.within(slo_s)
        for g in out.segments:
            self.rep_acc += g.answered / self.per_rep
            m = int(self.rep_acc)
            self.rep_acc -= m
            tl.reps.extend(g.quantile((j + 0.5) / m) for j in range(m))

