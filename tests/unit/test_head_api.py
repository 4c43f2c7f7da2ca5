"""The head's API is declared once (core.api.HeadApi); the service, the actor and the client all follow it."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from orchestrator.control.service import HeadService
from orchestrator.control.edge import check_args, check_batch
from orchestrator.core.api import BATCHED, HEAD_METHODS, MAX_BATCH_CALLS, HeadApi
from orchestrator.core.errors import InvalidRequestError
from orchestrator.rayport.client import CALL_TIMEOUT_S, WAITING, HeadClient
from orchestrator.rayport.head import HeadActor


def _params(fn: object) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]  # type: ignore[arg-type]


def test_the_declaration_lists_every_method() -> None:
    assert {"request_lease", "wait_lease", "submit_job", "explain_lease", "heartbeat", "status"} <= set(HEAD_METHODS)
    assert len(HEAD_METHODS) == len(set(HEAD_METHODS))


@pytest.mark.parametrize("name", HEAD_METHODS)
def test_the_service_implements_each_method_with_the_declared_parameters(name: str) -> None:
    assert name in HeadService.__dict__, f"HeadService lacks {name}"
    assert _params(HeadService.__dict__[name]) == _params(getattr(HeadApi, name))


@pytest.mark.parametrize("name", HEAD_METHODS)
def test_the_actor_answers_each_method_asynchronously(name: str) -> None:
    method = getattr(HeadActor, name, None)
    assert method is not None and inspect.iscoroutinefunction(method), f"HeadActor.{name} is not an async method"


@pytest.mark.parametrize("name", HEAD_METHODS)
def test_the_client_calls_each_method_with_the_declared_signature(name: str) -> None:
    method = HeadClient.__dict__[name]
    assert method is not HeadApi.__dict__[name]
    assert _params(method) == _params(getattr(HeadApi, name))


def test_nothing_answers_a_method_the_declaration_lacks() -> None:
    # dir(), not __dict__: HeadService is service.py's class with the job and cluster mixins, and a method a mixin
    # adds answers as much as one of the class's own
    public = {n for n in dir(HeadService) if callable(getattr(HeadService, n)) and not n.startswith("_")}
    helpers = {"cycle", "cycle_safely", "lease_settled", "lease_timeout", "agent_work", "grant_now",
               "activate_settled", "take_submissions", "send_submission", "submission_sent", "job_log_source",
               "read_job_log", "take_chores", "send_chore", "chore_done", "request_lease_now", "begin", "plan_begun",
               "launch_due", "loop_due", "caller", "check_lease_key", "check_job_owner", "autoscaler_demand"}
    # (the service's own, used by the actor and in-process)
    assert public - helpers == set(HEAD_METHODS)


@pytest.mark.parametrize("name", sorted(WAITING))
def test_a_call_that_waits_on_the_head_gets_its_wait_plus_the_call_timeout(name: str) -> None:
    # acquire_lease waited only the 60 s call timeout: a training backlog asking with a day's timeout
    # got GetTimeoutError from its own client while the head was still (correctly) holding it in the queue.
    seen: list[float | None] = []

    class Recording(HeadClient):
        def call(self, method: str, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
            seen.append(timeout)
            return {}

    client = Recording(handle=object())
    args = {"wait_lease": ("l-1", 500.0), "acquire_lease": ({"lease_id": "l-1"}, 500.0)}[name]
    getattr(client, name)(*args)
    assert seen == [CALL_TIMEOUT_S + 500.0]
    client.get_lease("l-1")
    assert seen[-1] == CALL_TIMEOUT_S


def test_the_batched_methods_are_declared_quick_ones() -> None:
    # call_many holds the head's loop for its whole batch: nothing in it may wait on the head or call out of it.
    assert BATCHED <= set(HEAD_METHODS)
    assert not BATCHED & WAITING
    assert not BATCHED & {"cancel_job", "job_logs", "list_jobs", "status", "heartbeat"}


@pytest.mark.parametrize(("calls", "field"), [
    ("submit_job", "calls"),
    ([["submit_job", [], {}]] * (MAX_BATCH_CALLS + 1), "calls"),
    ([["get_job", ["a"], {}], ["get_job", ["b"]]], "calls[1]"),
    ([["wait_lease", ["a", 1.0], {}]], "calls[0].method"),
    ([[7, [], {}]], "calls[0].method"),
    ([["get_job", "a", {}]], "calls[0].args"),
    ([["get_job", ["a"], {1: 2}]], "calls[0].kwargs"),
])
def test_a_malformed_batch_is_refused_naming_the_call_and_field(calls: Any, field: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        check_batch(calls)
    assert e.value.field == field


def test_a_wellformed_batch_is_read_as_triples() -> None:
    assert check_batch([("get_job", ("a",), {}), ["release", ["l"], {"token": 3}]]) == [
        ("get_job", ["a"], {}), ("release", ["l"], {"token": 3})]


@pytest.mark.parametrize("method, args", [
    ("get_job", ("../../api/jobs/",)), ("cancel_job", ("a/b",)), ("job_logs", ("x?y=1",)),
    ("get_lease", ("a b",)), ("release", ("-x", 1)), ("submit_job", ({"name": "x", "entrypoint": "true"}, "e/..%2F")),
    ("explain_job", ("x" * 129,)),
])
def test_a_lease_or_job_id_outside_the_one_pattern_is_refused_at_the_edge(method: str, args: tuple) -> None:
    # Issue #38: a job id reached Ray's job API inside a URL unchecked. One pattern (core.ids.ID_PATTERN) for every
    # parameter that names a lease or a job.
    with pytest.raises(InvalidRequestError) as e:
        check_args(method, args, {})
    assert e.value.field in ("job_id", "lease_id"), e.value


def test_ids_the_head_makes_pass_the_edge() -> None:
    for ident in ("train-1", "train-1.a2", "ray-02000000-123-4", "gang-7-w0", "lease-3f2a", "ns:x_y"):
        check_args("get_job", (ident,), {})
        check_args("get_lease", (ident,), {})
