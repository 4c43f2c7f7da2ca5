"""The head's job layer: jobs become leases, granted leases become Ray jobs.

In parts (``docs/design.md``, "The job layer"), each module's docstring stating its invariants:

* :mod:`.transitions` -- pure: given a job and what its leases and Ray say, its next step;
* :mod:`.intents` -- what the job layer asks of Ray's job API (a submission, a stop, a delete);
* :mod:`.executor` -- makes those calls through the :class:`JobRunner`, with the one retry policy;
* :mod:`.launches` -- the one hand-out of the calls due (durable first, stops first), shared by the head
  actor (off its loop) and an in-process head (:func:`run_due`);
* :mod:`.runner` -- Ray's job API as the layer sees it (the protocol; a runner that runs nothing);
* :mod:`.views` -- get, list, board, explain: reads only;
* :mod:`.codec` -- a job's stored form;
* :mod:`.manager` -- :class:`JobManager`, which glues them: the store write first, then the effects;
  its side of Ray's job API is :mod:`.ray_calls`, its reads :class:`.views.JobReads`.

The names callers use are re-exported here (``from orchestrator.control.jobs import JobManager``).
"""

from __future__ import annotations

from orchestrator.control.jobs.codec import job_from_json as _job_from_json
from orchestrator.control.jobs.codec import job_json as _job_json
from orchestrator.control.jobs.executor import (DELETES_IN_FLIGHT, SUBMIT_BACKOFF_FIRST_S, SUBMIT_BACKOFF_MAX_S,
                                                Executor)
from orchestrator.control.jobs.executor import Retry as _Retry
from orchestrator.control.jobs.intents import Chore, ChoreKind, RaySubmission
from orchestrator.control.jobs.launches import JobApiCall, JobApiSide, StoreNotDurableError, run_due, take_due
from orchestrator.control.jobs.manager import CHECKPOINT_FILE, RESTOP_SLACK_S, JobManager
from orchestrator.control.jobs.runner import AdmissionOnlyRunner, JobRunner
from orchestrator.control.jobs.transitions import Step
from orchestrator.control.jobs.views import BOARD_DECISIONS, MAX_BOARD_ROWS

__all__ = [
    "AdmissionOnlyRunner", "BOARD_DECISIONS", "CHECKPOINT_FILE", "Chore", "ChoreKind", "DELETES_IN_FLIGHT",
    "Executor", "JobApiCall", "JobApiSide", "JobManager", "JobRunner", "MAX_BOARD_ROWS", "RESTOP_SLACK_S",
    "RaySubmission", "SUBMIT_BACKOFF_FIRST_S", "SUBMIT_BACKOFF_MAX_S", "Step", "StoreNotDurableError", "_Retry",
    "_job_from_json", "_job_json", "run_due", "take_due",
]
