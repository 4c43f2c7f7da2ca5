"""Time windows, pure: which window is in force at a time of day, and the scheduler config it makes.

A :class:`~orchestrator.core.priorities.Window` (``windows:`` in
``configs/priorities.yaml``) overrides queues' quotas and borrowing from
``start`` to ``end`` each day::

    windows:
      - {name: day, start: "08:00", end: "22:00",
         queues: {inference: {quota_pct: 60}, training: {quota_pct: 40, borrowing: false}}}
      - {name: night, start: "22:00", end: "08:00",
         queues: {inference: {quota_pct: 10}, training: {borrowing: true}}}

By day inference is guaranteed 60% of the cluster's GPUs (a request within
that share preempts what it must) and training is capped at 40% (a request
beyond it waits, cause ``wait.window``); by night inference keeps a 10% floor
(beyond it, it only borrows idle cards) and training may take everything else.

:func:`effective_config` is the one function the head calls each cycle with
its injected clock's time of day and the cluster's GPU capacity; a
``quota_pct`` becomes ``quota_gpus = pct x capacity / 100`` then, so a
cluster that grows or shrinks changes the guarantee with it. Nothing here
preempts by itself: the scheduling cycle does, through the usual
checkpoint-and-yield path, when a queue within its (new) quota needs room.

**A guarantee that yields to load** (``surge_pct``). The clock's guarantee
is a forecast; the load may not follow it (a night that peaks, a spike at
dawn). A queue override with ``surge_pct`` has its quota follow the queue's
*demand* -- the GPUs its leases hold plus what its pending requests may take
(each at its largest choice, its fallback's included: :func:`queue_demand`),
rounded up to a whole GPU -- when that is above the clock's quota, up to
``surge_pct`` of the capacity. The demand is what the queue's own
autoscaler asked for from measured load, so the quota grows only while
replicas are wanted and shrinks back as they go; within it the queue's
requests may preempt lower priorities (training checkpoints and yields, the
usual path: no steps lost). Cause ``window.surge`` says which queue surged,
to what and why.

Invariants: pure functions of their arguments; with no windows the config
comes back unchanged (the same object); at most one window is in force at
any time of day (the config refuses overlaps); a surged quota is never below
the clock's nor above ``surge_pct`` of the capacity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from orchestrator.core.clock import DAY_S, format_hhmm
from orchestrator.core.lease import Lease
from orchestrator.core.priorities import QueueConfig, QueueOverride, SchedulerConfig, Window
from orchestrator.core.reasons import Cause, Reason
from orchestrator.scheduling.preemption import queue_usage


def window_at(windows: Sequence[Window], time_of_day_s: float) -> Window | None:
    """The window in force at ``time_of_day_s``, or None."""
    return next((w for w in windows if w.contains(time_of_day_s)), None)


def next_change(windows: Sequence[Window], time_of_day_s: float) -> tuple[float, Window | None] | None:
    """``(seconds until the window in force next changes, the window in force after it)``; None without windows."""
    if not windows:
        return None
    t = time_of_day_s % DAY_S
    now = window_at(windows, t)
    edges = sorted({w.start_s % DAY_S for w in windows} | {w.end_s % DAY_S for w in windows})
    for gap in sorted(((e - t) % DAY_S) or DAY_S for e in edges):
        after = window_at(windows, t + gap)
        if after is not now:
            return gap, after
    return None  # one window the whole day round: it never changes


def quota_gpus(override: QueueOverride, base: QueueConfig, capacity_gpus: float) -> float | None:
    """The quota a window sets: its GPUs, or its percent of ``capacity_gpus``; else the configured one."""
    if override.quota_gpus is not None:
        return override.quota_gpus
    if override.quota_pct is not None:
        return round(override.quota_pct * capacity_gpus / 100.0, 6)
    return base.quota_gpus


def surges(config: SchedulerConfig) -> bool:
    """Whether any window lets a queue's quota follow its demand (``surge_pct``): the head then passes demand."""
    return any(o.surge_pct is not None for w in config.windows for o in w.queues.values())


def queue_demand(holding: Iterable[Lease], pending: Iterable[Lease]) -> dict[str, float]:
    """GPUs per queue: what its holding leases take plus what its pending requests may take, each at its
    largest choice (a fallback to a whole card counts a card): the demand a surging quota follows."""
    out = dict(queue_usage(holding))
    for lease in pending:
        out[lease.queue] = out.get(lease.queue, 0.0) + max(c.gpu_demand for c in lease.request.choices)
    return out


def surged_quota(override: QueueOverride, clock_quota: float | None, capacity_gpus: float,
                 demand_gpus: float) -> float | None:
    """The quota with ``override``'s surge: ``min(surge cap, max(clock quota, ceil(demand)))``; the clock's
    quota when the override has no ``surge_pct`` or the queue is unlimited (None)."""
    if override.surge_pct is None or clock_quota is None:
        return clock_quota
    cap = round(override.surge_pct * capacity_gpus / 100.0, 6)
    return max(clock_quota, min(cap, float(math.ceil(demand_gpus - 1e-9))))


def effective_config(config: SchedulerConfig, time_of_day_s: float, capacity_gpus: float,
                     demand: Mapping[str, float] | None = None) -> tuple[SchedulerConfig, Window | None]:
    """``config`` with the quotas of the window in force at ``time_of_day_s``, and that window (None: unchanged).
    ``demand`` (GPUs per queue, :func:`queue_demand`): a ``surge_pct`` queue's quota follows it."""
    w = window_at(config.windows, time_of_day_s)
    if w is None:
        return config, None
    queues = dict(config.queues)
    for name, o in w.queues.items():
        base = queues[name]
        q = quota_gpus(o, base, capacity_gpus)
        if demand is not None:
            q = surged_quota(o, q, capacity_gpus, demand.get(name, 0.0))
        queues[name] = QueueConfig(quota_gpus=q, borrowing=base.borrowing if o.borrowing is None else o.borrowing)
    return config.model_copy(update={"queues": queues}), w


def surge_caps(config: SchedulerConfig, time_of_day_s: float, capacity_gpus: float) -> dict[str, float]:
    """The most each surging queue's quota may reach in the window in force (GPUs): what a scaling loop may
    ask for when its load needs it."""
    w = window_at(config.windows, time_of_day_s)
    return {} if w is None else {q: round(o.surge_pct * capacity_gpus / 100.0, 6)
                                  for q, o in w.queues.items() if o.surge_pct is not None}


@dataclass(frozen=True)
class WindowStatus:
    """What the head shows: the window in force (None: the configured quotas), when it next changes
    and to what, the quotas it sets, and the reason."""

    window: Window | None
    time_of_day_s: float
    next_change_in_s: float | None
    next_window: Window | None
    quotas: dict[str, tuple[float | None, bool]]
    reason: Reason

    def to_json(self) -> dict[str, Any]:
        # By hand: times of day as HH:MM, the next change and the quotas computed from several fields.
        nxt = None
        if self.next_change_in_s is not None:
            nxt = {"at": format_hhmm(self.time_of_day_s + self.next_change_in_s),
                   "in_s": round(self.next_change_in_s, 3),
                   "window": self.next_window.name if self.next_window else None}
        return {"window": self.window.name if self.window else None, "time_of_day": format_hhmm(self.time_of_day_s),
                "next_change": nxt,
                "quotas": {q: {"quota_gpus": g, "borrowing": b} for q, (g, b) in sorted(self.quotas.items())},
                **self.reason.fields()}


def window_status(config: SchedulerConfig, time_of_day_s: float, capacity_gpus: float,
                  demand: Mapping[str, float] | None = None) -> WindowStatus:
    """The window in force at ``time_of_day_s`` and the next change, with a ``window.*`` reason (``window.surge``
    when ``demand`` raised a queue's quota above the clock's)."""
    eff, w = effective_config(config, time_of_day_s, capacity_gpus, demand)
    clock, _ = effective_config(config, time_of_day_s, capacity_gpus)
    nc = next_change(config.windows, time_of_day_s)
    gap, after = nc if nc is not None else (None, None)
    quotas = {q: (eff.queues[q].quota_gpus, eff.queues[q].borrowing) for q in (w.queues if w else ())}
    when = "" if gap is None else f"; next change at {format_hhmm(time_of_day_s + gap)} to " + (
        f"window {after.name}" if after else "the configured quotas")
    if w is None:
        reason = Reason(Cause.WINDOW_NONE, f"{format_hhmm(time_of_day_s)}: no time window in force, the "
                                           f"configured quotas hold{when}")
    else:
        sets = ", ".join(f"{q} {_quota_text(g, b)}" for q, (g, b) in sorted(quotas.items()))
        up = {q: (clock.queues[q].quota_gpus, g) for q, (g, _) in quotas.items() if g != clock.queues[q].quota_gpus}
        surged = "; ".join(f"{q}'s demand {(demand or {}).get(q, 0.0):g} GPUs raised its quota from the clock's "
                           f"{c:g} to {g:g} (surge_pct {w.queues[q].surge_pct:g})" for q, (c, g) in sorted(up.items()))
        reason = Reason(Cause.WINDOW_SURGE if up else Cause.WINDOW_ACTIVE,
                        f"{format_hhmm(time_of_day_s)}: window {w.describe()} in force "
                        f"({sets or 'no queue changed'}){'; ' + surged if surged else ''}{when}")
    return WindowStatus(w, time_of_day_s % DAY_S, gap, after, quotas, reason)


def _quota_text(quota: float | None, borrowing: bool) -> str:
    q = "unlimited" if quota is None else f"quota {quota:g} GPUs"
    return f"{q}, " + ("borrows idle capacity" if borrowing else "capped")
