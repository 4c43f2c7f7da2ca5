"""``RayJobRunner.submit`` over real HTTP: which failures of Ray's job API are worth another try.

The server here is a stand-in for Ray's job head (named as such): it answers ``/api/version`` as Ray does and
then each submission the way a test sets, which a real dashboard does only by accident (no agent yet,
a hung request). Ray's own ``JobSubmissionClient`` talks to it; the classification is ours.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from orchestrator.core.errors import JobApiUnavailableError
from orchestrator.rayport import ray_api
from orchestrator.rayport.ray_api import RayJobRunner


class StandInJobHead:
    """Ray's job head as far as submitting, reading and deleting a job go: the version check; a submission is
    answered ``answer`` (``(status, body, delay)``) when a test sets one, else as Ray 2.60 does (an id it has:
    HTTP 500 relaying its agent's "already exists"; a new one: kept, PENDING); ``GET``/``DELETE /api/jobs/<id>`` as Ray (404 for
    an id it lacks; a delete refused while the job is not over)."""

    def __init__(self) -> None:
        self.answer: tuple[int, str, float] | None = None
        self.jobs: dict[str, dict[str, Any]] = {}
        self.posts = 0
        head = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _job(self) -> str | None:
                sid = self.path.removeprefix("/api/jobs/")
                return sid if sid in head.jobs else None

            def do_GET(self) -> None:
                if not self.path.startswith("/api/jobs/"):
                    self._send(200, json.dumps({"ray_version": "2.60.0", "version": "x", "session_name": "s"}).encode())
                elif (sid := self._job()) is None:
                    self._send(404, b"Job does not exist")
                else:
                    self._send(200, json.dumps(head.jobs[sid]).encode())

            def do_DELETE(self) -> None:
                if (sid := self._job()) is None:
                    self._send(404, b"Job does not exist")
                elif head.jobs[sid]["status"] not in ("SUCCEEDED", "FAILED", "STOPPED"):
                    self._send(400, f"Job {sid} is not in a terminal state".encode())
                else:
                    del head.jobs[sid]
                    self._send(200, json.dumps({"deleted": True}).encode())

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                head.posts += 1
                if head.answer is None:
                    sid = body["submission_id"]
                    if sid in head.jobs:  # Ray 2.60's job head relays its agent's 400 as a 500, traceback and all
                        self._send(500, f"Traceback (most recent call last): ...\nRuntimeError: Request failed with "
                                        f"status code 400: ... ValueError: Job with submission_id {sid} already "
                                        f"exists. Please use a different submission_id.".encode())
                        return
                    head.jobs[sid] = {"type": "SUBMISSION", "submission_id": sid, "status": "PENDING",
                                      "entrypoint": body["entrypoint"], "metadata": body.get("metadata") or {}}
                    self._send(200, json.dumps({"submission_id": sid, "job_id": None}).encode())
                    return
                status, text, delay = head.answer
                time.sleep(delay)
                try:
                    self._send(status, text.encode())
                except OSError:
                    pass  # the client gave up first

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def job_head() -> Iterator[StandInJobHead]:
    h = StandInJobHead()
    yield h
    h.close()


def _submit(runner: RayJobRunner) -> None:
    runner.submit("job-1-a1", "echo hi", {}, {}, {"num_gpus": 0}, {})


def test_a_5xx_is_unavailable_with_what_ray_said(job_head: StandInJobHead) -> None:
    job_head.answer = (500, "No available agent to submit job, please try again later.", 0.0)
    with pytest.raises(JobApiUnavailableError) as e:
        _submit(RayJobRunner(job_head.url))
    assert e.value.retryable and e.value.submission_id == "job-1-a1"
    assert "try again later" in e.value.detail


def test_a_4xx_is_a_refusal_not_a_retry(job_head: StandInJobHead) -> None:
    job_head.answer = (400, "runtime_env: working_dir does not exist", 0.0)
    with pytest.raises(RuntimeError, match="working_dir") as e:
        _submit(RayJobRunner(job_head.url))
    assert not isinstance(e.value, JobApiUnavailableError)


MINE = {"orchestrator_job": "job-1", "orchestrator_submitted_at": "1000.5"}


def test_an_id_ray_has_from_an_earlier_try_of_ours_is_taken_not_refused(job_head: StandInJobHead) -> None:
    """Ray answers an id it has with its "already exists" text (in an HTTP 500: not a failure that may pass): when
    its record carries our metadata, an earlier try of this submission landed (its answer was lost), and
    nothing is submitted twice."""
    runner = RayJobRunner(job_head.url)
    runner.submit("job-1-a1", "echo hi", {}, {}, {"num_gpus": 0}, MINE)
    job_head.jobs["job-1-a1"]["status"] = "RUNNING"
    runner.submit("job-1-a1", "echo hi", {}, {}, {"num_gpus": 0}, MINE)
    assert job_head.posts == 2 and job_head.jobs["job-1-a1"]["status"] == "RUNNING"


def test_an_id_ray_has_from_an_earlier_job_of_that_id_is_deleted_and_submitted_again(
        job_head: StandInJobHead) -> None:
    """A job id may be submitted again once the head dropped the first job of it (``ended_retention_s``): if Ray
    still has the first one's record, "already exists" is not this submission landing. Taking it as taken ran
    nothing and reported the old job's status as the new one's."""
    old = {"orchestrator_job": "job-1", "orchestrator_submitted_at": "1.25"}
    job_head.jobs["job-1-a1"] = {"type": "SUBMISSION", "submission_id": "job-1-a1", "status": "SUCCEEDED",
                                 "entrypoint": "echo old", "metadata": old, "end_time": int(time.time() * 1000) - 2000}
    # Ended 2 s ago: Ray's job manager may still watch it, and would fail a job put under its id now. Put off.
    with pytest.raises(JobApiUnavailableError, match="may still watch the earlier job"):
        RayJobRunner(job_head.url).submit("job-1-a1", "echo new", {}, {}, {"num_gpus": 0}, MINE)
    assert job_head.jobs["job-1-a1"]["metadata"] == old  # not deleted
    job_head.jobs["job-1-a1"]["end_time"] -= int(ray_api.ID_REUSE_QUIET_S * 1000)
    RayJobRunner(job_head.url).submit("job-1-a1", "echo new", {}, {}, {"num_gpus": 0}, MINE)
    assert job_head.jobs["job-1-a1"]["metadata"] == MINE and job_head.jobs["job-1-a1"]["entrypoint"] == "echo new"
    job_head.jobs["job-1-a1"].update(status="RUNNING", metadata=old, end_time=None)  # the earlier one runs: refused
    with pytest.raises(RuntimeError, match="earlier job with this id") as e:
        RayJobRunner(job_head.url).submit("job-1-a1", "echo new", {}, {}, {"num_gpus": 0}, MINE)
    assert not isinstance(e.value, JobApiUnavailableError)


def test_a_delete_is_refused_while_the_job_runs_and_unavailable_when_ray_cannot_answer(
        job_head: StandInJobHead) -> None:
    runner = RayJobRunner(job_head.url)
    runner.submit("job-2-a1", "echo hi", {}, {}, {"num_gpus": 0}, {})
    with pytest.raises(RuntimeError, match="terminal") as e:
        runner.delete("job-2-a1")
    assert not isinstance(e.value, JobApiUnavailableError)
    job_head.jobs["job-2-a1"]["status"] = "STOPPED"
    runner.delete("job-2-a1")
    assert "job-2-a1" not in job_head.jobs
    job_head.close()
    with pytest.raises(JobApiUnavailableError):
        runner.delete("job-2-a1")


def test_a_submission_that_lands_returns(job_head: StandInJobHead) -> None:
    _submit(RayJobRunner(job_head.url))
    assert job_head.posts == 1


def test_nothing_listening_is_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    with pytest.raises(JobApiUnavailableError, match="Failed to connect|Connection"):
        _submit(RayJobRunner(f"http://127.0.0.1:{port}"))


def test_a_hung_job_api_is_given_up_on_after_the_timeout(job_head: StandInJobHead) -> None:
    """Ray's client sets no timeout: without ours a hung dashboard would hold the head's loop for ever."""
    runner = RayJobRunner(job_head.url, timeout_s=0.5)
    runner.client  # the version check answers at once
    job_head.answer = (200, "{}", 5.0)
    t0 = time.monotonic()
    with pytest.raises(JobApiUnavailableError, match="Timeout|timed out"):
        _submit(runner)
    assert time.monotonic() - t0 < 3.0
