"""The curves' history kept by the head (``metric_history``) and the job rows' links, over the real head in-process.

A page whose server restarted must draw the past (the head keeps the points, not the page), the head's ring
must stay bounded, and a job's log must be served only to a signed-in page.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from headless import InProcessHead
from .test_dashboard import get, submit, until

from orchestrator.control.curves import ALL_NODES, MAX_POINTS, CurveHistory, Reading
from orchestrator.core.errors import PermissionDeniedError
from orchestrator.core.job import JobSpec
from orchestrator.core.request import GpuRequest
from orchestrator.dashboard.feed import Feed
from orchestrator.dashboard.server import DashboardServer

TOKEN = "token-of-the-page-0123456789"


def fast_curves(head: InProcessHead, every_s: float = 0.05) -> None:
    with head.lock:
        head.service.metrics.curves.every_s = every_s


def test_a_feed_started_after_the_head_ran_shows_the_earlier_points(head: InProcessHead) -> None:
    fast_curves(head)
    submit(head, "early", 2, "training", 30)
    until(lambda: any(p["util"] and max(p["util"].values()) > 0 for p in head.metric_history()["points"]), 10,
          "the head's curves showing the job's cards busy")
    before = time.time()
    first = Feed(head)
    first.poll()
    kept = first.history()
    # The feed started empty-handed, yet its curves begin before it did: the head kept them.
    assert kept and kept[0]["at"] < before and any(max(p["util"].values(), default=0) > 0 for p in kept)
    assert kept == head.metric_history()["points"][:len(kept)]
    # A page whose server restarted (a new feed) draws the same curves, and then new points after them.
    time.sleep(0.2)
    again = Feed(head)
    again.poll()
    assert again.history()[:len(kept)] == kept and len(again.history()) > len(kept)
    # Later polls ask only for what is new, and add it once.
    n = len(first.history())
    time.sleep(0.2)
    f = first.poll()
    assert f["points"] and first.history()[n:] == f["points"] and f["points"][0]["at"] > kept[-1]["at"]
    assert [p["t"] for p in first.history()] == sorted({p["t"] for p in first.history()})
    # Over HTTP: a page served by a new server gets the past in its first frame's history.
    with DashboardServer(head, port=0, poll_s=0.1) as server:
        _, body, _ = get(server.url + "api/frame")
        assert body["history"][0]["at"] == kept[0]["at"]
    for j in head.list_jobs():
        head.cancel_job(j["job_id"])


class _Head:
    """A head whose history restarts (a new origin) between two polls."""

    def __init__(self) -> None:
        self.origin = 100.0
        self.points = [{"t": 1.0, "at": 101.0}, {"t": 2.0, "at": 102.0}]

    def status(self) -> dict[str, Any]:
        return {"leases": [], "nodes": [], "queue": []}

    def job_board(self, limit: int = 200) -> dict[str, Any]:
        return {"counts": {"jobs": 0, "waiting_for_lease": 0, "ever_ran": 0, "resumed_live": 0, "resumptions": 0},
                "decisions": [], "jobs": [], "lease_jobs": {}}

    def metric_samples(self) -> dict[str, Any]:
        return {"at": 0.0, "samples": []}

    def metric_history(self, since: float | None = None) -> dict[str, Any]:
        return {"origin": self.origin, "max_points": 10,
                "points": [p for p in self.points if since is None or p["at"] > since]}


def test_a_restarted_head_starts_the_curves_again() -> None:
    head = _Head()
    feed = Feed(head)
    assert feed.poll()["restarted"] and [p["t"] for p in feed.history()] == [1.0, 2.0]
    assert not feed.poll()["points"]  # nothing new
    head.origin, head.points = 500.0, [{"t": 0.5, "at": 500.5}]
    f = feed.poll()
    assert f["restarted"] and feed.history() == [{"t": 0.5, "at": 500.5}] and feed.origin() == 500.0


def _reading(at: float, granted: float = 0.0, util: dict[str, float] | None = None) -> Reading:
    return Reading(at=at, granted=granted, inference=0.0, inference_buckets={}, preemptions=0.0, queue=0,
                   util=util or {})


def test_the_history_is_bounded() -> None:
    assert MAX_POINTS == 3600  # an hour at one point a second (docs/dashboard.md)
    h = CurveHistory(origin=0.0, every_s=1.0, max_points=5, max_nodes=3, max_waits=4)
    for i in range(1, 21):
        h.granted(float(i), 0.5)
        h.record(_reading(float(i), granted=float(i), util={f"n{k}": 0.5 for k in range(3 if i < 20 else 4)}))
    reply = h.since(None, 21.0)
    assert [p["t"] for p in reply["points"]] == [16.0, 17.0, 18.0, 19.0, 20.0] and reply["max_points"] == 5
    assert len(h._waits) <= 4  # noqa: SLF001 - the grants kept for the quantiles are bounded too
    assert reply["points"][-1]["util"] == {ALL_NODES: 0.5}  # beyond max_nodes: one mean, not a series per node
    assert reply["points"][-2]["util"] == {"n0": 0.5, "n1": 0.5, "n2": 0.5}
    assert reply["points"][-1]["grants_per_s"] == 1.0 and reply["points"][-1]["wait_p99_s"] == 0.5
    assert [p["t"] for p in h.since(18.0, 21.0)["points"]] == [19.0, 20.0]
    assert h.since(99.0, 100.0)["points"] == []


def test_the_head_records_a_point_every_every_s_and_no_more(head: InProcessHead) -> None:
    fast_curves(head, 0.5)
    n0 = len(head.metric_history()["points"])
    time.sleep(1.2)  # ~60 cycles of the in-process head
    grown = len(head.metric_history()["points"]) - n0
    assert 1 <= grown <= 3


@pytest.fixture
def signed_in(head: InProcessHead) -> Any:
    with DashboardServer(head, port=0, poll_s=0.2, token=TOKEN) as server:
        yield server


def test_a_job_rows_links_lead_to_its_explain_and_its_log(head: InProcessHead, signed_in: DashboardServer) -> None:
    spec = JobSpec(name="talker", gpu=GpuRequest.whole(1), priority="batch", entrypoint="echo said-by-the-driver")
    job = head.submit_job(spec.model_dump(mode="json"))["job_id"]
    until(lambda: head.get_job(job)["state"] == "succeeded", 20, "the job ending")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    status, body, headers = get(signed_in.url + f"api/logs/{job}", auth)
    assert status == 200 and "said-by-the-driver" in body and body == head.job_logs(job)
    assert {k.lower(): v for k, v in headers.items()}["content-type"].startswith("text/plain")
    assert get(signed_in.url + f"api/logs/{job}?attempt=1", auth)[0] == 200
    assert get(signed_in.url + f"api/logs/{job}?attempt=0", auth)[0] == 400
    status, body, _ = get(signed_in.url + "api/logs/nope", auth)
    assert status == 404 and "nope" in body
    assert get(signed_in.url + f"api/logs/{job}")[0] == 401  # not signed in
    assert get(signed_in.url + f"api/explain/{job}", auth)[0] == 200  # the row's other link
    # The rows carry both links (the page's script draws them).
    script = get(signed_in.url + "static/app.js", auth)[1]
    assert '"/api/logs/" + encodeURIComponent(jobId)' in script and "jobLinks(j.job_id)" in script
    # The head refuses the log to a caller that is neither the job's owner nor an administrator: the page says so.
    signed_in.head = _Refusing(head)
    status, body, _ = get(signed_in.url + f"api/logs/{job}", auth)
    assert status == 403 and "job_logs" in body


class _Refusing:
    def __init__(self, head: InProcessHead) -> None:
        self._head = head

    def job_logs(self, job_id: str, attempt: int | None = None) -> str:
        raise PermissionDeniedError("job_logs", "the job's owner or an administrator", job_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._head, name)


def test_a_page_without_sign_in_serves_no_logs(head: InProcessHead) -> None:
    job = submit(head, "quiet", 1, "batch", 0)
    with DashboardServer(head, port=0, poll_s=0.2) as server:  # loopback, no token: anyone on the machine
        status, body, _ = get(server.url + f"api/logs/{job}")
    assert status == 403 and "--token" in body
