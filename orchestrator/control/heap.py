"""When the head collects garbage and freezes its heap: a pure decision over a small state.

The head is one thread; a full garbage collection stops it for as long as it
takes to walk every tracked object not frozen (``gc.freeze``). What the head
keeps grows with the nodes (inventories, records, the snapshot, metric series)
and with the ledger (a few immutable objects per lease, kept a day after the
lease ends). Left to CPython's own thresholds, a full collection walks all of
it: at 5,000 nodes and 50,000 leases, pauses of hundreds of milliseconds inside
a reconcile cycle (``docs/scaling.md``).

So the head freezes what has settled:

* ``FREEZE_NODES`` -- once nodes joined and the agents asked for registered (or
  none more registered for a cycle): collect everything once, then freeze.
  What the nodes brought lives as long as they do.
* ``FREEZE_RECENT`` -- every ``freeze_every_s`` after that: collect (which walks
  only what is not frozen: what came in since the last freeze) and freeze the
  survivors. A collection then costs what changed in ``freeze_every_s``, not
  what the head holds.
* ``FULL_COLLECT`` -- every ``full_every_s``: unfreeze, collect everything, and
  freeze again. A frozen object is still freed by reference counting when it
  is dropped (ledger entries, leases and records are acyclic: that is how they
  go), but one that ends in a reference cycle is only reclaimed here. This is
  the one pause that grows with the heap; it is taken rarely, on purpose.

Invariants: :func:`decide` does no I/O and touches no ``gc`` state; it returns
the action, its reason and the next state, and the caller performs the action.
``FREEZE_RECENT`` and ``FULL_COLLECT`` happen only after a first
``FREEZE_NODES`` (before the nodes joined there is nothing worth freezing).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from orchestrator.core.config import Tuning

#: Seconds between freezes of what came since the last one: the collection before each walks what this
#: long brought (~12 ms at the scale bench's 200 leases/s and 5,000 heartbeats/s; ~50 ms at 10 s).
FREEZE_EVERY_S = Tuning().heap_freeze_every_s
#: Seconds between full collections of the whole heap (unfreeze, collect, freeze): reclaims frozen cycles.
#: Both are the defaults of ``settings.tuning.heap_freeze_every_s`` and ``heap_full_every_s``, which the head
#: passes to :func:`decide`.
FULL_EVERY_S = Tuning().heap_full_every_s


class HeapAction(enum.Enum):
    NONE = "none"
    FREEZE_NODES = "freeze.nodes"  # nodes joined and settled: collect all, freeze
    FREEZE_RECENT = "freeze.recent"  # collect what is not frozen (recent), freeze the survivors
    FULL_COLLECT = "collect.full"  # unfreeze, collect everything, freeze again


@dataclass(frozen=True, slots=True)
class HeapState:
    """What :func:`decide` remembers between cycles."""

    frozen_nodes: int = 0  # node records when the nodes were last frozen
    last_nodes: int = 0  # node records at the previous cycle
    frozen_at: float | None = None  # head clock at the last freeze of any kind (None: never)
    full_at: float | None = None  # head clock at the last full collection (or the first freeze)


def decide(state: HeapState, *, nodes: int, starts_pending: bool, now: float,
           freeze_every_s: float = FREEZE_EVERY_S, full_every_s: float = FULL_EVERY_S
           ) -> tuple[HeapAction, str, HeapState]:
    """The action for this cycle, why, and the state after it (see the module docstring).

    ``nodes``: node records now; ``starts_pending``: agents asked for that have not registered yet."""
    if nodes > state.frozen_nodes and (not starts_pending or nodes == state.last_nodes):
        return (HeapAction.FREEZE_NODES, f"{nodes - state.frozen_nodes} nodes joined and settled",
                HeapState(nodes, nodes, now, now if state.full_at is None else state.full_at))
    state = replace(state, last_nodes=nodes)
    if state.frozen_at is None:
        return HeapAction.NONE, "no nodes settled yet", state
    if state.full_at is not None and now - state.full_at >= full_every_s:
        return (HeapAction.FULL_COLLECT, f"{full_every_s:g}s since the last full collection",
                replace(state, frozen_at=now, full_at=now))
    if now - state.frozen_at >= freeze_every_s:
        return HeapAction.FREEZE_RECENT, f"{freeze_every_s:g}s since the last freeze", replace(state, frozen_at=now)
    return HeapAction.NONE, "nothing due", state
