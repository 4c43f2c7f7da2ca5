"""The head's direct channel (``orchestrator/rayport/direct.py``) over real loopback TCP, without Ray: the server on
an event loop in a thread of its own, as the head actor's loop serves it, with ``handle`` and ``durable`` standing in
for ``HeadActor._answer_batches`` and the group commit (the seam the actor fills). The real head serves it in
``tests/integration/test_fuzz_head.py`` and ``test_runtime.py`` (a SIGKILLed head, and a client that follows it)."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.rayport import direct
from orchestrator.rayport.direct import ChannelBroken, DirectConnection, DirectServer, Endpoint

TOKEN = "s3cret-token-for-tests"


def echo(batches: list[Any]) -> list[dict[str, Any]]:
    """Each frame's calls answered with themselves (as ``call_many`` answers: one envelope per call)."""
    return [{"ok": [{"ok": c} for c in calls]} for calls in batches]


async def at_once() -> None:
    return None


@contextmanager
def serving(handle: Callable[[list[Any]], list[dict[str, Any]]] = echo,
            durable: Callable[[], Awaitable[None]] = at_once) -> Iterator[tuple[DirectServer, Endpoint]]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = DirectServer(handle, durable, TOKEN)
    endpoint = asyncio.run_coroutine_threadsafe(server.start("127.0.0.1"), loop).result(5)
    try:
        yield server, endpoint
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def raw(endpoint: Endpoint, hello: bool = True) -> socket.socket:
    s = socket.create_connection((endpoint.host, endpoint.port), timeout=5)
    if hello:
        s.sendall(direct.frame({"token": TOKEN}))
        assert read_frame(s) == {"ok": True}
    return s


def read_frame(s: socket.socket) -> Any:
    head = recv_all(s, 4)
    if head is None:
        return None
    body = recv_all(s, struct.unpack("!I", head)[0])
    return None if body is None else orjson.loads(body)


def recv_all(s: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def test_each_call_gets_its_own_reply_when_many_threads_share_the_connection() -> None:
    with serving() as (server, endpoint):
        conn = DirectConnection(endpoint, 5)
        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(lambda i: conn.call([["get_job", [f"job-{i}"], {}]], 5), range(400)))
        conn.close()
    assert got == [{"ok": [{"ok": ["get_job", [f"job-{i}"], {}]}]} for i in range(400)]
    assert server.frames == 400


def test_frames_that_reach_the_head_together_are_one_batch_in_the_order_sent() -> None:
    # While the loop is busy with the first frame (its handle blocks the loop, as a long plan would), the others
    # arrive; they are drained together, in the order each connection sent them.
    seen: list[list[Any]] = []
    release = threading.Event()

    def handle(batches: list[Any]) -> list[dict[str, Any]]:
        seen.append([calls[0][1][0] for calls in batches])
        if len(seen) == 1:
            release.wait(5)
        return echo(batches)

    with serving(handle) as (server, endpoint):
        first, second = DirectConnection(endpoint, 5), DirectConnection(endpoint, 5)
        with ThreadPoolExecutor(1) as pool:
            blocked = pool.submit(first.call, [["get_job", ["blocker"], {}]], 5)
            while not seen:
                time.sleep(0.01)
            for i in range(5):  # each connection's frames go out in order, none waiting for an answer
                for conn, tag in ((first, "a"), (second, "b")):
                    conn._sock.sendall(direct.frame({"id": 100 + i, "calls": [["get_job", [f"{tag}{i}"], {}]]}))
            time.sleep(0.3)
            release.set()
            blocked.result(5)
            deadline = time.monotonic() + 5
            while server.frames < 11 and time.monotonic() < deadline:
                time.sleep(0.01)
        first.close(), second.close()
    assert seen[0] == ["blocker"] and len(seen) == 2, seen
    assert [x for x in seen[1] if x[0] == "a"] == [f"a{i}" for i in range(5)]
    assert [x for x in seen[1] if x[0] == "b"] == [f"b{i}" for i in range(5)]
    assert server.drains == 2


def test_each_reply_waits_for_the_group_commit() -> None:
    committed = threading.Event()

    async def durable() -> None:
        while not committed.is_set():
            await asyncio.sleep(0.01)

    with serving(durable=durable) as (_, endpoint):
        conn = DirectConnection(endpoint, 5)
        with ThreadPoolExecutor(1) as pool:
            reply = pool.submit(conn.call, [["get_job", ["x"], {}]], 5)
            time.sleep(0.3)
            assert not reply.done()
            committed.set()
            assert reply.result(5) == {"ok": [{"ok": ["get_job", ["x"], {}]}]}
        conn.close()


def test_a_wrong_token_is_refused_and_never_echoed() -> None:
    with serving() as (server, endpoint):
        wrong = Endpoint(endpoint.host, endpoint.port, "not-the-token-1234")
        with pytest.raises(ChannelBroken) as e:
            DirectConnection(wrong, 5)
        assert "hello.token" in str(e.value) and "not-the-token-1234" not in str(e.value)
        assert TOKEN not in str(e.value)
        assert server.frames == 0
    assert TOKEN not in repr(endpoint) and "token" not in repr(endpoint)


@pytest.mark.parametrize("sent, field", [
    (struct.pack("!I", direct.MAX_FRAME + 1), "frame.length"),
    (struct.pack("!I", 5) + b"{nope", "frame"),
    (direct.frame([["get_job", ["x"], {}]]), "frame"),  # a batch without its id
])
def test_a_malformed_frame_is_refused_naming_what_and_closes_only_its_connection(sent: bytes, field: str) -> None:
    with serving() as (server, endpoint):
        good = DirectConnection(endpoint, 5)
        bad = raw(endpoint)
        bad.sendall(sent)
        refused = read_frame(bad)
        assert refused["error"]["type"] == "InvalidRequestError", refused
        assert refused["error"]["fields"]["field"] == field
        assert read_frame(bad) is None  # closed
        assert good.call([["get_job", ["still"], {}]], 5) == {"ok": [{"ok": ["get_job", ["still"], {}]}]}
        good.close()
        assert server.frames == 1


def test_a_peer_that_never_says_hello_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direct, "HELLO_TIMEOUT_S", 0.2)
    with serving() as (server, endpoint):
        silent = raw(endpoint, hello=False)
        silent.settimeout(5)
        t0 = time.monotonic()
        assert silent.recv(1) == b""
        assert time.monotonic() - t0 < 4
        deadline = time.monotonic() + 5
        while server.connections and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.connections == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.binary(max_size=64) | st.builds(lambda v: direct.frame(v), st.recursive(
    st.none() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5), lambda c: st.lists(c, max_size=3)
    | st.dictionaries(st.sampled_from(["id", "calls", "token", "x"]), c, max_size=3), max_leaves=5)))
def test_whatever_a_peer_sends_the_server_answers_the_others(junk: bytes) -> None:
    with serving() as (server, endpoint):
        peer = raw(endpoint)
        peer.sendall(junk)
        peer.shutdown(socket.SHUT_WR)
        conn = DirectConnection(endpoint, 5)
        assert conn.call([["get_job", ["ok"], {}]], 5) == {"ok": [{"ok": ["get_job", ["ok"], {}]}]}
        conn.close()
        peer.close()


def test_a_fault_in_the_head_answers_every_frame_of_the_batch() -> None:
    def broken(batches: list[Any]) -> list[dict[str, Any]]:
        raise RuntimeError("boom")

    with serving(broken) as (_, endpoint):
        conn = DirectConnection(endpoint, 5)
        reply = conn.call([["get_job", ["x"], {}]], 5)
        assert reply["error"]["type"] == "OrchestratorError" and "boom" in reply["error"]["message"]
        assert conn.broken is None  # the connection goes on
        conn.close()


def test_a_reply_that_is_not_json_is_each_calls_error_not_a_hang() -> None:
    with serving(lambda b: [{"ok": [{"ok": object()}]} for _ in b]) as (_, endpoint):
        conn = DirectConnection(endpoint, 5)
        (one,) = conn.call([["get_job", ["x"], {}]], 5)["ok"]
        assert one["error"]["type"] == "OrchestratorError" and "JSON" in one["error"]["message"]
        conn.close()


def test_a_timed_out_call_leaves_the_connection_usable_and_its_late_reply_is_dropped() -> None:
    async def durable() -> None:
        await asyncio.sleep(0.3)

    with serving(durable=durable) as (_, endpoint):
        conn = DirectConnection(endpoint, 5)
        with pytest.raises(TimeoutError):
            conn.call([["get_job", ["slow"], {}]], 0.05)
        assert conn.call([["get_job", ["next"], {}]], 5) == {"ok": [{"ok": ["get_job", ["next"], {}]}]}
        conn.close()


def test_a_connection_that_ends_fails_every_waiting_call_and_every_later_one() -> None:
    # A head that dies with calls on the connection (here: a server that takes the hello and two frames, then
    # closes): each waiting call is told, none hangs, and the connection refuses new calls at once.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def one_peer() -> None:
        s, _ = listener.accept()
        read_frame(s)
        s.sendall(direct.frame({"ok": True}))
        read_frame(s), read_frame(s)
        s.close()

    peer = threading.Thread(target=one_peer, daemon=True)
    peer.start()
    conn = DirectConnection(Endpoint("127.0.0.1", port, TOKEN), 5)
    with ThreadPoolExecutor(2) as pool:
        waiting = [pool.submit(conn.call, [["get_job", [str(i)], {}]], 30) for i in range(2)]
        for w in waiting:
            with pytest.raises(ChannelBroken):
                w.result(10)
    with pytest.raises(ChannelBroken):
        conn.call([["get_job", ["after"], {}]], 5)
    listener.close()
    peer.join(5)


def test_a_failed_group_commit_answers_an_error_never_ok() -> None:
    async def failing() -> None:
        raise RuntimeError("gcs down")

    with serving(durable=failing) as (_, endpoint):
        conn = DirectConnection(endpoint, 5)
        reply = conn.call([["release", ["x"], {}]], 5)
        assert reply["error"]["type"] == "OrchestratorError" and "durable" in reply["error"]["message"]
        conn.close()


def test_a_reply_the_client_cannot_read_breaks_the_connection_instead_of_hanging_a_call() -> None:
    # A peer that answers the hello, then a frame whose id is not one a call could have (a list): every waiting
    # call is told at once.
    listener = socket.create_server(("127.0.0.1", 0))

    def one_peer() -> None:
        s, _ = listener.accept()
        read_frame(s)
        s.sendall(direct.frame({"ok": True}))
        read_frame(s)
        s.sendall(direct.frame({"id": [1], "reply": {"ok": []}}))
        time.sleep(1)
        s.close()

    peer = threading.Thread(target=one_peer, daemon=True)
    peer.start()
    conn = DirectConnection(Endpoint("127.0.0.1", listener.getsockname()[1], TOKEN), 5)
    t0 = time.monotonic()
    with pytest.raises(ChannelBroken):
        conn.call([["get_job", ["x"], {}]], 30)
    assert time.monotonic() - t0 < 0.9  # told when the bad frame came, not when the peer closed
    listener.close()
    peer.join(5)


class _SendFails:
    """The connection's socket, except that sending fails (a peer that reset the connection mid-write)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def sendall(self, data: bytes) -> None:
        raise ConnectionResetError("reset while sending")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def test_a_failed_send_breaks_the_connection_and_tells_the_caller_at_once() -> None:
    # The send failing inside the connection's lock once deadlocked the caller: failing the connection takes
    # the same lock.
    with serving() as (_, endpoint):
        conn = DirectConnection(endpoint, 5)
        conn._sock = _SendFails(conn._sock)  # type: ignore[assignment]
        got: list[BaseException] = []

        def send() -> None:
            try:
                conn.call([["get_job", ["x"], {}]], 30)
            except BaseException as e:
                got.append(e)

        caller = threading.Thread(target=send, daemon=True)  # a deadlocked caller must fail the test, not hang it
        caller.start()
        caller.join(5)
        assert not caller.is_alive(), "the caller is stuck"
        assert len(got) == 1 and isinstance(got[0], ChannelBroken) and "reset while sending" in str(got[0]), got
        assert conn.broken is not None
        with pytest.raises(ChannelBroken):
            conn.call([["get_job", ["after"], {}]], 5)
