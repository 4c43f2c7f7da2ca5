"""The head's job layer, glued: jobs become leases, granted leases become Ray jobs.

The parts: :mod:`.transitions` decides a job's next step (pure), this module carries it out (the store
write first, then the lease calls and the intents of :mod:`.intents`), :mod:`.ray_calls` is the manager's
side of Ray's job API (hands the intents out, applies the answers), :mod:`.launches` is the one hand-out
every driver of the head uses, :mod:`.executor` makes the calls with its one retry policy, :mod:`.views`
reads, :mod:`.codec` is the stored form (``docs/design.md``, "The job layer").

:class:`JobManager` is a plain class beside the
:class:`~orchestrator.control.controller.HeadController` (no Ray import; the
Ray job API is behind the :class:`JobRunner` protocol, faked in unit tests).
It is one class made of three parts, one per responsibility: this module's
(state, store, steps), :class:`~.ray_calls.RayCalls` and
:class:`~.views.JobReads` (mixins that hold no state of their own).
The head calls :meth:`JobManager.reconcile` after every controller
cycle. Contract, as the controller's:

* **Hard state first, one mode**: a step never calls Ray's job API. It writes
  the job's record, then leaves an intent (a submission, a stop, a delete) that
  :meth:`~.ray_calls.RayCalls.take_submissions` and
  :meth:`~.ray_calls.RayCalls.take_chores` hand out only once the store holds
  the record (:mod:`.launches`: the head actor after its group commit, off its
  loop; an in-process head through :func:`.launches.run_due`). So a restarted
  head knows every submission id it may have made (a submission id is the
  attempt id ``<job>.a<n>``, so a retried submit after a crash is refused by Ray
  as a duplicate rather than run twice), and stops again what it may not have
  stopped before it crashed (:meth:`JobManager.restore`).
* **Idempotent**: ``submit`` with a known job id and the same spec returns the
  job; ``cancel`` of a finished job returns it.

One job, its life (see :data:`orchestrator.core.job.JOB_TRANSITIONS`):

1. ``submit``: admission refusals (the field named), then QUEUED with a lease
   request ``<job>.a<attempt>`` of the job's class, queue and original
   submission time;
2. lease GRANTED -> ADMITTED -> (handed out) the Ray job is submitted with the lease's
   env vars (``CUDA_VISIBLE_DEVICES`` ...), pinned to the lease's node
   (label selector ``ray.io/node-id``, a label Ray gives every node, KubeRay
   pods included), asking Ray for the hand-out's share of its cards
   (``entrypoint_resources``, ``rayport.ray_api.gpu_demand``) -> RUNNING, lease ACTIVE;
3. the Ray job ends -> SUCCEEDED / FAILED, lease RELEASED;
4. the lease becomes CHECKPOINTING (a preemption victim) -> PREEMPTING: the
   job's ``preemption_requested()`` now answers true; it checkpoints and
   calls ``ack_checkpoint(path)``, or its grace period runs out; then the Ray
   job is stopped and the job is QUEUED again with ``resume_from`` and a new
   lease attempt that keeps its original submission time;
5. the lease is LOST (node gone) -> the Ray job is stopped and the job is
   requeued to resume from its last checkpoint;
6. an ended job (succeeded, failed, cancelled) leaves the head and the store
   ``settings.ended_retention_s`` after it ended, as its leases leave the ledger
   (:meth:`JobManager.prune_ended`); a name's ``<name>-<n>`` ids are never given
   twice (the last ``n`` of each name is stored).

**Gang jobs** (``spec.workers`` > 1, ``--gpu 2x4``): an attempt is one lease
per worker (``<attempt>-w<i>``, each a member of the gang ``<attempt>``),
granted all together or not at all by the scheduler. The job's lease state is
read over all of them (:func:`.transitions.lease_view`): it is admitted when every
worker is granted; one worker checkpointing (the head takes a gang as one
victim) makes the job PREEMPTING; its acknowledgement ends every worker's
lease. Its driver runs as one Ray job on worker 0's node asking Ray for no
card: it gets every worker's hand-out in ``ORCHESTRATOR_GANG`` and holds the
cards through the gang's placement group (``sdk.leases.JobGang``), as an SDK
gang does. An **elastic** gang job (``--gpu 1-4x1``, ``spec.min_workers``)
queues its most workers each attempt; the scheduler grants the first ``k`` that
fit and withdraws the others (RELEASED, never granted), and the attempt is the
``k`` granted ones: its driver gets ``k`` hand-outs (Ray Train's
``num_workers``). A resize is a preemption (``victim.grow`` / ``victim.shrink``)
and the next attempt asks the whole range again.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from orchestrator.control.controller import HeadController
from orchestrator.control.jobs import transitions, views
from orchestrator.control.jobs.codec import job_from_json, job_json
from orchestrator.control.jobs.executor import Executor
from orchestrator.control.jobs.intents import Chore, ChoreKind
from orchestrator.control.jobs.ray_calls import RayCalls
from orchestrator.control.jobs.runner import JobRunner
from orchestrator.control.jobs.transitions import Step
from orchestrator.control.jobs.views import JobReads
from orchestrator.control.ledger import LedgerEntry
from orchestrator.control.store import StateStore
from orchestrator.core.config import Tuning
from orchestrator.core.errors import InvalidRequestError, PermissionDeniedError, UnknownObjectError
from orchestrator.core.ids import ID_ALLOWED, ID_PATTERN, attempt_id, job_slug
from orchestrator.core.job import Job, JobSpec, JobState, Preempted
from orchestrator.core.lease import LeaseRequest, LeaseState
from orchestrator.core.gang_request import GangMember
from orchestrator.scheduling.admission import check_submission

log = logging.getLogger(__name__)

#: The name a training job's checkpoint gets inside its checkpoint directory (jobs/train.py writes it).
CHECKPOINT_FILE = "checkpoint.pt"
#: A restarted head stops again what the crashed one may not have stopped, back this long past ``submit_retry_s``.
#: The default of ``settings.tuning.restop_slack_s``, which the manager reads (its controller's settings).
RESTOP_SLACK_S = Tuning().restop_slack_s


class JobManager(RayCalls, JobReads):
    """Jobs on top of leases; see the module docstring. Every attribute of its parts is set here."""

    def __init__(self, ctl: HeadController, store: StateStore, runner: JobRunner, *, clock: Callable[[], float],
                 namespace: str, head_name: str, status_poll_s: float = 0.0, submit_retry_s: float = 300.0) -> None:
        self.ctl = ctl
        self.store = store
        self.clock = clock
        self.namespace = namespace
        self.head_name = head_name
        self._prefix = f"{namespace}/job/"
        self._names_key = f"{namespace}/job-names"  # per name, the last number an unnamed submission got
        self._names: dict[str, int] = {}
        self._jobs: dict[str, Job] = {}
        self._ended: dict[str, float] = {}  # ended jobs -> when they ended, in that order (see prune_ended)
        self._acks: dict[str, tuple[str, int | None, float]] = {}  # job id -> (checkpoint path, step, at)
        self._seq = 0
        self.status_poll_s = status_poll_s
        self._ray_status: dict[str, str | None] = {}  # submission id -> Ray status, as of the last batched read
        self._read_at = float("-inf")
        self._read_failing = False  # the last status read failed (said once, until one succeeds)
        # A job's Ray submission waits for take_submissions(), which the head calls once the store holds the
        # admission (the grant it runs on included); then it is with Ray's job API until its answer is applied.
        self._ready: dict[str, None] = {}  # admitted jobs whose submission awaits take_submissions(), in order
        self._sending: set[str] = set()  # jobs whose submission is with Ray's job API now (send -> sent)
        # The calls to Ray's job API and their retries (submissions, and stops and deletes: the chores).
        tuning = ctl.settings.tuning
        self.executor = Executor(runner, clock=clock, retry_for_s=submit_retry_s,
                                 backoff_first_s=tuning.submit_backoff_first_s, backoff_max_s=tuning.submit_backoff_max_s)
        # The jobs a step may move (not ended), in submission order, and the queued ones among them whose
        # lease changed since they were last stepped: a queued job whose lease did not change has nothing to
        # do, so a cycle steps only those of a long queue (see reconcile()).
        self._live: dict[str, None] = {}
        self._touched: set[str] = set()
        ctl.ledger.watch(self._lease_changed)

    @property
    def runner(self) -> JobRunner:
        return self.executor.runner

    @property
    def submit_retry_s(self) -> float:
        """How long a call Ray's job API cannot take is asked again before it is given up."""
        return self.executor.retry_for_s

    # ---- persistence ---------------------------------------------------------------------------
    def restore(self) -> int:
        for key in self.store.keys(self._prefix):
            d = self.store.get(key)
            if d is not None:
                job = job_from_json(d)
                self._jobs[job.job_id] = job
                self._seq = max(self._seq, int(d.get("seq", 0)))
        self._names = dict(self.store.get(self._names_key) or {})
        for job in sorted(self._jobs.values(), key=lambda j: j.submitted_at):
            self._track(job)
            self._touched.add(job.job_id)  # every restored job is looked at once
            since = self.clock() - self.submit_retry_s - self.ctl.settings.tuning.restop_slack_s
            for sub_id in transitions.may_run_unwanted(job, since=since):
                self._stop(sub_id)
        self._ended = dict(sorted(self._ended.items(), key=lambda kv: kv[1]))  # in the order they ended
        return len(self._jobs)

    def _commit(self, job: Job) -> Job:
        self._seq += 1
        self.store.put(self._prefix + job.job_id, {**job_json(job), "seq": self._seq})
        self._jobs[job.job_id] = job
        self._track(job)
        if job.state is not JobState.ADMITTED and job.ray_submission_id:
            self.executor.submission_over(job.ray_submission_id)  # submitted, or gone another way
        return job

    def _track(self, job: Job) -> None:
        if job.terminal:
            self._live.pop(job.job_id, None)
            self._ended.setdefault(job.job_id, job.history[-1].at)
        else:
            self._live.setdefault(job.job_id, None)

    def prune_ended(self, cutoff: float) -> list[str]:
        """Drop the jobs that ended before ``cutoff`` (head clock), from the store first; returns their ids.

        The head calls it with the cutoff of the controller's prune pass (``ReconcileReport.pruned_before``:
        ``settings.ended_retention_s`` ago, every 10 s), so jobs and their leases leave together; an id is
        recognised (a resubmission answered with the job) until then. Jobs are kept in the order they
        ended, so a call costs what it drops. Each dropped job's attempts are deleted from Ray's job table
        too (after the store has dropped it; :meth:`~.ray_calls.RayCalls.take_chores`): Ray never empties it, and a job submitted
        again under a dropped job's id then finds no record of the old one under its submission ids."""
        pruned = []
        for job_id, at in self._ended.items():
            if at >= cutoff:
                break
            pruned.append(job_id)
        for job_id in pruned:
            self.store.delete(self._prefix + job_id)
            del self._ended[job_id]
            job = self._jobs.pop(job_id)
            self._acks.pop(job_id, None)
            for n in range(1, job.attempt + 1):  # Ray keeps every job's record for ever: ours go with the job
                if n < job.attempt or job.ray_submission_id:
                    self._chore(Chore(ChoreKind.DELETE, attempt_id(job_id, n)))
        return pruned

    def _lease_changed(self, old: LedgerEntry | None, new: LedgerEntry | None) -> None:
        """A ledger watcher: a lease of a job changed (or was dropped), so the job has a step to take."""
        owner = (new or old).spec.owner  # type: ignore[union-attr]
        if owner.startswith("job:"):
            self._touched.add(owner[4:])

    # ---- public API ----------------------------------------------------------------------------
    def submit(self, spec: JobSpec, job_id: str | None = None, owner: str | None = None) -> dict[str, Any]:
        """Queue a validated spec (the head's edge validated it) or refuse it at once, naming the field. ``owner``:
        the user id it is submitted under (who may cancel it and read its logs besides an administrator)."""
        if job_id is not None and not ID_PATTERN.match(job_id):  # it becomes a Ray submission id, in URLs
            raise InvalidRequestError("job_id", job_id, ID_ALLOWED)
        if job_id is not None and job_id in self._jobs:
            known = self._jobs[job_id]
            if known.spec != spec or known.owner != owner:
                raise InvalidRequestError("job_id", job_id, "an id not used before",
                                          detail="that id already names a different job")
            return self.get(job_id)
        class_name, pclass = check_submission(spec.gpu, spec.priority, spec.queue, self.ctl.sched_config,
                                              self.ctl.snapshot())
        if job_id is None:  # <name>-<n>, n never given to that name before (pruned jobs included)
            slug = job_slug(spec.name)
            n = self._names.get(slug, 0) + 1
            while f"{slug}-{n}" in self._jobs:
                n += 1
            job_id, self._names[slug] = f"{slug}-{n}", n
            self.store.put(self._names_key, dict(self._names))
        now = self.clock()
        job = Job.new(job_id, spec, priority=pclass.priority, priority_class=class_name, now=now, owner=owner)
        job = replace(job, attempt=1, lease_id=attempt_id(job_id, 1))
        self._commit(job)
        self._request_lease(job)
        return self.get(job_id)

    def cancel(self, job_id: str, reason: str = "cancelled by the user") -> dict[str, Any]:
        job = self._job(job_id)
        if job.terminal:
            return self.get(job_id)
        if job.ray_submission_id and job.state in (JobState.RUNNING, JobState.PREEMPTING, JobState.ADMITTED):
            self._stop(job.ray_submission_id)
        self._release_lease(job, reason, fence=True)  # its cards go on once the agent says the job is gone
        self._commit(job.transition(JobState.CANCELLED, now=self.clock(), reason=reason, message=reason))
        return self.get(job_id)

    def explain(self, job_id: str) -> dict[str, Any]:
        """Why the job is where it is (:func:`.views.explain`), from the controller's explanation of its leases."""
        job = self._job(job_id)
        explained: list[dict[str, Any] | None] = []
        for lid in job.lease_ids:
            try:
                explained.append(self.ctl.explain_lease(lid))
            except UnknownObjectError:
                explained.append(None)
        return views.explain(job, explained, submit_retrying=self.executor.retrying(job.ray_submission_id or ""))

    def ack_checkpoint(self, job_id: str, path: str, step: int | None = None,
                       token: int | None = None) -> dict[str, Any]:
        """The job checkpointed because it was asked to; its lease (a gang's: every worker's) ends as PREEMPTED now.

        ``token`` must be the fencing token of the job's current lease (a gang's: worker 0's), and that lease
        must hold devices (the job has the token in ``ORCHESTRATOR_FENCING_TOKEN``): a stale attempt or another
        driver can neither end the lease nor name the checkpoint a queued job will resume from
        (:class:`PermissionDeniedError` while it holds none)."""
        job = self._job(job_id)
        lease = self._lease(job)
        if lease is None or not lease.lease.holding:
            raise PermissionDeniedError("job_ack_checkpoint", "the job, while its lease holds devices", job_id)
        self.ctl.check_token(lease, token)
        now = self.clock()
        self._acks[job_id] = (path, step, now)
        for e in self._leases(job):
            if e is None:
                continue
            if job.state is JobState.PREEMPTING and e.state is LeaseState.CHECKPOINTING:
                self.ctl.ack_preemption(e.lease_id, path)
            elif job.state is JobState.RUNNING:
                self.ctl.report_checkpoint(e.lease_id, path, now)
        return self.get(job_id)

    def advance(self, job_id: str) -> str | None:
        """One step of one job now, outside the cycle: a job whose lease the fast grant path just granted is
        admitted in the call that submitted it (its submission handed out as any other, :mod:`.launches`)."""
        return self._step(self._job(job_id))

    # ---- the reconcile step --------------------------------------------------------------------
    def reconcile(self) -> list[str]:
        """Drive every live job one step; returns human-readable events (for the head's log).

        A queued job is stepped only when a lease of its changed since its last step (a ledger watcher marks
        it; every restored job is marked once), or when its last step failed: one that is still waiting for
        its grant has nothing to do, and a cycle costs what changed, not the length of the queue. A running
        (or preempting) job is stepped when marked so, or when this cycle read Ray's statuses; an admitted
        one every cycle.

        The Ray status of every started job is read at most once per ``status_poll_s``, in one batched
        call (:meth:`JobRunner.status_many`): one read per tick, whatever the number of jobs."""
        events: list[str] = []
        read = self._read_statuses()
        touched, self._touched = self._touched, set()
        for job_id in list(self._live):
            job = self._jobs[job_id]
            if job_id not in touched and (job.state is JobState.QUEUED or (
                    not read and job.state in (JobState.RUNNING, JobState.PREEMPTING))):
                continue  # nothing it looks at changed since its last step: its lease, and Ray's status
            try:
                ev = self._step(job)
            except Exception as e:  # one job's failure never stops the others (or the head)
                ev = f"{job.job_id}: reconcile error {type(e).__name__}: {e}"
                self._touched.add(job_id)  # tried again next cycle
            if ev:
                events.append(ev)
        return events

    def _step(self, job: Job) -> str | None:
        """Carry out the job's next step (:func:`.transitions.next_step`): the store write first, then the
        lease calls and the calls to Ray's job API."""
        state, lease = self._view(job)
        now = self.clock()
        step = transitions.next_step(
            job, state, lease, self._status(job.ray_submission_id),
            launching=job.job_id in self._ready or job.job_id in self._sending,
            retry_waiting=self.executor.retry_waiting(job.ray_submission_id or "", now),
            acked=job.job_id in self._acks)
        if step is Step.NOTHING:
            return None
        if step is Step.ADMIT:
            assert lease is not None
            admitted = self._commit(job.transition(JobState.ADMITTED, now=now, reason=lease.reason(),
                                                   placement_reason=lease.grant_reason()))
            return self._start(admitted, lease)
        if step is Step.REQUEUE_UNADMITTED:
            assert state is not None
            self._requeue(job, f"lease {job.lease_id} ended ({state.value}) before it was admitted")
            return f"{job.job_id}: lease ended before admission; requeued"
        if step is Step.REQUEST_AGAIN:
            self._request_lease(job)
            return f"{job.job_id}: lease {job.lease_id} missing; requested again"
        if step is Step.START:
            assert lease is not None
            return self._start(job, lease)
        if step is Step.REQUEUE_UNSTARTED:
            what = state.value if state else "gone"
            self._commit(job.transition(JobState.QUEUED, now=now, reason=f"lease {what} before start"))
            self._requeue(self._jobs[job.job_id], f"lease {what} before the Ray job started")
            return f"{job.job_id}: requeued"
        if step is Step.ASK_CHECKPOINT:
            assert lease is not None
            self._commit(job.transition(JobState.PREEMPTING, now=now, reason=lease.preempt_reason or "preempted"))
            return f"{job.job_id}: asked to checkpoint ({lease.preempt_reason})"
        if step is Step.STOP_AND_REQUEUE:
            assert lease is not None and state is not None
            self._stop(job.ray_submission_id)
            self._finish_preemption(job, lease.preempt_reason or lease.reason(), lost=state is LeaseState.LOST)
            return f"{job.job_id}: {state.value}; requeued to resume"
        if step is Step.FINISH:
            return self._finish(job, self._status(job.ray_submission_id) or "")
        assert step is Step.STOP_CHECKPOINTED
        self._stop(job.ray_submission_id)
        self._finish_preemption(job, (lease.preempt_reason if lease else "") or "preempted")
        return f"{job.job_id}: checkpointed and stopped; requeued to resume"

    # ---- steps ---------------------------------------------------------------------------------
    def _finish(self, job: Job, ray_status: str) -> str:
        to = transitions.finished_state(ray_status)
        why = f"Ray job {job.ray_submission_id} {ray_status}"
        self._release_lease(job, why)
        self._commit(job.transition(to, now=self.clock(), reason=why, message=why))
        return f"{job.job_id}: {to.value}"

    def _finish_preemption(self, job: Job, reason: str, lost: bool = False) -> None:
        ack = self._acks.pop(job.job_id, None)
        _, lease = self._view(job)
        # A gang ends as one: the workers not preempted or lost with the others give their cards back too.
        self._release_lease(job, f"its gang was {'lost' if lost else 'preempted'}: {reason}")
        path = (ack[0] if ack else None) or (lease.lease.checkpoint_path if lease else None) or self._checkpoint_on_disk(job)
        by = (lease.preempt_for if lease else None) or ("node lost" if lost else "")
        by_entry = self.ctl.ledger.find(by) if by else None
        by_job = transitions.owner_job(by_entry.spec.owner) if by_entry else by
        asked_at = lease.lease.entered(LeaseState.CHECKPOINTING) if lease else None
        record = Preempted(by=by_job or "unknown", reason=reason, at=self.clock(), checkpoint_path=path,
                           checkpoint_s=(ack[2] - asked_at) if ack and asked_at is not None else None)
        to_queue = job.transition(JobState.QUEUED, now=self.clock(),
                                  reason=f"{'lost' if lost else 'preempted'} by {record.by}: {reason}; "
                                         f"resumes from {path or 'the start'}",
                                  preemptions=job.preemptions + (record,), resume_from=path)
        self._commit(to_queue)
        self._requeue(to_queue, None)

    def _requeue(self, job: Job, reason: str | None) -> None:
        attempt = job.attempt + 1
        job = self._commit(replace(job, attempt=attempt, lease_id=attempt_id(job.job_id, attempt),
                                   message=reason or job.message))
        self._request_lease(job)

    def _request_lease(self, job: Job) -> None:
        """Queue the job's current attempt (a gang: every worker's lease, members of the gang named by the
        attempt); its class and queue were resolved at admission, not again here. Idempotent per lease id."""
        assert job.lease_id
        gang = job.spec.gang
        for i, lid in enumerate(job.lease_ids):
            spec = LeaseRequest(lease_id=lid, request=job.spec.gpu, owner=f"job:{job.job_id}",
                                priority_class=job.priority_class, queue=job.spec.queue, requeue_on_loss=False,
                                enqueued_at=job.submitted_at,
                                gang=GangMember.of(gang, job.lease_id, i) if gang is not None else None)
            self.ctl.enqueue(spec, job.priority_class, job.priority)

    def _release_lease(self, job: Job, reason: str, *, fence: bool = False) -> None:
        """End the job's leases; ``fence``: its processes may still run, so each keeps its cards until the node's
        agent has stopped them and confirmed (``HeadController.released``)."""
        for lease in self._leases(job):
            if lease and not lease.lease.terminal:
                self.ctl.released(lease.lease_id,
                                  lease.lease.fencing_token if lease.state is not LeaseState.PENDING else None, reason,
                                  fence=fence)

    # ---- helpers -------------------------------------------------------------------------------
    def _lease(self, job: Job) -> LedgerEntry | None:
        """The ledger entry of the job's current attempt (a gang's: worker 0's), typed, read in-process; None
        once pruned."""
        ids = job.lease_ids
        return self.ctl.ledger.find(ids[0]) if ids else None

    def _leases(self, job: Job) -> list[LedgerEntry | None]:
        """Every lease of the current attempt, in worker order (one for a single-lease job), less an elastic gang's
        workers withdrawn from it (:func:`.transitions.withdrawn`): the attempt runs with the others."""
        found = [self.ctl.ledger.find(lid) for lid in job.lease_ids]
        return [e for e in found if e is None or not transitions.withdrawn(e)]

    def _view(self, job: Job) -> tuple[LeaseState | None, LedgerEntry | None]:
        """The attempt's lease state and the entry that shows it (:func:`.transitions.lease_view`)."""
        return transitions.lease_view(self._leases(job))

    @staticmethod
    def _checkpoint_on_disk(job: Job) -> str | None:
        if job.spec.checkpoint_dir:
            p = Path(job.spec.checkpoint_dir) / CHECKPOINT_FILE
            if p.exists():
                return str(p)
        return None
