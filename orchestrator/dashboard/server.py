"""Serving the live page: a poller thread over the head, uvicorn in another, one stop for both.

:class:`DashboardServer` owns what it starts -- the listening socket, uvicorn's
thread, the poller's thread -- and :meth:`DashboardServer.stop` ends all three
(idempotent; open event streams are told to end first, so uvicorn's graceful
shutdown does not wait on them). The poller reads the head every ``poll_s``
(:class:`~orchestrator.dashboard.feed.Feed`) and, every ``ANNOUNCE_S``, tells the
head where the page is (``announce_dashboard``), which ``orchestrator status
--json`` reports as ``dashboard_url``. A head that does not answer leaves the
last frame in place and says so in ``error``; the next poll tries again.

Binding: 127.0.0.1 by default. Any other address needs a token
(:func:`resolve_token`: the one given, else a new one of the page's own -- never
Ray's cluster token, which would give whoever signs in to the page the cluster);
the page asks for it in a form (``/login``), never in a URL. A job's log is served only behind a token (a
page on loopback without one would show every job's log to every user of the machine): ``--token-file`` on
loopback too, to read them.
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
import signal
import socket
import threading
import time
from typing import Any

import uvicorn

from orchestrator.core.errors import InvalidRequestError
from orchestrator.dashboard.app import Comparison, create_app, plotly_js
from orchestrator.dashboard.feed import Feed

log = logging.getLogger(__name__)

#: How often the poller tells the head where the page is (it reports it for twice as long).
ANNOUNCE_S = 10.0
DEFAULT_PORT = 8090


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_token(host: str, token: str | None) -> str | None:
    """The token the page requires: ``token`` when one is given; none on loopback; elsewhere a new random one of
    the page's own (never Ray's cluster token: whoever signs in to the page must not get the cluster with it)."""
    if token:
        if not 16 <= len(token) <= 256:
            raise InvalidRequestError("token", "<token>", "16 to 256 characters")
        return token
    if is_loopback(host):
        return None
    return secrets.token_urlsafe(32)


class DashboardServer:
    """See the module docstring. ``head`` is any :class:`~orchestrator.core.api.HeadApi`."""

    def __init__(self, head: Any, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT, token: str | None = None,
                 poll_s: float = 1.0, comparison: Comparison | None = None, public_host: str | None = None) -> None:
        if not (0 <= int(port) <= 65535):
            raise InvalidRequestError("port", port, "0..65535 (0: any free port)")
        if not (poll_s > 0):
            raise InvalidRequestError("poll_s", poll_s, "seconds > 0")
        plotly_js()  # the page draws with plotly (the `dashboard` extra): say so now, not at the first request
        self.head = head
        self.host = host
        self.token = resolve_token(host, token)
        self.poll_s = poll_s
        self.feed = Feed(head)
        self.comparison = comparison or Comparison("not computed by this server (orchestrator dashboard --compare)")
        self.error: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sock = _bind(host, int(port))
        self.port = int(self._sock.getsockname()[1])
        self.public_host = public_host or (host if host not in ("0.0.0.0", "::") else socket.gethostname())
        app = create_app(self.feed, self._explain, comparison=self.comparison, token=self.token, stop=self._stop,
                         logs=self._logs)
        config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2,
                                access_log=False)
        self._uvicorn = uvicorn.Server(config)
        self._threads: list[threading.Thread] = []
        self._started = False

    @property
    def url(self) -> str:
        """The page's address (its token is never part of it: the page asks for it, ``/login``)."""
        host = self.public_host
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}/"

    # ---- life -----------------------------------------------------------------------------------------
    def start(self, first_poll_timeout_s: float = 30.0) -> "DashboardServer":
        """Start polling and serving; returns once the first frame is in (or the timeout passed)."""
        if self._started:
            return self
        self._started = True
        web = threading.Thread(target=self._uvicorn.run, kwargs={"sockets": [self._sock]}, name="dashboard-http",
                               daemon=True)
        poller = threading.Thread(target=self._poll_loop, name="dashboard-poll", daemon=True)
        self._threads = [web, poller]
        web.start()
        poller.start()
        deadline = time.monotonic() + first_poll_timeout_s
        while self.feed.latest() is None and time.monotonic() < deadline and poller.is_alive():
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        """End the event streams, the HTTP server and the poller; close the socket. Idempotent."""
        self._stop.set()
        self._uvicorn.should_exit = True
        for t in self._threads:
            t.join(timeout=10)
        self._threads = []
        try:
            self._sock.close()
        except OSError:
            pass

    def __enter__(self) -> "DashboardServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- the poller -------------------------------------------------------------------------------------
    def _poll_loop(self) -> None:
        announced = float("-inf")
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                with self._lock:
                    self.feed.poll()
                self.error = None
                if started - announced >= ANNOUNCE_S:
                    announced = started
                    self.head.announce_dashboard(self.url, ANNOUNCE_S * 3)
            except Exception as e:  # the head is a boundary: keep the last frame and try again
                self.error = f"{type(e).__name__}: {e}"
                log.warning("dashboard poll failed: %s", self.error)
            self._stop.wait(max(0.0, self.poll_s - (time.monotonic() - started)))

    def _explain(self, job_id: str) -> dict[str, Any]:
        with self._lock:
            return dict(self.head.explain_job(job_id))

    def _logs(self, job_id: str, attempt: int | None) -> str:
        """The head's ``job_logs``: the head lets only the job's owner or an administrator read them, and this
        server's head client presents the administrator key of the user who ran ``orchestrator up`` (the state
        folder's ``admin.key``, picked up by its default credentials); the route is only for a signed-in page."""
        with self._lock:
            return str(self.head.job_logs(job_id, attempt))


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise InvalidRequestError("port", port, "a free port (0: any)", detail=f"cannot listen on {host}:{port}: "
                                  f"{e.strerror or e}") from None
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


def wait_for_signal(until: threading.Event | None = None) -> int | None:
    """Block until SIGINT, SIGTERM or SIGHUP (returns it) or ``until`` is set (returns None).

    Main thread only (Python delivers signals there); the previous handlers come back after.
    """
    got = threading.Event()
    which: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        which.append(signum)
        got.set()

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        while not got.wait(0.2):
            if until is not None and until.is_set():
                return None
        return which[0]
    finally:
        for s, h in old.items():
            signal.signal(s, h)
