"""The job manager's side of Ray's job API: admitted jobs handed out as submissions, Ray's answers applied,
the stops and deletes (chores) handed out, and the batched reads of Ray's job statuses.

:class:`RayCalls` is a part of :class:`~.manager.JobManager` (a mixin: it holds no state of its own; every
attribute it reads is set by ``JobManager.__init__``, annotated below), kept apart because it is the one
place the job layer meets Ray's job API. Invariants (the hand-out itself: :mod:`.launches`):

* **intents, never calls, in a step**: a step records an admitted job's submission id, then marks it ready
  (:meth:`RayCalls._start`); a stop or delete is queued with the executor (:meth:`RayCalls._chore`). Only
  :meth:`~RayCalls.take_submissions` and :meth:`~RayCalls.take_chores` hand them out, once the store holds
  the record that made them due, and each is handed out once;
* :meth:`~RayCalls.send_submission` and :meth:`~RayCalls.send_chore` read and change no state (they may run
  off the head's loop); the answers are applied on the loop, to the job as it is then
  (:meth:`~RayCalls.sent`): a job that changed meanwhile has what Ray took stopped;
* a job whose submission is ready or with Ray (``_ready``, ``_sending``) is not stepped again until the
  answer is applied (``transitions.next_step``'s ``launching``);
* Ray's status of every started job is read at most once per ``status_poll_s``, in one batched call.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from orchestrator.control.jobs import transitions
from orchestrator.control.jobs.intents import Chore, ChoreKind, RaySubmission
from orchestrator.control.ledger import LedgerEntry
from orchestrator.core.errors import JobApiUnavailableError
from orchestrator.core.ids import attempt_id
from orchestrator.core.job import Job, JobState
from orchestrator.core.lease import LeaseState

if TYPE_CHECKING:
    from orchestrator.control.controller import HeadController
    from orchestrator.control.jobs.executor import Executor
    from orchestrator.control.jobs.runner import JobRunner

log = logging.getLogger(__name__)


class RayCalls:
    """:class:`~.manager.JobManager`'s calls to Ray's job API; see the module docstring."""

    # Set by JobManager.__init__ (this class holds no state of its own).
    ctl: HeadController
    clock: Callable[[], float]
    namespace: str
    head_name: str
    executor: Executor
    status_poll_s: float
    _jobs: dict[str, Job]
    _live: dict[str, None]
    _touched: set[str]
    _ready: dict[str, None]
    _sending: set[str]
    _ray_status: dict[str, str | None]
    _read_at: float
    _read_failing: bool

    # JobManager's, used here.
    runner: JobRunner
    submit_retry_s: float
    _commit: Callable[[Job], Job]
    _leases: Callable[[Job], list[LedgerEntry | None]]
    _view: Callable[[Job], tuple[LeaseState | None, LedgerEntry | None]]
    _release_lease: Callable[..., None]

    # ---- submissions -----------------------------------------------------------------------------
    def _start(self, job: Job, lease: LedgerEntry) -> str:
        """Record the Ray submission id of the job's attempt, then mark it ready for :meth:`take_submissions`."""
        sub_id = attempt_id(job.job_id, job.attempt)  # the lease attempt's id: one id from our jobs to Ray's
        self._commit(replace(job, ray_submission_id=sub_id))  # the id is known before Ray hears of it
        self._ready[job.job_id] = None
        return f"{job.job_id}: admitted; submitted to Ray as {sub_id} once recorded"

    def take_submissions(self) -> list[RaySubmission]:
        """The submissions of the jobs admitted since the last call that are still admitted on a granted lease
        (each now *sending*: no step touches it until :meth:`sent`); a job that is not is logged and left to its
        next step. Call once the store holds what was written so far (:mod:`.launches`), then
        :meth:`send_submission` each and apply the answer with :meth:`submission_sent`.

        Invariant: no Ray job starts on a grant a restarted head would not restore."""
        ready, self._ready = self._ready, {}
        subs = []
        for job_id in ready:
            job = self._jobs.get(job_id)
            state, lease = self._view(job) if job else (None, None)
            if job is None or job.state is not JobState.ADMITTED or state is not LeaseState.GRANTED or lease is None:
                # changed meanwhile (cancelled, preempted, lost): its next step deals with it
                log.info("%s: not submitted to Ray: the job is %s, its lease %s", job_id,
                         job.state.value if job else "gone", state.value if state else "gone")
                continue
            try:
                subs.append(self._submission(job, lease))
            except Exception as e:  # one job's failure never stops the others (or the head)
                log.warning("%s: launch error %s: %s", job_id, type(e).__name__, e)
                continue
            self._sending.add(job_id)
        return subs

    def send_submission(self, sub: RaySubmission) -> Exception | None:
        """Hand ``sub`` to Ray's job API (:meth:`.executor.Executor.send`); returns what it raised (None: taken).
        Reads and changes no state of the manager: the head actor calls it on a thread of its own while its
        loop goes on."""
        return self.executor.send(sub)

    def _submission(self, job: Job, lease: LedgerEntry) -> RaySubmission:
        """What the admitted job is submitted to Ray with (:func:`.transitions.submission`)."""
        members = [e for e in self._leases(job) if e is not None]
        return transitions.submission(job, lease, members, namespace=self.namespace, head_name=self.head_name)

    def submission_sent(self, sub: RaySubmission, error: Exception | None) -> str:
        """:meth:`sent`, its own failure an event (one job's failure never stops the others, or the head)."""
        try:
            return self.sent(sub, error)
        except Exception as e:
            self._sending.discard(sub.job_id)
            self._touched.add(sub.job_id)
            return f"{sub.job_id}: launch error {type(e).__name__}: {e}"

    def sent(self, sub: RaySubmission, error: Exception | None) -> str:
        """Apply Ray's answer to ``sub`` (:meth:`send_submission`'s return) to the job as it is now.

        Still admitted on a granted lease: taken -> its lease(s) activated for the Ray job and the job RUNNING;
        unavailable for now -> sent again after a backoff (:meth:`_submit_later`); refused -> FAILED, its
        lease(s) freed. Changed meanwhile (cancelled, its lease preempted or lost): a Ray job that was taken
        is stopped, and the job's next step deals with the rest."""
        self._sending.discard(sub.job_id)
        job = self._jobs.get(sub.job_id)
        taken = error is None
        current = job is not None and job.state is JobState.ADMITTED and job.ray_submission_id == sub.submission_id
        state, lease = self._view(job) if job is not None and current else (None, None)
        if job is None or not current or state is not LeaseState.GRANTED or lease is None:
            if taken:
                self._stop(sub.submission_id)  # what Ray took must not run on devices the job no longer holds
            if job is not None:
                self._touched.add(job.job_id)
            return (f"{sub.job_id}: changed while {sub.submission_id} was being submitted (the job "
                    f"{job.state.value if job else 'gone'}, its lease {state.value if state else 'not granted'})"
                    + ("; stopped it in Ray" if taken else ""))
        if isinstance(error, JobApiUnavailableError):
            return self._submit_later(job, error)
        if not taken:
            self._release_lease(job, f"Ray refused the job: {error}")
            self._commit(job.transition(JobState.FAILED, now=self.clock(), reason=f"Ray refused the submission: {error}",
                                        message=str(error)))
            return f"{job.job_id}: Ray refused the submission: {error}"
        a = lease.lease.allocation
        assert a is not None
        members = [e for e in self._leases(job) if e is not None]
        for e in members:
            self.ctl.activated(e.lease_id, e.lease.fencing_token, None, f"job:{sub.submission_id}")
        where = a.node_name if len(members) == 1 else f"{a.node_name} (driver; gang of {len(members)} on " \
            f"{','.join(sorted({e.lease.allocation.node_name for e in members if e.lease.allocation}))})"
        retried = {"message": ""} if self.executor.retrying(sub.submission_id) else {}  # the retry's note is over
        self._commit(job.transition(JobState.RUNNING, now=self.clock(),
                                    reason=f"submitted to Ray as {sub.submission_id} on {where} ({a.kind.value})",
                                    **retried))
        return f"{job.job_id}: running as {sub.submission_id} on {a.node_name}"

    def _submit_later(self, job: Job, e: JobApiUnavailableError) -> str:
        """Ray's job API could not take the submission for now: the job stays admitted on its lease and is
        sent again, under the same submission id, after a backoff (:meth:`.executor.Executor.submit_failed`);
        after ``submit_retry_s`` of failures it fails with what Ray said and frees its lease(s). The job's
        ``message`` says where it stands."""
        now, sub_id = self.clock(), job.ray_submission_id or ""
        retry, give_up = self.executor.submit_failed(sub_id, now)
        if give_up:
            why = f"Ray's job API did not take {sub_id} in {now - retry.first:.0f}s of trying: {e.detail}"
            self._release_lease(job, why)
            self._commit(job.transition(JobState.FAILED, now=now, reason=why, message=why))
            return f"{job.job_id}: {why}"
        msg = (f"{e}; submitting it again in {retry.due - now:g}s (try {retry.tries}, failing after "
               f"{self.submit_retry_s:g}s)")
        if retry.tries == 1:
            log.warning("%s: %s", job.job_id, msg)
        self._commit(replace(job, message=msg))
        return f"{job.job_id}: {msg}"

    # ---- stops and deletes (chores) ----------------------------------------------------------------
    def _stop(self, sub_id: str | None) -> None:
        """Stop the Ray job ``sub_id`` (:meth:`_chore`)."""
        if sub_id:
            self._chore(Chore(ChoreKind.STOP, sub_id))

    def _chore(self, chore: Chore) -> None:
        """Ask for ``chore``: handed out by :meth:`take_chores` once the store holds what was written so far."""
        self.executor.ask(chore)

    def launch_due(self) -> bool:
        """Whether :meth:`take_submissions` or :meth:`take_chores` would hand anything out now: what the head's
        loop makes durable and hands Ray's job API (nothing else it writes needs a flush of its own)."""
        return bool(self._ready) or bool(self.executor.due_chores())

    def take_chores(self) -> list[Chore]:
        """The calls to Ray's job API due now other than submissions, each handed out once: those asked for
        since the last call, and those whose retry is due. Call once the store holds what was written so far,
        then :meth:`send_chore` each and apply the answer with :meth:`chore_done`.

        Invariant: a Ray job is stopped only after the record that made it unwanted (cancelled, preempted, lost)
        is in the store, so a restarted head never finds a job it believes running stopped under it; and its
        record in Ray's job table is deleted only after the job left our store (``prune_ended``). At most
        :data:`~.executor.DELETES_IN_FLIGHT` deletes are out at a time: a prune drops a day's worth of jobs after
        a long outage, and their deletes must not queue ahead of the submissions on the job API's one thread."""
        return self.executor.take_chores()

    def send_chore(self, chore: Chore) -> Exception | None:
        """Make the call to Ray's job API (:meth:`.executor.Executor.send_chore`); returns what it raised (None:
        done). Reads and changes no state of the manager: the head actor calls it on a thread of its own."""
        return self.executor.send_chore(chore)

    def chore_done(self, chore: Chore, error: Exception | None) -> str:
        """Apply Ray's answer to a stop or delete (:meth:`.executor.Executor.chore_done`: asked again after a
        backoff where it may pass, for ``submit_retry_s``)."""
        return self.executor.chore_done(chore, error)

    # ---- reads -------------------------------------------------------------------------------------
    def _read_statuses(self) -> bool:
        """Read the Ray status of every started job if ``status_poll_s`` has passed; True if it did."""
        now = self.clock()
        if now - self._read_at < self.status_poll_s:
            return False
        ids = [j.ray_submission_id for j in map(self._jobs.__getitem__, self._live)
               if j.ray_submission_id and j.state in (JobState.RUNNING, JobState.PREEMPTING)]
        self._read_at = now
        if not ids:
            self._ray_status = {}
            return True
        try:
            self._ray_status = dict(self.runner.status_many(ids))
        except Exception as e:  # the Ray job API is a boundary: keep the last answers, ask again next tick
            if not self._read_failing:
                log.warning("reading the Ray status of %d jobs failed (%s: %s); asking again every %gs",
                            len(ids), type(e).__name__, e, self.status_poll_s)
            self._read_failing = True
            return False
        self._read_failing = False
        return True

    def _status(self, sub_id: str | None) -> str | None:
        """The job's Ray status from the last batched read (None: not read yet, or unknown to Ray)."""
        return self._ray_status.get(sub_id) if sub_id else None

    def read_log(self, submission_id: str) -> str:
        """The runner's log of ``submission_id``, or a line saying why there is none. Reads no state of the
        manager: the head actor calls it off its loop (it is a call out of the head)."""
        try:
            return self.runner.logs(submission_id)
        except Exception as e:  # the Ray job API is a boundary: say what failed, never crash the head
            return f"(logs of {submission_id} unavailable: {type(e).__name__}: {e})"
