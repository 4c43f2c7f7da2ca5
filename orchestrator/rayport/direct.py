"""The head's direct channel: a client's quick calls over one TCP connection, beside Ray's actor calls.

Why: a Ray actor call costs ~0.65-0.75 ms on the development machine (task submission, the hand-over from Ray's
threads to the head's event loop, the reply's way back), and the way into the head, an asyncio actor, was
~0.75 ms of a one-caller grant of 1.3 ms. A framed request on a loopback TCP connection served by the head's own
event loop takes ~0.06-0.1 ms there. The head's quick methods (:data:`~orchestrator.core.api.BATCHED`: the grant
path) go this way; everything else, and every client that cannot reach the channel, calls the actor as before
(``HeadActor.call_many``, the same batches and the same answers). docs/load.md has the figures.

The protocol, one connection per client (per :class:`~.client.HeadClient`):

* a frame is a 4-byte big-endian length and that many bytes of JSON (orjson), at most :data:`MAX_FRAME` bytes;
* the client's first frame is ``{"token": ...}``; the head answers ``{"ok": true}``, or a typed error and closes;
* then each client frame is ``{"id": n, "calls": [[method, args, kwargs], ...]}`` (what ``call_many`` takes),
  sent as soon as the calls are made, whatever is still on its way; the head answers each with
  ``{"id": n, "reply": ...}``, ``reply`` being exactly what ``call_many`` answers, in any order.

Calls that reach the head together are carried out together. Each frame read is put in the server's inbox; the
inbox is drained by one callback the loop runs after the readers it woke in the same turn, so the frames of every
connection that arrived meanwhile are one batch: one plan for the requests they queue, one wake-up of the loop,
one wait for the group commit. A lone frame is drained at once (no timer). The batching that a client's threads
did by waiting for each other (:mod:`.coalesce`) is done where the work is, without anyone waiting.

Invariants:

* the channel is served on the head's event loop and hands each drain to the same code as ``call_many``
  (``handle``, then ``durable``): it adds no path into the service, so every check, the group commit before each
  answer and the loop's wake-up are the same whichever way a call comes; one frame's malformed batch is refused
  alone, never the frames drained with it;
* the frames of one connection are carried out in the order they were sent;
* the token is made afresh by each incarnation of the head and given out only through a Ray call to it
  (``HeadActor.direct_endpoint``: whoever may call the head's actor may use the channel; token auth on the Ray
  cluster guards both), compared in constant time, and never logged nor shown (:class:`Endpoint`'s repr hides it);
* nothing a peer sends can stop the head: a frame that is too long, not JSON or not a frame is answered with a
  typed error naming what was wrong and that connection alone is closed; a peer that says nothing for
  :data:`HELLO_TIMEOUT_S` after connecting is dropped;
* a client's call is answered exactly once: with its frame's reply, with :class:`ChannelBroken` when the connection
  ends first (every call on it then), or with ``TimeoutError`` (a reply that comes later is dropped by its id).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import orjson

from orchestrator.core.errors import InvalidRequestError, OrchestratorError
from orchestrator.rayport.wire import encode, fault

log = logging.getLogger(__name__)

#: The longest frame either end accepts (bytes of JSON). A batch of ``MAX_BATCH`` job submissions is ~100 KB.
MAX_FRAME = 16 * 1024 * 1024
#: Seconds a new connection has to send its hello.
HELLO_TIMEOUT_S = 5.0
_LEN = struct.Struct("!I")


class ChannelBroken(ConnectionError):
    """The connection ended or failed while a batch was on it: the head closed it (it died or restarted, or
    refused what it was sent), or the network failed. Whether the head carried the batch out is unknown."""


def frame(obj: Any) -> bytes:
    """``obj`` as one frame: its length, then its JSON."""
    body = _json(obj)
    return _LEN.pack(len(body)) + body


def _json(obj: Any) -> bytes:
    """``obj`` as JSON, as both ends write it (``TypeError`` for what JSON cannot carry)."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY, default=_jsonable)


def _jsonable(v: Any) -> Any:
    """What orjson cannot write itself: sets as sorted lists (as the JSON views write them)."""
    if isinstance(v, (set, frozenset)):
        return sorted(v, key=str)
    raise TypeError(f"{type(v).__name__} is not JSON")


@dataclass(frozen=True)
class Endpoint:
    """Where a head's direct channel listens, and its token (hidden from ``repr``: it is a secret)."""

    host: str
    port: int
    token: str = field(repr=False)

    @classmethod
    def from_json(cls, d: Any) -> "Endpoint":
        if not (isinstance(d, dict) and isinstance(d.get("host"), str) and isinstance(d.get("port"), int)
                and isinstance(d.get("token"), str)):
            raise InvalidRequestError("direct_endpoint", type(d).__name__, "{host: str, port: int, token: str}")
        return cls(d["host"], d["port"], d["token"])

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "token": self.token}


class _BadFrame(Exception):
    def __init__(self, error: OrchestratorError) -> None:
        super().__init__(str(error))
        self.error = error


async def _read(reader: asyncio.StreamReader) -> Any:
    """One frame's JSON. Raises ``asyncio.IncompleteReadError`` at the end of the stream, :class:`_BadFrame` for
    a frame over :data:`MAX_FRAME` or not JSON."""
    (n,) = _LEN.unpack(await reader.readexactly(_LEN.size))
    if n > MAX_FRAME:
        raise _BadFrame(InvalidRequestError("frame.length", n, f"at most {MAX_FRAME} bytes"))
    body = await reader.readexactly(n)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise _BadFrame(InvalidRequestError("frame", body[:40].decode("utf-8", "replace"), "JSON", str(e))) from None


class DirectServer:
    """Serves the direct channel on the running event loop. ``handle(batches)`` carries out the frames drained
    together (each a ``call_many`` argument) and returns each one's ``call_many`` answer, synchronously, on the
    loop; ``durable()`` waits for the group commit holding what they changed; then each is answered. See the
    module docstring for the protocol and invariants."""

    def __init__(self, handle: Callable[[list[Any]], list[dict[str, Any]]],
                 durable: Callable[[], Awaitable[None]], token: str, most: int = 256, metrics: Any = None) -> None:
        self._handle = handle
        self._durable = durable
        self._token = token.encode()
        self._most = most  # frames in one drain (more wait for the next)
        self._metrics = metrics  # HeadMetrics (direct_frames, direct_batches, direct_connections), if any
        self._server: asyncio.AbstractServer | None = None
        self._inbox: list[tuple[Any, Any, asyncio.StreamWriter]] = []  # (id, calls, where to answer)
        self._pending: set[asyncio.Task[None]] = set()  # answers waiting for their group commit
        self.endpoint: Endpoint | None = None
        self.connections = 0  # open now (for tests and figures)
        self.frames = 0  # carried out, over all connections
        self.drains = 0  # batches they made

    async def start(self, host: str, port: int = 0) -> Endpoint:
        self._server = await asyncio.start_server(self._serve, host, port)
        bound = self._server.sockets[0].getsockname()
        self.endpoint = Endpoint(host, int(bound[1]), self._token.decode())
        return self.endpoint

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connected(+1)
        try:
            if await self._hello(reader, writer):
                while True:
                    msg = await _read(reader)
                    if not (isinstance(msg, dict) and "id" in msg and "calls" in msg):
                        raise _BadFrame(InvalidRequestError("frame", type(msg).__name__, "{id, calls}"))
                    if not self._inbox:
                        asyncio.get_running_loop().call_soon(self._drain)
                    self._inbox.append((msg["id"], msg["calls"], writer))
        except _BadFrame as e:
            await _last_word(writer, {"error": encode(e.error)})
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError):
            pass  # the peer left (or never spoke): nothing to answer
        except Exception:  # a fault of ours: this connection ends, the head goes on
            log.exception("direct channel: a connection failed")
        finally:
            self._connected(-1)
            writer.close()

    def _connected(self, change: int) -> None:
        self.connections += change
        if self._metrics is not None:
            self._metrics.direct_connections.set(self.connections)

    def _drain(self) -> None:
        """Carry out what the inbox holds (up to ``most`` frames; the rest next turn), then answer it once the
        group commit holds it."""
        taken, self._inbox = self._inbox[:self._most], self._inbox[self._most:]
        if self._inbox:
            asyncio.get_running_loop().call_soon(self._drain)
        if not taken:
            return
        self.drains += 1
        self.frames += len(taken)
        if self._metrics is not None:
            self._metrics.direct_batches.inc()
            self._metrics.direct_frames.inc(len(taken))
        try:
            replies = self._handle([calls for _, calls, _ in taken])
        except Exception as e:  # a fault of ours: every frame is told, none waits forever
            log.exception("direct channel: a batch failed")
            replies = [fault("the head failed on a batch", e) for _ in taken]
        task = asyncio.get_running_loop().create_task(self._answer(taken, replies))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _answer(self, taken: list[tuple[Any, Any, asyncio.StreamWriter]], replies: list[dict[str, Any]]) -> None:
        try:
            await self._durable()
        except Exception as e:  # never answer ok for what may not be in the GCS; never leave a caller waiting
            log.exception("direct channel: the group commit failed")
            replies = [fault("the head could not make the change durable", e) for _ in taken]
        for (ident, calls, writer), reply in zip(taken, replies):
            if writer.is_closing():
                continue  # the client left; its calls were carried out all the same (each is idempotent)
            writer.write(self._encode(ident, reply, calls))

    async def _hello(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        hello = await asyncio.wait_for(_read(reader), HELLO_TIMEOUT_S)
        token = hello.get("token") if isinstance(hello, dict) else None
        if isinstance(token, str) and hmac.compare_digest(token.encode(), self._token):
            writer.write(frame({"ok": True}))
            return True
        # The value is never echoed: it may be someone's secret sent to the wrong place.
        await _last_word(writer, {"error": encode(InvalidRequestError(
            "hello.token", "(not shown)", "the token HeadActor.direct_endpoint gives", "refused"))})
        return False

    @staticmethod
    def _encode(ident: Any, reply: dict[str, Any], calls: Any) -> bytes:
        """The reply as a frame. A value that is not JSON is a fault of the head's: each call is answered with it
        (logged), so the client is never left waiting."""
        try:
            return frame({"id": ident, "reply": reply})
        except TypeError as e:
            log.exception("direct channel: a reply could not be written as JSON")
            n = len(calls) if isinstance(calls, list) else 1
            return frame({"id": ident, "reply": {"ok": [fault("the head could not write its answer as JSON", e)] * n}})


async def _last_word(writer: asyncio.StreamWriter, reply: dict[str, Any]) -> None:
    try:
        writer.write(frame(reply))
        await asyncio.wait_for(writer.drain(), 1.0)
    except (ConnectionError, asyncio.TimeoutError):
        pass


class DirectConnection:
    """A client's connection to one head's direct channel, shared by the threads of its process: each
    :meth:`call` sends its frame at once (under a lock for the write only) and waits for its own reply, which a
    reader thread of the connection hands it by id. Once the connection fails every waiting call gets
    :class:`ChannelBroken`, and so does every later one: the owner opens a new connection."""

    def __init__(self, endpoint: Endpoint, timeout: float) -> None:
        self.endpoint = endpoint
        self.broken: ChannelBroken | None = None
        self._sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock.settimeout(timeout)
            self._sock.sendall(frame({"token": endpoint.token}))
            hello = self._read_frame()
        except BaseException:
            self._sock.close()
            raise
        if not (isinstance(hello, dict) and hello.get("ok") is True):
            self._sock.close()
            why = hello.get("error", {}).get("message", hello) if isinstance(hello, dict) else hello
            raise ChannelBroken(f"the head refused the channel: {why}")
        self._sock.settimeout(None)
        self._lock = threading.Lock()
        self._next = 0
        self._waiting: dict[int, _Waiter] = {}
        self._reader = threading.Thread(target=self._read_replies, name="rgo-direct", daemon=True)
        self._reader.start()

    def call(self, calls: list[Any], timeout: float) -> dict[str, Any]:
        """``calls`` as one frame; the head's ``call_many`` envelope for it. Raises :class:`ChannelBroken` if the
        connection ends first (or had ended), ``TimeoutError`` after ``timeout`` s (the connection stays open),
        ``TypeError`` (nothing sent) for calls that cannot be written as JSON."""
        w = _Waiter()
        body = orjson.Fragment(_json(calls))  # before anything is sent
        with self._lock:
            if self.broken is not None:
                raise self.broken
            self._next += 1
            ident = self._next
            self._waiting[ident] = w
            try:
                self._sock.sendall(frame({"id": ident, "calls": body}))
                sent: OSError | None = None
            except OSError as e:
                sent = e
        if sent is not None:  # outside the lock: failing the connection takes it
            self._fail(ChannelBroken(f"{type(sent).__name__}: {sent}"))
            raise w.error or ChannelBroken(str(sent))
        try:
            if not w.done.wait(timeout):
                raise TimeoutError(f"no answer in {timeout:.1f}s")
        finally:
            with self._lock:
                self._waiting.pop(ident, None)
        if w.error is not None:
            raise w.error
        return w.reply  # type: ignore[return-value]

    def _read_replies(self) -> None:
        try:
            while True:
                msg = self._read_frame()
                if not isinstance(msg, dict) or "reply" not in msg:
                    why = msg.get("error", {}).get("message") if isinstance(msg, dict) else None
                    raise ChannelBroken(f"the head closed the channel: {why or msg!r}")
                with self._lock:
                    w = self._waiting.pop(msg.get("id"), None)
                if w is not None and isinstance(msg["reply"], dict):
                    w.reply = msg["reply"]
                    w.done.set()
        except ChannelBroken as e:
            self._fail(e)
        except Exception as e:  # the socket failed, or the head sent what is not a reply: no call may wait on it
            self._fail(ChannelBroken(f"{type(e).__name__}: {e}"))

    def _read_frame(self) -> Any:
        (n,) = _LEN.unpack(self._recv(_LEN.size))
        if n > MAX_FRAME:
            raise ChannelBroken(f"the head's frame claims {n} bytes, over {MAX_FRAME}")
        try:
            return orjson.loads(self._recv(n))
        except orjson.JSONDecodeError as e:
            raise ChannelBroken(f"the head sent a frame that is not JSON: {e}") from None

    def _recv(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self._sock.recv(n - len(buf))
            if not chunk:
                raise ChannelBroken("the head closed the connection")
            buf += chunk
        return bytes(buf)

    def _fail(self, error: ChannelBroken) -> None:
        with self._lock:
            if self.broken is None:
                self.broken = error
            waiting, self._waiting = self._waiting, {}
        for w in waiting.values():
            w.error = self.broken
            w.done.set()
        self.close()

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass


@dataclass(eq=False)
class _Waiter:
    done: threading.Event = field(default_factory=threading.Event)
    reply: dict[str, Any] | None = None
    error: ChannelBroken | None = None
