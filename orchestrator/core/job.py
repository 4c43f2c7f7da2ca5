"""Jobs: what a user submits, and the state machine the head moves it through.

A :class:`JobSpec` is the user's declaration (name, shell entrypoint run as a
Ray job, GPU request, priority class, queue, runtime_env, checkpoint
directory). A :class:`Job` is the head's record of one: immutable, changed
only along :data:`JOB_TRANSITIONS`, with a history of (time, state, reason).

A job is *admitted* only when its lease is granted (as Kueue admits a
suspended RayJob): QUEUED -> ADMITTED happens in the same step as the lease's
PENDING -> GRANTED. Preemption moves RUNNING -> PREEMPTING (checkpoint asked)
-> QUEUED again with ``resume_from`` set, so a job may run several
*attempts*, each with its own lease and Ray submission id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Annotated, Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.ids import gang_worker_id
from orchestrator.core.request import GpuRequest, fields_of
from orchestrator.core.gang_request import MAX_GANG_WORKERS, GangRequest
from orchestrator.core.statemachine import Transition, TransitionTable
from orchestrator.core.validation import typed_error

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$")


class JobSpec(BaseModel):
    """What a user submits. Validated on construction; errors name the field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Annotated[str, Field(description="DNS-like name: lowercase letters, digits, '-', '_', '.'")]
    entrypoint: Annotated[str, Field(description="Shell command, run as a Ray job")]
    gpu: GpuRequest = Field(default_factory=lambda: GpuRequest.whole(1),
                            description="What the job needs; with workers > 1, what each worker of its gang needs")
    workers: Annotated[int, Field(ge=1, le=MAX_GANG_WORKERS,
                                  description="Workers of a gang (Ray Train's num_workers), granted all or nothing")] = 1
    same_node: bool = Field(default=False, description="A gang: every worker on one node (required)")
    min_workers: Annotated[int | None, Field(ge=1, le=MAX_GANG_WORKERS, description="An elastic gang: the fewest "
                                             "workers an attempt runs with (workers is the most); None: fixed")] = None
    priority: str | None = Field(default=None, description="Priority class; None = the config's default")
    queue: str = "default"
    runtime_env: dict[str, Any] = Field(default_factory=dict)
    checkpoint_dir: str | None = Field(default=None, description="Where a training job writes its checkpoints")

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise typed_error(e, "job", JobSpec) from None

    @classmethod
    def parse(cls, data: "JobSpec | Mapping[str, Any]") -> "JobSpec":
        """The spec itself, or one validated from its JSON form (the head's edge: validated once, here)."""
        if isinstance(data, JobSpec):
            return data
        return cls(**fields_of(data, "job", list(cls.model_fields)))

    @property
    def gang(self) -> GangRequest | None:
        """The gang this job asks for (``workers`` > 1), or None for a single lease."""
        if self.workers == 1:
            if self.min_workers not in (None, 1):
                raise InvalidRequestError("min_workers", self.min_workers, "unset, or at most workers (1)")
            return None
        return GangRequest(workers=self.workers, worker=self.gpu, same_node=self.same_node,
                           min_workers=self.min_workers)

    def describe_gpu(self) -> str:
        gang = self.gang
        return gang.describe() if gang is not None else self.gpu.describe()

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise InvalidRequestError("name", v, "1-63 lowercase letters, digits, '-', '_' or '.', "
                                      "starting and ending with a letter or digit")
        return v

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, v: str) -> str:
        if not v or not v.strip():
            raise InvalidRequestError("entrypoint", v, "a non-empty shell command", detail="empty command")
        return v

    @model_validator(mode="after")
    def _gang(self) -> "JobSpec":
        self.gang  # a gang's worker request must be one a gang can ask for (no node pin); raises naming the field
        return self

    @field_validator("runtime_env")
    @classmethod
    def _runtime_env(cls, v: dict[str, Any]) -> dict[str, Any]:
        env = v.get("env_vars", {})
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in env.items()):
            raise InvalidRequestError("runtime_env.env_vars", env, "a mapping of strings to strings")
        return v


class JobState(str, Enum):
    QUEUED = "queued"
    ADMITTED = "admitted"
    RUNNING = "running"
    PREEMPTING = "preempting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


J = JobState
JOB_TRANSITIONS: TransitionTable[JobState] = TransitionTable(
    "job",
    {
        J.QUEUED: {
            J.ADMITTED: "its lease was granted: the devices are reserved for it",
            J.CANCELLED: "cancelled by the user while waiting",
            J.FAILED: "refused at admission (e.g. its request can never fit any node)",
        },
        J.ADMITTED: {
            J.RUNNING: "submitted to Ray with the lease's devices; the Ray job started",
            J.QUEUED: "its lease was lost or preempted before the Ray job started; waits again",
            J.FAILED: "Ray refused the submission",
            J.CANCELLED: "cancelled by the user before it started",
        },
        J.RUNNING: {
            J.SUCCEEDED: "the Ray job exited with status SUCCEEDED",
            J.FAILED: "the Ray job exited with status FAILED",
            J.CANCELLED: "cancelled by the user; the Ray job was stopped and the lease released",
            J.PREEMPTING: "chosen as a preemption victim: asked to checkpoint within its grace period",
            J.QUEUED: "its node was lost (agent silent past its TTL): requeued from its last checkpoint",
        },
        J.PREEMPTING: {
            J.QUEUED: "checkpoint acknowledged (or grace period over): stopped, lease released, requeued to resume",
            J.SUCCEEDED: "finished on its own before it had to yield",
            J.FAILED: "failed while checkpointing",
            J.CANCELLED: "cancelled by the user while checkpointing",
        },
        J.SUCCEEDED: {},
        J.FAILED: {},
        J.CANCELLED: {},
    },
    terminal=frozenset({J.SUCCEEDED, J.FAILED, J.CANCELLED}),
)


@dataclass(frozen=True, slots=True)
class Preempted:
    """One preemption of a job: by whom, why, when, and the checkpoint it left."""

    by: str
    reason: str
    at: float
    checkpoint_path: str | None
    checkpoint_s: float | None = None
    lost_steps: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"by": self.by, "reason": self.reason, "at": self.at, "checkpoint_path": self.checkpoint_path,
                "checkpoint_s": self.checkpoint_s}


@dataclass(frozen=True, slots=True)
class Job:
    """The head's immutable record of a job."""

    job_id: str
    spec: JobSpec
    priority: int
    priority_class: str
    submitted_at: float
    state: JobState = JobState.QUEUED
    history: tuple[Transition[JobState], ...] = ()
    lease_id: str | None = None
    ray_submission_id: str | None = None
    attempt: int = 0
    resume_from: str | None = None
    placement_reason: str = ""
    preemptions: tuple[Preempted, ...] = field(default=())
    message: str = ""
    owner: str | None = None  # the user id (credentials.user_id) it was submitted under; None: the head's own

    @classmethod
    def new(cls, job_id: str, spec: JobSpec, *, priority: int, priority_class: str, now: float,
            owner: str | None = None) -> "Job":
        return cls(job_id, spec, priority, priority_class, now,
                   history=(Transition(now, JobState.QUEUED, "submitted"),), owner=owner)

    @property
    def terminal(self) -> bool:
        return self.state in JOB_TRANSITIONS.terminal

    @property
    def lease_ids(self) -> tuple[str, ...]:
        """The current attempt's leases: its one lease, or one per worker of its gang (``<attempt>-w<i>``,
        the gang's id being the attempt's lease id)."""
        if not self.lease_id:
            return ()
        if self.spec.workers == 1:
            return (self.lease_id,)
        return tuple(gang_worker_id(self.lease_id, i) for i in range(self.spec.workers))

    def transition(self, to: JobState, *, now: float, reason: str, **changes: Any) -> "Job":
        JOB_TRANSITIONS.check(self.state, to)
        return replace(self, state=to, history=self.history + (Transition(now, to, reason),), **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id, "name": self.spec.name, "state": self.state.value,
            "entrypoint": self.spec.entrypoint, "gpu": self.spec.describe_gpu(), "workers": self.spec.workers,
            **({"min_workers": self.spec.min_workers} if self.spec.min_workers is not None else {}),
            "priority_class": self.priority_class, "priority": self.priority, "queue": self.spec.queue,
            "submitted_at": self.submitted_at, "lease_id": self.lease_id, "ray_submission_id": self.ray_submission_id,
            "attempt": self.attempt, "resume_from": self.resume_from, "placement_reason": self.placement_reason,
            "preemptions": [p.to_dict() for p in self.preemptions], "message": self.message,
            "owner": self.owner, "history": [t.to_dict() for t in self.history],
        }
