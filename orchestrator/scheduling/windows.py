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

Invariants: pure functions of their arguments; with no windows the config
comes back unchanged (the same object); at most one window is in force at
any time of day (the config refuses overlaps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from orchestrator.core.clock import DAY_S, format_hhmm
from orchestrator.core.priorities import QueueConfig, QueueOverride, SchedulerConfig, Window
from orchestrator.core.reasons import Cause, Reason


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


def effective_config(config: SchedulerConfig, time_of_day_s: float,
                     capacity_gpus: float) -> tuple[SchedulerConfig, Window | None]:
    """``config`` with the quotas of the window in force at ``time_of_day_s``, and that window (None: unchanged)."""
    w = window_at(config.windows, time_of_day_s)
    if w is None:
        return config, None
    queues = dict(config.queues)
    for name, o in w.queues.items():
        base = queues[name]
        queues[name] = QueueConfig(quota_gpus=quota_gpus(o, base, capacity_gpus),
                                   borrowing=base.borrowing if o.borrowing is None else o.borrowing)
    return config.model_copy(update={"queues": queues}), w


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


def window_status(config: SchedulerConfig, time_of_day_s: float, capacity_gpus: float) -> WindowStatus:
    """The window in force at ``time_of_day_s`` and the next change, with a ``window.*`` reason."""
    eff, w = effective_config(config, time_of_day_s, capacity_gpus)
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
        reason = Reason(Cause.WINDOW_ACTIVE, f"{format_hhmm(time_of_day_s)}: window {w.describe()} in force "
                                             f"({sets or 'no queue changed'}){when}")
    return WindowStatus(w, time_of_day_s % DAY_S, gap, after, quotas, reason)


def _quota_text(quota: float | None, borrowing: bool) -> str:
    q = "unlimited" if quota is None else f"quota {quota:g} GPUs"
    return f"{q}, " + ("borrows idle capacity" if borrowing else "capped")
