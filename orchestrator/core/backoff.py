"""One back-off policy: how long to wait before the next try after failures (or quiet polls) in a row.

Every retry loop of the project waits ``first_s``, then ``factor`` times longer each time, never longer
than ``max_s``: the job layer's resubmissions to Ray's job API, the group commit's writes to the GCS, the
wait for a lease's placement group, the SDK's job poll. Pure; the callers keep the count and the clock.
"""

from __future__ import annotations

#: Past this many tries every reasonable schedule has long reached its cap; the exponent stops here so a
#: count that keeps growing (a GCS away for days) never overflows a float.
_MAX_EXPONENT = 1000


def backoff_s(tries: int, first_s: float, max_s: float, factor: float = 2.0) -> float:
    """The wait after ``tries`` earlier waits in a row: ``first_s * factor ** tries``, at most ``max_s``.

    ``tries=0`` is the first wait. ``first_s``, ``max_s`` >= 0 and 1 <= ``factor`` <= 2 (the exponent is
    clamped at 1000, where any such schedule has reached its cap)."""
    return min(max_s, first_s * factor ** min(max(tries, 0), _MAX_EXPONENT))
