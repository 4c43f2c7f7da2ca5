"""The one back-off policy every retry loop uses."""

from __future__ import annotations

import pytest

from orchestrator.control.jobs import _Retry
from orchestrator.core.backoff import backoff_s


def test_doubles_from_the_first_wait_up_to_the_cap() -> None:
    assert [backoff_s(n, 1.0, 30.0) for n in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert [backoff_s(n, 0.02, 0.05) for n in range(3)] == [0.02, 0.04, 0.05]


def test_another_factor_and_a_first_wait_above_the_cap() -> None:
    assert [backoff_s(n, 0.5, 2.0, 1.5) for n in range(5)] == [0.5, 0.75, 1.125, 1.6875, 2.0]
    assert backoff_s(0, 5.0, 2.0) == 2.0


@pytest.mark.parametrize("tries", [10_000, 10**9])
def test_a_long_run_of_failures_stays_at_the_cap(tries: int) -> None:
    assert backoff_s(tries, 0.05, 2.0) == 2.0


def test_the_job_layer_resubmits_after_one_two_four_seconds_counted_from_the_first() -> None:
    r = _Retry.after(None, 100.0)
    assert (r.first, r.due, r.tries) == (100.0, 101.0, 1)
    r = _Retry.after(r, 101.0)
    assert (r.first, r.due, r.tries) == (100.0, 103.0, 2)
    r = _Retry.after(r, 103.0)
    assert r.due == 107.0
