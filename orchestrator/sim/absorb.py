"""How long the services took to absorb each load spike, read from the day's p99 series.

Pure functions over plain numbers: no head, no clock. Invariants of :func:`spike_absorb`'s answer: one entry
per spike start, in the order given; ``absorb_s`` is ``None`` when the p99 never stayed under the SLO for
``settle_s`` within the series, else ``>= 0``, and ``0.0`` when it settled without going over first;
steps that end at or before a start do not count for it; a step with no answered request (p99 ``None``)
counts as under the SLO; times are rounded to 0.1 s.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence


def spike_absorb(p99s: Sequence[tuple[float, float | None]], starts: Sequence[float], slo_s: float,
                 settle_s: float) -> list[dict[str, Any]]:
    """For each spike start, seconds until the worst service's p99 is back under ``slo_s`` and stays there for
    ``settle_s`` (0 when it never went over; None when it never came back within the day). ``p99s`` is
    ``(step end, p99)`` per step; a step with no answered request does not break a settled stretch."""
    out = []
    for s in starts:
        over_seen = False
        ok_since: float | None = None
        absorbed: float | None = None
        prev_end = s
        for end, p99 in p99s:
            if end <= s:
                continue
            over = p99 is not None and p99 > slo_s
            if over:
                over_seen, ok_since = True, None
            elif ok_since is None:
                ok_since = prev_end
            prev_end = end
            if ok_since is not None and end - ok_since >= settle_s:
                absorbed = (ok_since - s) if over_seen else 0.0
                break
        out.append({"at_s": round(s, 1), "absorb_s": None if absorbed is None else round(absorbed, 1)})
    return out


def max_absorb(absorb: Sequence[Mapping[str, Any]]) -> float | None:
    """The longest absorb among the spikes that were absorbed (None: none was)."""
    vals = [a["absorb_s"] for a in absorb if a["absorb_s"] is not None]
    return max(vals) if vals else None
