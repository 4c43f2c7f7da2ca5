"""Typed errors survive the trip through the head actor's replies."""

from __future__ import annotations

import pytest

from orchestrator.core import errors as E
from orchestrator.control.store import MemoryStore
from orchestrator.rayport.wire import answer, decode, encode, unwrap


@pytest.mark.parametrize("err", [
    E.InvalidRequestError("gpu.profile", "9g", ["1g.10gb"], detail="no such"),
    E.ConfigError("settings.agent_ttl_s", -1, "> 0"),
    E.IllegalTransitionError("lease", "released", "active"),
    E.UnknownObjectError("lease", "x"),
    E.StaleFencingTokenError("x", 1),
    E.LeaseTimeoutError("1x whole", 5.0, "no node fits"),
    E.CapacityError("does not fit"),
])
def test_round_trip(err: E.OrchestratorError) -> None:
    back = decode(encode(err))
    assert type(back) is type(err) and str(back) == str(err) and back.retryable == err.retryable


def test_answer_and_unwrap() -> None:
    assert unwrap(answer(lambda: 3)) == 3
    with pytest.raises(E.UnknownObjectError):
        unwrap(answer(lambda: (_ for _ in ()).throw(E.UnknownObjectError("lease", "y"))))


def test_memory_store_round_trips_json() -> None:
    s = MemoryStore()
    s.put("a/1", {"x": [1, 2]})
    s.put("b/1", 3)
    assert s.get("a/1") == {"x": [1, 2]} and s.keys("a/") == ["a/1"] and s.get("zz") is None
    s.delete("a/1")
    assert s.keys("a/") == []
