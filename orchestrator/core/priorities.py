"""Priority classes, queues and quotas: declared in ``configs/priorities.yaml``.

Nomenclature:

* a **priority class** (``inference``, ``training``, ``batch``...) gives a job
  its priority and says whether, and how gently, it may be preempted:
  ``min_runtime_s`` (never preempted younger than this), ``grace_period_s``
  (how long its checkpoint may take), ``checkpoint`` (whether it is asked to
  checkpoint before it is stopped);
* a **queue** groups jobs of one team; its ``quota_gpus`` is what it is
  guaranteed. A queue may *borrow* idle capacity beyond its quota when
  ``borrowing`` is on; borrowed leases are the first to be reclaimed when a
  queue within its quota needs room (as Kueue's cohorts and KAI's reclaim do);
* **aging** raises a waiting job's effective priority by ``aging_per_minute``
  each minute, capped below the next class up, so nothing starves but aging
  never turns batch work into inference.

The config is frozen pydantic; validators name the offending value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from orchestrator.core import validation
from orchestrator.core.errors import ConfigError
from orchestrator.core.yamlfile import read_yaml


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PriorityClass(_Frozen):
    """How important a job is and how it may be preempted."""

    priority: Annotated[int, Field(ge=0, le=1_000_000, description="Higher runs first and may preempt lower")]
    preemptible: bool = Field(default=True, description="May be preempted by higher-priority work")
    min_runtime_s: Annotated[float, Field(ge=0, description="Never preempted before running this long")] = 0.0
    grace_period_s: Annotated[float, Field(ge=0, description="How long a checkpoint may take before a hard stop")] = 30.0
    checkpoint: bool = Field(default=True, description="Ask the holder to checkpoint before stopping it")
    description: str = ""


class QueueConfig(_Frozen):
    """A queue and its guaranteed share."""

    quota_gpus: Annotated[float, Field(ge=0, description="Guaranteed GPUs (fractions count); None = unlimited")] | None = None
    borrowing: bool = Field(default=True, description="May use idle capacity beyond the quota (reclaimable)")


DEFAULT_CLASSES: dict[str, PriorityClass] = {
    "inference": PriorityClass(priority=1000, preemptible=False, checkpoint=False,
                               description="latency-sensitive serving; never preempted"),
    "training": PriorityClass(priority=100, preemptible=True, min_runtime_s=30, grace_period_s=60, checkpoint=True,
                              description="checkpointing training; yields to inference, resumes later"),
    "batch": PriorityClass(priority=10, preemptible=True, min_runtime_s=0, grace_period_s=0, checkpoint=False,
                           description="best-effort; stopped at once when room is needed"),
}


#: Every placement policy's name (their code is in :mod:`orchestrator.scheduling.policies`, which
#: checks at import that it implements exactly these).  ``default`` is FGD with the hand-out's
#: tie-breaks; ``bestfit`` is the classic best fit.
POLICY_NAMES: tuple[str, ...] = ("random", "bestfit", "packing", "spread", "dotproduct", "clustering", "fgd", "default")


class SchedulerConfig(_Frozen):
    """Everything the pure scheduler needs besides the snapshot and the queue."""

    classes: dict[str, PriorityClass] = Field(default_factory=lambda: dict(DEFAULT_CLASSES))
    queues: dict[str, QueueConfig] = Field(default_factory=lambda: {"default": QueueConfig()})
    default_class: str = "batch"
    aging_per_minute: Annotated[float, Field(ge=0, description="Effective-priority points gained per minute waiting")] = 1.0
    policy: str = Field(default="default", description="Placement policy name: one of POLICY_NAMES. The one "
                        "place the head's policy is set (cluster config `scheduler.policy` or priorities.yaml)")

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        if v not in POLICY_NAMES:
            raise ValueError(f"policy {v!r} is not one of {list(POLICY_NAMES)}")
        return v

    @field_validator("classes")
    @classmethod
    def _non_empty(cls, v: dict[str, PriorityClass]) -> dict[str, PriorityClass]:
        if not v:
            raise ValueError("classes: at least one priority class is needed")
        return v

    @model_validator(mode="after")
    def _default_known(self) -> "SchedulerConfig":
        if self.default_class not in self.classes:
            raise ValueError(f"default_class {self.default_class!r} is not one of {sorted(self.classes)}")
        if "default" not in self.queues:
            raise ValueError(f"queues must include 'default' (have {sorted(self.queues)})")
        return self

    def priority_class(self, name: str | None) -> tuple[str, PriorityClass]:
        """(name, class) for ``name``; None means the default class. Unknown names are refused."""
        key = name or self.default_class
        try:
            return key, self.classes[key]
        except KeyError:
            raise ConfigError("priority", name, sorted(self.classes), detail="unknown priority class") from None

    def queue(self, name: str | None) -> tuple[str, QueueConfig]:
        key = name or "default"
        try:
            return key, self.queues[key]
        except KeyError:
            raise ConfigError("queue", name, sorted(self.queues), detail="unknown queue") from None

    def aging_cap(self, priority: int) -> float:
        """The highest effective priority a job of ``priority`` can age to: just below the next class."""
        above = [c.priority for c in self.classes.values() if c.priority > priority]
        return (min(above) - 0.5) if above else float(priority)

    @classmethod
    def load(cls, path: str | Path) -> "SchedulerConfig":
        return cls.parse(read_yaml(path) or {}, source=str(path))

    @classmethod
    def parse(cls, data: Any, source: str = "config") -> "SchedulerConfig":
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            t = validation.typed_error(e, "", cls, ConfigError)
            raise ConfigError(f"{source}:{t.field}" if t.field else source, t.value, t.allowed, t.detail) from None
