"""The agent's holds against Ray: carries out :func:`orchestrator.control.holds.plan`.

One :class:`RayHolds` per agent. Its groups are detached placement groups in the agent's Ray namespace,
each bundle pinned to the node by Ray's own node-id label, so an agent that dies leaves them in place and
its successor finds them by name (:meth:`RayHolds.sync` reads the placement-group table once, on its first
call). Steps run one after another and a new group is awaited until placed (bounded by ``place_timeout_s``)
before any later step moves capacity (removes a group or makes one): that order is what makes a group land on
the card the plan freed for it (``control/holds.py``). A step that moves none (a lease adopting a piece that
already holds its card) does not wait, and neither does the end of :meth:`RayHolds.sync`: a lease granted
while a released card is being held again is handed its group at once. A group made right after another was
removed first waits until the GCS sees the removed capacity free again (50-100 ms): made sooner, the GCS fails
to place it and tries again only 0.3-1 s later (``docs/ray-native.md``, "Figures").

A node that advertises no Ray ``GPU`` (a cluster we attached to whose nodes were started otherwise) gets
no holds: :meth:`sync` does nothing there, and holders use the per-card resources as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any, Mapping, Sequence

import ray

from orchestrator.control.holds import (GRID, AdoptPiece, CreateLease, HoldPiece, LeaseShape, Piece, RemoveLease, RemovePiece,
                                        lease_group_name, parse_lease_group, parse_piece, piece_name, plan)
from orchestrator.core.config import CARD_RESOURCE_PREFIX, RAY_NODE_ID_LABEL, Tuning, card_resource

log = logging.getLogger(__name__)

#: How long one new group may take to be placed before the agent moves on (and tries again next beat).
#: It, RETURN_WAIT_S and LEND_TIMEOUT_S are the defaults of ``settings.tuning.hold_place_timeout_s``,
#: ``hold_return_wait_s`` and ``lend_timeout_s``, which the agent gives its :class:`RayHolds`.
PLACE_TIMEOUT_S = Tuning().hold_place_timeout_s
#: How long a new group waits for a removed group's capacity to be seen free before it is made anyway.
RETURN_WAIT_S = Tuning().hold_return_wait_s
#: The GCS key-value namespace of the agents' record of adopted pieces.
KV_NS = "rgo-holds"
#: How long a lease's capacity may stay lent (its own group removed) before its holder's group is adopted.
LEND_TIMEOUT_S = Tuning().lend_timeout_s


class RayHolds:
    """The hold pieces and lease groups of one node (see the module docstring)."""

    def __init__(self, node_name: str, ray_node_id: str, *, place_timeout_s: float = PLACE_TIMEOUT_S,
                 return_wait_s: float = RETURN_WAIT_S, lend_timeout_s: float = LEND_TIMEOUT_S) -> None:
        self.node_name = node_name
        self.ray_node_id = ray_node_id
        self.place_timeout_s = place_timeout_s
        self.return_wait_s = return_wait_s  # a new group's wait for a removed one's capacity (_capacity_back)
        self.lend_timeout_s = lend_timeout_s  # how long a lease's capacity may stay lent (lend)
        self.pieces: dict[str, Piece] = {}
        self.groups: dict[str, Any] = {}  # group name -> PlacementGroup
        self.leases: dict[str, LeaseShape | None] = {}  # lease id -> its shape (None: found, shape unknown)
        self.enabled: bool | None = None  # None: not looked at yet
        self.card_resources = False  # the node declares rgo-gpu-<i> (ours do)
        self.unplaced: set[str] = set()  # groups made but not placed within the timeout
        self.pending: dict[str, asyncio.Future] = {}  # groups made, not yet seen placed: awaited before capacity moves
        self._returning = False  # a group was removed since the last one was made: its capacity is on its way back
        self.lending: dict[str, float] = {}  # lease id -> when its loan lapses (monotonic)
        self.adopted: set[str] = set()  # leases whose group is one their holder made
        self.adopted_pieces: dict[str, str] = {}  # lease id -> the hold piece that became its group

    def _advertises_gpus(self) -> bool:
        node = next((n for n in ray.nodes() if n.get("NodeID") == self.ray_node_id), None)
        resources = (node or {}).get("Resources") or {}
        self.card_resources = any(k.startswith(CARD_RESOURCE_PREFIX) for k in resources)
        return bool(resources.get("GPU"))

    def _lease_bundle(self, shape: LeaseShape) -> dict[str, float]:
        """A lease's group: its share of Ray's GPU, its CPUs and, where the node declares them, its share of each
        card's own resource (so nothing outside the lease asks Ray for that card by name)."""
        bundle = shape.bundle()
        if self.card_resources:
            for c, u in shape.cards:
                bundle[card_resource(c)] = u / 10_000
        return bundle

    def _piece_bundle(self, card: int, units: int) -> dict[str, float]:
        """A piece holds its card's share of Ray's ``GPU`` and, where the node declares them, of the card's own
        resource: an idle card cannot be taken through either (the per-card resources are what gangs and the
        Serve path ask for; a lease's own group leaves its card's resource to those holders)."""
        bundle = {"GPU": units / 10_000}
        if self.card_resources:
            bundle[card_resource(card)] = units / 10_000
        return bundle

    def _discover(self) -> None:
        from ray.util.placement_group import PlacementGroup, placement_group_table
        from ray._raylet import PlacementGroupID

        for pg_id, row in placement_group_table().items():
            if row.get("state") == "REMOVED":
                continue
            name = row.get("name") or ""
            piece = parse_piece(name, self.node_name)
            lease_id = parse_lease_group(name, self.node_name)
            if piece is None and lease_id is None:
                continue
            self.groups[name] = PlacementGroup(PlacementGroupID(bytes.fromhex(pg_id)))
            if piece is not None:
                self.pieces[name] = piece
            elif lease_id is not None:
                self.leases[lease_id] = None
        for lease_id, piece_name_ in self._load().items():  # pieces that stand for a lease
            if piece_name_ in self.pieces:
                p = self.pieces.pop(piece_name_)
                self.groups[lease_group_name(self.node_name, lease_id)] = self.groups.pop(piece_name_)
                self.leases[lease_id] = LeaseShape(((p.card, p.units),))
                self.adopted_pieces[lease_id] = piece_name_

    # A piece adopted as a lease's group keeps its Ray name: which lease each stands for is kept in the GCS, so
    # an agent that restarts reads its pieces and lease groups right.
    def _kv_key(self) -> bytes:
        return f"holds/{self.node_name}".encode()

    def _save(self) -> None:
        from ray.experimental.internal_kv import _internal_kv_put

        _internal_kv_put(self._kv_key(), json.dumps(self.adopted_pieces).encode(), overwrite=True, namespace=KV_NS)

    def _load(self) -> dict[str, str]:
        from ray.experimental.internal_kv import _internal_kv_get

        raw = _internal_kv_get(self._kv_key(), namespace=KV_NS)
        return dict(json.loads(raw)) if raw else {}

    def _make(self, name: str, bundle: dict[str, float]) -> Any:
        from ray.util.placement_group import placement_group

        pg = placement_group([bundle], strategy="STRICT_PACK", name=name, lifetime="detached",
                             bundle_label_selector=[{RAY_NODE_ID_LABEL: self.ray_node_id}])
        self.groups[name] = pg
        return pg

    def _remove(self, name: str) -> None:
        from ray.util.placement_group import remove_placement_group

        pg = self.groups.pop(name, None)
        self.unplaced.discard(name)
        self.pending.pop(name, None)
        self._returning = self._returning or pg is not None
        if pg is not None:
            try:
                remove_placement_group(pg)
            except Exception as e:  # gone already
                log.info("holds %s: removing %s: %s", self.node_name, name, e)

    async def _capacity_back(self, gpu: float, cpu: float) -> None:
        """After a removal, wait (bounded by ``return_wait_s``) until the GCS sees ``gpu`` and ``cpu`` free on this
        node. The raylet returns a removed group's capacity some 50-100 ms later; a group made before then is not
        placed at once but at the GCS's next try, 0.3-1 s later (measured: docs/ray-native.md, "Figures")."""
        if not self._returning:
            return
        from ray._private.state import state

        deadline = time.monotonic() + self.return_wait_s
        while time.monotonic() < deadline:
            free = state.available_resources_per_node().get(self.ray_node_id, {})
            if free.get("GPU", 0.0) >= gpu - 1e-4 and free.get("CPU", 0.0) >= cpu - 1e-4:
                break
            await asyncio.sleep(0.01)
        self._returning = False

    def _pend(self, name: str, pg: Any) -> None:
        """``pg`` was just made: it is awaited (:meth:`settle`) before the next step that moves capacity."""
        self.pending[name] = asyncio.ensure_future(asyncio.wrap_future(pg.ready().future()))

    async def settle(self) -> None:
        """Wait until every group made so far is placed (or its ``place_timeout_s`` ran out): called before
        anything that moves capacity, so that a group can only ever land on the capacity freed for it."""
        while self.pending:
            name, fut = next(iter(self.pending.items()))
            try:
                await asyncio.wait_for(asyncio.shield(fut), self.place_timeout_s)
                self.unplaced.discard(name)
            except asyncio.TimeoutError:
                self.unplaced.add(name)
                log.warning("holds %s: group %s not placed within %.0fs (the capacity it stands for is taken by "
                            "work outside every group?)", self.node_name, name, self.place_timeout_s)
            except Exception as e:  # removed meanwhile
                log.info("holds %s: group %s: %s", self.node_name, name, e)
            finally:
                self.pending.pop(name, None)

    async def sync(self, cards: Sequence[int], desired: Mapping[str, LeaseShape]) -> bool:
        """Make the node's groups match ``desired`` (lease id -> shape). Returns False where the node
        advertises no Ray ``GPU`` (nothing to hold)."""
        if self.enabled is None:
            self.enabled = self._advertises_gpus()
            if self.enabled:
                self._discover()
        if not self.enabled:
            return False
        self._lapsed_loans(time.monotonic())
        keys: dict[str, str] = {}
        for step in plan(cards, list(self.pieces.values()), self.leases, desired):
            if not isinstance(step, AdoptPiece):
                await self.settle()  # this step moves capacity: every group made before it is placed first
            if isinstance(step, RemoveLease):
                self._remove(lease_group_name(self.node_name, step.lease_id))  # its own, or the one it adopted
                if self.adopted_pieces.pop(step.lease_id, None) is not None:
                    self._save()
                self.leases.pop(step.lease_id, None)
                self.lending.pop(step.lease_id, None)
                self.adopted.discard(step.lease_id)
            elif isinstance(step, RemovePiece):
                name = keys.get(step.name, step.name)
                self._remove(name)
                self.pieces.pop(name, None)
            elif isinstance(step, HoldPiece):
                name = piece_name(self.node_name, step.card, step.units, uuid.uuid4().hex[:8])
                keys[step.key] = name
                self.pieces[name] = Piece(step.card, step.units, name)
                await self._capacity_back(step.units / GRID, 0.0)
                self._pend(name, self._make(name, self._piece_bundle(step.card, step.units)))
            elif isinstance(step, AdoptPiece):
                piece = keys.get(step.name, step.name)
                self.pieces.pop(piece, None)
                name = lease_group_name(self.node_name, step.lease_id)
                self.groups[name] = self.groups.pop(piece)
                if piece in self.pending:  # a piece made moments ago: the lease's group once it is placed
                    self.pending[name] = self.pending.pop(piece)
                self.leases[step.lease_id] = step.shape
                self.adopted_pieces[step.lease_id] = piece
                self._save()
            elif isinstance(step, CreateLease):
                name = lease_group_name(self.node_name, step.lease_id)
                self.leases[step.lease_id] = step.shape
                await self._capacity_back(step.shape.units / GRID, step.shape.cpus)
                self._pend(name, self._make(name, self._lease_bundle(step.shape)))
        return True

    # ---- lending a lease's capacity to a placement group its holder makes (Ray Train, Tune, Serve) ----
    async def lend(self, lease_id: str, now: float) -> bool:
        """Remove ``lease_id``'s own group so that a placement group its holder makes next, pinned to this node,
        lands on exactly that capacity; until :meth:`adopt` (or ``lend_timeout_s``), the plan sees the lease as
        covered and makes nothing for it. False for a lease this node does not hold."""
        if lease_id not in self.leases or lease_id in self.lending or lease_id in self.adopted:
            return False  # one group of the holder's per lease: a second would take the first one's capacity
        await self.settle()  # lending frees capacity: every group made before it is placed first
        self._remove(lease_group_name(self.node_name, lease_id))
        if self.adopted_pieces.pop(lease_id, None) is not None:
            self._save()
        self.lending[lease_id] = now + self.lend_timeout_s
        return True

    def adopt(self, lease_id: str, pg_hex: str) -> bool:
        """The holder's own group now stands for ``lease_id``: it is removed with the lease (a preemption stops
        what runs in it), and :meth:`placed_group` names it."""
        from ray._raylet import PlacementGroupID
        from ray.util.placement_group import PlacementGroup

        if lease_id not in self.leases:
            return False
        self.lending.pop(lease_id, None)
        self.adopted.add(lease_id)
        self.groups[lease_group_name(self.node_name, lease_id)] = PlacementGroup(PlacementGroupID(bytes.fromhex(pg_hex)))
        return True

    def give_back(self, lease_id: str) -> None:
        """The holder removed its own group: make the lease's own again (at the next sync)."""
        self.lending.pop(lease_id, None)
        self.adopted.discard(lease_id)
        self.groups.pop(lease_group_name(self.node_name, lease_id), None)
        if lease_id in self.leases:
            del self.leases[lease_id]  # no group: the next plan creates it

    def _lapsed_loans(self, now: float) -> None:
        for lid, deadline in list(self.lending.items()):
            if now >= deadline:
                log.warning("holds %s: lease %s was lent to a group never adopted; making its own again",
                            self.node_name, lid)
                self.give_back(lid)

    def lease_groups(self) -> dict[str, str]:
        """Lease id -> the hex id of the group that stands for it here (its own, or one its holder made)."""
        out = {}
        for lid in self.leases:
            pg = self.groups.get(lease_group_name(self.node_name, lid))
            if pg is not None:
                out[lid] = pg.id.hex()
        return out

    def placed_group(self, lease_id: str) -> str | None:
        """The hex id of ``lease_id``'s group once placed; None before (or when this node has no such lease)."""
        name = lease_group_name(self.node_name, lease_id)
        pg = self.groups.get(name)
        if pg is None or name in self.unplaced or lease_id not in self.leases or lease_id in self.lending:
            return None
        fut = self.pending.get(name)
        if fut is not None and not (fut.done() and not fut.cancelled() and fut.exception() is None):
            return None
        return pg.id.hex()
