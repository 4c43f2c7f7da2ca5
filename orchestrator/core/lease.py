"""Leases: a workload's claim on concrete GPU devices.

A lease binds one :class:`~orchestrator.core.request.GpuRequest` to an
:class:`~orchestrator.core.allocation.Allocation` (node, GPU indices and
UUIDs, MIG slot or MPS/time-slice share). Nomenclature:

* **granted**: the head has reserved the devices in its ledger; nothing runs yet.
* **active**: the holder (an actor or a Ray job) has started on them.
* **checkpointing**: the holder was asked to checkpoint because it is being
  preempted; the devices are still reserved.
* terminal states **released** (holder finished or gave them back),
  **preempted** (taken for higher-priority work), **expired** (granted but
  never activated within the grant TTL), **lost** (the node's agent stopped
  answering, or the holder died).

Invariants:

* a lease only moves along an edge of :data:`LEASE_TRANSITIONS`;
* ``history`` is append-only and its last entry is the current state;
* ``fencing_token`` is the ledger's counter at grant time: it grows with
  every grant, so a holder with an older token than the ledger's latest for
  the same devices is stale (the classic fencing-token rule);
* devices are held from *granted* until a terminal state, never after;
* the fencing token is a capability: it is returned only to the lease's
  requester (who proves it with the key whose :func:`key_digest` it sent as
  ``requester_digest``), to the holder it was handed to, and to the head's own
  job layer; every read view shows it redacted (:data:`REDACTED`).

Leases are immutable values: :meth:`Lease.transition` returns a new lease.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Annotated, Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.core.allocation import Allocation
from orchestrator.core.credentials import digest, matches
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.ids import ID_ALLOWED, ID_PATTERN
from orchestrator.core.request import GpuRequest, fields_of
from orchestrator.core.gang_request import GangMember
from orchestrator.core.statemachine import Transition, TransitionTable
from orchestrator.core.validation import typed_error


#: What a read view shows in place of a fencing token.
REDACTED = "<redacted>"


#: A requester sends ``key_digest(key)`` with its request; ``key_matches`` checks a key against it. The one digest
#: and the one constant-time check of every credential (core.credentials).
key_digest, key_matches = digest, matches


class LeaseRequest(BaseModel):
    """What a client sends to ``request_lease``. ``lease_id`` is the client's own, which makes retries safe."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lease_id: str = Field(description="Client-supplied id: a retry with the same id returns the same lease")
    request: GpuRequest
    owner: str = ""
    priority: Annotated[int, Field(ge=0, le=1_000_000, description="0 = its class's priority")] = 0
    priority_class: str = ""
    requeue_on_loss: bool = Field(default=True, description="When the node is lost, queue a new attempt")
    queue: str = Field(default="default", description="Queue (quota group) the lease counts against")
    enqueued_at: float | None = Field(default=None, allow_inf_nan=False, description="Keep this queue position (a resumed job keeps "
                                      "its original submission time); None = now")
    requeue_on_preempt: bool = Field(default=False, description="When preempted, queue a new attempt that "
                                     "resumes from the checkpoint (resume_from); the requester waits for it")
    checkpoint_dir: str | None = Field(default=None, description="Where the holder writes its checkpoint when "
                                       "asked (a preemptible actor's checkpoint(dir) receives it)")
    resume_from: str | None = Field(default=None, description="Set by the head on a requeued attempt: the "
                                    "checkpoint its holder starts from")
    requester_digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$",
                                         description="key_digest() of the requester's secret key: get_lease and "
                                         "wait_lease with that key return the fencing token; no one else sees it")
    gang: GangMember | None = Field(default=None, description="This lease is one worker of a gang: granted, "
                                    "preempted and requeued together with the other workers (scheduling.gang)")

    @classmethod
    def parse(cls, data: "LeaseRequest | Mapping[str, Any]") -> "LeaseRequest":
        if isinstance(data, LeaseRequest):
            return data
        d = fields_of(data, "lease_request", list(cls.model_fields))
        try:
            if isinstance(d.get("request"), str):
                d["request"] = GpuRequest.parse(d["request"])
            out = cls(**d)
        except ValidationError as e:
            raise typed_error(e, "lease_request", LeaseRequest) from None
        if not ID_PATTERN.match(out.lease_id):
            raise InvalidRequestError("lease_request.lease_id", out.lease_id, ID_ALLOWED)
        return out


class LeaseState(str, Enum):
    PENDING = "pending"
    GRANTED = "granted"
    ACTIVE = "active"
    CHECKPOINTING = "checkpointing"
    RELEASED = "released"
    PREEMPTED = "preempted"
    EXPIRED = "expired"
    LOST = "lost"


L = LeaseState
LEASE_TRANSITIONS: TransitionTable[LeaseState] = TransitionTable(
    "lease",
    {
        L.PENDING: {
            L.GRANTED: "the placement engine found devices and the ledger reserved them",
            L.RELEASED: "the request was withdrawn (job cancelled) before it was granted",
            L.EXPIRED: "the requester gave up waiting (lease timeout) while still pending",
        },
        L.GRANTED: {
            L.ACTIVE: "the holder started on the devices (actor created, job submitted)",
            L.RELEASED: "the holder gave the grant back before starting",
            L.EXPIRED: "the holder never activated within the grant TTL",
            L.PREEMPTED: "taken before it started: nothing to checkpoint, so no handshake",
            L.LOST: "the node's agent went silent past its TTL before the holder started",
        },
        L.ACTIVE: {
            L.CHECKPOINTING: "chosen as a preemption victim: the holder is asked to checkpoint",
            L.RELEASED: "the holder finished or gave the lease back",
            L.PREEMPTED: "a non-checkpointing victim (batch, or no checkpoint support) is stopped at once",
            L.LOST: "the node's agent went silent past its TTL, or the holder process died",
        },
        L.CHECKPOINTING: {
            L.PREEMPTED: "the holder acknowledged its checkpoint, or its grace period ran out; it is stopped",
            L.RELEASED: "the holder finished on its own while checkpointing",
            L.LOST: "the node or the holder died during the checkpoint",
        },
        L.RELEASED: {},
        L.PREEMPTED: {},
        L.EXPIRED: {},
        L.LOST: {},
    },
    terminal=frozenset({L.RELEASED, L.PREEMPTED, L.EXPIRED, L.LOST}),
)

#: States in which a lease holds devices in the ledger.
HOLDING_STATES = frozenset({L.GRANTED, L.ACTIVE, L.CHECKPOINTING})


#: A fencing token is ``counter << TOKEN_RANDOM_BITS | seal``: the counter (high bits) orders grants as a fencing
#: token must (a later grant's token is larger), the low bits -- an HMAC of the lease id and the counter under the
#: head's secret (:func:`make_token`) -- make a holder's token unguessable from another's (a counter alone let
#: anyone who saw one token name the next). 31 + 32 bits: a signed 64-bit JSON int. The journal (the GCS KV, which
#: any driver of the cluster can read) keeps the counter only; the head, which alone has the secret, derives the
#: token again when it restores (``control.ledger``).
TOKEN_RANDOM_BITS = 32


def make_token(counter: int, lease_id: str, secret: bytes) -> int:
    """The token of lease ``lease_id``'s grant at fencing ``counter``: the counter, then 32 bits of
    HMAC-SHA256(``secret``, lease id and counter). Deterministic for the head; unguessable without ``secret``."""
    mac = hmac.new(secret, f"{lease_id}\0{int(counter)}".encode(), hashlib.sha256).digest()
    return (int(counter) << TOKEN_RANDOM_BITS) | int.from_bytes(mac[:TOKEN_RANDOM_BITS // 8], "big")


def token_counter(token: int) -> int:
    """The fencing counter a token was made from (what orders it)."""
    return int(token) >> TOKEN_RANDOM_BITS


@dataclass(frozen=True, slots=True)
class Lease:
    """An immutable lease value; see the module docstring for its invariants."""

    lease_id: str
    request: GpuRequest
    owner: str = ""
    priority: int = 0
    priority_class: str = ""
    state: LeaseState = LeaseState.PENDING
    allocation: Allocation | None = None
    fencing_token: int = 0
    history: tuple[Transition[LeaseState], ...] = field(default=())
    checkpoint_path: str | None = None
    last_checkpoint_at: float | None = None
    queue: str = "default"
    restore_estimate_s: float = 0.0
    gang: str | None = None  # the gang id when this lease is one worker of a gang: preempted as one victim
    #: ``(min, max)`` workers when its gang is elastic (``GangMember.elastic``): the scheduler may shrink or grow
    #: it through a checkpoint (docs/preemption.md, "Elastic gangs"); None otherwise.
    elastic: tuple[int, int] | None = None

    @classmethod
    def new(cls, lease_id: str, request: GpuRequest, *, now: float, owner: str = "", priority: int = 0,
            priority_class: str = "", queue: str = "default", reason: str = "requested",
            gang: str | None = None, elastic: tuple[int, int] | None = None) -> "Lease":
        return cls(lease_id, request, owner, priority, priority_class, queue=queue,
                   history=(Transition(now, LeaseState.PENDING, reason),), gang=gang, elastic=elastic)

    @property
    def gpus_held(self) -> float:
        """GPUs this lease holds, fractions counted (a 3g MIG slice is 3/7, an MPS 30% share 0.3)."""
        a = self.allocation
        return a.gpu_demand if a is not None and self.holding else 0.0

    @property
    def started_at(self) -> float | None:
        """When the holder started (entered ACTIVE), else when granted."""
        active = self.entered(LeaseState.ACTIVE)
        return active if active is not None else self.entered(LeaseState.GRANTED)

    @property
    def holding(self) -> bool:
        return self.state in HOLDING_STATES

    @property
    def terminal(self) -> bool:
        return self.state in LEASE_TRANSITIONS.terminal

    def entered(self, state: LeaseState) -> float | None:
        """When the lease last entered ``state`` (None if never)."""
        for t in reversed(self.history):
            if t.state is state:
                return t.at
        return None

    def transition(self, to: LeaseState, *, now: float, reason: str, **changes: Any) -> "Lease":
        """Move along one edge of :data:`LEASE_TRANSITIONS`; raises on an edge it lacks."""
        LEASE_TRANSITIONS.check(self.state, to)
        return replace(self, state=to, history=self.history + (Transition(now, to, reason),), **changes)

    def grant(self, allocation: Allocation, token: int, *, now: float, reason: str) -> "Lease":
        return self.transition(LeaseState.GRANTED, now=now, reason=reason, allocation=allocation, fencing_token=token)

    def to_dict(self) -> dict[str, Any]:
        return {
            "lease_id": self.lease_id,
            "owner": self.owner,
            "state": self.state.value,
            "request": self.request.describe(),
            "priority": self.priority,
            "priority_class": self.priority_class,
            "fencing_token": self.fencing_token,
            "allocation": self.allocation.to_json() if self.allocation else None,
            "checkpoint_path": self.checkpoint_path,
            "queue": self.queue,
            "gang": self.gang,
            "history": [t.to_dict() for t in self.history],
        }
