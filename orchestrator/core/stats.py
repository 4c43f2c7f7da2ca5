"""The percentiles the benches, the scenarios and the live page report, computed one way (pure Python: core
imports no numpy)."""

from __future__ import annotations

import math
from typing import Iterable


def quantile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-quantile (``q`` in 0..1) of ``values``, interpolated linearly between the two closest ranks
    (numpy's default method); None when there are no values."""
    xs = sorted(float(v) for v in values)
    if not xs:
        return None
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be within 0..1, not {q}")
    pos = q * (len(xs) - 1)
    i = int(math.floor(pos))
    j = min(i + 1, len(xs) - 1)
    return xs[i] + (xs[j] - xs[i]) * (pos - i)


def rounded_quantile(values: Iterable[float], q: float, digits: int = 3) -> float | None:
    """:func:`quantile`, rounded to ``digits`` decimals, as the figures print it."""
    v = quantile(values, q)
    return None if v is None else round(v, digits)
