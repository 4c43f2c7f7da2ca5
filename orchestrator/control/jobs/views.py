"""The job layer's read views: a job's public view, the list, the board, ``explain``.

Invariants:

* a view reads and never changes: no store write, no lease call, no call to Ray;
* the board scans the jobs once and builds only ``limit`` rows (never every job's full view);
* every waiting job's ``explain`` says why it waits and what would free capacity (the controller's lease
  explanation, its owners named by job id), and every placed one why it went where it is;
* :class:`JobReads` is the manager's reading half (a mixin of :class:`~.manager.JobManager` that holds no
  state of its own): it builds its answers with the functions here and never asks the executor or Ray.
"""

from __future__ import annotations

import heapq
from typing import Any, Callable, Iterable, Sequence

from orchestrator.control.jobs.transitions import owner_job
from orchestrator.control.ledger import LedgerEntry
from orchestrator.core.errors import InvalidRequestError, UnknownObjectError
from orchestrator.core.ids import attempt_id
from orchestrator.core.job import Job, JobState

#: ``job_board``: the transitions it shows, and the most rows one may ask for.
BOARD_DECISIONS = 40
MAX_BOARD_ROWS = 5000
_RESUMED_LIVE = frozenset({JobState.QUEUED, JobState.ADMITTED, JobState.RUNNING})


def job_view(job: Job, leases: Sequence[LedgerEntry | None]) -> dict[str, Any]:
    """The job's public view, with its current lease's (``leases``: the attempt's, in worker order)."""
    d = job.to_dict()
    e = leases[0] if leases else None
    d["lease"] = e.to_dict() if e else None
    if job.spec.workers > 1:
        d["worker_leases"] = [x.to_dict() if x else None for x in leases]
    return d


def board(jobs: Iterable[Job], limit: int, decisions: int) -> dict[str, Any]:
    """``HeadApi.job_board``: read off the jobs as they are, with no job's full view built but the rows'.

    The list builds and sends every job kept, history and lease included: with 8,000 jobs in the
    retention window that was ~215 ms on the head's loop and a 7 MB reply, which the live page asked for
    every second. This scans the jobs once (counts, the latest transitions) and builds ``limit`` rows."""
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_BOARD_ROWS:
        raise InvalidRequestError("limit", limit, f"1 to {MAX_BOARD_ROWS} rows")
    jobs = sorted(jobs, key=lambda j: j.submitted_at)
    running = JobState.RUNNING
    counts = {"jobs": len(jobs),
              "waiting_for_lease": sum(1 for j in jobs if j.state is JobState.QUEUED and not j.lease_id),
              "ever_ran": sum(1 for j in jobs if any(h.state is running for h in j.history)),
              "resumed_live": sum(1 for j in jobs if j.attempt > 1 and j.state in _RESUMED_LIVE),
              "resumptions": sum(j.attempt - 1 for j in jobs)}
    # The newest transitions, keyed (at, job id, index: a job's later entry first at one time), are among
    # the histories of the jobs whose last entries are newest: a job outside those has ``decisions`` keys
    # above its every entry.
    recent = heapq.nlargest(decisions, jobs, key=lambda j: (j.history[-1].at, j.job_id) if j.history else (0, ""))
    latest = heapq.nlargest(decisions, ((h.at, j.job_id, k, h.state.value, h.reason)
                                        for j in recent for k, h in enumerate(j.history)))
    live = [j for j in jobs if not j.terminal][-limit:]
    ended = [j for j in jobs if j.terminal][len(live) - limit:] if len(live) < limit else []
    rows = sorted(live + ended, key=lambda j: j.submitted_at)
    return {"counts": counts,
            "decisions": [{"at": at, "job_id": jid, "state": st, "reason": why} for at, jid, _, st, why in latest],
            "jobs": [{"job_id": j.job_id, "name": j.spec.name, "state": j.state.value, "gpu": j.spec.describe_gpu(),
                      "priority_class": j.priority_class, "attempt": j.attempt, "preemptions": len(j.preemptions)}
                     for j in rows],
            "lease_jobs": {lid: j.job_id for j in jobs if not j.terminal for lid in j.lease_ids}}


def explain(job: Job, explained: Sequence[dict[str, Any] | None], *, submit_retrying: bool) -> dict[str, Any]:
    """Why the job is where it is. ``explained``: the controller's explanation of each lease of the current
    attempt, in worker order (None: not in the ledger); ``submit_retrying``: its Ray submission waits for
    another try (the job's message says so)."""
    out: dict[str, Any] = {"job_id": job.job_id, "name": job.spec.name, "state": job.state.value,
                           "pending": None, "placement": None,
                           "preemptions": [{"by": p.by, "reason": p.reason, "at": p.at,
                                            "checkpoint_path": p.checkpoint_path} for p in job.preemptions]}
    lease = None
    if explained:
        # A gang's pending reason is that of its first worker that says why it waits; each worker's is listed.
        lease = next((x for x in explained if x and x.get("pending")), explained[0])
    if job.spec.workers > 1:
        out["workers"] = [worker_view(i, lid, x) for i, (lid, x) in enumerate(zip(job.lease_ids, explained))]
    if lease and lease.get("pending"):
        pend = lease["pending"]
        pend["would_preempt"] = [dict(v, owner=owner_job(v["owner"])) for v in pend["would_preempt"]]
        pend["being_preempted"] = [dict(v, owner=owner_job(v["owner"])) for v in pend["being_preempted"]]
        out["pending"] = pend
    if lease and lease.get("placement") and job.state in (JobState.ADMITTED, JobState.RUNNING, JobState.PREEMPTING,
                                                            JobState.SUCCEEDED, JobState.FAILED):
        out["placement"] = lease["placement"]
    out["summary"] = summary(job, out, submit_retrying=submit_retrying)
    return out


def worker_view(index: int, lease_id: str, ex: dict[str, Any] | None) -> dict[str, Any]:
    """One gang worker in ``explain``: its lease, state, node and why it is there (or waits)."""
    if ex is None:
        return {"worker": index, "lease_id": lease_id, "state": None, "node": None, "reason": "not in the ledger"}
    pend, pl = ex.get("pending"), ex.get("placement")
    return {"worker": index, "lease_id": lease_id, "state": ex.get("state"), "node": pl.get("node") if pl else None,
            "reason": (pend or {}).get("reason") or (pl or {}).get("reason") or ""}


def summary(job: Job, ex: dict[str, Any], *, submit_retrying: bool) -> str:
    """``explain``'s one line."""
    if job.state is JobState.QUEUED and ex["pending"]:
        p = ex["pending"]
        s = f"pending at queue position {p['position'] + 1}: {p['reason']}"
        if p["being_preempted"]:
            s += "; waiting for " + ", ".join(f"{v['owner']} ({v['lease_id']})" for v in p["being_preempted"]) + \
                 " to checkpoint and yield"
        elif p["would_preempt"]:
            s += "; preempting " + ", ".join(dict.fromkeys(v["owner"] for v in p["would_preempt"])) + " would admit it"
        elif p["preemption_blocked"]:
            s += f"; no preemption: {p['preemption_blocked']}"
        if job.preemptions:
            last = job.preemptions[-1]
            s += f" (preempted earlier by {last.by}; resumes from {last.checkpoint_path or 'the start'})"
        return s
    if ex["placement"] and job.state in (JobState.ADMITTED, JobState.RUNNING, JobState.PREEMPTING):
        pl = ex["placement"]
        s = f"{job.state.value} on {pl['node']} GPU {','.join(map(str, pl['gpu_indices']))} ({pl['kind']}): {pl['reason']}"
        if job.state is JobState.PREEMPTING:
            s += f"; being preempted: {job.history[-1].reason}"
        elif job.state is JobState.ADMITTED and submit_retrying:
            s += f"; {job.message}"
        return s
    if job.preemptions:
        last = job.preemptions[-1]
        return (f"{job.state.value}; preempted {len(job.preemptions)}x, last by {last.by}: {last.reason}; "
                + (f"checkpoint {last.checkpoint_path}" if last.checkpoint_path else "no checkpoint was written"))
    return f"{job.state.value}: {job.history[-1].reason}"


def preemption_requested(job: Job, lease: LedgerEntry | None) -> dict[str, Any]:
    """Whether the job is asked to checkpoint and yield, by when and why (``lease``: its current one)."""
    return {"requested": job.state is JobState.PREEMPTING, "lease_id": job.lease_id,
            "deadline": lease.preempt_deadline if lease else None,
            "reason": (lease.preempt_reason or None) if lease else None}


class JobReads:
    """The job manager's reads (see the module docstring); every attribute it uses is :class:`~.manager.JobManager`'s."""

    _jobs: dict[str, Job]
    _leases: Callable[[Job], list[LedgerEntry | None]]
    _lease: Callable[[Job], LedgerEntry | None]
    read_log: Callable[[str], str]

    def _job(self, job_id: str) -> Job:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise UnknownObjectError("job", job_id) from None

    def get(self, job_id: str) -> dict[str, Any]:
        """The job's public view, with its current lease's (:func:`job_view`)."""
        job = self._job(job_id)
        return job_view(job, self._leases(job))

    def list(self) -> list[dict[str, Any]]:
        return [self.get(j) for j in sorted(self._jobs, key=lambda j: self._jobs[j].submitted_at)]

    def board(self, limit: int = 200, decisions: int = BOARD_DECISIONS) -> dict[str, Any]:
        """``HeadApi.job_board`` (:func:`board`)."""
        return board(self._jobs.values(), limit, decisions)

    def logs(self, job_id: str, attempt: int | None = None) -> str:
        """The driver log of the job's current attempt, or of ``attempt`` (each attempt is its own Ray job)."""
        sub_id = self.log_source(job_id, attempt)
        return self.read_log(sub_id) if sub_id else ""

    def log_source(self, job_id: str, attempt: int | None = None) -> str | None:
        """The Ray submission id whose log :meth:`logs` reads (None: the attempt has not reached Ray yet)."""
        job = self._job(job_id)
        if attempt is not None and not 1 <= attempt <= job.attempt:
            raise InvalidRequestError("attempt", attempt, f"an attempt of {job_id}: 1 to {job.attempt}")
        if attempt is not None and attempt != job.attempt:
            return attempt_id(job.job_id, attempt)
        return job.ray_submission_id

    def preemption_requested(self, job_id: str) -> dict[str, Any]:
        job = self._job(job_id)
        return preemption_requested(job, self._lease(job))

    def owner_of(self, job_id: str) -> str | None:
        """The user id job ``job_id`` was submitted under (``UnknownObjectError`` for an unknown job)."""
        return self._job(job_id).owner
