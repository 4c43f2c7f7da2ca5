"""The live page's data feed, web app, tokens and static report, over the real head in-process (no Ray).

The head is :class:`headless.InProcessHead` -- the real HeadService, real agent
cores on simulated GPUs, jobs as local processes -- and the page is served by
the real :class:`DashboardServer` on a free loopback port, read over HTTP.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from headless import InProcessHead

from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.job import JobSpec
from orchestrator.core.request import GpuRequest
from orchestrator.dashboard.feed import histogram_quantile, quantile
from orchestrator.dashboard.report import chart_specs, write_report
from orchestrator.dashboard.server import DashboardServer, resolve_token


def until(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read().decode()
            return r.status, (json.loads(body) if r.headers.get_content_type() == "application/json" else body), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


@pytest.fixture
def page(head: InProcessHead) -> Iterator[DashboardServer]:
    server = DashboardServer(head, port=0, poll_s=0.1).start()
    yield server
    server.stop()


def submit(head: InProcessHead, name: str, cards: int, cls: str, seconds: float) -> str:
    spec = JobSpec(name=name, gpu=GpuRequest.whole(cards), priority=cls, entrypoint=f"sleep {seconds}")
    return head.submit_job(spec.model_dump(mode="json"))["job_id"]


def frame(page: DashboardServer) -> dict[str, Any]:
    status, body, _ = get(page.url + "api/frame")
    assert status == 200
    return body


def test_pipeline_counts_curves_decisions_and_cluster_map_follow_the_head(head: InProcessHead,
                                                                          page: DashboardServer) -> None:
    first = frame(page)["frame"]
    assert first["pipeline"]["running"] == {"now": 0, "total": 0}
    job = submit(head, "t", 2, "training", 3)
    until(lambda: frame(page)["frame"]["pipeline"]["running"]["now"] == 1, 10, "the job running on the page")
    f = frame(page)
    assert f["frame"]["pipeline"]["submit"]["total"] == 1 and f["frame"]["pipeline"]["lease"]["total"] == 1
    # The latest decisions carry the head's reasons, newest first.
    d = f["frame"]["decisions"]
    assert [x["state"] for x in d[:3]] == ["running", "admitted", "queued"] and "chose" in d[1]["reason"]
    # The cluster map shows the job as the holder of its two cards.
    held = [(n["name"], g["index"]) for n in f["frame"]["cluster"] for g in n["gpus"]
            for s in g["shares"] if s["holder"] == job]
    assert len(held) == 2
    # The curves gain a point per poll; utilisation of the job's node rose in the workload model.
    n0 = len(f["history"])
    node = held[0][0]
    until(lambda: len(frame(page)["history"]) > n0 + 3, 10, "new curve points")
    assert max(p["util"].get(node, 0) for p in frame(page)["history"]) > 0
    until(lambda: frame(page)["frame"]["pipeline"]["running"]["now"] == 0, 20, "the job finishing")
    # Explain, as the page's click asks it; an unknown job is a 404 naming it.
    status, body, _ = get(page.url + f"api/explain/{job}")
    assert status == 200 and body["job_id"] == job and body["placement"]
    status, body, _ = get(page.url + "api/explain/nope")
    assert status == 404 and "nope" in body
    # The head was told where the page is: status reports it (orchestrator status --json).
    assert head.status()["endpoints"]["dashboard_url"] == page.url


def test_preemption_moves_the_checkpoint_stage_and_the_resume_count(head: InProcessHead, page: DashboardServer) -> None:
    for i in range(3):
        submit(head, f"b{i}", (4, 2, 2)[i], "batch", 30)
    until(lambda: frame(page)["frame"]["pipeline"]["running"]["now"] == 3, 15, "every card busy")
    submit(head, "serve", 1, "inference", 1)
    until(lambda: frame(page)["frame"]["pipeline"]["preempt"]["total"] >= 1, 15, "a preemption on the page")
    f = until(lambda: (lambda fr: fr if fr["frame"]["pipeline"]["resume"]["total"] >= 1 else None)(frame(page)),
              30, "the victim resumed")
    until(lambda: frame(page)["history"][-1]["preemptions"] >= 1, 10, "the preemption on the curve")  # a point a second
    assert any(x["state"] == "queued" and "preempted" in x["reason"] for x in f["frame"]["decisions"])
    for j in head.list_jobs():
        head.cancel_job(j["job_id"])


def test_event_stream_sends_init_then_frames(page: DashboardServer) -> None:
    with urllib.request.urlopen(page.url + "api/events", timeout=10) as r:
        assert r.headers.get_content_type() == "text/event-stream"
        events: list[str] = []
        deadline = time.monotonic() + 10
        while events.count("frame") < 2 and time.monotonic() < deadline:
            line = r.readline().decode()
            if line.startswith("event: "):
                events.append(line[7:].strip())
    assert events[0] == "init" and events.count("frame") >= 2


def test_static_files_and_plotly_are_served_offline(page: DashboardServer) -> None:
    status, body, _ = get(page.url)
    assert status == 200 and "/static/plotly.min.js" in body and "/static/app.js" in body
    status, body, headers = get(page.url + "static/plotly.min.js")
    assert status == 200 and len(body) > 1_000_000
    assert get(page.url + "static/..%2Fapp.py")[0] == 404


def test_a_token_guards_every_route_but_health_and_is_never_taken_from_a_url(head: InProcessHead) -> None:
    import urllib.parse
    import urllib.request

    token = "s3cret-token-of-the-page"
    with DashboardServer(head, port=0, poll_s=0.2, token=token) as server:
        assert get(server.url + "healthz")[0] == 200
        assert get(server.url + "api/frame")[0] == 401
        _, body, headers = get(server.url + "?token=" + token)  # a token in a URL is never taken (logs keep URLs)
        assert 'action="/login"' in str(body) and not any(k.lower() == "set-cookie" for k in headers)
        assert get(server.url + "api/frame", {"Authorization": f"Bearer {token}"})[0] == 200

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *a: object, **k: object) -> None:
                return None

        opener = urllib.request.build_opener(NoRedirect)
        for given, want in (("wrong-token-xxxxxxxx", 401), (token, 303)):
            req = urllib.request.Request(server.url + "login", data=urllib.parse.urlencode({"token": given}).encode(),
                                         method="POST")
            try:
                resp = opener.open(req, timeout=10)
                code, cookie = resp.status, resp.headers.get("set-cookie", "")
            except urllib.error.HTTPError as e:
                code, cookie = e.code, e.headers.get("set-cookie", "") or ""
            assert code == want
        assert "rgo_dashboard_token=" in cookie and token not in cookie and "HttpOnly" in cookie  # a session id
        session = cookie.split(";")[0]
        assert get(server.url + "api/frame", {"Cookie": session})[0] == 200
        assert get(server.url + "api/frame", {"Cookie": f"rgo_dashboard_token={token}"})[0] == 401


def test_binding_beyond_loopback_makes_a_token_of_the_pages_own(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_token("127.0.0.1", None) is None
    monkeypatch.setenv("RAY_AUTH_TOKEN", "the-clusters-own-token")
    made = {resolve_token("0.0.0.0", None) for _ in range(3)}
    assert len(made) == 3 and "the-clusters-own-token" not in made and all(len(t) >= 32 for t in made)
    assert resolve_token("0.0.0.0", "given-token-0123456789") == "given-token-0123456789"
    with pytest.raises(InvalidRequestError) as e:
        resolve_token("0.0.0.0", "short")
    assert e.value.field == "token"


def test_bad_port_and_a_taken_port_are_refused_naming_the_field(head: InProcessHead, page: DashboardServer) -> None:
    with pytest.raises(InvalidRequestError) as e:
        DashboardServer(head, port=70000)
    assert e.value.field == "port"
    with pytest.raises(InvalidRequestError) as e:
        DashboardServer(head, port=page.port)
    assert e.value.field == "port" and "cannot listen" in str(e.value)


def test_stop_ends_the_threads_and_frees_the_port(head: InProcessHead) -> None:
    server = DashboardServer(head, port=0, poll_s=0.1).start()
    port = server.port
    with urllib.request.urlopen(server.url + "api/events", timeout=10) as r:
        r.readline()
        t0 = time.monotonic()
        server.stop()  # an open event stream must not hold the stop up
    assert time.monotonic() - t0 < 8
    assert not [t for t in server._threads if t.is_alive()]  # noqa: SLF001
    DashboardServer(head, port=port).stop()  # the port is free again


def test_quantiles_match_prometheus_histogram_quantile() -> None:
    before = {0.1: 0.0, 0.5: 0.0, 1.0: 0.0, float("inf"): 0.0}
    now = {0.1: 10.0, 0.5: 30.0, 1.0: 40.0, float("inf"): 40.0}
    assert histogram_quantile(0.5, now, before) == pytest.approx(0.1 + 0.4 * (20 - 10) / 20)
    assert histogram_quantile(0.99, now, before) == pytest.approx(0.5 + 0.5 * (39.6 - 30) / 10)
    assert histogram_quantile(0.5, before, before) is None  # nothing observed in the window
    assert histogram_quantile(0.99, {1.0: 1.0, float("inf"): 5.0}, {}) == 1.0  # +Inf: the highest finite bound
    assert quantile([1, 2, 3, 4], 0.5) == 2.5 and quantile([], 0.5) is None


def test_static_report_has_every_chart_as_html_and_png(tmp_path: Path) -> None:
    history = [{"t": float(i), "grants_per_s": i % 3, "inference_rps": 100.0 * (i > 5), "wait_p50_s": 0.1,
                "wait_p99_s": 0.2, "inference_p50_s": None, "inference_p99_s": None, "util": {"a": 0.5, "b": 1.0},
                "queue": i % 2, "preemptions": i // 5} for i in range(12)]
    comparison = {"title": "t", "notes": ["n"], "schemes": [
        {"label": "whole cards", "served_pct": 60.0, "occupied_pct": 90.0, "placed_pct": 50.0},
        {"label": "ours", "served_pct": 80.0, "occupied_pct": 80.0, "placed_pct": 70.0}]}
    frame = {"pipeline": {"running": {"now": 1, "total": 3}}, "decisions": [
        {"job_id": "j-1", "state": "running", "reason": "<b>why</b>"}]}
    files = write_report(tmp_path, history, frame, comparison)
    keys = [s.key for s in chart_specs(history, comparison)]
    assert keys == ["throughput", "latency", "utilisation", "queue", "preemptions", "schemes"]
    page = (tmp_path / "report.html").read_text()
    assert all(f'id="chart-{k}"' in page for k in keys)
    assert page.count("plotly.js v") <= 2 and "&lt;b&gt;why&lt;/b&gt;" in page  # plotly inlined once; text escaped
    for k in keys:
        png = tmp_path / f"{k}.png"
        assert png in files and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
