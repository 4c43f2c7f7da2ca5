"""The one percentile the benches, the scenarios and the live page report (``orchestrator.core.stats``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core.stats import quantile, rounded_quantile


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=60), st.floats(0.0, 1.0))
def test_quantile_is_numpys_linear_percentile(xs: list[float], q: float) -> None:
    assert quantile(xs, q) == pytest.approx(float(np.percentile(np.array(xs), 100 * q)), rel=1e-9, abs=1e-6)


def test_edges() -> None:
    assert quantile([], 0.5) is None and rounded_quantile([], 0.99) is None
    assert quantile([3.0], 0.99) == 3.0
    assert quantile([1, 2, 3, 4], 0.5) == 2.5 and rounded_quantile([0.1234567, 0.2], 0.0) == 0.123
    with pytest.raises(ValueError, match="0..1"):
        quantile([1.0], 50)  # a percent, not a fraction: refused rather than read past the end
