"""The head's channel (``orchestrator/rayport/channel.py``: gRPC) over real loopback connections, without Ray: the
server on an event loop in a thread of its own, as the head actor's loop serves it, with ``handle`` and ``durable``
standing in for ``HeadActor._answer_batches`` and the group commit (the seam the actor fills). The real head serves
it in ``tests/integration/test_fuzz_head.py``, ``test_load.py`` and ``test_runtime.py``."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import grpc
import orjson
import pytest

from orchestrator.rayport import channel as ch
from orchestrator.rayport.channel import Channel, ChannelBroken, Endpoint, HeadChannel

TOKEN = "s3cret-token-for-tests"


class Recorder:
    """``handle``: each batch's calls answered with themselves; every drain kept, in order."""

    def __init__(self) -> None:
        self.drains: list[list[Any]] = []

    def __call__(self, batches: list[Any]) -> list[dict[str, Any]]:
        self.drains.append(list(batches))
        return [{"ok": [{"ok": c} for c in calls]} for calls in batches]


async def at_once() -> None:
    return None


@contextmanager
def serving(handle: Callable[[list[Any]], list[dict[str, Any]]] | None = None,
            durable: Callable[[], Awaitable[None]] = at_once, tls: bool | None = None, **server_kw: Any
            ) -> Iterator[tuple[HeadChannel, Endpoint, Any]]:
    handle = handle or Recorder()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = HeadChannel(handle, durable, TOKEN, **server_kw)
    endpoint = asyncio.run_coroutine_threadsafe(server.start("127.0.0.1", tls=tls), loop).result(10)
    try:
        yield server, endpoint, handle
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def raw_stream(ep: Endpoint, messages: list[bytes], token: str = TOKEN, method: str = ch.METHOD) -> list[Any]:
    """``messages`` sent on a stream of our own; every answer the head wrote (decoded), once it closes the stream."""
    channel = grpc.insecure_channel(f"{ep.host}:{ep.port}")
    try:
        replies = channel.stream_stream(method)(iter(messages), timeout=10,
                                                metadata=(("authorization", f"Bearer {token}"),))
        return [a for r in replies for a in orjson.loads(r)]
    finally:
        channel.close()


def test_each_call_gets_its_own_reply_when_many_threads_share_the_channel() -> None:
    with serving() as (_, ep, _h):
        c = Channel(ep, 5)
        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(lambda i: c.call([["m", [i], {}]], 10), range(200)))
        assert [g["ok"][0]["ok"] for g in got] == [["m", [i], {}] for i in range(200)]
        c.close()


def test_calls_that_reach_the_head_together_are_one_batch() -> None:
    gate = threading.Event()
    rec = Recorder()

    def slow(batches: list[Any]) -> list[dict[str, Any]]:
        if not rec.drains:
            gate.wait(5)  # the first drain holds the loop while the others arrive
        return rec(batches)

    # A window of 0.5 s: on a busy machine (load 10-20 on 2 cores) grpc.aio hands the held calls over tens of
    # milliseconds apart once the loop is free again, not the fraction of one the default window expects (a 50 ms
    # window still failed so); what is tested is that calls that wait together are one batch, not the window.
    with serving(slow, window_s=0.5, max_wait_s=5.0) as (server, ep, _h):
        c = Channel(ep, 5)
        with ThreadPoolExecutor(9) as pool:
            futures = [pool.submit(c.call, [["m", [i], {}]], 10) for i in range(9)]
            deadline = time.monotonic() + 10  # every call on its way (a busy machine starts threads slowly)
            while len(c._waiting) < 9 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.2)  # and gRPC's sending thread past them
            gate.set()
            replies = [f.result() for f in futures]
        assert len(replies) == 9 and server.frames == 9
        assert len(rec.drains) < 9 and max(len(d) for d in rec.drains) > 1, [len(d) for d in rec.drains]
        c.close()


def test_each_reply_waits_for_the_group_commit() -> None:
    committed = asyncio.Event()

    async def durable() -> None:
        await committed.wait()

    with serving(durable=durable) as (_, ep, _h):
        c = Channel(ep, 5)
        with pytest.raises(TimeoutError):
            c.call([["m", [], {}]], 0.5)
        c.close()


@pytest.mark.parametrize("token", ["wrong", "", TOKEN + "x"])
def test_a_wrong_token_runs_nothing_and_is_never_echoed(token: str) -> None:
    with serving() as (server, ep, rec):
        c = Channel(Endpoint(ep.host, ep.port, token), 5)
        with pytest.raises(ChannelBroken) as e:
            c.call([["submit_job", [{"name": "x"}], {}]] * 3, 5)
        assert "UNAUTHENTICATED" in str(e.value) and (not token or token not in str(e.value))
        with pytest.raises(ChannelBroken):  # and every later call on it
            c.call([["m", [], {}]], 5)
        assert rec.drains == [] and server.frames == 0


def test_a_refused_stream_is_refused_on_its_headers_and_runs_nothing_it_sent() -> None:
    # 8 MiB of calls behind a wrong token: answered UNAUTHENTICATED at once, nothing of it carried out
    big = orjson.dumps([{"id": i, "calls": [["m", ["x" * 1024], {}]]} for i in range(8 << 10)])
    with serving() as (server, ep, rec):
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            raw_stream(ep, [big, big], token="nope")
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and time.monotonic() - t0 < 5
        assert rec.drains == [] and server.frames == 0


@pytest.mark.parametrize("message,field", [(b"{not json", "message"), (b'{"id": 1, "calls": []}', "message"),
                                           (b"[]", "message"), (b'[{"id": 2}]', "message")])
def test_a_malformed_message_is_refused_naming_what_and_the_stream_goes_on(message: bytes, field: str) -> None:
    with serving() as (_, ep, rec):
        got = raw_stream(ep, [message, b'[{"id": 9, "calls": [["m", [], {}]]}]'])
        refused = next(a for a in got if a["id"] != 9)
        answered = next(a for a in got if a["id"] == 9)
        assert refused["reply"]["error"]["type"] == "InvalidRequestError", refused
        assert refused["reply"]["error"]["fields"]["field"] == field, refused
        assert answered == {"id": 9, "reply": {"ok": [{"ok": ["m", [], {}]}]}}
        assert rec.drains == [[[["m", [], {}]]]]


def test_calls_sent_in_one_message_are_each_answered_by_id() -> None:
    with serving() as (_, ep, rec):
        got = raw_stream(ep, [orjson.dumps([{"id": i, "calls": [["m", [i], {}]]} for i in range(5)])])
        assert sorted(a["id"] for a in got) == list(range(5))
        assert all(a["reply"]["ok"][0]["ok"] == ["m", [a["id"]], {}] for a in got)


def test_another_protocol_version_is_not_served() -> None:
    with serving() as (_, ep, rec):
        with pytest.raises(grpc.RpcError) as e:
            raw_stream(ep, [b'[{"id": 1, "calls": []}]'], method=ch.METHOD.replace(".v1.", ".v2."))
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED and rec.drains == []


def test_a_message_over_the_limit_ends_that_stream_and_the_head_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ch, "_SIZES", [("grpc.max_receive_message_length", 64 << 10),
                                       ("grpc.max_send_message_length", 64 << 10)])
    with serving() as (_, ep, rec):
        c = Channel(ep, 5)
        with pytest.raises(ChannelBroken) as e:
            c.call([["m", ["x" * (128 << 10)], {}]], 5)
        assert "RESOURCE_EXHAUSTED" in str(e.value) and rec.drains == []
        c2 = Channel(ep, 5)
        assert c2.call([["m", [], {}]], 5)["ok"]
        c2.close()


def test_a_client_over_its_in_flight_bound_is_answered_with_errors_not_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ch, "MAX_IN_FLIGHT", 2)
    held = asyncio.Event()

    async def durable() -> None:
        await held.wait()

    with serving(durable=durable) as (_, ep, rec):
        channel = grpc.insecure_channel(f"{ep.host}:{ep.port}")
        replies = channel.stream_stream(ch.METHOD)(
            iter([orjson.dumps([{"id": i, "calls": [["m", [i], {}]]} for i in range(4)])]), timeout=3,
            metadata=(("authorization", f"Bearer {TOKEN}"),))
        first = orjson.loads(next(replies))  # the two over the bound, answered at once; the two under it wait
        assert sorted(a["id"] for a in first) == [2, 3]
        assert all("at most 2 calls" in a["reply"]["error"]["message"] for a in first)
        channel.close()


def test_off_loopback_the_channel_is_tls_and_a_client_must_pin_its_certificate() -> None:
    with serving(tls=True) as (_, ep, _h):
        assert ep.cert_pem and "BEGIN CERTIFICATE" in ep.cert_pem
        c = Channel(ep, 5)
        assert c.call([["m", [1], {}]], 5)["ok"][0]["ok"] == ["m", [1], {}]
        c.close()
        with pytest.raises((TimeoutError, ChannelBroken)):  # plaintext to a TLS port: no channel
            plain = Channel(Endpoint(ep.host, ep.port, TOKEN), 2)
            plain.call([["m", [], {}]], 2)
        _, other = ch.self_signed()
        with pytest.raises((TimeoutError, ChannelBroken)):  # another certificate: refused
            wrong = Channel(Endpoint(ep.host, ep.port, TOKEN, other.decode()), 2)
            wrong.call([["m", [], {}]], 2)
    assert ch.is_loopback("127.0.0.1") and ch.is_loopback("::1") and not ch.is_loopback("10.0.0.5")


def test_a_fault_in_the_head_answers_every_call_of_the_batch() -> None:
    def broken(batches: list[Any]) -> list[dict[str, Any]]:
        raise RuntimeError("boom")

    with serving(broken) as (_, ep, _h):
        c = Channel(ep, 5)
        reply = c.call([["m", [], {}]], 5)
        assert reply["error"]["type"] == "OrchestratorError" and "failed on a batch" in reply["error"]["message"]
        c.close()


def test_a_failed_group_commit_answers_an_error_never_ok() -> None:
    async def failing() -> None:
        raise OSError("gcs down")

    with serving(durable=failing) as (_, ep, _h):
        c = Channel(ep, 5)
        reply = c.call([["m", [], {}]], 5)
        assert "error" in reply and "durable" in reply["error"]["message"]
        c.close()


def test_a_reply_that_is_not_json_is_each_calls_error_not_a_hang() -> None:
    with serving(lambda b: [{"ok": [object()]} for _ in b]) as (_, ep, _h):
        c = Channel(ep, 5)
        reply = c.call([["m", [], {}]], 5)
        assert "could not write its answer as JSON" in reply["ok"][0]["error"]["message"]
        c.close()


def test_a_head_that_went_away_breaks_the_channel_for_every_later_call() -> None:
    with serving() as (_, ep, _h):
        c = Channel(ep, 5)
        assert c.call([["m", [], {}]], 5)["ok"]
    with pytest.raises(ChannelBroken):
        c.call([["m", [], {}]], 5)
    with pytest.raises(ChannelBroken):
        c.call([["m", [], {}]], 5)


def test_calls_json_cannot_carry_are_refused_before_anything_is_sent() -> None:
    with serving() as (_, ep, rec):
        c = Channel(ep, 5)
        with pytest.raises(TypeError):
            c.call([["m", [object()], {}]], 5)
        assert rec.drains == [] and c.broken is None
        c.close()
