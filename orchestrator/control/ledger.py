"""The lease ledger: every lease the head knows, persisted before it is believed.

A :class:`LedgerEntry` is one lease plus what the head keeps beside it (the
request, queue position, hand-out, holder, retry links, preemption state).
:class:`Ledger` owns the entries and the counters, and is the one place that
encodes them for the store (:meth:`LedgerEntry.to_json` /
:meth:`LedgerEntry.from_json`).

Invariants:

* **hard state first** -- :meth:`Ledger.commit` writes entries to the store and
  only then makes them current; :meth:`Ledger.put_meta` writes the fencing
  counter and sequence, and the controller calls it *before* committing the
  leases a new token covers, so a restore never reissues a token;
* ``waiting`` and ``why_pending`` are soft state: recomputed every scheduling
  cycle, never persisted;
* after :meth:`Ledger.restore`, ``fencing`` and ``seq`` are at least the
  largest token and sequence of any restored entry.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Iterator

from orchestrator.control.handout import Handout
from orchestrator.control.store import StateStore
from orchestrator.core import env as E
from orchestrator.core.allocation import Allocation
from orchestrator.core.errors import UnknownObjectError
from orchestrator.core.lease import REDACTED, Lease, LeaseRequest, LeaseState
from orchestrator.core.statemachine import Transition
from orchestrator.scheduling.cycle import Waiting


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One lease in the ledger, with what the head needs beside the lease value itself."""

    lease: Lease
    spec: LeaseRequest
    seq: int
    enqueued_at: float
    handout: Handout | None = None
    holder: str | None = None
    attempt_of: str | None = None
    requeued_as: str | None = None
    why_pending: str = ""
    preempt_for: str | None = None
    preempt_reason: str = ""
    preempt_cause: str = ""  # the victim's cause code (victim.priority, victim.reclaim): why it was chosen
    preempt_deadline: float | None = None
    workload: str | None = None  # what runs on the devices: actor:<ns>/<name>, job:<submission id>, pid:<n>
    revoking: bool = False  # ended, but its devices stay fenced off until the node's agent confirms them free
    waiting: Waiting | None = None  # soft state: the scheduler's answer for a pending lease, this cycle

    @property
    def lease_id(self) -> str:
        return self.lease.lease_id

    @property
    def state(self) -> LeaseState:
        return self.lease.state

    def reason(self) -> str:
        """The reason of the lease's latest transition."""
        return self.lease.history[-1].reason

    def grant_reason(self) -> str:
        """Why it was placed where it is ("" before a grant)."""
        t = next((t for t in reversed(self.lease.history) if t.state is LeaseState.GRANTED), None)
        return t.reason if t else ""

    def to_json(self) -> dict[str, Any]:
        """The stored form (see :meth:`from_json`)."""
        a = self.lease.allocation
        return {
            "spec": self.spec.model_dump(mode="json"), "seq": self.seq, "enqueued_at": self.enqueued_at,
            "priority": self.lease.priority, "priority_class": self.lease.priority_class,
            "state": self.lease.state.value, "fencing_token": self.lease.fencing_token,
            "allocation": a.to_json() if a else None,
            "history": [t.to_dict() for t in self.lease.history],
            "handout": self.handout.to_dict() if self.handout else None, "holder": self.holder,
            "attempt_of": self.attempt_of, "requeued_as": self.requeued_as,
            "checkpoint_path": self.lease.checkpoint_path, "last_checkpoint_at": self.lease.last_checkpoint_at,
            "preempt_for": self.preempt_for, "preempt_reason": self.preempt_reason, "preempt_cause": self.preempt_cause,
            "preempt_deadline": self.preempt_deadline, "workload": self.workload, "revoking": self.revoking,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "LedgerEntry":
        spec = LeaseRequest.parse(d["spec"])
        history = tuple(Transition(h["at"], LeaseState(h["state"]), h["reason"]) for h in d["history"])
        alloc = Allocation.from_json(d["allocation"]) if d.get("allocation") else None
        lease = Lease(spec.lease_id, spec.request, spec.owner, d["priority"], d["priority_class"],
                      state=LeaseState(d["state"]), allocation=alloc, fencing_token=d["fencing_token"],
                      history=history, checkpoint_path=d.get("checkpoint_path"),
                      last_checkpoint_at=d.get("last_checkpoint_at"), queue=spec.queue)
        return cls(lease, spec, d["seq"], d["enqueued_at"],
                   handout=Handout.from_dict(d["handout"]) if d.get("handout") else None,
                   holder=d.get("holder"), attempt_of=d.get("attempt_of"), requeued_as=d.get("requeued_as"),
                   preempt_for=d.get("preempt_for"), preempt_reason=d.get("preempt_reason", ""),
                   preempt_cause=d.get("preempt_cause", ""),
                   preempt_deadline=d.get("preempt_deadline"), workload=d.get("workload"),
                   revoking=bool(d.get("revoking", False)))

    def to_dict(self, *, reveal: bool = False) -> dict[str, Any]:
        """The public view (``get_lease``, ``status``): the fencing token redacted unless ``reveal``
        (the caller proved it is the requester, or already holds the token)."""
        d = self.lease.to_dict()
        handout = self.handout.to_dict() if self.handout else None
        if not reveal:
            d["fencing_token"] = None
            d["token_redacted"] = True
            if handout is not None and E.FENCING_TOKEN in handout.get("env_vars", {}):
                handout["env_vars"] = {**handout["env_vars"], E.FENCING_TOKEN: REDACTED}
        d.update(request_spec=self.spec.request.model_dump(mode="json", exclude_defaults=True),
                 handout=handout, holder=self.holder,
                 attempt_of=self.attempt_of, requeued_as=self.requeued_as, why_pending=self.why_pending or None,
                 preempt_for=self.preempt_for, preempt_reason=self.preempt_reason or None,
                 preempt_cause=self.preempt_cause or None,
                 preempt_deadline=self.preempt_deadline, workload=self.workload, revoking=self.revoking,
                 resume_from=self.spec.resume_from)
        return d


class Ledger:
    """The entries, the fencing counter and the sequence, over a :class:`StateStore`; see the module docstring."""

    def __init__(self, store: StateStore, namespace: str) -> None:
        self.store = store
        self.meta_key = f"{namespace}/meta"
        self.prefix = f"{namespace}/lease/"
        self.entries: dict[str, LedgerEntry] = {}
        self.fencing = 0
        self.seq = 0

    def restore(self) -> list[LedgerEntry]:
        meta = self.store.get(self.meta_key) or {}
        self.fencing = int(meta.get("fencing", 0))
        self.seq = int(meta.get("seq", 0))
        out = []
        for key in self.store.keys(self.prefix):
            d = self.store.get(key)
            if d is None:
                continue
            e = LedgerEntry.from_json(d)
            self.entries[e.lease_id] = e
            self.seq = max(self.seq, e.seq)
            self.fencing = max(self.fencing, e.lease.fencing_token)
            out.append(e)
        return out

    def put_meta(self) -> None:
        self.store.put(self.meta_key, {"fencing": self.fencing, "seq": self.seq})

    def commit(self, entries: Iterable[LedgerEntry]) -> None:
        """Write entries to the store, then make them current in memory (hard state first)."""
        entries = list(entries)
        for e in entries:
            self.store.put(self.prefix + e.lease_id, e.to_json())
        for e in entries:
            self.entries[e.lease_id] = e

    def soft(self, e: LedgerEntry, **changes: Any) -> None:
        """Change soft state only (never persisted: ``waiting``, ``why_pending``, a moved column position)."""
        self.entries[e.lease_id] = replace(e, **changes)

    def prune_ended(self, cutoff: float) -> list[str]:
        """Drop leases that ended before ``cutoff``, from the store first; returns their ids.

        A lease stays while a later attempt it was requeued as is still live (so
        ``latest`` keeps leading a client holding the first id to the running one),
        and while its devices await the agent's confirmation."""
        out = []
        for e in self:
            if not e.lease.terminal or e.revoking or e.lease.history[-1].at > cutoff:
                continue
            if not self.latest(e.lease_id).lease.terminal:
                continue
            self.drop(e.lease_id)
            out.append(e.lease_id)
        return out

    def drop(self, lease_id: str) -> None:
        """Forget an ended lease, from the store first."""
        self.store.delete(self.prefix + lease_id)
        del self.entries[lease_id]

    def get(self, lease_id: str) -> LedgerEntry:
        try:
            return self.entries[lease_id]
        except KeyError:
            raise UnknownObjectError("lease", lease_id) from None

    def find(self, lease_id: str) -> LedgerEntry | None:
        return self.entries.get(lease_id)

    def latest(self, lease_id: str) -> LedgerEntry:
        """Follow ``requeued_as`` from ``lease_id`` to its latest attempt."""
        e = self.get(lease_id)
        while e.requeued_as and e.requeued_as in self.entries:
            e = self.entries[e.requeued_as]
        return e

    def __iter__(self) -> Iterator[LedgerEntry]:
        return iter(list(self.entries.values()))

    def in_state(self, *states: LeaseState) -> list[LedgerEntry]:
        return [e for e in self.entries.values() if e.lease.state in states]

    def holding(self) -> list[LedgerEntry]:
        return [e for e in self.entries.values() if e.lease.holding]

    def occupying(self) -> list[LedgerEntry]:
        """Entries whose devices are taken: holding ones, and ended ones awaiting their agent's confirmation."""
        return [e for e in self.entries.values() if e.lease.holding or e.revoking]
