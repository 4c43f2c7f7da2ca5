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
from orchestrator.rayport.ray_api import RayJobRunner


class StandInJobHead:
    """Ray's job head as far as a submission goes: the version check, then ``(status, body, delay)``."""

    def __init__(self) -> None:
        self.answer: tuple[int, str, float] = (200, json.dumps({"submission_id": "x", "job_id": None}), 0.0)
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

            def do_GET(self) -> None:
                self._send(200, json.dumps({"ray_version": "2.60.0", "version": "x", "session_name": "s"}).encode())

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                head.posts += 1
                status, body, delay = head.answer
                time.sleep(delay)
                try:
                    self._send(status, body.encode())
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


def test_an_id_ray_already_has_is_taken_not_refused(job_head: StandInJobHead) -> None:
    """What Ray's job head answers for an id it has (HTTP 400, its text): an earlier try of ours landed."""
    job_head.answer = (400, "Job with submission_id job-1-a1 already exists. Please use a different submission_id.", 0.0)
    _submit(RayJobRunner(job_head.url))
    job_head.answer = (400, "Job with submission_id job-9-a1 already exists.", 0.0)  # someone else's id
    with pytest.raises(RuntimeError, match="already exists"):
        _submit(RayJobRunner(job_head.url))


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
