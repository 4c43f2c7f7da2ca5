"""The head's channel for clients' quick calls: gRPC (``grpc.aio`` on the head's event loop, grpcio's client).

Why: a Ray actor call costs ~0.65-0.75 ms on the development machine (task submission, the hand-over from Ray's
threads to the head's event loop, the reply's way back), most of a one-caller grant. The head's quick methods
(:data:`~orchestrator.core.api.BATCHED`: the grant path) go over this channel instead; a client that cannot reach
it (a Ray Client driver, ``ray://``, outside the cluster's network) calls ``HeadActor.call_many`` with the same
batches and gets the same answers, in the same encoding (JSON). It replaced a home-made TCP protocol
(``rayport/direct.py``) and a client-side batcher (``rayport/coalesce.py``): gRPC brings what that lacked --
HTTP/2 flow control (a slow reader is backpressure, not a growing buffer), deadlines, keepalive, TLS, message
size limits, a versioned method path -- from a library Ray itself ships. ``docs/design.md`` and ``docs/load.md``
have the choice and the figures.

The protocol:

* one bidirectional stream per client process, ``/rgo.head.v1.Head/Calls`` (the path names the protocol's
  version: a client of another version is answered ``UNIMPLEMENTED``). A client message is a JSON list of
  ``{"id": n, "calls": [[method, args, kwargs], ...]}`` (what ``call_many`` takes, with the client's id), the calls
  its threads queued together; the head answers each with ``{"id": n, "reply": ...}``, ``reply`` being exactly
  what ``call_many`` answers (``{"ok": [envelope...]}`` or ``{"error": ...}``), the answers ready together in one
  JSON list, in any order;
* authentication: the stream's ``authorization`` metadata is ``Bearer <token>``. The token is made afresh by each
  incarnation of the head and given out only through a Ray call to it (``HeadActor.direct_endpoint``: whoever
  may call the head's actor may use the channel; token auth on the Ray cluster guards both). It is checked on
  the stream's headers (gRPC caps them at 8 KiB) before a byte of its messages is read: a refused stream is
  answered ``UNAUTHENTICATED`` and runs none of what it sent;
* transport security: plaintext only when the head listens on a loopback address; otherwise TLS, with a key
  and self-signed certificate the head makes at start and hands out with the token (clients pin exactly that
  certificate);
* limits and backpressure: :data:`MAX_MESSAGE` bytes a message either way, :data:`MAX_CONNECTIONS` connections,
  :data:`MAX_CALLS` streams at once (beyond: ``RESOURCE_EXHAUSTED``), :data:`MAX_IN_FLIGHT` unanswered calls per
  stream (beyond: each further call answered with an error), answers written in turn under HTTP/2 flow control
  (a client that does not read holds only its own answers), keepalive pings both ways.

Calls that reach the head together are carried out together: each call goes to the server's inbox, and the
inbox is drained as one: one plan, one wake-up of the loop, one wait for the group commit. A call that finds
nothing else in flight (one caller, an idle head) is drained at once; under load the drain waits until no call
has joined for :data:`WINDOW_S` (1 ms), at most :data:`MAX_WAIT_S` (5 ms; the settings' ``tuning.channel_window_s``
and ``channel_max_wait_s``): grpc.aio hands the head its messages one after another, so calls that arrive
together reach the inbox over a fraction of a millisecond.

Invariants:

* the channel is served on the head's event loop and hands each drain to the same code as ``call_many``
  (``handle``, then ``durable``): every check, the group commit before each answer and the loop's wake-up are
  the same whichever way a call comes; one call's malformed batch is refused alone, never the others drained
  with it;
* the calls of one client message are taken in the order sent;
* a client's call is answered exactly once: with its reply, with :class:`ChannelBroken` when the stream ends
  first (the head is unreachable, restarted, or refused the token: ask it again), or with ``TimeoutError`` (a
  reply that comes later is dropped by its id);
* nothing a peer sends can stop the head: a message that is not JSON or not a list of ``{id, calls}`` is
  answered with a typed error naming what was wrong, and the stream goes on.

Why one module over 500 lines: it is one protocol, and its two ends (:class:`HeadChannel`, the head's server;
:class:`Channel`, the client) share its wire format, limits, keepalive and TLS settings, which change together;
the limits are module attributes both ends read at call time (tests lower them on this module).
"""

from __future__ import annotations

import asyncio
import datetime
import hmac
import ipaddress
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import grpc
import orjson
from pydantic import StrictInt, StrictStr

from orchestrator.core import codec
from orchestrator.core.config import Tuning
from orchestrator.core.errors import InvalidRequestError
from orchestrator.rayport.wire import encode, fault

log = logging.getLogger(__name__)

#: The method's path: service ``rgo.head.v1.Head``, method ``Call``. A new protocol gets a new version.
METHOD = "/rgo.head.v1.Head/Calls"
#: The largest message either end accepts (bytes of JSON). A batch of ``MAX_BATCH`` job submissions is ~100 KB.
MAX_MESSAGE = 16 * 1024 * 1024
#: Connections the head accepts at once, and calls in flight over all of them.
MAX_CONNECTIONS = 256
MAX_CALLS = 4096
#: Calls one stream may have unanswered; a further one is answered with an error at once.
MAX_IN_FLIGHT = 4096
#: The most calls (or answers) one message carries: what was queued together goes together.
MAX_MERGE = 256
#: Seconds a stream the client closed stays open for the answers to the calls it had sent (by default:
#: ``settings.tuning.channel_call_grace_s``, which the head gives its :class:`HeadChannel`).
CALL_GRACE_S = Tuning().channel_call_grace_s
#: What the TLS certificate names; clients ask for it whatever address they reach the head at.
TLS_NAME = "rgo-head"
_KEEPALIVE = [("grpc.keepalive_time_ms", 20_000), ("grpc.keepalive_timeout_ms", 10_000),
              ("grpc.http2.min_ping_interval_without_data_ms", 10_000), ("grpc.keepalive_permit_without_calls", 1),
              ("grpc.http2.max_pings_without_data", 0)]
#: Batching under load (``HeadChannel._drain_settled``): a call that finds other calls still unanswered waits
#: until no other call has joined it for ``WINDOW_S``, at most ``MAX_WAIT_S``; a call that finds none in flight
#: (one caller, or an idle head) is carried out at once. The defaults of ``settings.tuning.channel_window_s`` and
#: ``channel_max_wait_s``, which the head gives its :class:`HeadChannel`.
WINDOW_S = Tuning().channel_window_s
MAX_WAIT_S = Tuning().channel_max_wait_s
_SIZES = [("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.max_send_message_length", MAX_MESSAGE)]


class ChannelBroken(ConnectionError):
    """The head could not be reached, or refused this client's token (it restarted): ask it for its channel
    again. Whether a call that was on its way was carried out is unknown (every quick call is idempotent)."""


def _json(obj: Any) -> bytes:
    """``obj`` as JSON, as both ends write it (``TypeError`` for what JSON cannot carry)."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY, default=_jsonable)


def _jsonable(v: Any) -> Any:
    """What orjson cannot write itself: sets as sorted lists (as the JSON views write them)."""
    if isinstance(v, (set, frozenset)):
        return sorted(v, key=str)
    raise TypeError(f"{type(v).__name__} is not JSON")


def as_json(reply: dict[str, Any], calls: Any = None) -> bytes:
    """A ``call_many`` answer as JSON. A value JSON cannot carry is a fault of the head's: each call is answered
    with it (logged), so no client is left waiting and every path answers in the one encoding."""
    try:
        return _json(reply)
    except TypeError:  # an integer past 64 bits (a caller sent one; its refusal names it): the standard library's
        pass  # JSON writes any integer
    try:
        import json

        return json.dumps(reply, default=_jsonable, separators=(",", ":")).encode()
    except (TypeError, ValueError) as e:
        log.exception("head channel: a reply could not be written as JSON")
        n = len(calls) if isinstance(calls, list) else 1
        return _json({"ok": [fault("the head could not write its answer as JSON", e)] * n})


@dataclass(frozen=True)
class Endpoint:
    """Where a head's channel listens, its token and (off loopback) its certificate; the secret is hidden from
    ``repr``."""

    # Strict: the head's answer is taken as it is typed (no ``"6380"`` for a port). JSON derived from the fields.
    host: StrictStr
    port: StrictInt
    token: StrictStr = field(repr=False)
    cert_pem: StrictStr | None = field(default=None, repr=False)

    @classmethod
    def from_json(cls, d: Any) -> "Endpoint":
        """The endpoint ``direct_endpoint`` answered; ``InvalidRequestError`` naming the key otherwise, showing
        the offending value's type only (what came may hold the token)."""
        try:
            return codec.load(cls, d, "direct_endpoint")
        except InvalidRequestError as e:
            raise InvalidRequestError(e.field, type(e.value).__name__, e.allowed, e.detail) from None

    def to_json(self) -> dict[str, Any]:
        return codec.dump(self)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def self_signed(days: int = 365) -> tuple[bytes, bytes]:
    """A fresh EC key and a certificate for :data:`TLS_NAME` signed by it: (key PEM, certificate PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, TLS_NAME)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(TLS_NAME)]), critical=False)
            .sign(key, hashes.SHA256()))
    return (key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()),
            cert.public_bytes(serialization.Encoding.PEM))


class _TokenCheck(grpc.aio.ServerInterceptor):
    """Lets a call through only with ``authorization: Bearer <token>`` (constant-time compare); a refused call is
    answered by a handler that never reads its body. The value sent is never echoed nor logged."""

    def __init__(self, token: str) -> None:
        self._want = f"Bearer {token}".encode()

        async def refuse(request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "the channel's token is the one HeadActor.direct_endpoint gives")

        self._refuse = grpc.stream_stream_rpc_method_handler(refuse)

    async def intercept_service(self, continuation: Callable[..., Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        got = next((v for k, v in (details.invocation_metadata or ()) if k == "authorization"), "")
        got_b = got.encode() if isinstance(got, str) else bytes(got)
        if hmac.compare_digest(got_b, self._want):
            return await continuation(details)
        return self._refuse


class HeadChannel:
    """Serves the channel on the running event loop. ``handle(batches)`` carries out the batches drained together
    (each a ``call_many`` argument) and returns each one's ``call_many`` answer, synchronously, on the loop;
    ``durable()`` waits for the group commit holding what they changed; then each is answered. See the module
    docstring for the protocol and invariants."""

    def __init__(self, handle: Callable[[list[Any]], list[dict[str, Any]]],
                 durable: Callable[[], Awaitable[None]], token: str, most: int = 256, metrics: Any = None, *,
                 window_s: float = WINDOW_S, max_wait_s: float = MAX_WAIT_S, call_grace_s: float = CALL_GRACE_S
                 ) -> None:
        self._handle = handle
        self._durable = durable
        self._token = token
        self._most = most  # batches in one drain (more wait for the next)
        self._metrics = metrics  # HeadMetrics (channel_calls, channel_batches, channel_in_flight), if any
        self._window_s, self._max_wait_s = window_s, max_wait_s  # batching under load (_drain_settled)
        self._call_grace_s = call_grace_s  # a closed stream's wait for its answers (_session)
        self._server: grpc.aio.Server | None = None
        self._inbox: list[tuple[Any, Any, asyncio.Queue[bytes | None], _Unanswered]] = []  # (calls, id, stream, its count)
        self.unanswered = 0  # calls taken in and not yet answered, over every stream
        self.endpoint: Endpoint | None = None
        self.streams = 0  # clients' streams open now
        self.frames = 0  # calls carried out
        self.drains = 0  # batches they made

    async def start(self, host: str, port: int = 0, *, tls: bool | None = None) -> Endpoint:
        """Listen on ``host:port`` (0: a free port): plaintext on a loopback address, else TLS (``tls`` forces it)."""
        options = [*_SIZES, *_KEEPALIVE, ("grpc.max_allowed_incoming_connections", MAX_CONNECTIONS),
                   ("grpc.so_reuseport", 0)]
        server = grpc.aio.server(interceptors=[_TokenCheck(self._token)], options=options,
                                 maximum_concurrent_rpcs=MAX_CALLS)
        handler = grpc.stream_stream_rpc_method_handler(self._session)
        service, method = METHOD.strip("/").split("/")
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service, {method: handler})])
        cert_pem = None
        secure = (not is_loopback(host)) if tls is None else tls
        if not secure:
            bound = server.add_insecure_port(f"{host}:{port}")
        else:
            key, cert = self_signed()
            bound = server.add_secure_port(f"{host}:{port}", grpc.ssl_server_credentials([(key, cert)]))
            cert_pem = cert.decode()
        if not bound:
            raise OSError(f"the head's channel could not listen on {host}:{port}")
        await server.start()
        self._server = server
        self.endpoint = Endpoint(host, int(bound), self._token, cert_pem)
        return self.endpoint

    async def close(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=1.0)

    async def _session(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        """One client's stream: each message read is put in the inbox; its answer goes back on the same stream,
        written in turn by one writer (``context.write`` waits for HTTP/2 flow control: a client that does not
        read holds its own answers, not the head). A client with :data:`MAX_IN_FLIGHT` calls unanswered is
        answered with an error for each further one."""
        loop = asyncio.get_running_loop()
        out: asyncio.Queue[bytes | None] = asyncio.Queue()
        writer = loop.create_task(self._write(context, out))
        unanswered = _Unanswered()
        self.streams += 1
        try:
            while True:
                raw = await context.read()
                if raw is grpc.aio.EOF:
                    break
                for ident, calls, error in _messages(raw):
                    if error is None and unanswered.n >= MAX_IN_FLIGHT:
                        error = InvalidRequestError("calls", unanswered.n, f"at most {MAX_IN_FLIGHT} calls "
                                                    "unanswered on one stream", "wait for answers before sending more")
                    if error is not None:
                        out.put_nowait(_answer_json(ident, {"error": encode(error)}, None))
                        continue
                    unanswered.add(+1)
                    if not self._inbox:
                        if self.unanswered:  # under load (others' calls on their way): let calls arriving join it
                            loop.call_later(self._window_s, self._drain_settled, 1, loop.time() + self._max_wait_s)
                        else:  # nothing else in flight: at once
                            loop.call_soon(self._drain)
                    self._unanswered(+1)
                    self._inbox.append((calls, ident, out, unanswered))
        finally:
            try:  # the client said all it had to say: its calls already taken in are still answered
                await asyncio.wait_for(unanswered.none.wait(), self._call_grace_s)
            finally:
                self.streams -= 1
                out.put_nowait(None)
                await writer

    @staticmethod
    async def _write(context: grpc.aio.ServicerContext, out: "asyncio.Queue[bytes | None]") -> None:
        """Write the stream's answers in turn, those ready together as one message (a JSON list of them)."""
        try:
            while (first := await out.get()) is not None:
                ready, end = [first], False
                while not out.empty() and len(ready) < MAX_MERGE:
                    nxt = out.get_nowait()
                    if nxt is None:
                        end = True
                        break
                    ready.append(nxt)
                await context.write(b"[" + b",".join(ready) + b"]")
                if end:
                    return
        except Exception:  # the stream ended: its answers have nowhere to go (each call was carried out)
            pass

    def _unanswered(self, change: int) -> None:
        """Calls taken in and not yet answered, over every stream (the gauge ``channel_calls_in_flight``)."""
        self.unanswered += change
        if self._metrics is not None:
            self._metrics.channel_in_flight.set(self.unanswered)

    def _drain_settled(self, seen: int, deadline: float) -> None:
        """Drain once no call joined the inbox for ``window_s`` (or at ``deadline``). grpc.aio hands the head
        its calls one after another, each a few callbacks apart: calls that arrive together under load reach the
        inbox over a fraction of a millisecond, and one plan for all of them costs the head less than one each."""
        loop = asyncio.get_running_loop()
        n = len(self._inbox)
        if n > seen and loop.time() < deadline:
            loop.call_later(self._window_s, self._drain_settled, n, deadline)
            return
        self._drain()

    def _drain(self) -> None:
        """Carry out what the inbox holds (up to ``most`` batches; the rest next turn), then answer it once the
        group commit holds it."""
        taken, self._inbox = self._inbox[:self._most], self._inbox[self._most:]
        if self._inbox:
            asyncio.get_running_loop().call_soon(self._drain)
        if not taken:
            return
        self.drains += 1
        self.frames += len(taken)
        if self._metrics is not None:
            self._metrics.channel_batches.inc()
            self._metrics.channel_calls.inc(len(taken))
        try:
            replies = self._handle([calls for calls, _, _, _ in taken])
        except Exception as e:  # a fault of ours: every call is told, none waits forever
            log.exception("head channel: a batch failed")
            replies = [fault("the head failed on a batch", e) for _ in taken]
        asyncio.get_running_loop().create_task(self._answer(taken, replies))

    async def _answer(self, taken: list[Any], replies: list[dict[str, Any]]) -> None:
        try:
            await self._durable()
        except Exception as e:  # never answer ok for what may not be in the GCS; never leave a caller waiting
            log.exception("head channel: the group commit failed")
            replies = [fault("the head could not make the change durable", e) for _ in taken]
        for (calls, ident, out, unanswered), reply in zip(taken, replies):
            self._unanswered(-1)
            out.put_nowait(_answer_json(ident, reply, calls))
            unanswered.add(-1)


class _Unanswered:
    """A stream's calls taken in and not yet answered; ``none`` is set while there are none."""

    def __init__(self) -> None:
        self.n = 0
        self.none = asyncio.Event()
        self.none.set()

    def add(self, change: int) -> None:
        self.n += change
        if self.n:
            self.none.clear()
        else:
            self.none.set()


def _messages(raw: bytes) -> list[tuple[Any, Any, InvalidRequestError | None]]:
    """Each ``(id, calls, None)`` of a client's message (a JSON list of ``{id, calls}``), or ``(id if any, None,
    why it is refused)`` for one that is malformed; a message that is not such a list is one refusal."""
    try:
        msg = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        return [(None, None, InvalidRequestError("message", raw[:40].decode("utf-8", "replace"), "JSON", str(e)))]
    if not isinstance(msg, list) or not msg or len(msg) > MAX_MERGE:
        return [(None, None, InvalidRequestError("message", type(msg).__name__,
                                                 f"a list of 1 to {MAX_MERGE} {{id, calls: [...]}}"))]
    out: list[tuple[Any, Any, InvalidRequestError | None]] = []
    for one in msg:
        if isinstance(one, dict) and "id" in one and "calls" in one:
            out.append((one["id"], one["calls"], None))  # the calls themselves are checked as call_many's are
        else:
            ident = one.get("id") if isinstance(one, dict) else None
            out.append((ident, None, InvalidRequestError("message", type(one).__name__, "{id, calls: [...]}")))
    return out


def _answer_json(ident: Any, reply: dict[str, Any], calls: Any) -> bytes:
    """``{"id", "reply"}`` as JSON; a reply JSON cannot carry is each call's fault (see :func:`as_json`)."""
    try:
        return _json({"id": ident, "reply": reply})
    except TypeError:
        return b'{"id":' + _json(ident) + b',"reply":' + as_json(reply, calls) + b"}"


class Channel:
    """A client's channel to one head: one gRPC stream shared by the threads of its process. Each :meth:`call`
    sends its message at once and waits for its own answer, which a reader thread hands it by id. Once the stream
    ends (the head is unreachable, restarted, or refused the token) :attr:`broken` is set and every waiting and
    later call raises it: the owner asks the head for its endpoint again."""

    def __init__(self, endpoint: Endpoint, connect_timeout: float) -> None:
        self.endpoint = endpoint
        self.broken: ChannelBroken | None = None
        target = f"{endpoint.host}:{endpoint.port}"
        options = [*_SIZES, *_KEEPALIVE, ("grpc.enable_retries", 0)]
        if endpoint.cert_pem:
            creds = grpc.ssl_channel_credentials(root_certificates=endpoint.cert_pem.encode())
            self._channel = grpc.secure_channel(target, creds, options=[*options,
                                                                        ("grpc.ssl_target_name_override", TLS_NAME)])
        else:
            self._channel = grpc.insecure_channel(target, options=options)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=connect_timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise TimeoutError(f"no connection to {target} in {connect_timeout:g}s") from None
        self._lock = threading.Lock()
        self._next = 0
        self._waiting: dict[int, _Waiter] = {}
        self._outbox: "queue.SimpleQueue[bytes | None]" = queue.SimpleQueue()
        self._replies = self._channel.stream_stream(METHOD)(self._messages(),
                                                            metadata=(("authorization", f"Bearer {endpoint.token}"),))
        self._reader = threading.Thread(target=self._read, name="rgo-channel", daemon=True)
        self._reader.start()

    def call(self, calls: list[Any], timeout: float) -> dict[str, Any]:
        """``calls`` as one message; the head's ``call_many`` envelope for it. Raises :class:`ChannelBroken` if the
        stream ends first (or had ended), ``TimeoutError`` after ``timeout`` s (the stream stays open, a late
        answer is dropped), ``TypeError`` (nothing sent) for calls that cannot be written as JSON."""
        body = orjson.Fragment(_json(calls))  # before anything is sent
        w = _Waiter()
        with self._lock:
            if self.broken is not None:
                raise self.broken
            self._next += 1
            ident = self._next
            self._waiting[ident] = w
        self._outbox.put(_json({"id": ident, "calls": body}))
        try:
            if not w.done.wait(timeout):
                raise TimeoutError(f"no answer in {timeout:.1f}s")
        finally:
            with self._lock:
                self._waiting.pop(ident, None)
        if w.error is not None:
            raise w.error
        return w.reply  # type: ignore[return-value]

    def _messages(self) -> Any:
        """The stream's messages: the calls queued together, as one (gRPC's sending thread pulls from here)."""
        while (first := self._outbox.get()) is not None:
            ready = [first]
            try:
                while len(ready) < MAX_MERGE:
                    nxt = self._outbox.get_nowait()
                    if nxt is None:
                        yield b"[" + b",".join(ready) + b"]"
                        return
                    ready.append(nxt)
            except queue.Empty:
                pass
            yield b"[" + b",".join(ready) + b"]"

    def _read(self) -> None:
        try:
            for raw in self._replies:
                for msg in orjson.loads(raw):
                    with self._lock:
                        w = self._waiting.pop(msg.get("id"), None) if isinstance(msg, dict) else None
                    if w is not None and isinstance(msg.get("reply"), dict):
                        w.reply = msg["reply"]
                        w.done.set()
            self._fail(ChannelBroken("the head ended the stream"))
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            self._fail(ChannelBroken(f"{code.name if code else 'failed'}: {e.details() if hasattr(e, 'details') else e}"))
        except Exception as e:  # the head sent what is not an answer: no call may wait on it
            self._fail(ChannelBroken(f"{type(e).__name__}: {e}"))

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
        self._outbox.put(None)
        self._channel.close()


@dataclass(eq=False)
class _Waiter:
    done: threading.Event = field(default_factory=threading.Event)
    reply: dict[str, Any] | None = None
    error: ChannelBroken | None = None
