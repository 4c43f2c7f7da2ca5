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
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Mapping

from orchestrator.core.api import HeadApi
from orchestrator.core.errors import OrchestratorError
from orchestrator.core.job import JOB_TRANSITIONS, JobSpec
from orchestrator.sdk.connect import Connection, open_connection
from orchestrator.sdk.inputs import as_spec, new_job_id

__all__ = ["Client", "JobHandle", "JobWaitTimeoutError", "TERMINAL_STATES"]

TERMINAL_STATES = frozenset(s.value for s in JOB_TRANSITIONS.terminal)


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

    ``head`` injects a :class:`HeadApi` (nothing connects then).
    Use as a context manager, or call :meth:`close`, to disconnect a driver the
    client connected itself; a driver that was already connected stays so.
    """

    def __init__(self, address: str | None = None, *, namespace: str | None = None, head_name: str | None = None,
                 state_dir: str | os.PathLike[str] | None = None, head: HeadApi | None = None) -> None:
        self._conn: Connection | None = None
        if head is None:
            self._conn = open_connection(address, namespace=namespace, head_name=head_name, state_dir=state_dir)
            head = self._conn.head
        self.head: HeadApi = head

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
        info = self.head.submit_job(spec.model_dump(mode="json"), job_id or new_job_id(spec.name))
        return JobHandle(self.head, info["job_id"], info)

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
        delay = poll_s
        while True:
            d = self.status()
            key = (d.get("state"), d.get("message"), d.get("attempt"))
            if key != seen:
                seen, delay = key, poll_s
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
            step = delay if deadline is None else max(0.0, min(delay, deadline - clock()))
            sleep(step)
            delay = min(max_poll_s, delay * 1.5)

    def logs(self) -> str:
        """The Ray job's output so far (the current attempt's)."""
        return self.head.job_logs(self.job_id)

    def cancel(self) -> dict[str, Any]:
        """Stop the job (queued, running or checkpointing) and release its lease. Idempotent."""
        self.info = self.head.cancel_job(self.job_id)
        return self.info

    def explain(self) -> dict[str, Any]:
        """Why it waits (grouped reasons, queue position, what preemption would admit it), or why it runs where it does."""
        return self.head.explain_job(self.job_id)
