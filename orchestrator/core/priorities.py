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
  never turns batch work into inference;
* a **time window** (``windows:``) overrides queues' quotas and borrowing
  between two times of day (``08:00``-``22:00``; it may wrap midnight), in
  GPUs or as ``quota_pct`` of the cluster's GPU capacity: by day inference
  guaranteed 60% and training capped at 40%, by night training borrowing
  everything above an inference floor. Windows may not overlap; outside every
  window the queues stand as configured. The head applies the window in force
  each cycle (:func:`orchestrator.scheduling.windows.effective_config`);
  no ``windows`` (the default) is the behaviour without them.

The config is frozen pydantic; validators name the offending value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from orchestrator.core import validation
from orchestrator.core.clock import DAY_S, format_hhmm, parse_hhmm
from orchestrator.core.errors import ConfigError, PermissionDeniedError
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
    """A queue of the tree: its guaranteed share, its weight, its limit, its parent and who may submit to it.

    Invariants (checked by :class:`SchedulerConfig`): ``parent`` names another queue and the parents form no
    circle; ``limit_gpus`` is not below ``quota_gpus``; jobs go to leaves (a queue no other names as parent)."""

    quota_gpus: Annotated[float, Field(ge=0, description="Guaranteed GPUs (fractions count); None = no guarantee "
                                       "(and, without fairness, no cap)")] | None = None
    borrowing: bool = Field(default=True, description="May use idle capacity beyond the quota (reclaimable)")
    parent: str | None = Field(default=None, min_length=1, max_length=63,
                               description="The queue above this one (an organisation above its teams, a team above "
                               "its users); None: a top-level queue")
    weight: Annotated[float, Field(gt=0, le=1000, description="Share of what its siblings contend for beyond their "
                                   "guarantees, relative to theirs (fairness)")] = 1.0
    limit_gpus: Annotated[float, Field(ge=0, description="GPUs its subtree may never hold more of, borrowing or "
                                       "not; None: no limit")] | None = None
    submitters: tuple[str, ...] = Field(default=(), description="User ids (u-..., as `orchestrator whoami` prints) "
                                        "who may submit to this queue; empty: anyone. Administrators always may")

    @model_validator(mode="after")
    def _limit_above_quota(self) -> "QueueConfig":
        if self.limit_gpus is not None and self.quota_gpus is not None and self.limit_gpus < self.quota_gpus:
            raise ConfigError("limit_gpus", self.limit_gpus, f">= quota_gpus ({self.quota_gpus:g})",
                              detail="a queue cannot be guaranteed more than it may hold")
        return self


class Consolidation(_Frozen):
    """Moving running work to make room (:mod:`orchestrator.scheduling.consolidate`); off by default."""

    enabled: bool = Field(default=False, description="When a request fits nowhere and no preemption helps, move "
                          "one or two running shares that requeue on preemption (checkpoint, stop, land "
                          "elsewhere) if that makes room for it")
    max_moves: Annotated[int, Field(ge=1, le=2, description="Running shares moved for one request, at most")] = 2
    max_cost_gpu_s: Annotated[float, Field(ge=0, description="The most a move may cost: work since the checkpoint "
                                           "plus the measured restore time, x GPUs, summed over the moves")] = 600.0


class Elastic(_Frozen):
    """Elastic gangs (``min..max`` workers, :mod:`orchestrator.scheduling.elastic`): growing into idle capacity.
    Shrinking needs no setting (a preempted elastic gang comes back at what is left)."""

    grow: bool = Field(default=True, description="Ask a running elastic gang below its most to checkpoint and "
                       "resume larger when idle cards fit at least one more worker and nothing waits")
    grow_after_s: Annotated[float, Field(ge=0, le=7 * 86400, description="An elastic gang grows only after its "
                                         "current attempt has run this long: a resize costs a checkpoint and a "
                                         "restore, and this bounds how often one gang pays it")] = 300.0


class Fairness(_Frozen):
    """Hierarchical weighted fair share (:mod:`orchestrator.scheduling.fairshare`); off by default, when the
    queues behave as flat quotas with borrowing."""

    enabled: bool = Field(default=False, description="Compute every queue's fair share each cycle, serve queues "
                          "below theirs first and let them reclaim from queues above theirs")
    half_life_s: Annotated[float, Field(gt=0, le=30 * 86400, description="Half-life of the usage history that "
                                        "orders queues standing alike (Slurm's PriorityDecayHalfLife)")] = 3600.0
    reclaim: bool = Field(default=True, description="A queue below its fair share may preempt (checkpoint, stop, "
                          "requeue) leases of queues above theirs, even of equal priority")
    reclaim_tolerance: Annotated[float, Field(ge=0, le=1, description="Reclaim only while the victim's side holds "
                                              "a larger fraction of its fair share than the requester's by more "
                                              "than this (a band against churn as demand moves)")] = 0.1
    max_reclaims_per_cycle: Annotated[int, Field(ge=0, le=1000, description="At most this many leases preempted "
                                                 "for fair share in one cycle (shares converge without "
                                                 "thrashing)")] = 4
    starvation_bound_s: Annotated[float, Field(gt=0, description="A request waiting longer than this reserves "
                                               "the nodes where it fits soonest; None: no reservations")] | None = None


class QueueOverride(_Frozen):
    """What a time window changes of one queue: its quota (in GPUs, or in percent of the
    cluster's GPU capacity) and whether it borrows. A field left out keeps the configured value."""

    quota_gpus: Annotated[float, Field(ge=0, description="Guaranteed GPUs while the window is in force")] | None = None
    quota_pct: Annotated[float, Field(ge=0, le=100, description="Guaranteed share of the cluster's GPU capacity, "
                                      "percent, while the window is in force")] | None = None
    borrowing: bool | None = Field(default=None, description="Whether the queue borrows idle capacity beyond its "
                                   "quota while the window is in force (false: capped at the quota)")
    surge_pct: Annotated[float, Field(ge=0, le=100, description="While what the queue holds and asks exceeds its "
                                      "quota, the quota follows it up to this share of the cluster's GPU capacity, "
                                      "percent (its requests may then preempt lower priorities for it); null: the "
                                      "quota is the clock's alone")] | None = None

    @model_validator(mode="after")
    def _one_quota(self) -> "QueueOverride":
        if self.quota_gpus is not None and self.quota_pct is not None:
            raise ConfigError("quota_pct", self.quota_pct, "either quota_gpus or quota_pct, not both")
        if self.surge_pct is not None and self.quota_pct is not None and self.surge_pct < self.quota_pct:
            raise ConfigError("surge_pct", self.surge_pct, f"at least quota_pct={self.quota_pct:g}")
        return self


class Window(_Frozen):
    """Quota overrides in force from ``start`` to ``end`` each day (``end`` <= ``start`` wraps midnight;
    ``end`` 24:00 is midnight). Covers ``[start, end)``."""

    name: str = Field(min_length=1, max_length=63, description="Window name, shown in status and reasons")
    start: str = Field(description="Time of day it begins, HH:MM")
    end: str = Field(description="Time of day it ends, HH:MM (24:00 = midnight; before start: wraps midnight)")
    queues: dict[str, QueueOverride] = Field(default_factory=dict, description="Queue name -> what changes")

    @field_validator("start", "end")
    @classmethod
    def _hhmm(cls, v: str, info: ValidationInfo) -> str:
        parse_hhmm(v, info.field_name or "time")
        return v

    @model_validator(mode="after")
    def _not_empty(self) -> "Window":
        if self.start_s >= DAY_S:
            raise ConfigError("start", self.start, "a time of day from 00:00 to 23:59")
        if self.start_s == self.end_s:
            raise ConfigError("end", self.end, f"a time other than start={self.start} (00:00-24:00 is the whole day)",
                              detail="a window from a time to the same time is ambiguous")
        return self

    @property
    def start_s(self) -> float:
        return parse_hhmm(self.start)

    @property
    def end_s(self) -> float:
        return parse_hhmm(self.end)

    def contains(self, time_of_day_s: float) -> bool:
        """Whether the window is in force at ``time_of_day_s`` (seconds after midnight)."""
        t, a, b = time_of_day_s % DAY_S, self.start_s, self.end_s % DAY_S
        return a <= t < b if a < b else (t >= a or t < b)

    def describe(self) -> str:
        return f"{self.name} {format_hhmm(self.start_s)}-{self.end}"


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
    windows: tuple[Window, ...] = Field(default=(), description="Time windows overriding queue quotas by time "
                                        "of day (none: the queues always stand as configured)")
    fairness: Fairness = Field(default_factory=Fairness, description="Hierarchical weighted fair share, reclaim "
                               "and reservations (off: flat quotas with borrowing)")
    consolidation: Consolidation = Field(default_factory=Consolidation, description="Moving running shares "
                                         "through checkpoint and resume to make room (off by default)")
    elastic: Elastic = Field(default_factory=Elastic, description="Elastic gangs growing into idle capacity")

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
        self._check_tree()
        self._check_windows()
        return self

    def _check_tree(self) -> None:
        """Every parent a known queue, no circle; ``default`` stays a leaf (jobs that name no queue go there)."""
        for name, q in self.queues.items():
            if q.parent is not None and q.parent not in self.queues:
                raise ConfigError(f"queues.{name}.parent", q.parent, sorted(set(self.queues) - {name}),
                                  detail="unknown parent queue")
            seen, up = {name}, q.parent
            while up is not None:
                if up in seen:
                    raise ConfigError(f"queues.{name}.parent", q.parent, "a queue that is not below this one",
                                      detail=f"the parents form a circle through {up}")
                seen.add(up)
                up = self.queues[up].parent
        if any(q.parent == "default" for q in self.queues.values()):
            raise ConfigError("queues.default", "default", "a leaf queue", detail="jobs that name no queue go to "
                              "'default', so no queue may hang below it")

    def _check_windows(self) -> None:
        """Window names unique, their queues known, and no two in force at the same minute."""
        seen: dict[str, int] = {}
        for i, w in enumerate(self.windows):
            if w.name in seen:
                raise ConfigError(f"windows.{i}.name", w.name, "a name no other window has")
            seen[w.name] = i
            for q in w.queues:
                if q not in self.queues:
                    raise ConfigError(f"windows.{i}.queues", q, sorted(self.queues), detail="unknown queue")
        for minute in range(0, int(DAY_S), 60):
            on = [i for i, w in enumerate(self.windows) if w.contains(minute)]
            if len(on) > 1:
                a, b = self.windows[on[0]], self.windows[on[1]]
                raise ConfigError(f"windows.{on[1]}.start", b.start, f"a time outside window {a.describe()}",
                                  detail=f"windows {a.name} and {b.name} overlap at {format_hhmm(minute)}")

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

    def leaf_queue(self, name: str | None) -> tuple[str, QueueConfig]:
        """:meth:`queue`, refusing a queue with queues below it: work is submitted to leaves."""
        key, q = self.queue(name)
        below = sorted(n for n, c in self.queues.items() if c.parent == key)
        if below:
            raise ConfigError("queue", name, below, detail=f"queue {key} has queues below it: submit to one of them")
        return key, q

    def may_submit(self, queue: str, user: str | None, trusted: bool) -> bool:
        """Whether a caller (user id ``user``; ``trusted``: an administrator or the head itself) may submit to
        ``queue``: anyone when the queue names no submitters and none of its ancestors does, else only those
        named by the queue or one of its ancestors (a team's list admits its users' queues too)."""
        if trusted:
            return True
        named: list[tuple[str, ...]] = []
        q: str | None = queue
        while q is not None and q in self.queues:
            if self.queues[q].submitters:
                named.append(self.queues[q].submitters)
            q = self.queues[q].parent
        return not named or any(user is not None and user in names for names in named)

    def check_submitter(self, method: str, queue: str | None, user: str | None, trusted: bool) -> None:
        """Refuse (:class:`PermissionDeniedError`) a submission to ``queue`` the caller may not make
        (:meth:`may_submit`); the error names the queue, never whose key would do."""
        key = queue or "default"
        if key in self.queues and not self.may_submit(key, user, trusted):
            raise PermissionDeniedError(method, f"the submitters of queue {key} or an administrator", target=key)

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
            raise validation.config_error(e, cls, source) from None
