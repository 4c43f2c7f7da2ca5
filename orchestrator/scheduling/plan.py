"""The records of one scheduling cycle (:mod:`.cycle`): what waits (:class:`PendingItem`) and what the cycle
decided -- grants, preemptions, waits, an elastic gang's withdrawn workers, each with its reason -- gathered in a :class:`Plan`.

Immutable; their JSON is derived (:mod:`orchestrator.core.codec`) except where a class says why not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from pydantic import ConfigDict, Field

from orchestrator.core import codec
from orchestrator.core.gang_request import GangMember
from orchestrator.core.reasons import Reason, ReasonFields
from orchestrator.core.request import GpuRequest
from orchestrator.scheduling.engine import Placement, Unschedulable
from orchestrator.scheduling.fairshare import FairShares
from orchestrator.scheduling.preemption import Victim
from orchestrator.scheduling.snapshot import ClusterSnapshot


@dataclass(frozen=True, slots=True)
class PendingItem:
    """A request waiting for a lease."""

    item_id: str
    request: GpuRequest
    priority: int
    priority_class: str
    submitted_at: float
    queue: str = "default"
    nominated: bool = False  # victims are already being preempted for it
    gang: GangMember | None = None  # one worker of a gang: scheduled with the others, all or nothing

    @property
    def demand(self) -> float:
        """GPUs asked for, fractions counted: :attr:`GpuRequest.gpu_demand`, the definition held leases count too."""
        return self.request.gpu_demand


@dataclass(frozen=True, slots=True)
class Grant(ReasonFields):
    """Grant ``item_id`` its placement (cause ``placed``, or ``placed.borrowing`` beyond its queue's quota)."""

    item_id: str
    placement: Placement
    reason: Reason

    def to_json(self) -> dict[str, Any]:
        return codec.dump(self)


@dataclass(frozen=True, slots=True)
class Preemption(ReasonFields):
    """Stop ``victim`` so that ``for_item`` can run."""

    victim: Victim
    for_item: str
    reason: Reason

    def to_json(self) -> dict[str, Any]:
        return codec.dump(self)


@dataclass(frozen=True, slots=True)
class Trim(ReasonFields):
    """Withdraw pending ``item_id``: a worker of an elastic gang beyond the size this attempt runs at (cause
    ``elastic.trimmed``; the head ends its lease RELEASED, never granted: :mod:`.gang_cycle`)."""

    item_id: str
    reason: Reason

    def to_json(self) -> dict[str, Any]:
        return codec.dump(self)


@codec.by_hand
@dataclass(frozen=True, slots=True)
class Waiting:
    """Why an item is still pending (a ``wait.*`` cause); ``preemption_blocked``: why no preemption
    helps it (a ``no_preemption.*`` cause), None when none was tried or one was planned."""

    item_id: str
    position: int
    effective_priority: float
    reason: Reason
    unschedulable: Unschedulable | None = None
    would_preempt: tuple[str, ...] = ()
    preemption_blocked: Reason | None = None

    def to_json(self) -> dict[str, Any]:
        # By hand: the blocking reason split in two keys, the unschedulable details last (API views keep this).
        blocked = self.preemption_blocked
        return {"item_id": self.item_id, "position": self.position, "effective_priority": self.effective_priority,
                **self.reason.fields(),
                "would_preempt": list(self.would_preempt),
                "preemption_blocked": blocked.text if blocked else "",
                "preemption_blocked_cause": blocked.cause.value if blocked else None,
                "unschedulable": self.unschedulable.to_json() if self.unschedulable else None}


@dataclass(frozen=True, slots=True)
class Plan:
    """What one cycle decided. ``after``: the snapshot the plan was made on with every grant applied, in
    plan order (the cycle's working snapshot at its end). Every grant fits the snapshot as the grants before
    it left it (the cycle took each in turn; a gang's workers all or none), so the caller granting them takes
    ``after`` as the cluster's snapshot instead of applying them again."""

    grants: tuple[Grant, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    waiting: tuple[Waiting, ...] = field(default=())
    after: Annotated[ClusterSnapshot, Field(exclude=True)] = field(kw_only=True, compare=False, repr=False)
    #: Every queue's fair share this cycle (None when fairness is off); the nodes reserved for a starving request.
    shares: Annotated[FairShares | None, Field(exclude=True)] = field(default=None, kw_only=True, compare=False,
                                                                       repr=False)
    reserved: Annotated[tuple[str, ...], Field(exclude_if=lambda v: not v)] = field(default=(), kw_only=True)
    #: The pending workers of elastic gangs withdrawn because their gang runs smaller this attempt.
    trims: Annotated[tuple[Trim, ...], Field(exclude_if=lambda v: not v)] = field(default=(), kw_only=True)

    #: The snapshot is no JSON value (the plan's JSON leaves it out): pydantic takes it as an opaque instance.
    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(arbitrary_types_allowed=True)

    def waiting_for(self, item_id: str) -> Waiting | None:
        return next((w for w in self.waiting if w.item_id == item_id), None)

    def to_json(self) -> dict[str, Any]:
        return codec.dump(self)
