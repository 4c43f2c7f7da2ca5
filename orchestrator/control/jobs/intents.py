"""What the job layer asks of Ray's job API: the intents its transitions emit and its executor carries out.

Invariants:

* an intent is a frozen value: it names a Ray submission id and carries everything the call needs, so the
  call can be made off the head's loop without reading the manager's state;
* a submission id is the lease attempt's id ``<job>.a<n>`` (``core.ids.attempt_id``): one id from our jobs
  to Ray's, never given to two attempts, so an intent sent twice is refused by Ray as a duplicate rather
  than run twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


@dataclass(frozen=True, slots=True)
class RaySubmission:
    """One job attempt's submission to Ray's job API, prepared on the head's loop (:meth:`JobManager.
    take_submissions`). :meth:`JobManager.send_submission` makes the call -- blocking HTTP, so the head actor
    makes it on a thread of its own -- and :meth:`JobManager.sent` applies the answer, back on the loop, to
    whatever the job has become meanwhile (:mod:`.launches`)."""

    job_id: str
    submission_id: str
    entrypoint: str
    runtime_env: dict[str, Any]
    label_selector: dict[str, str]
    demand: dict[str, Any]
    metadata: dict[str, str]


class ChoreKind(str, Enum):
    """A call to Ray's job API other than a submission."""

    STOP = "stop"  # a cancelled job's attempt, a preempted or lost one, one Ray took for a job that changed
    DELETE = "delete"  # a pruned job's attempt, from Ray's job table (which Ray never empties)

    @property
    def done(self) -> str:
        return "stopped" if self is ChoreKind.STOP else "deleted"


@dataclass(frozen=True, slots=True)
class Chore:
    """Stop or delete the Ray job ``submission_id`` (:meth:`JobManager.take_chores`)."""

    kind: ChoreKind
    submission_id: str
