"""The head's supervisor (``python -m orchestrator.deploy.kuberay head --supervise S``, the orchestrator-head
sidecar's command): when it exits and when it must not. Its real run, killing the head and starting it
again, is in tests/integration/test_gcs_fault_tolerance.py."""

from __future__ import annotations

import threading
from typing import Callable, Iterator

import pytest

from orchestrator.core.errors import ConfigError
from orchestrator.deploy.k8s.config import HeadSpec, parse_config
from orchestrator.deploy.kuberay import LOST_AFTER, supervise_head


def _answers(*seq: object) -> tuple[Callable[[], bool], threading.Event]:
    """A head look that gives ``seq`` in turn (an exception is raised), then stops the supervisor."""
    stop = threading.Event()
    it: Iterator[object] = iter(seq)

    def look() -> bool:
        try:
            got = next(it)
        except StopIteration:
            stop.set()
            return True
        if isinstance(got, BaseException):
            raise got
        return bool(got)
    return look, stop


def test_the_head_is_lost_only_after_lost_after_answers_in_a_row() -> None:
    look, stop = _answers(*([False] * (LOST_AFTER - 1)), True, *([False] * LOST_AFTER))
    assert supervise_head(look, 0, stop) is True
    look, stop = _answers(*([False] * (LOST_AFTER - 1)), True, *([False] * (LOST_AFTER - 1)))
    assert supervise_head(look, 0, stop) is False  # never LOST_AFTER in a row: stopped, not lost


def test_no_answer_from_the_gcs_is_not_a_lost_head() -> None:
    # A GCS restarting under fault tolerance raises for a while: the sidecar must not restart for that.
    look, stop = _answers(*([ConnectionError("GCS away")] * (5 * LOST_AFTER)))
    assert supervise_head(look, 0, stop) is False
    look, stop = _answers(False, ConnectionError("GCS away"), *([False] * (LOST_AFTER - 1)))
    assert supervise_head(look, 0, stop) is True  # an error neither resets nor adds to the count


def test_the_head_command_must_be_the_supervisor() -> None:
    assert "--supervise" in HeadSpec().command
    with pytest.raises(ConfigError) as e:
        parse_config({"pools": [{"name": "c", "sharing": "cpu"}],
                      "head": {"command": ["python", "-m", "orchestrator.deploy.kuberay", "head"]}})
    assert e.value.field == "head.command" and "--supervise" in str(e.value)
