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
  largest token and sequence of any restored entry;
* ``entries`` changes only through :meth:`Ledger.commit`, :meth:`Ledger.soft`,
  :meth:`Ledger.drop` and :meth:`Ledger.restore`, which keep the indexes (by
  state, the occupying leases of each node, the victims of each request and
  those of them still on their way out, the holding workers of elastic gangs) equal to a scan of it. Every
  query answers in ``entries``' order, as a scan would: the head's cost then
  grows with what a query returns, not with every lease the ledger keeps
  (``docs/scaling.md``);
* every ended entry has an item ``(ended at, position, id)`` in the ended-lease heap, so
  :meth:`Ledger.prune_ended` pops what ended before its cutoff instead of walking every
  ended lease (a day of them by default); an item whose entry is gone or changed is
  stale and skipped;
* a watcher (:meth:`Ledger.watch`) sees every change of ``entries`` as ``(old, new)``
  (``None`` for an entry that comes or goes), after the indexes moved, in the order
  the changes happen; it is first told of every entry already there as ``(None, e)``.
  What it keeps from them is its own (the metrics' lease counts): it must not change
  the ledger.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from typing import Any, Callable, Collection, Iterable, Iterator

from orchestrator.control.handout import Handout
from orchestrator.control.store import StateStore
from orchestrator.core import env as E
from orchestrator.core.allocation import Allocation
from orchestrator.core.changefeed import ChangeFeed
from orchestrator.core.errors import UnknownObjectError
from orchestrator.core.lease import (HOLDING_STATES, LEASE_TRANSITIONS, REDACTED, Lease, LeaseRequest, LeaseState,
                                     make_token, token_counter)
from orchestrator.core.statemachine import Transition
from orchestrator.scheduling.cycle import Waiting
from orchestrator.scheduling.preemption import USAGE_UNITS, usage_units


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
    #: Its holder asked for it to be released with this reason once the holder is gone (``release(when_gone=True)``):
    #: the devices stay its until then, and the holder's death is a release, not a loss.
    release_when_gone: str = ""
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
        # By hand: the stored form flattens the lease's fields beside the entry's, and the soft state stays out.
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
            **({"release_when_gone": self.release_when_gone} if self.release_when_gone else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "LedgerEntry":
        # By hand, as to_json: the lease is rebuilt from the spec and the flattened fields.
        spec = LeaseRequest.parse(d["spec"])
        history = tuple(Transition(h["at"], LeaseState(h["state"]), h["reason"]) for h in d["history"])
        alloc = Allocation.from_json(d["allocation"]) if d.get("allocation") else None
        lease = Lease(spec.lease_id, spec.request, spec.owner, d["priority"], d["priority_class"],
                      state=LeaseState(d["state"]), allocation=alloc, fencing_token=d["fencing_token"],
                      history=history, checkpoint_path=d.get("checkpoint_path"),
                      last_checkpoint_at=d.get("last_checkpoint_at"), queue=spec.queue,
                      gang=spec.gang.gang_id if spec.gang else None, elastic=spec.gang.elastic if spec.gang else None)
        return cls(lease, spec, d["seq"], d["enqueued_at"],
                   handout=Handout.from_dict(d["handout"]) if d.get("handout") else None,
                   holder=d.get("holder"), attempt_of=d.get("attempt_of"), requeued_as=d.get("requeued_as"),
                   preempt_for=d.get("preempt_for"), preempt_reason=d.get("preempt_reason", ""),
                   preempt_cause=d.get("preempt_cause", ""),
                   preempt_deadline=d.get("preempt_deadline"), workload=d.get("workload"),
                   revoking=bool(d.get("revoking", False)), release_when_gone=d.get("release_when_gone", ""))

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
                 release_when_gone=self.release_when_gone or None, resume_from=self.spec.resume_from)
        return d


def _on_its_way_out(e: LedgerEntry) -> bool:
    """A preemption victim still giving its devices back: asked to checkpoint, or ended but not yet confirmed
    stopped by its node's agent (revoking)."""
    return e.lease.state is LeaseState.CHECKPOINTING or e.revoking


#: Entry fields no index of the ledger and no watcher reads (see :meth:`Ledger.soft`).
_UNINDEXED = frozenset({"waiting", "why_pending"})


class Ledger:
    """The entries, the fencing counter and the sequence, over a :class:`StateStore`; see the module docstring."""

    def __init__(self, store: StateStore, namespace: str, token_secret: bytes | None = None) -> None:
        self.store = store
        #: what tokens are made from (:func:`~orchestrator.core.lease.make_token`); the journal keeps only their
        #: counters (:meth:`_sealed`), so reading the GCS KV gives no holder's token. Without one (in-process use),
        #: a random secret kept in the store itself (the Ray head passes its own: the GCS never sees it).
        self.token_secret = token_secret if token_secret is not None else self._store_secret(store, namespace)
        self.meta_key = f"{namespace}/meta"
        self.prefix = f"{namespace}/lease/"
        self.entries: dict[str, LedgerEntry] = {}
        self.fencing = 0
        self.seq = 0
        # Indexes over ``entries`` (see the module docstring): lease ids by state, the occupying leases of
        # each node, and each id's position in ``entries`` (what keeps answers in scan order).
        self._pos: dict[str, int] = {}
        self._next_pos = 0
        self._by_state: dict[LeaseState, set[str]] = {s: set() for s in LeaseState}
        self._occupying: set[str] = set()
        self._elastic: set[str] = set()  # holding workers of elastic gangs (what the scheduler may grow)
        self._usage: dict[str, int] = {}  # queue -> GPUs its holding leases hold, in preemption.USAGE_UNITS
        self._on_node: dict[str, set[str]] = {}
        self._node_feed: ChangeFeed[str] = ChangeFeed()  # the nodes an occupying lease of which came, went or changed
        self._victims: dict[str, set[str]] = {}  # a request's id -> the leases preempted (or being) for it
        self._nominating: dict[str, set[str]] = {}  # the same, of those still on their way out (see nominated)
        self._ended: list[tuple[float, int, str]] = []  # heap: (ended at, position, id) of ended entries
        self._watchers: list[Callable[[LedgerEntry | None, LedgerEntry | None], None]] = []

    def watch(self, fn: Callable[[LedgerEntry | None, LedgerEntry | None], None]) -> None:
        """Call ``fn(old, new)`` on every change of ``entries`` from now on, after telling it of every
        entry already there as ``(None, e)`` (see the module docstring)."""
        for e in self.entries.values():
            fn(None, e)
        self._watchers.append(fn)

    def unwatch(self, fn: Callable[[LedgerEntry | None, LedgerEntry | None], None]) -> None:
        self._watchers.remove(fn)

    def restore(self) -> list[LedgerEntry]:
        meta = self.store.get(self.meta_key) or {}
        self.fencing = int(meta.get("fencing", 0))
        self.seq = int(meta.get("seq", 0))
        out = []
        for key in self.store.keys(self.prefix):
            d = self.store.get(key)
            if d is None:
                continue
            e = LedgerEntry.from_json(self._unsealed(d))
            self._put(e)
            self.seq = max(self.seq, e.seq)
            self.fencing = max(self.fencing, token_counter(e.lease.fencing_token))
            out.append(e)
        return out

    def put_meta(self) -> None:
        self.store.put(self.meta_key, {"fencing": self.fencing, "seq": self.seq})

    def commit(self, entries: Iterable[LedgerEntry]) -> None:
        """Write entries to the store, then make them current in memory (hard state first)."""
        entries = list(entries)
        for e in entries:
            self.store.put(self.prefix + e.lease_id, self._sealed(e.to_json()))
        for e in entries:
            self._put(e)

    def make_token(self, lease_id: str) -> int:
        """The token of ``lease_id``'s grant at the current fencing counter (:func:`~orchestrator.core.lease.make_token`)."""
        return make_token(self.fencing, lease_id, self.token_secret)

    @staticmethod
    def _sealed(d: dict[str, Any]) -> dict[str, Any]:
        """``d`` (an entry's stored form) without its token: the counter stays (``fencing_counter``), the token and
        the hand-out's copy of it go. What the GCS KV holds: any driver of the cluster can read it."""
        token = d.get("fencing_token")
        if token:
            d = {**d, "fencing_token": 0, "fencing_counter": token_counter(token)}
            h = d.get("handout")
            if h and E.FENCING_TOKEN in (h.get("env_vars") or {}):
                d["handout"] = {**h, "env_vars": {**h["env_vars"], E.FENCING_TOKEN: REDACTED}}
        return d

    def _unsealed(self, d: dict[str, Any]) -> dict[str, Any]:
        """The stored form with its token made again from the counter and the secret (:meth:`_sealed` undone)."""
        counter = d.get("fencing_counter")
        if counter is None:
            return d
        token = make_token(int(counter), d["spec"]["lease_id"], self.token_secret)
        d = {**d, "fencing_token": token}
        h = d.get("handout")
        if h and E.FENCING_TOKEN in (h.get("env_vars") or {}):
            d["handout"] = {**h, "env_vars": {**h["env_vars"], E.FENCING_TOKEN: str(token)}}
        return d

    @staticmethod
    def _store_secret(store: StateStore, namespace: str) -> bytes:
        key = f"{namespace}/token-secret"
        got = store.get(key)
        if got is None:
            import secrets

            got = {"hex": secrets.token_hex(32)}
            store.put(key, got)
        return bytes.fromhex(got["hex"])

    def soft(self, e: LedgerEntry, **changes: Any) -> None:
        """Change soft state only (never persisted: ``waiting``, ``why_pending``, a moved column position).

        ``waiting`` and ``why_pending`` are in no index and no watcher reads them: a change of only those
        replaces the entry without re-indexing or telling the watchers (it happens for every pending lease,
        every cycle)."""
        if changes.keys() <= _UNINDEXED:
            if all(getattr(e, k) == v for k, v in changes.items()):
                return
            self.entries[e.lease_id] = replace(e, **changes)
            return
        self._put(replace(e, **changes))

    def _put(self, e: LedgerEntry) -> None:
        """Make ``e`` current and move it in the indexes."""
        lid = e.lease_id
        old = self.entries.get(lid)
        if old is None:
            self._pos[lid] = self._next_pos
            self._next_pos += 1
        else:
            self._unindex(old)
        self.entries[lid] = e
        self._by_state[e.lease.state].add(lid)
        if e.lease.state in LEASE_TRANSITIONS.terminal and (old is None or old.lease.history[-1] != e.lease.history[-1]):
            heapq.heappush(self._ended, (e.lease.history[-1].at, self._pos[lid], lid))
        if e.preempt_for:
            self._victims.setdefault(e.preempt_for, set()).add(lid)
            if _on_its_way_out(e):
                self._nominating.setdefault(e.preempt_for, set()).add(lid)
        if e.lease.holding:
            q = e.lease.queue
            self._usage[q] = self._usage.get(q, 0) + usage_units(e.lease)
            if e.lease.elastic is not None:
                self._elastic.add(lid)
        if e.lease.holding or e.revoking:
            self._occupying.add(lid)
            if e.lease.allocation is not None:
                self._on_node.setdefault(e.lease.allocation.node_name, set()).add(lid)
                self._bump(e.lease.allocation.node_name)
        for fn in self._watchers:
            fn(old, e)

    def _unindex(self, e: LedgerEntry) -> None:
        lid = e.lease_id
        self._by_state[e.lease.state].discard(lid)
        self._elastic.discard(lid)
        if e.lease.holding:
            q = e.lease.queue
            left = self._usage[q] - usage_units(e.lease)
            if left:
                self._usage[q] = left
            else:
                del self._usage[q]
        if e.preempt_for:
            victims = self._victims[e.preempt_for]
            victims.discard(lid)
            if not victims:
                del self._victims[e.preempt_for]
            if _on_its_way_out(e):
                going = self._nominating[e.preempt_for]
                going.discard(lid)
                if not going:
                    del self._nominating[e.preempt_for]
        if lid in self._occupying:
            self._occupying.discard(lid)
            a = e.lease.allocation
            ids = self._on_node.get(a.node_name) if a is not None else None
            if a is not None:
                self._bump(a.node_name)
            if ids is not None:
                ids.discard(lid)
                if not ids:
                    del self._on_node[a.node_name]  # type: ignore[union-attr]

    def in_order(self, ids: Collection[str]) -> list[LedgerEntry]:
        """The entries of ``ids`` in ``entries``' order (what a scan would return)."""
        pos = self._pos
        return [self.entries[i] for i in sorted(ids, key=pos.__getitem__)]

    def prune_ended(self, cutoff: float) -> list[str]:
        """Drop leases that ended before ``cutoff``, from the store first; returns their ids in ``entries``' order.

        A lease stays while a later attempt it was requeued as is still live (so
        ``latest`` keeps leading a client holding the first id to the running one),
        and while its devices await the agent's confirmation. The candidates come off
        the ended-lease heap (O(ended before the cutoff x log)); those that stay go back
        on it, to be asked again at the next prune, as a scan would."""
        heap, entries = self._ended, self.entries
        due: dict[str, LedgerEntry] = {}
        while heap and heap[0][0] <= cutoff:
            at, _, lid = heapq.heappop(heap)
            e = entries.get(lid)
            if e is None or e.lease.state not in LEASE_TRANSITIONS.terminal or e.lease.history[-1].at != at:
                continue  # stale: dropped already, or its item was pushed again when it changed
            due[lid] = e
        out = []
        for e in self.in_order(due):
            if e.revoking or not self.latest(e.lease_id).lease.terminal:
                heapq.heappush(heap, (e.lease.history[-1].at, self._pos[e.lease_id], e.lease_id))
                continue
            self.drop(e.lease_id)
            out.append(e.lease_id)
        return out

    def drop(self, lease_id: str) -> None:
        """Forget an ended lease, from the store first."""
        self.store.delete(self.prefix + lease_id)
        old = self.entries.pop(lease_id)
        self._unindex(old)
        del self._pos[lease_id]
        for fn in self._watchers:
            fn(old, None)

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

    def count(self, state: LeaseState) -> int:
        """How many leases are in ``state`` (no entries built or sorted)."""
        return len(self._by_state[state])

    def in_state(self, *states: LeaseState) -> list[LedgerEntry]:
        if len(states) == 1:
            return self.in_order(self._by_state[states[0]])
        return self.in_order(set().union(*(self._by_state[s] for s in states)))

    def in_state_any_order(self, *states: LeaseState) -> list[LedgerEntry]:
        """:meth:`in_state` without the ledger's order: for counting and probing, where it does not
        matter, it saves sorting every live lease by position each cycle."""
        entries = self.entries
        return [entries[i] for s in states for i in self._by_state[s]]

    def holding(self) -> list[LedgerEntry]:
        return self.in_state(*HOLDING_STATES)

    @property
    def any_elastic(self) -> bool:
        """Whether a worker of an elastic gang holds devices (the cycle then looks for a gang to grow)."""
        return bool(self._elastic)

    def elastic_holding(self) -> list[LedgerEntry]:
        """The holding workers of elastic gangs (``Lease.elastic``), in ledger order."""
        return self.in_order(self._elastic)

    def occupying(self) -> list[LedgerEntry]:
        """Entries whose devices are taken: holding ones, and ended ones awaiting their agent's confirmation."""
        return self.in_order(self._occupying)

    def queue_usage(self) -> dict[str, float]:
        """GPUs held per queue by the holding leases: :func:`~orchestrator.scheduling.preemption.queue_usage`
        over :meth:`holding`, kept up as entries change instead of summed each time."""
        return {q: n / USAGE_UNITS for q, n in self._usage.items()}

    def occupying_any_order(self) -> list[LedgerEntry]:
        """:meth:`occupying` without the ledger's order (no sort)."""
        entries = self.entries
        return [entries[i] for i in self._occupying]

    def _bump(self, node: str) -> None:
        self._node_feed.changed(node)

    def node_version(self, node: str) -> int:
        """A number that changes whenever an occupying lease on ``node`` comes, goes or changes (it only grows)."""
        return self._node_feed.version(node)

    @property
    def node_changes(self) -> int:
        """How many such changes there have been: a mark for :meth:`nodes_changed_since`."""
        return self._node_feed.count

    def nodes_changed_since(self, mark: int) -> list[str]:
        """The nodes an occupying lease of which came, went or changed since :attr:`node_changes` was ``mark``,
        newest first (:class:`~orchestrator.core.changefeed.ChangeFeed`: costs what changed, not the nodes)."""
        return self._node_feed.since(mark)

    def node_occupied(self, node: str) -> bool:
        """Whether some occupying lease is on ``node`` (one node of :meth:`nodes_occupied`)."""
        return node in self._on_node

    def nodes_occupied(self) -> set[str]:
        """The nodes some occupying lease is on."""
        return set(self._on_node)

    def nominated(self) -> set[str]:
        """Requests whose victims are still on their way out (checkpointing, or revoking): the scheduler plans
        no second preemption for them. Kept as entries change: asked before every plan, the fast grant path's
        included, it had walked (and sorted) every occupying lease."""
        return set(self._nominating)

    def victims_for(self, lease_id: str) -> list[LedgerEntry]:
        """The entries preempted, or being preempted, for ``lease_id`` (``preempt_for``)."""
        return self.in_order(self._victims.get(lease_id, ()))

    def occupying_on(self, node: str) -> list[LedgerEntry]:
        """The occupying entries (:meth:`occupying`) whose allocation is on ``node``."""
        return self.in_order(self._on_node.get(node, ()))
