"""The head's cluster snapshot made again from scratch, as a pure function of what the head knows.

Invariant: the snapshot :func:`rebuild` returns depends only on its arguments --
the registered nodes' specs, the ledger's occupying entries (holding ones, and
ended ones still fenced) and the GPUs cordoned for a MIG repartition. The
occupying leases are applied in fencing-token order (the order they were
granted), so a rebuild after a restart places them as they were placed. It
writes nothing: the controller
(:meth:`~orchestrator.control.controller.HeadController._rebuild_snapshot`)
keeps the snapshot it returns and writes the two lists to the ledger --
``moved`` as soft state (a lease's column positions change when nodes come and
go), ``misfits`` as leases that lost their devices (a GPU vanished from its
node's inventory, or the lease no longer fits on it).

:class:`NodeSpecs` keeps each node's :class:`~orchestrator.scheduling.snapshot.NodeSpec`
while its inventory is the same object, so a rebuild converts only the
inventories that changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Iterable, Mapping, Sequence

from orchestrator.control.ledger import LedgerEntry
from orchestrator.core.allocation import Allocation
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.inventory import NodeInventory
from orchestrator.scheduling.snapshot import ClusterSnapshot, NodeSpec


class NodeSpecs:
    """Per node, its inventory as the placement engine sees it (one per node, replaced when the inventory is)."""

    def __init__(self) -> None:
        self._specs: dict[str, tuple[NodeInventory, NodeSpec]] = {}

    def of(self, inv: NodeInventory) -> NodeSpec:
        """The engine's view of an inventory, kept while the node's inventory is the same object."""
        cached = self._specs.get(inv.name)
        if cached is None or cached[0] is not inv:
            cached = self._specs[inv.name] = (inv, NodeSpec.from_inventory(inv))
        return cached[1]


@dataclass(frozen=True, slots=True)
class Rebuilt:
    """A rebuilt snapshot and what the ledger must learn from it (both lists in fencing-token order)."""

    snapshot: ClusterSnapshot
    moved: list[tuple[LedgerEntry, Allocation]]  # an entry whose allocation sits at new column positions
    misfits: list[LedgerEntry]  # an entry whose devices are not in the snapshot any more


def rebuild(specs: Sequence[NodeSpec], occupying: Iterable[LedgerEntry], cordoned: Mapping[str, Collection[int]], *,
            timeslice_capacity_milli: int) -> Rebuilt:
    """A fresh snapshot of ``specs`` with every ``occupying`` entry applied again and the ``cordoned`` GPUs
    (per node, GPU indices) marked unhealthy, so that no new grant lands on them. An entry on a node
    ``specs`` lacks (one not registered now) is skipped: it occupies nothing in this snapshot."""
    snap = ClusterSnapshot.build(specs, timeslice_capacity_milli=timeslice_capacity_milli)
    misfits: list[tuple[int, LedgerEntry]] = []
    located: list[tuple[int, LedgerEntry, Allocation]] = []
    for k, e in enumerate(sorted(occupying, key=lambda e: e.lease.fencing_token)):
        a = e.lease.allocation
        if a is None or a.node_name not in snap.static.index:
            continue
        try:
            located.append((k, e, snap.locate(a)))
        except (InvalidRequestError, IndexError):
            misfits.append((k, e))
    snap, failed = snap.apply_many([moved for _, _, moved in located])
    refused = set(failed)
    moves: list[tuple[LedgerEntry, Allocation]] = []
    for n, (k, e, moved) in enumerate(located):
        if n in refused:
            misfits.append((k, e))
        elif moved != e.lease.allocation:  # column positions change when nodes come and go
            moves.append((e, moved))
    for node, gpus in cordoned.items():  # a GPU being repartitioned takes no new grant
        if node in snap.static.index:
            for idx in sorted(gpus):
                snap = snap.with_health(node, idx, False)
    return Rebuilt(snap, moves, [e for _, e in sorted(misfits, key=lambda m: m[0])])
