"""The job layer's pure part: given a job and what its leases and Ray say, the step it takes next.

Nothing here writes, calls Ray or reads a clock: each function maps values to values, so the job's life
(the manager's module docstring) can be read, and tested, as a table. The manager
(:class:`~orchestrator.control.jobs.manager.JobManager`) turns a :class:`Step` into its effects: the store
write first, then the lease calls and the intents (:mod:`.intents`) the executor carries out.

Invariants:

* :func:`next_step` looks only at the job's state, the attempt's lease state (:func:`lease_view`), Ray's
  last read status and whether a submission is out or waiting for its backoff; every pair of a job state and
  a lease state has one answer, :attr:`Step.NOTHING` where nothing changed that the job looks at;
* a gang's lease state is read over all its workers, bad news first (:data:`GANG_STATE_ORDER`), leaving out
  the workers of an elastic gang withdrawn from this attempt (:func:`withdrawn`);
* a gang's driver asks Ray for no card and gets none of the devices' variables (:func:`submission`).
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Sequence

from orchestrator.control.jobs.intents import RaySubmission
from orchestrator.control.ledger import LedgerEntry
from orchestrator.core import env as envvars
from orchestrator.core.config import RAY_NODE_ID_LABEL
from orchestrator.core.ids import attempt_id
from orchestrator.core.job import Job, JobState
from orchestrator.core.lease import LeaseState

#: The Ray job statuses that end a job (SUCCEEDED, else FAILED, or CANCELLED for STOPPED: :func:`finished_state`).
RAY_TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
#: The first of these states any worker of a gang is in is the gang's state (bad news first), see :func:`lease_view`.
GANG_STATE_ORDER = (LeaseState.LOST, LeaseState.EXPIRED, LeaseState.PREEMPTED, LeaseState.RELEASED,
                    LeaseState.CHECKPOINTING)
#: Variables that bind a process to a lease's devices: a gang's driver holds none (its workers do).
DEVICE_VARS = (envvars.CUDA_VISIBLE_DEVICES, envvars.SHARE_KIND, envvars.MIG_PROFILE, envvars.TIMESLICE_MILLI,
               envvars.MEMORY_LIMIT_MIB)
_ENDED_BEFORE_ADMISSION = (LeaseState.LOST, LeaseState.EXPIRED, LeaseState.PREEMPTED, LeaseState.RELEASED)
_ENDED_BEFORE_START = (LeaseState.LOST, LeaseState.PREEMPTED, LeaseState.EXPIRED)
_ENDED_WHILE_PREEMPTING = (LeaseState.PREEMPTED, LeaseState.LOST, LeaseState.RELEASED)


class Step(Enum):
    """What a job does next (:func:`next_step`); the manager's ``_step`` carries it out."""

    NOTHING = "nothing"  # nothing it looks at changed: wait
    # QUEUED
    ADMIT = "admit"  # the lease is granted and handed out -> ADMITTED, then start the Ray job
    REQUEUE_UNADMITTED = "requeue unadmitted"  # the lease ended before admission -> a new attempt
    REQUEST_AGAIN = "request again"  # the lease is missing from the ledger -> the same request again
    # ADMITTED
    START = "start"  # the lease is (still) granted -> submit the Ray job (again, under the same id)
    REQUEUE_UNSTARTED = "requeue unstarted"  # the lease ended before the Ray job started -> QUEUED, new attempt
    # RUNNING
    ASK_CHECKPOINT = "ask checkpoint"  # the lease is a preemption victim -> PREEMPTING
    STOP_AND_REQUEUE = "stop and requeue"  # the lease was preempted or lost under it -> stop, requeue to resume
    FINISH = "finish"  # the Ray job ended -> SUCCEEDED / FAILED / CANCELLED, lease released
    # PREEMPTING
    STOP_CHECKPOINTED = "stop checkpointed"  # acknowledged or grace over -> stop, requeue to resume


def next_step(job: Job, state: LeaseState | None, lease: LedgerEntry | None, ray_status: str | None, *,
              launching: bool, retry_waiting: bool, acked: bool) -> Step:
    """The job's next step. ``state``, ``lease``: the attempt's lease state and the entry that shows it
    (:func:`lease_view`); ``ray_status``: the Ray job's status as last read (None: not read, or unknown);
    ``launching``: its submission waits to be taken or for Ray's answer; ``retry_waiting``: Ray's job API could
    not take it and the next try is not due; ``acked``: it acknowledged a checkpoint since it was asked."""
    if job.state is JobState.QUEUED:
        if state is LeaseState.GRANTED and lease and lease.handout is not None:
            return Step.ADMIT
        if state in _ENDED_BEFORE_ADMISSION:
            return Step.REQUEUE_UNADMITTED
        if state is None and job.lease_id:
            # The head never got the request (a restart between the job's write and the lease's),
            # or the lease ended and was pruned unseen: ask again, under the same id (idempotent).
            return Step.REQUEST_AGAIN
        return Step.NOTHING
    if job.state is JobState.ADMITTED:
        if launching:
            return Step.NOTHING  # its submission waits to be taken, or for Ray's answer
        if state is LeaseState.GRANTED and lease:
            return Step.NOTHING if retry_waiting else Step.START
        if state in _ENDED_BEFORE_START or state is None:
            return Step.REQUEUE_UNSTARTED
        return Step.NOTHING
    if job.state is JobState.RUNNING:
        if state is LeaseState.CHECKPOINTING and lease:
            return Step.ASK_CHECKPOINT
        if state in (LeaseState.PREEMPTED, LeaseState.LOST) and lease:
            return Step.STOP_AND_REQUEUE
        if ray_status in RAY_TERMINAL:
            return Step.FINISH
        return Step.NOTHING
    # PREEMPTING (the manager steps only live jobs: an ended one reaches here only through ``advance``)
    if state in _ENDED_WHILE_PREEMPTING or state is None:
        return Step.STOP_CHECKPOINTED
    if ray_status in RAY_TERMINAL and not acked:
        return Step.FINISH
    return Step.NOTHING


def finished_state(ray_status: str) -> JobState:
    """The state a job ends in when its Ray job ends with ``ray_status`` (one of :data:`RAY_TERMINAL`)."""
    if ray_status == "SUCCEEDED":
        return JobState.SUCCEEDED
    return JobState.CANCELLED if ray_status == "STOPPED" else JobState.FAILED


def lease_view(entries: Sequence[LedgerEntry | None]) -> tuple[LeaseState | None, LedgerEntry | None]:
    """The attempt's lease state and the entry that shows it, from its leases in worker order. A single lease
    is itself. A gang is GRANTED (or ACTIVE) only when every worker is; otherwise the first worker in a state
    of :data:`GANG_STATE_ORDER` (bad news first: one lost worker is a lost gang) speaks for it, else worker 0
    (pending); a worker missing from the ledger makes the gang's state None (ask again). The workers of an
    elastic gang withdrawn from the attempt (:func:`withdrawn`) are not read: the attempt is the others."""
    if len(entries) <= 1:
        e = entries[0] if entries else None
        return (e.state if e else None), e
    if any(e is None for e in entries):
        return None, None
    running = [e for e in entries if not withdrawn(e)]  # type: ignore[arg-type]
    entries = running or entries
    for s in GANG_STATE_ORDER:
        for e in entries:
            if e is not None and e.state is s:
                return s, e
    states = {e.state for e in entries if e is not None}
    if len(states) == 1:
        return states.pop(), entries[0]
    return LeaseState.PENDING, entries[0]


def withdrawn(e: LedgerEntry) -> bool:
    """A worker of an elastic gang the scheduler withdrew from this attempt (cause ``elastic.trimmed``): its lease
    ended RELEASED without ever being granted while its gang ran smaller (``scheduling.gang_cycle``)."""
    g = e.spec.gang
    return (g is not None and g.elastic is not None and e.state is LeaseState.RELEASED
            and e.lease.entered(LeaseState.GRANTED) is None)


def may_run_unwanted(job: Job, since: float) -> list[str]:
    """The Ray submissions of a restored job that the crashed head may have meant to stop and not yet
    stopped (stops leave after the record that needs them: a crash can fall in between): a cancelled job's
    attempt, and the attempt before the current one of a job that was requeued (preempted, or its lease
    lost) -- when that happened after ``since``. A stop is asked for ``submit_retry_s`` at most, so one
    needed before then was taken or given up: a restart re-stops a few jobs, not a day of cancelled ones
    (each an HTTP call, queued before the submissions). Stopping one that already ended is a no-op Ray
    refuses, which is dropped; earlier attempts were stopped before the one before the current one was
    admitted."""
    if job.state is JobState.CANCELLED and job.ray_submission_id and job.history[-1].at >= since:
        return [job.ray_submission_id]
    if not job.terminal and job.attempt > 1:
        requeued = max((h.at for h in job.history if h.state is JobState.QUEUED), default=float("-inf"))
        if requeued >= since:
            return [attempt_id(job.job_id, job.attempt - 1)]
    return []


def owner_job(owner: str) -> str:
    """The job id in a lease owner ``job:<id>``; any other owner as it is."""
    return owner[4:] if owner.startswith("job:") else owner


def submission(job: Job, lease: LedgerEntry, members: Sequence[LedgerEntry], *, namespace: str,
               head_name: str) -> RaySubmission:
    """What the admitted job (its submission id recorded) is submitted to Ray with: on its lease's node,
    with the lease's environment (a gang's driver: every worker's hand-out, no device of its own).
    ``members``: the attempt's leases in the ledger, in worker order."""
    h = lease.handout
    assert h is not None and lease.lease.allocation is not None and job.ray_submission_id, \
        "only a handed-out lease starts a job"
    env = dict(job.spec.runtime_env.get("env_vars", {}))
    env.update(h.env_vars)
    demand = h.to_dict()
    if job.spec.workers > 1:
        # The driver holds no card (the gang's placement group does, worker by worker): every worker's
        # hand-out goes in its environment, none of the devices' variables, and it asks Ray for no card.
        for k in DEVICE_VARS:
            env.pop(k, None)
        env = {k: v for k, v in env.items() if not k.startswith(envvars.MPS_PREFIX)}
        env[envvars.GANG] = json.dumps([e.handout.to_dict() for e in members if e.handout is not None])
        demand = {**demand, "num_gpus": 0.0, "resources": {}, "env_vars": {}}
    env.setdefault(envvars.RAY_RUNTIME_ENV_HOOK, envvars.NATIVE_HOOK)  # the driver's num_gpus work: in its lease
    env.update({envvars.JOB_ID: job.job_id, envvars.NAMESPACE: namespace,
                envvars.HEAD_NAME: head_name, envvars.LEASE_ID: lease.lease_id,
                envvars.ATTEMPT: str(job.attempt)})
    if job.spec.checkpoint_dir:
        env[envvars.CHECKPOINT_DIR] = job.spec.checkpoint_dir
    if job.resume_from:
        env[envvars.RESUME_FROM] = job.resume_from
    return RaySubmission(job.job_id, job.ray_submission_id, job.spec.entrypoint,
                         {**job.spec.runtime_env, "env_vars": env}, {RAY_NODE_ID_LABEL: h.node_id}, demand,
                         {"orchestrator_job": job.job_id, "lease": job.lease_id or "",
                          # which job of that id: one submitted again after the first was dropped differs here
                          "orchestrator_submitted_at": repr(job.submitted_at)})
