"""What must hold between the head's ledger and the agents, whatever is killed: checked over snapshots.

Pure: no Ray, no I/O. A driver (``bench/chaos.py``) reads the head's ``status``
and each agent's ``info`` into an :class:`Observation`; the functions here say
what is wrong with it, and :class:`History` what is wrong with a sequence of them.
Nomenclature: a lease **occupies** a device from its grant until it ends, and
after that while it is *revoking* (fenced until its agent confirms); a **fault**
is something the driver did to a node (its agent or its raylet killed).

Invariants, one function each:

* **No double grant** (:func:`double_grants`, at any instant): on every card the
  occupying leases fit its share rules -- a whole card has one lease and nothing
  else; MPS shares sum to at most 100% of SMs, time-slices to at most the
  time-slice capacity; MIG instances do not overlap (memory slices) and no card
  mixes MIG, MPS, time-slice and whole leases; no MIG instance has two leases.
  Checked independently of the scheduler's snapshot (its own arithmetic), so a
  bug there cannot hide here.
* **Ledger and agents agree** (:func:`disagreements`, once reconciliation has
  settled): on a registered node whose agent answers, the leases the agent holds
  are exactly the ledger's holding leases on that node, and no agent holds a
  lease the ledger places on another node. A heartbeat's lag makes this false
  for a moment after every change; the driver retries until a deadline.
* **Fencing is monotonic** (:meth:`History.observe`): the head's counter never
  goes down (a restored head included); a lease's token never changes once
  granted; no two leases share a token; a lease seen pending while the counter
  was C is granted a token above C.
* **No lease is lost** (:meth:`History.observe`, ``leases_lost``): a lease the
  ledger reported holding is *lost* when later it (1) is gone from the ledger
  without having been seen to end, (2) is back to pending or holds other devices
  or another token, (3) ended with no reason, (4) ended *released* although no
  one the driver knows of released it (its own leases only), or (5) ended *lost*
  although no fault touched its node since it was granted, or shortly before
  (``fault_window_s``: granted to a killed agent before the head noticed); a
  head restart must keep every lease. Leases ended *lost* on a faulted node are expected: counted
  as ``ended_by_faults``, not as lost.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from orchestrator.core.catalogue import gpu_model
from orchestrator.core.lease import token_counter

HOLDING = frozenset({"granted", "active", "checkpointing"})
TERMINAL = frozenset({"released", "preempted", "expired", "lost"})


@dataclass(frozen=True, slots=True)
class LeaseSeen:
    """One lease as the ledger showed it. ``token`` is None where the view redacts it."""

    lease_id: str
    state: str
    reason: str = ""
    allocation: Mapping[str, Any] | None = None
    token: int | None = None
    revoking: bool = False

    @property
    def holding(self) -> bool:
        return self.state in HOLDING

    @property
    def occupying(self) -> bool:
        return (self.holding or self.revoking) and self.allocation is not None

    @property
    def node(self) -> str | None:
        return self.allocation.get("node") if self.allocation else None

    @classmethod
    def from_view(cls, d: Mapping[str, Any], token: int | None = None) -> "LeaseSeen":
        """From a ``status``/``get_lease`` lease view; ``token``: the one the observer knows, if the view hid it."""
        history = d.get("history") or [{}]
        t = d.get("fencing_token")
        return cls(d["lease_id"], d["state"], history[-1].get("reason", ""), d.get("allocation"),
                   int(t) if t is not None else token, bool(d.get("revoking")))


@dataclass(frozen=True, slots=True)
class Observation:
    """The ledger and the agents, read one after the other by a driver.

    ``agents`` maps a node to the lease ids its agent holds, or None when the agent did not answer;
    ``registered``: the nodes the head has registered now."""

    at: float
    fencing_counter: int
    leases: tuple[LeaseSeen, ...]
    agents: Mapping[str, frozenset[str] | None] = field(default_factory=dict)
    registered: frozenset[str] = frozenset()
    timeslice_capacity_milli: int = 1000


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant: ``kind`` is a stable code, ``detail`` says what was seen."""

    kind: str  # double_grant | disagreement | fencing | lease_lost (| recovery: a driver's, nothing came back in time)
    detail: str
    lease_id: str = ""
    node: str = ""

    def to_json(self) -> dict[str, str]:
        # By hand: the report's key order is not the field order (``detail`` is the constructors' second argument).
        return {"kind": self.kind, "lease_id": self.lease_id, "node": self.node, "detail": self.detail}


def observation(status: Mapping[str, Any], agents: Mapping[str, Iterable[str] | None], *, at: float,
                tokens: Mapping[str, int] | None = None, extra: Iterable[Mapping[str, Any]] = (),
                timeslice_capacity_milli: int = 1000) -> Observation:
    """An :class:`Observation` from the head's ``status`` view, what each agent holds (None: no answer),
    the tokens the observer knows (its own leases) and ``extra`` lease views it read one by one."""
    tokens = tokens or {}
    seen: dict[str, LeaseSeen] = {}
    for d in [*status.get("ended_leases", ()), *status.get("leases", ()), *extra]:
        seen[d["lease_id"]] = LeaseSeen.from_view(d, tokens.get(d["lease_id"]))
    return Observation(at, int(status["head"]["fencing_counter"]), tuple(seen.values()),
                       {n: (frozenset(ids) if ids is not None else None) for n, ids in agents.items()},
                       frozenset(n["name"] for n in status.get("nodes", ()) if n["state"] == "registered"),
                       timeslice_capacity_milli)


# ---- at one instant ------------------------------------------------------------------------------
def _mig_mask(a: Mapping[str, Any]) -> int:
    profile = gpu_model(a["model"]).profile(a["mig_profile"]) if a.get("model") else None
    width = profile.memory_slices if profile is not None else 1
    return ((1 << width) - 1) << int(a.get("mig_start") or 0)


def double_grants(obs: Observation) -> list[Violation]:
    """Cards whose occupying leases break their share rules (see the module docstring)."""
    by_card: dict[tuple[str, int], list[LeaseSeen]] = defaultdict(list)
    mig_owner: dict[str, str] = {}
    out: list[Violation] = []
    for le in obs.leases:
        if not le.occupying:
            continue
        a = le.allocation or {}
        for idx in a.get("gpu_indices", ()):
            by_card[(a["node"], int(idx))].append(le)
        uuid = a.get("mig_uuid")
        if uuid:
            if uuid in mig_owner:
                out.append(Violation("double_grant", f"MIG instance {uuid} held by {mig_owner[uuid]} and "
                                     f"{le.lease_id}", le.lease_id, a["node"]))
            mig_owner[uuid] = le.lease_id
    for (node, idx), leases in sorted(by_card.items()):
        ids = ", ".join(sorted(le.lease_id for le in leases))
        kinds = {(le.allocation or {})["kind"] for le in leases}
        where = f"{node} GPU {idx}"
        if len(kinds) > 1:
            out.append(Violation("double_grant", f"{where} mixes {sorted(kinds)}: {ids}", leases[0].lease_id, node))
            continue
        kind = kinds.pop()
        if kind == "whole" and len(leases) > 1:
            out.append(Violation("double_grant", f"{where} is whole-card to {len(leases)} leases: {ids}",
                                 leases[0].lease_id, node))
        elif kind == "mps" and sum(int((le.allocation or {}).get("sm_percent") or 0) for le in leases) > 100:
            out.append(Violation("double_grant", f"{where}: MPS shares above 100% of SMs: {ids}", leases[0].lease_id, node))
        elif kind == "timeslice" and sum(int((le.allocation or {})["milli"]) for le in leases) > obs.timeslice_capacity_milli:
            out.append(Violation("double_grant", f"{where}: time-slices above {obs.timeslice_capacity_milli} milli: {ids}",
                                 leases[0].lease_id, node))
        elif kind == "mig":
            used = 0
            for le in leases:
                m = _mig_mask(le.allocation or {})
                if used & m:
                    out.append(Violation("double_grant", f"{where}: MIG instances overlap: {ids}", le.lease_id, node))
                    break
                used |= m
    return out


def disagreements(obs: Observation) -> list[Violation]:
    """Where a registered node's answering agent holds other leases than the ledger gives it."""
    ledger: dict[str, set[str]] = defaultdict(set)
    where: dict[str, str] = {}
    for le in obs.leases:
        if le.holding and le.node:
            ledger[le.node].add(le.lease_id)
            where[le.lease_id] = le.node
    out = []
    for node, held in sorted(obs.agents.items()):
        if held is None or node not in obs.registered:
            continue
        for lid in sorted(ledger[node] - held):
            out.append(Violation("disagreement", f"the ledger holds {lid} on {node}; its agent does not", lid, node))
        for lid in sorted(held - ledger[node]):
            other = where.get(lid)
            why = f"the ledger places it on {other}" if other else "the ledger holds no such lease"
            out.append(Violation("disagreement", f"the agent of {node} holds {lid}; {why}", lid, node))
    return out


# ---- over time -----------------------------------------------------------------------------------
@dataclass(slots=True)
class _Tracked:
    first: LeaseSeen
    last: LeaseSeen
    held: LeaseSeen | None = None  # its latest holding sight
    held_since: float | None = None
    ended: bool = False
    counted: bool = False


class History:
    """Checks a sequence of observations (see the module docstring); counts lost leases and fault endings.

    The driver tells it of its own actions: :meth:`released` (it gave a lease back) and :meth:`fault`
    (it killed something on a node)."""

    def __init__(self, fault_window_s: float = 30.0) -> None:
        #: A fault on a node at time f explains the loss of a lease on it first seen holding before
        #: f + fault_window_s (a lease granted to a killed agent before the head noticed).
        self.fault_window_s = fault_window_s
        self.counter = 0
        self.leases: dict[str, _Tracked] = {}
        self.tokens: dict[int, str] = {}
        self.pending_counter: dict[str, int] = {}  # lease id -> the largest counter seen while it was pending
        self.own: set[str] = set()
        self.released_by_driver: set[str] = set()
        self.faults: dict[str, list[float]] = defaultdict(list)
        self.leases_lost = 0
        self.ended_by_faults = 0
        self.lost_ids: list[str] = []

    def requested(self, lease_id: str) -> None:
        """A lease the driver asked for itself: (4) applies to it."""
        self.own.add(lease_id)

    def released(self, lease_id: str) -> None:
        self.released_by_driver.add(lease_id)

    def fault(self, node: str, at: float) -> None:
        self.faults[node].append(at)

    def _lost(self, t: _Tracked, why: str) -> list[Violation]:
        """Count ``t`` lost, once: a lease lost is one violation however often it is seen so."""
        if t.counted:
            return []
        t.counted = True
        self.leases_lost += 1
        self.lost_ids.append(t.first.lease_id)
        return [Violation("lease_lost", why, t.first.lease_id, (t.held or t.last).node or "")]

    def observe(self, obs: Observation, gone: Iterable[str] = ()) -> list[Violation]:
        """Check ``obs`` against what came before. ``gone``: lease ids the driver asked the ledger for
        and it answered that it knows no such lease (absence from a partial view proves nothing)."""
        out: list[Violation] = []
        if obs.fencing_counter < self.counter:
            out.append(Violation("fencing", f"the fencing counter went down: {self.counter} -> {obs.fencing_counter}"))
        self.counter = max(self.counter, obs.fencing_counter)
        for le in obs.leases:
            t = self.leases.get(le.lease_id)
            if t is None:
                t = self.leases[le.lease_id] = _Tracked(le, le)
            out.extend(self._fencing(t, le, obs))
            out.extend(self._step(t, le, obs.at))
            t.last = le
        for lid in gone:
            t = self.leases.get(lid)
            if t is not None and t.held is not None and not t.ended:
                out += self._lost(t, f"{lid} was {t.held.state} and is gone from the ledger without ending")
        return out

    def _fencing(self, t: _Tracked, le: LeaseSeen, obs: Observation) -> list[Violation]:
        out = []
        if le.state == "pending":
            self.pending_counter[le.lease_id] = max(self.pending_counter.get(le.lease_id, 0), obs.fencing_counter)
        if le.token is None or not (le.holding or le.state in TERMINAL) or le.token == 0:
            return out
        if token_counter(le.token) > obs.fencing_counter:
            out.append(Violation("fencing", f"{le.lease_id} has token {le.token} above the counter {obs.fencing_counter}",
                                 le.lease_id, le.node or ""))
        owner = self.tokens.setdefault(le.token, le.lease_id)
        if owner != le.lease_id:
            out.append(Violation("fencing", f"token {le.token} given to both {owner} and {le.lease_id}", le.lease_id,
                                 le.node or ""))
        before = self.pending_counter.get(le.lease_id)
        if before is not None and token_counter(le.token) <= before:
            out.append(Violation("fencing", f"{le.lease_id} was pending while the counter was {before} and was "
                                 f"granted token {le.token}", le.lease_id, le.node or ""))
        return out

    def _step(self, t: _Tracked, le: LeaseSeen, at: float) -> list[Violation]:
        out: list[Violation] = []
        if t.ended:
            if le.state != t.last.state:
                out += self._lost(t, f"{le.lease_id} ended {t.last.state} and is now {le.state}")
            return out
        if le.holding:
            h = t.held
            if h is not None and (le.token is not None and h.token is not None and le.token != h.token):
                out.append(Violation("fencing", f"{le.lease_id}'s token changed {h.token} -> {le.token}", le.lease_id,
                                     le.node or ""))
            if h is not None and _devices(le) != _devices(h):
                out += self._lost(t, f"{le.lease_id} moved while holding: {_devices(h)} -> {_devices(le)}")
            if h is None:
                t.held_since = at
            t.held = le
            return out
        if le.state == "pending":
            if t.held is not None:
                out += self._lost(t, f"{le.lease_id} was {t.held.state} and is pending again")
            return out
        t.ended = True  # a terminal state
        if t.held is None:
            return out  # withdrawn or expired before a grant: nothing was held
        node = t.held.node or ""
        if not le.reason.strip():
            out += self._lost(t, f"{le.lease_id} ended {le.state} with no reason")
        elif le.state == "released" and le.lease_id in self.own and le.lease_id not in self.released_by_driver:
            out += self._lost(t, f"{le.lease_id} was released by someone else: {le.reason}")
        elif le.state == "lost":
            since = t.held_since if t.held_since is not None else float("-inf")
            if any(since <= f + self.fault_window_s and f <= at for f in self.faults.get(node, ())):
                self.ended_by_faults += 1
            elif "holder died" not in le.reason:
                out += self._lost(t, f"{le.lease_id} on {node} ended lost with no fault on that node: {le.reason}")
        return out


def _devices(le: LeaseSeen) -> tuple[Any, ...]:
    a = le.allocation or {}
    return (a.get("node"), tuple(a.get("gpu_indices", ())), a.get("kind"), a.get("mig_start"), a.get("milli"))
