"""The live page's web app (Starlette): the page, its script, Plotly's, and the data it is fed.

Routes:

* ``GET /`` -- the page (``static/index.html``); ``/static/*`` its script and style,
  ``/static/plotly.min.js`` the copy of Plotly shipped inside the ``plotly`` package
  (the page works offline);
* ``GET /api/events`` -- server-sent events: ``init`` (the latest frame, the curves'
  history -- the head's, so a restarted server sends the past too -- and the schemes' comparison) once,
  then ``frame`` whenever the feed has a new one, its ``points`` those this page lacks (``restarted``: a
  new head, draw them anew); a comment line every 15 s keeps proxies from closing the stream;
* ``GET /api/frame`` -- the same as one JSON document (for scripts and tests);
* ``GET /api/explain/{job_id}`` -- the head's ``explain_job``;
* ``GET /api/logs/{job_id}[?attempt=N]`` -- the job's driver log (the head's ``job_logs``: only its owner or an
  administrator may read it, and the page's server asks as the administrator), as plain text, its last
  :data:`LOG_TAIL_CHARS` characters; only for a signed-in page: a page without a token (loopback) answers 403,
  since anyone on the machine reaches it;
* ``GET /api/comparison`` -- the comparison of sharing schemes, once computed;
* ``GET /healthz``.

Access: with a ``token`` every route but ``/healthz`` and ``/login`` needs it -- ``Authorization:
Bearer TOKEN``, or the session cookie ``POST /login`` sets (the token in a form body, never a URL; so the
page's own requests and its event stream carry it). The command binds to
127.0.0.1 without a token, and refuses any other address without one.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import threading
from urllib.parse import parse_qs
from importlib import resources
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import (FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse,
                                 Response, StreamingResponse)
from starlette.routing import Route

from orchestrator.core.errors import OrchestratorError, PermissionDeniedError, UnknownObjectError
from orchestrator.core.extras import require
from orchestrator.dashboard.feed import CURVES, STAGES, Feed

STATIC = Path(str(resources.files("orchestrator.dashboard") / "static"))
COOKIE = "rgo_dashboard_token"
KEEPALIVE_S = 15.0
#: The most of a job's log the logs route sends: its end (a training job's log grows for days).
LOG_TAIL_CHARS = 1_000_000


def plotly_js() -> Path:
    """Plotly's JavaScript as the ``plotly`` package ships it (the ``dashboard`` extra)."""
    plotly = require("plotly", "dashboard")

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


class Comparison:
    """The comparison of sharing schemes: computed in the background, shown once ready."""

    def __init__(self, error: str | None = None) -> None:
        self.data: dict[str, Any] | None = None
        self.error: str | None = error

    def set(self, data: dict[str, Any]) -> None:
        self.data = data

    def fail(self, why: str) -> None:
        self.error = why

    def to_dict(self) -> dict[str, Any]:
        return {"ready": self.data is not None, "error": self.error, **(self.data or {})}


def create_app(feed: Feed, explain: Callable[[str], dict[str, Any]], *, comparison: Comparison | None = None,
               token: str | None = None, stop: threading.Event | None = None, tick_s: float = 0.25,
               logs: Callable[[str, int | None], str] | None = None) -> Starlette:
    """The app over a feed; ``explain`` answers a job id (the head's ``explain_job``), ``logs`` a job id and an
    attempt (the head's ``job_logs``; None: the route answers 404)."""
    comparison = comparison or Comparison()

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    async def plotly(request: Request) -> Response:
        return FileResponse(plotly_js(), media_type="application/javascript",
                            headers={"Cache-Control": "max-age=86400"})

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        path = (STATIC / name).resolve()
        if path.parent != STATIC.resolve() or not path.is_file():
            return PlainTextResponse("not found", status_code=404)
        return FileResponse(path)

    def init() -> dict[str, Any]:
        return {"frame": feed.latest(), "history": feed.history(), "comparison": comparison.to_dict(),
                "stages": STAGES, "curves": CURVES}

    async def frame(request: Request) -> Response:
        return JSONResponse(init())

    async def events(request: Request) -> Response:
        async def stream() -> AsyncIterator[str]:
            seen, origin = feed.version(), feed.origin()
            first = init()
            last_t = first["history"][-1]["t"] if first["history"] else float("-inf")
            yield _sse("init", first)
            comparison_ready = comparison.data is not None
            idle = 0.0
            while not (stop is not None and stop.is_set()):
                await asyncio.sleep(tick_s)
                idle += tick_s
                v = feed.version()
                if v != seen:
                    seen, idle = v, 0.0
                    # The points since the last one this page got, not only the latest frame's: frames the
                    # stream skipped (polls faster than its tick) keep none of theirs back.
                    frame = dict(feed.latest() or {})
                    restarted = feed.origin() != origin
                    if restarted:
                        origin, last_t = feed.origin(), float("-inf")
                    frame["points"] = feed.points_after(last_t)
                    frame["restarted"] = restarted
                    if frame["points"]:
                        last_t = frame["points"][-1]["t"]
                    yield _sse("frame", frame)
                if not comparison_ready and comparison.data is not None:
                    comparison_ready = True
                    yield _sse("comparison", comparison.to_dict())
                if idle >= KEEPALIVE_S:
                    idle = 0.0
                    yield ": keep-alive\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def explain_route(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        try:
            return JSONResponse(await run_in_threadpool(explain, job_id))
        except UnknownObjectError as e:
            return JSONResponse(e.to_dict(), status_code=404)
        except OrchestratorError as e:
            return JSONResponse(e.to_dict(), status_code=503)

    async def logs_route(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        if logs is None:
            return PlainTextResponse("this page serves no job logs", status_code=404)
        if not token:  # no sign-in in front of it: every user of this machine would read every job's log
            return PlainTextResponse("job logs need a signed-in page: start the dashboard with --token-file (a page "
                                     "on loopback without one is open to every user of the machine)", status_code=403)
        raw = request.query_params.get("attempt")
        try:
            attempt = None if raw in (None, "") else int(raw)
            if attempt is not None and attempt < 1:
                raise ValueError(raw)
        except ValueError:
            return PlainTextResponse(f"attempt must be a whole number >= 1, not {raw!r}", status_code=400)
        try:
            text = await run_in_threadpool(logs, job_id, attempt)
        except UnknownObjectError as e:
            return JSONResponse(e.to_dict(), status_code=404)
        except PermissionDeniedError as e:
            return JSONResponse(e.to_dict(), status_code=403)
        except OrchestratorError as e:
            return JSONResponse(e.to_dict(), status_code=503)
        if len(text) > LOG_TAIL_CHARS:
            text = f"[... the first {len(text) - LOG_TAIL_CHARS} characters left out ...]\n" + text[-LOG_TAIL_CHARS:]
        return PlainTextResponse(text, headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})

    async def comparison_route(request: Request) -> Response:
        return JSONResponse(comparison.to_dict())

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    app = Starlette(routes=[
        Route("/", page), Route("/static/plotly.min.js", plotly), Route("/static/{name}", static),
        Route("/api/events", events), Route("/api/frame", frame), Route("/api/explain/{job_id:path}", explain_route),
        Route("/api/logs/{job_id:path}", logs_route),
        Route("/api/comparison", comparison_route), Route("/healthz", healthz),
    ])
    if token:
        app.add_middleware(BaseHTTPMiddleware, dispatch=_require(token))
    return app


def _sse(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


#: The login form (``GET /login``): the token goes in a POST body, never in a URL (where logs and history keep it).
_LOGIN = """<!doctype html><meta charset="utf-8"><title>ray-gpu-orchestrator: sign in</title>
<form method="post" action="/login" style="font-family:sans-serif;margin:4em auto;max-width:28em">
<p>This dashboard needs its token (printed by <code>orchestrator dashboard</code> to its own file, 0600).</p>
<input type="password" name="token" autocomplete="current-password" autofocus style="width:100%">
<button type="submit">Open the dashboard</button></form>"""


def _require(token: str) -> Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]:
    """Every route but ``/healthz`` and ``/login`` needs ``Authorization: Bearer <token>`` or the session cookie
    that ``POST /login`` with the token sets (HttpOnly, SameSite=Strict; a random session id, not the token).
    A token in the URL (``?token=``) is never accepted: URLs end up in logs, history and Referer headers."""
    sessions: set[str] = set()

    def ok(given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(str(given).encode(), token.encode())

    async def dispatch(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        path = request.url.path
        if path == "/healthz":
            return await call_next(request)
        if path == "/login":
            if request.method == "POST":
                body = (await request.body())[:4096].decode(errors="replace")  # a urlencoded form, one field
                if ok((parse_qs(body).get("token") or [""])[0]):
                    sid = secrets.token_urlsafe(32)
                    sessions.add(sid)
                    response = RedirectResponse("/", status_code=303)
                    response.set_cookie(COOKIE, sid, httponly=True, samesite="strict",
                                        secure=request.url.scheme == "https")
                    return response
                return HTMLResponse(_LOGIN.replace("<p>", "<p><b>Wrong token.</b> ", 1), status_code=401)
            return HTMLResponse(_LOGIN)
        auth = request.headers.get("authorization", "")
        bearer = auth[7:] if auth.lower().startswith("bearer ") else None
        sid = request.cookies.get(COOKIE)
        if ok(bearer) or (sid is not None and any(hmac.compare_digest(sid, s) for s in sessions)):
            return await call_next(request)
        if path == "/" and request.method == "GET":
            return RedirectResponse("/login", status_code=303)
        return PlainTextResponse("this dashboard needs its token: sign in at /login, or send "
                                 "Authorization: Bearer TOKEN", status_code=401)

    return dispatch
