"""Nothing a client sends can crash or wedge the head: its public methods fuzzed through the real actor.

One head actor on the module's real 3-node Ray cluster holds a granted lease.
Hypothesis then calls every method of ``HeadApi`` (``HEAD_METHODS``) on the raw
actor handle with malformed arguments: wrong types, wrong counts, unknown
keyword arguments, NaN and huge numbers, ids of nothing, strings where lists
belong. Every answer must be the wire envelope (``{"ok": ...}`` or a typed
``{"error": ...}``, an ``InvalidRequestError`` naming a field); no exception may
escape the actor and no call may hang. Afterwards the same actor process still
answers, still holds the lease with its fencing token, and still grants a new
one (its scheduling loop is not wedged by anything it accepted).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from orchestrator.core import errors as E
from orchestrator.core.api import BATCHED, HEAD_METHODS
from orchestrator.core.config import RuntimeSettings
from orchestrator.core.lease import key_digest

from tests.integration.heads import running_head

pytestmark = pytest.mark.ray

SETTINGS = RuntimeSettings(namespace="rgo-fuzz", head_name="rgo-fuzz-head", heartbeat_interval_s=0.5, agent_ttl_s=6.0,
                           reconcile_interval_s=0.1)
KEEP, KEY = "keep-9f4e2c71", "fuzz-secret-key"  # no fuzzed string is ever these
EXAMPLES = 200

scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=10) | st.sampled_from(["", "a100-0", "h100-0", "lease-x", "job-x", "1", "mig:9g",
                                                    "http://x", "pid:1", "actor:ns/x"]))
values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                      max_leaves=6)
calls = st.tuples(st.sampled_from(HEAD_METHODS), st.lists(values, max_size=5),
                  st.dictionaries(st.sampled_from(["timeout", "key", "token", "holder", "reason", "bogus", "inventory",
                                                   "allocated", "utilization", "ttl_s", "slo_s"]), values, max_size=2))

#: What ``call_many`` is sent: well-formed batches of BATCHED calls with malformed arguments, batches with malformed
#: calls (other methods, junk in any place), and junk instead of a batch.
_kwargs = st.dictionaries(st.sampled_from(["key", "token", "holder", "reason", "bogus"]), values, max_size=2)
good_items = st.tuples(st.sampled_from(sorted(BATCHED)), st.lists(values, max_size=4), _kwargs).map(list)
bad_items = st.tuples(st.sampled_from(sorted(BATCHED)) | st.sampled_from(["wait_lease", "status", "nope"]) | scalars,
                      st.lists(values, max_size=4) | scalars, _kwargs | scalars).map(list)
batches = st.lists(good_items, min_size=1, max_size=6) | st.lists(bad_items | values, max_size=6) | values


@pytest.fixture(scope="module")
def head(ray_cluster: Any) -> Iterator[Any]:
    with running_head(SETTINGS, ray_cluster.config) as handle:
        yield handle


def _call(handle: Any, method: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    import ray

    got = ray.get(getattr(handle, method).remote(*args, **kwargs), timeout=30)
    if isinstance(got, bytes):  # call_many answers in the channel's encoding, JSON
        import orjson

        return orjson.loads(got)  # type: ignore[no-any-return]
    return got  # type: ignore[no-any-return]


def _ok(reply: dict[str, Any]) -> Any:
    assert "ok" in reply, reply
    return reply["ok"]


def _checked(method: str, args: list[Any], kwargs: dict[str, Any], reply: Any) -> None:
    """The envelope, and a typed error that says what was wrong."""
    assert isinstance(reply, dict) and set(reply) in ({"ok"}, {"error"}), (method, args, kwargs, reply)
    if "error" in reply:
        err = E.OrchestratorError if reply["error"]["type"] not in dir(E) else getattr(E, reply["error"]["type"])
        assert issubclass(err, E.OrchestratorError), reply
        if issubclass(err, E.InvalidRequestError):
            assert reply["error"]["fields"]["field"], reply


def test_malformed_calls_get_typed_answers_and_the_head_keeps_its_lease(head: Any) -> None:
    import ray

    _ok(_call(head, "request_lease", {"lease_id": KEEP, "request": "1", "requester_digest": key_digest(KEY)}))
    granted = _ok(_call(head, "wait_lease", KEEP, 30.0, KEY))
    assert granted["state"] == "granted" and granted["fencing_token"] >= 1
    before = _ok(_call(head, "ping"))
    started = time.monotonic()
    seen: set[str] = set()

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(calls)
    def fuzz(call: tuple[str, list[Any], dict[str, Any]]) -> None:
        method, args, kwargs = call
        waits = method in ("wait_lease", "acquire_lease")
        if waits and args[1:2] and isinstance(args[1], (int, float)) and not isinstance(args[1], bool) \
                and math.isfinite(args[1]) and args[1] > 1:
            args[1] = 1.0  # a valid wait is a wait: keep it short
        kwargs.pop("timeout", None) if waits else None
        try:
            ref = getattr(head, method).remote(*args, **kwargs)
        except TypeError:  # the actor's own methods have real signatures: Ray refuses the call before sending it
            assert waits or method == "job_logs", (method, args, kwargs)
            return
        try:
            reply = ray.get(ref, timeout=30)
        except ray.exceptions.RayTaskError as e:  # an exception escaped the actor's envelope
            pytest.fail(f"{method}{tuple(args)} {kwargs}: untyped {e}")
        _checked(method, args, kwargs, reply)
        seen.add(method)

    fuzz()
    took = time.monotonic() - started
    print(f"\n{EXAMPLES} fuzzed calls over {len(seen)} methods in {took:.1f}s")
    after = _ok(_call(head, "ping"))
    assert (after["pid"], after["started_at"]) == (before["pid"], before["started_at"]), "the head restarted"
    kept = _ok(_call(head, "get_lease", KEEP, KEY))
    assert kept["state"] == "granted" and kept["fencing_token"] == granted["fencing_token"]
    # Not wedged: the loop still schedules what it is asked.
    _ok(_call(head, "request_lease", {"lease_id": "after-fuzz", "request": "timeslice:0.1"}))
    assert _ok(_call(head, "wait_lease", "after-fuzz", 30.0))["state"] == "granted"
    assert len(_ok(_call(head, "status"))["nodes"]) == 3


def test_a_second_driver_learns_no_token_from_a_refusal_and_cannot_make_the_head_its_workload(head: Any) -> None:
    # Issue #38's attacks, from a driver that is not the lease's requester (this test process, holding no key):
    # "steal a lease in two calls" (the refusal carried the real token) and "kill the head in three calls" (a
    # lease of one's own, activated with the head as its workload, then preempted: the agent ray.killed it).
    _ok(_call(head, "request_lease", {"lease_id": "honest", "request": "timeslice:0.1",
                                      "requester_digest": key_digest(KEY)}))
    honest = _ok(_call(head, "wait_lease", "honest", 30.0, KEY))
    token = honest["fencing_token"]
    for guess in (0, token + 1):
        for key, refusal in ((None, "PermissionDeniedError"), ("guessed-key", "PermissionDeniedError"),
                             (KEY, "StaleFencingTokenError")):  # without the key, refused before any token is read
            refused = _call(head, "release", "honest", guess, "stolen", key)
            assert refused["error"]["type"] == refusal, refused
            assert token not in refused["error"]["fields"].values(), refused
            assert str(token) not in refused["error"]["message"].replace(f"fencing token {guess}", ""), refused
    before = _ok(_call(head, "ping"))
    mine, my_key = "attacker", "attacker-key"
    _ok(_call(head, "request_lease", {"lease_id": mine, "request": "timeslice:0.1", "requester_digest": key_digest(my_key)}))
    my_token = _ok(_call(head, "wait_lease", mine, 30.0, my_key))["fencing_token"]
    for target in (SETTINGS.head_name, "rgo-agent-a100-0"):
        reply = _call(head, "activate", mine, my_token, None, f"actor:{SETTINGS.namespace}/{target}", my_key)
        assert reply["error"]["type"] == "InvalidRequestError" and reply["error"]["fields"]["field"] == "workload", reply
    after = _ok(_call(head, "ping"))
    assert (after["pid"], after["started_at"]) == (before["pid"], before["started_at"])
    kept = _ok(_call(head, "get_lease", "honest", KEY))
    assert kept["state"] == "granted" and kept["fencing_token"] == token
    _ok(_call(head, "release", mine, my_token, "done", my_key))
    _ok(_call(head, "release", "honest", token, "done", KEY))


def test_malformed_batches_get_typed_answers_each_call_its_own(head: Any) -> None:
    # call_many (the client's threads' calls sent together): the batch is refused whole, naming the malformed
    # call's field, or each call is answered with its own envelope -- and the head keeps what it held.
    import ray

    _ok(_call(head, "request_lease", {"lease_id": "keep-batch", "request": "1", "requester_digest": key_digest(KEY)}))
    granted = _ok(_call(head, "wait_lease", "keep-batch", 30.0, KEY))
    before = _ok(_call(head, "ping"))
    answered = 0

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(batches)
    @example(-(2**63) - 1)  # past 64 bits: its refusal names it, and orjson cannot write it (the answer still comes)
    @example([-(2**63) - 1])
    def fuzz(batch: Any) -> None:
        nonlocal answered
        try:
            reply = _call(head, "call_many", batch)
        except ray.exceptions.RayTaskError as e:
            pytest.fail(f"call_many({batch!r}): untyped {e}")
        _checked("call_many", [batch], {}, reply)
        if "error" in reply:
            assert reply["error"]["fields"]["field"].startswith("calls"), reply
            return
        assert isinstance(batch, list) and len(reply["ok"]) == len(batch), (batch, reply)
        for (method, args, kwargs), one in zip(batch, reply["ok"]):
            _checked(method, args, kwargs, one)
            answered += 1

    fuzz()
    print(f"\n{answered} calls answered one by one inside fuzzed batches")
    assert answered >= EXAMPLES // 4  # most well-formed batches were answered call by call
    after = _ok(_call(head, "ping"))
    assert (after["pid"], after["started_at"]) == (before["pid"], before["started_at"]), "the head restarted"
    kept = _ok(_call(head, "get_lease", "keep-batch", KEY))
    assert kept["state"] == "granted" and kept["fencing_token"] == granted["fencing_token"]
    # A well-formed batch: each call answered as its own call is.
    ok, refused, unknown = _ok(_call(head, "call_many", [
        ["get_lease", ["keep-batch", KEY], {}], ["release", ["no-such-lease"], {"token": "x"}],
        ["get_job", ["no-such-job"], {}]]))
    assert ok == _call(head, "get_lease", "keep-batch", KEY)
    assert refused["error"]["type"] == "InvalidRequestError" and refused["error"]["fields"]["field"] == "token"
    assert unknown == _call(head, "get_job", "no-such-job") and unknown["error"]["type"] == "UnknownObjectError"


def _endpoint(head: Any) -> Any:
    from orchestrator.rayport.channel import Endpoint

    return Endpoint.from_json(_ok(_call(head, "direct_endpoint")))


def test_the_channel_answers_fuzzed_batches_as_call_many_does_and_refuses_junk(head: Any) -> None:
    # The same batches over the head's channel (rayport/channel.py, gRPC): each answered as call_many answers it,
    # a malformed one refused alone; junk bodies are refused naming the request, a wrong token runs nothing; the
    # head keeps its pid, its lease, and its channel.
    import grpc
    import orjson

    from orchestrator.rayport import channel as ch
    from orchestrator.rayport.channel import Channel, ChannelBroken, Endpoint

    _ok(_call(head, "request_lease", {"lease_id": "keep-direct", "request": "1", "requester_digest": key_digest(KEY)}))
    granted = _ok(_call(head, "wait_lease", "keep-direct", 30.0, KEY))
    before = _ok(_call(head, "ping"))
    endpoint = _endpoint(head)
    assert endpoint.host == "127.0.0.1" and endpoint.cert_pem is None  # loopback: plaintext
    conn = Channel(endpoint, 5)
    raw = grpc.insecure_channel(f"{endpoint.host}:{endpoint.port}")
    stream = raw.stream_stream(ch.METHOD)
    auth = (("authorization", f"Bearer {endpoint.token}"),)
    answered = 0

    @settings(max_examples=EXAMPLES // 2, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(batches, st.binary(max_size=48))
    def fuzz(batch: Any, junk: bytes) -> None:
        nonlocal answered
        try:
            reply = conn.call(batch, 30)
        except TypeError:  # not JSON (an integer past 64 bits): the client sends it to the actor instead
            return
        _checked("direct", [batch], {}, reply)
        if "error" in reply:
            assert reply["error"]["fields"]["field"].startswith("calls"), reply
        else:
            assert len(reply["ok"]) == len(batch)
            answered += len(batch)
        for answers in stream(iter([junk]), timeout=30, metadata=auth):  # junk is answered, never a hang
            for got in orjson.loads(answers):
                assert "error" in got["reply"] or "ok" in got["reply"], got

    fuzz()
    assert answered >= EXAMPLES // 10 and conn.broken is None
    with pytest.raises(ChannelBroken, match="UNAUTHENTICATED"):
        Channel(Endpoint(endpoint.host, endpoint.port, "wrong-" + "x" * 20), 5).call(
            [["release", ["keep-direct", granted["fencing_token"]], {}]], 5)
    assert _ok(_call(head, "get_lease", "keep-direct", KEY))["state"] == "granted"  # the refused call ran nothing
    # Batches sent together from several threads: each answered with its own calls' answers, the malformed one alone.
    from concurrent.futures import ThreadPoolExecutor

    frames = [[["get_lease", ["keep-direct", KEY], {}]], [["wait_lease", ["keep-direct", 1.0], {}]],
              [["get_job", ["no-such-job"], {}]]] * 4
    with ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(lambda f: conn.call(f, 30), frames))
    for f, reply in zip(frames, replies):
        if f[0][0] == "wait_lease":
            assert reply["error"]["fields"]["field"] == "calls[0].method", reply
        else:
            assert reply["ok"] == _ok(_call(head, "call_many", f)), reply
    raw.close()
    conn.close()
    after = _ok(_call(head, "ping"))
    assert (after["pid"], after["started_at"]) == (before["pid"], before["started_at"]), "the head restarted"
    kept = _ok(_call(head, "get_lease", "keep-direct", KEY))
    assert kept["state"] == "granted" and kept["fencing_token"] == granted["fencing_token"]
    assert _endpoint(head) == endpoint
