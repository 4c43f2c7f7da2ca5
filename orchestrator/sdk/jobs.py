"""Jobs through the SDK: ``Client().submit(JobSpec(...))`` and the :class:`JobHandle` it returns.

The head queues the job, admits it when its lease is granted and runs it as a
Ray job with the lease's devices; the handle follows it (``status``, ``wait``,
``logs``, ``cancel``, ``explain``). :class:`Client` finds the head as every
command does (:mod:`orchestrator.sdk.connect`); ``head=`` injects any
implementation of :class:`~orchestrator.core.api.HeadApi` instead (the tests
pass the real head logic, in process).

**Idempotent submission.** ``submit`` picks the job id on the client
(``<name>-<6 hex>``) unless given one, so a call the head's actor retries
after a restart finds the job it already made instead of making a second.

**The working directory travels as a URI.** A local ``runtime_env["working_dir"]`` (a folder or a ``.zip``)
is zipped and uploaded to the cluster's GCS *from this machine* by ``submit``, with Ray's own packaging, as
``ray job submit`` does (:func:`orchestrator.rayport.packages.upload_working_dir`); the spec the head keeps
carries the ``gcs://_ray_pkg_<hash>.zip`` URI, so it works against a remote cluster and for every attempt of
the job. A URI (``gcs://``, ``s3://``, ``gs://``, ``https://...zip``) is passed on unchanged.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Mapping

from orchestrator.core.api import HeadApi
from orchestrator.core.backoff import backoff_s
from orchestrator.core.errors import InvalidRequestError, OrchestratorError
from orchestrator.core.job import JOB_TRANSITIONS, JobSpec
from orchestrator.rayport.packages import upload_working_dir
from orchestrator.sdk.connect import Connection, open_connection
from orchestrator.sdk.inputs import as_spec, new_job_id

__all__ = ["Client", "JobHandle", "JobWaitTimeoutError", "TERMINAL_STATES", "WORKING_DIR_ALLOWED"]

TERMINAL_STATES = frozenset(s.value for s in JOB_TRANSITIONS.terminal)

#: What ``runtime_env["working_dir"]`` may be, in the refusals that name it.
WORKING_DIR_ALLOWED = ("an existing local directory or .zip file (uploaded to the cluster), or a URI: gcs://, "
                       "s3://, gs://, https://...zip")

#: Uploads a spec's local ``runtime_env["working_dir"]`` and returns the runtime env carrying its URI.
Uploader = Callable[[Mapping[str, Any]], dict[str, Any]]


class JobWaitTimeoutError(OrchestratorError, TimeoutError):
    """A job did not reach a terminal state within the caller's timeout. Retryable: wait again."""

    retryable = True

    def __init__(self, job_id: str, timeout_s: float, state: str, summary: str = "") -> None:
        self.job_id, self.timeout_s, self.state, self.summary = job_id, timeout_s, state, summary
        msg = f"job {job_id} still {state} after {timeout_s:g}s"
        if summary:
            msg += f": {summary}"
        super().__init__(msg)


class Client:
    """The orchestrator, as a program sees it. See the module docstring for how it finds the head.

    ``head`` injects a :class:`HeadApi` (nothing connects then); ``upload`` replaces the upload of a local
    working directory (default: Ray's, into the connected cluster's GCS; a client with an injected head and
    no ``upload`` refuses a local working directory, having no cluster to send it to).
    Use as a context manager, or call :meth:`close`, to disconnect a driver the
    client connected itself; a driver that was already connected stays so.
    """

    def __init__(self, address: str | None = None, *, namespace: str | None = None, head_name: str | None = None,
                 state_dir: str | os.PathLike[str] | None = None, head: HeadApi | None = None,
                 upload: Uploader | None = None) -> None:
        self._conn: Connection | None = None
        if head is None:
            self._conn = open_connection(address, namespace=namespace, head_name=head_name, state_dir=state_dir)
            head = self._conn.head
            upload = upload or upload_working_dir  # into the cluster this client connected to
        self.head: HeadApi = head
        self._upload = upload

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def submit(self, spec: JobSpec | Mapping[str, Any], *, job_id: str | None = None) -> "JobHandle":
        """Queue a job; refused at once (``InvalidRequestError`` naming the field) when it can never run."""
        spec = as_spec(spec)  # local refusals before any call
        spec = self._with_uploaded_working_dir(spec)
        info = self.head.submit_job(spec.model_dump(mode="json"), job_id or new_job_id(spec.name))
        return JobHandle(self.head, info["job_id"], info)

    def _with_uploaded_working_dir(self, spec: JobSpec) -> JobSpec:
        """``spec`` with a local ``runtime_env["working_dir"]`` uploaded and replaced by its URI (see the module
        docstring). Raises ``InvalidRequestError`` naming ``working_dir`` for a path that is not here."""
        wd = spec.runtime_env.get("working_dir")
        if wd is None or (isinstance(wd, str) and "://" in wd):
            return spec
        if not isinstance(wd, (str, os.PathLike)):
            raise InvalidRequestError("working_dir", wd, WORKING_DIR_ALLOWED)
        path = os.path.abspath(os.path.expanduser(os.fspath(wd)))
        if not (os.path.isdir(path) or (os.path.isfile(path) and path.endswith(".zip"))):
            raise InvalidRequestError("working_dir", os.fspath(wd), WORKING_DIR_ALLOWED, detail="no such directory here")
        if self._upload is None:
            raise InvalidRequestError("working_dir", os.fspath(wd), "a URI: this client has no cluster to upload "
                                      "a local directory to (it was given a head, no upload)")
        return spec.model_copy(update={"runtime_env": self._upload({**spec.runtime_env, "working_dir": path})})

    def job(self, job_id: str) -> "JobHandle":
        """A handle on a job submitted earlier (raises ``UnknownObjectError`` for an unknown id)."""
        return JobHandle(self.head, job_id, self.head.get_job(job_id))

    def jobs(self) -> list[dict[str, Any]]:
        return self.head.list_jobs()

    def status(self) -> dict[str, Any]:
        """Nodes, leases and queue at once (what ``orchestrator status`` shows)."""
        return self.head.status()

    def nodes(self) -> list[dict[str, Any]]:
        return self.head.status()["nodes"]

    def leases(self) -> list[dict[str, Any]]:
        """Live leases (pending, granted, active, checkpointing)."""
        return self.head.status()["leases"]

    def queue(self) -> list[dict[str, Any]]:
        """Pending leases in the order the scheduler considers them, each with why it waits."""
        return self.head.status()["queue"]

    def queues(self) -> list[dict[str, Any]]:
        """The queue tree, parents before children: each queue's guarantee, weight, limit, what it holds and
        asks, its fair share and why it stands where it does (``cause`` ``fair.*``)."""
        return self.head.status().get("queues", [])


class JobHandle:
    """One submitted job. ``info`` is the job dict last seen (``Job.to_dict()`` plus its ``lease``)."""

    def __init__(self, head: HeadApi, job_id: str, info: dict[str, Any] | None = None) -> None:
        self.head = head
        self.job_id = job_id
        self.info = info or {}

    def __repr__(self) -> str:
        return f"JobHandle({self.job_id!r}, state={self.info.get('state')!r})"

    @property
    def state(self) -> str | None:
        return self.info.get("state")

    def status(self) -> dict[str, Any]:
        self.info = self.head.get_job(self.job_id)
        return self.info

    def wait(self, timeout: float | None = None, *, poll_s: float = 0.5, max_poll_s: float = 2.0,
             on_change: Callable[[dict[str, Any]], None] | None = None,
             clock: Callable[[], float] | None = None, sleep: Callable[[float], None] | None = None) -> dict[str, Any]:
        """Wait for succeeded, failed or cancelled; return the final job dict.

        ``on_change`` sees the job dict each time its state or message changes
        (the CLI prints progress from it). Polls every ``poll_s``, backing off
        to ``max_poll_s``. Raises :class:`JobWaitTimeoutError` after ``timeout``.
        """
        clock = clock or time.monotonic
        sleep = sleep or time.sleep
        deadline = None if timeout is None else clock() + timeout
        seen: tuple[Any, ...] | None = None
        polls = 0  # quiet polls in a row: the wait grows from poll_s to max_poll_s
        while True:
            d = self.status()
            key = (d.get("state"), d.get("message"), d.get("attempt"))
            if key != seen:
                seen, polls = key, 0
                if on_change is not None:
                    on_change(d)
            if d["state"] in TERMINAL_STATES:
                return d
            if deadline is not None and clock() >= deadline:
                summary = ""
                try:
                    summary = self.explain().get("summary", "")
                except OrchestratorError:
                    pass
                raise JobWaitTimeoutError(self.job_id, float(timeout or 0), d["state"], summary)
            delay = backoff_s(polls, poll_s, max(poll_s, max_poll_s), 1.5)
            step = delay if deadline is None else max(0.0, min(delay, deadline - clock()))
            sleep(step)
            polls += 1

    def logs(self, attempt: int | None = None) -> str:
        """The Ray job's output so far: the current attempt's, or ``attempt``'s (1 is the first; the head refuses
        one the job has not had, naming ``attempt``)."""
        return self.head.job_logs(self.job_id) if attempt is None else self.head.job_logs(self.job_id, attempt)

    def cancel(self) -> dict[str, Any]:
        """Stop the job (queued, running or checkpointing) and release its lease. Idempotent."""
        self.info = self.head.cancel_job(self.job_id)
        return self.info

    def explain(self) -> dict[str, Any]:
        """Why it waits (grouped reasons, queue position, what preemption would admit it), or why it runs where it does."""
        return self.head.explain_job(self.job_id)
