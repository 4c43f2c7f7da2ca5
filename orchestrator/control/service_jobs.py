"""The job-facing half of the head's API: :class:`JobMethods`, a part of
:class:`~orchestrator.control.service.HeadService`.

:class:`~orchestrator.control.service.HeadService` stays the one class that implements
:class:`~orchestrator.core.api.HeadApi`: this mixin holds no state of its own (it reads the service's
``jobs``, a :class:`~orchestrator.control.jobs.JobManager`, and calls the service's fast grant path through
``_planned``), and every API method it defines is wrapped by the service's edge check like the service's own.

Invariants:

* the arguments were validated at the edge; a job spec is parsed into :class:`~orchestrator.core.job.JobSpec`
  here, once;
* a job is cancelled, and its logs read, only by its owner, an administrator or the head itself
  (:meth:`JobMethods.check_job_owner`);
* no method here calls Ray's job API on the head's loop: a submission, a stop or a delete a call makes due is
  handed out by :func:`~orchestrator.control.jobs.launches.take_due` over this class's job-API side
  (``take_*``, ``send_*``, ``*_done``/``*_sent``), after the store holds what made it due -- by the head
  actor off its loop (``rayport.head.launch_off_loop``), by an in-process head through
  :func:`~orchestrator.control.jobs.launches.run_due`; each answer is applied here, on the loop, and logged.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Mapping

from orchestrator.control.controller import HeadController, ReconcileReport
from orchestrator.control.jobs import Chore, JobManager, RaySubmission
from orchestrator.core import credentials
from orchestrator.core.api import Caller, Json
from orchestrator.core.errors import PermissionDeniedError
from orchestrator.core.job import JobSpec

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Begun:
    """A call of :data:`HeadService.PLANNED` with its request queued and not yet planned (:meth:`HeadService.begin`).

    ``queued``: whether it queued a request for the fast grant path (a known job's resubmission queues none);
    ``finish``: its answer, given the report of the plan that ran after it (:meth:`HeadService.grant_now`)."""

    queued: bool
    finish: Callable[[ReconcileReport], Json]


class JobMethods:
    """The job-facing methods of :class:`~orchestrator.control.service.HeadService`; see the module docstring."""

    jobs: JobManager  # set by HeadService.__init__
    ctl: HeadController  # set by HeadService.__init__
    _planned: Callable[[Begun], Json]  # HeadService's: begun, planned by the fast grant path, finished

    def submit_job(self, spec: Mapping[str, Any], job_id: str | None = None) -> Json:
        return self._planned(self._begin_submit_job(spec, job_id))

    def _begin_submit_job(self, spec: Mapping[str, Any], job_id: str | None = None) -> Begun:
        parsed, who = JobSpec.parse(spec), credentials.current()
        self.ctl.sched_config.check_submitter("submit_job", parsed.queue, who.user, who.trusted)
        d = self.jobs.submit(parsed, job_id, owner=who.user)

        def finish(report: ReconcileReport) -> Json:
            if not report.granted:
                return d
            self.jobs.advance(d["job_id"])  # admitted in the call that submitted it when its lease was granted
            return self.jobs.get(d["job_id"])
        return Begun(d["state"] == "queued", finish)

    def get_job(self, job_id: str) -> Json:
        return self.jobs.get(job_id)

    def list_jobs(self) -> list[Json]:
        return self.jobs.list()

    def job_board(self, limit: int = 200) -> Json:
        return self.jobs.board(limit)

    def cancel_job(self, job_id: str) -> Json:
        self.check_job_owner("cancel_job", job_id)
        return self.jobs.cancel(job_id)

    def job_logs(self, job_id: str, attempt: int | None = None) -> str:
        self.check_job_owner("job_logs", job_id)
        return self.jobs.logs(job_id, attempt)

    def job_log_source(self, job_id: str, attempt: int | None = None) -> str | None:
        """The Ray submission whose log ``job_logs`` reads (:meth:`JobManager.log_source`), on the loop; only for
        the job's owner or an administrator."""
        self.check_job_owner("job_logs", job_id)
        return self.jobs.log_source(job_id, attempt)

    def check_job_owner(self, method: str, job_id: str) -> None:
        """Refuse (:class:`PermissionDeniedError`) ``method`` on job ``job_id`` unless the caller is its owner (the
        user key it was submitted with), an administrator or the head itself. ``UnknownObjectError`` first."""
        who = credentials.current()
        owner = self.jobs.owner_of(job_id)
        if not who.trusted and (owner is None or who.user != owner):
            raise PermissionDeniedError(method, Caller.JOB_OWNER.value, job_id)

    def read_job_log(self, submission_id: str) -> str:
        """The log of ``submission_id`` (:meth:`JobManager.read_log`): touches no state, safe off the loop."""
        return self.jobs.read_log(submission_id)

    def explain_job(self, job_id: str) -> Json:
        return self.jobs.explain(job_id)

    def job_preemption_requested(self, job_id: str) -> Json:
        return self.jobs.preemption_requested(job_id)

    def job_ack_checkpoint(self, job_id: str, path: str, step: int | None = None, token: int | None = None) -> Json:
        return self.jobs.ack_checkpoint(job_id, path, step, token)

    # ---- Ray's job API: the hand-out's side (jobs.launches) ----------------------------------------
    def take_submissions(self) -> list[RaySubmission]:
        """The submissions to hand Ray's job API now (:meth:`JobManager.take_submissions`); call once the
        store holds the admissions (:mod:`.jobs.launches`)."""
        return self.jobs.take_submissions()

    def send_submission(self, sub: RaySubmission) -> Exception | None:
        """The blocking call to Ray's job API (:meth:`JobManager.send_submission`): touches no state, safe off the
        loop."""
        return self.jobs.send_submission(sub)

    def submission_sent(self, sub: RaySubmission, error: Exception | None) -> str:
        """Apply Ray's answer (:meth:`JobManager.submission_sent`), on the loop."""
        event = self.jobs.submission_sent(sub, error)
        log.info("%s", event)
        return event

    def launch_due(self) -> bool:
        """Whether a submission or another call to Ray's job API is due (:meth:`JobManager.launch_due`)."""
        return self.jobs.launch_due()

    def take_chores(self) -> list[Chore]:
        """The Ray jobs to stop or delete now (:meth:`JobManager.take_chores`); call once the store holds what was
        written."""
        return self.jobs.take_chores()

    def send_chore(self, chore: Chore) -> Exception | None:
        """The blocking call to Ray's job API (:meth:`JobManager.send_chore`): touches no state, safe off the loop."""
        return self.jobs.send_chore(chore)

    def chore_done(self, chore: Chore, error: Exception | None) -> str:
        """Apply Ray's answer to a stop or delete (:meth:`JobManager.chore_done`), on the loop."""
        event = self.jobs.chore_done(chore, error)
        log.info("%s", event)
        return event
