"""Ray's ``GPU`` made to follow the ledger, card by card: the agent's holds. Pure.

Every node advertises Ray's own ``GPU`` resource, one per card, so users' ``num_gpus`` code, Ray Train,
Serve and Tune see GPUs (``docs/ray-native.md``). What keeps work that holds no lease off the cards is that
**every unit of a node's Ray ``GPU`` is inside a placement group the node's agent made**:

* a *hold piece* (``rgo-hold/<node>/<card>/<units>/<nonce>``): capacity of one card that no lease covers;
* a *lease group* (``rgo-lease/<node>/<lease id>``): one bundle ``{"GPU": share, "CPU": cpus}`` that holds
  exactly what the ledger granted the lease; its holder runs inside it and captures its own child tasks.

Ray's free pool of ``GPU`` is therefore empty on a node whose agent is up; a plain ``@ray.remote(num_gpus=1)``
from a driver without a lease waits (Ray reports it pending), and never lands on a card.

**Which card a group stands for.** A placement group asks for an amount, not a card. The plan keeps every
card's capacity held except the capacity it is moving right now, and the executor waits for each group to be
placed before the next step: a group created at a step can only land on the capacity that step freed, the
card the ledger named. Shares are in grid units of 1/10,000 (Ray's own fixed point), the lease's share is
:func:`~orchestrator.control.handout.ray_num_gpus` (floored), and the invariant the property tests check is:

    for every card: sum(hold pieces) + sum(lease shares) == 1 (10,000 units), after every plan, and between
    two steps the capacity outside every group is only on the cards of the one lease being created.

:func:`plan` turns (what exists, what the ledger wants) into a list of steps; :mod:`orchestrator.rayport.holds`
carries them out against Ray. A piece is never shrunk in place (Ray cannot): a grant removes the fewest,
largest pieces that cover its share and holds the rest again as one new piece (or, where a piece holds exactly
its share of one card and it asks for no CPU, adopts that piece as its group: no Ray call on the grant's path,
and first in the plan, so it never waits behind a release being held again);
a release holds its share again as a new piece at once, so no capacity is left outside a group longer than
one step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence, Union

from orchestrator.control.handout import ray_num_gpus
from orchestrator.core.allocation import Allocation
from orchestrator.core.request import ShareKind

#: Ray keeps resource quantities to 4 decimals; one card is this many units.
GRID = 10_000
HOLD_PREFIX = "rgo-hold/"
LEASE_PREFIX = "rgo-lease/"


@dataclass(frozen=True, slots=True)
class LeaseShape:
    """What one lease takes of its node's Ray ``GPU``: its share of each card, in grid units, and its CPUs."""

    cards: tuple[tuple[int, int], ...]  # (card index, units), in card order
    cpus: float = 0.0

    @property
    def units(self) -> int:
        return sum(u for _, u in self.cards)

    def bundle(self) -> dict[str, float]:
        """The lease group's one bundle: all its cards' shares together (its holder, or a Train run inside it,
        takes them as one actor or as several tasks), and its CPUs."""
        b: dict[str, float] = {"GPU": self.units / GRID}
        if self.cpus > 0:
            b["CPU"] = self.cpus
        return b


def lease_shape(a: Allocation, *, timeslice_capacity_milli: int = 1000) -> LeaseShape:
    """The share of Ray's ``GPU`` the ledger's allocation ``a`` stands for (what its holder asks Ray for)."""
    if a.kind is ShareKind.WHOLE:
        cards = tuple((i, GRID) for i in sorted(a.gpu_indices))
    else:
        share = ray_num_gpus(a, timeslice_capacity_milli=timeslice_capacity_milli)
        cards = ((a.gpu_indices[0], round(share * GRID)),)
    return LeaseShape(cards, a.cpu_milli / 1000)


@dataclass(frozen=True, slots=True)
class Piece:
    """One hold piece that exists (or is being made): ``units`` of card ``card``."""

    card: int
    units: int
    name: str


# ---- the steps ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RemoveLease:
    """Remove the lease's group (the lease ended here; whatever still runs inside it is stopped by Ray)."""

    lease_id: str


@dataclass(frozen=True, slots=True)
class RemovePiece:
    name: str


@dataclass(frozen=True, slots=True)
class HoldPiece:
    """Make a new piece of ``units`` on ``card`` and wait until it is placed. A later :class:`RemovePiece` of
    the same plan names it by ``key`` (the executor maps it to the name it gave the group)."""

    card: int
    units: int
    key: str = ""


@dataclass(frozen=True, slots=True)
class CreateLease:
    """Make the lease's group and wait until it is placed (on the capacity the steps before it freed)."""

    lease_id: str
    shape: LeaseShape


@dataclass(frozen=True, slots=True)
class AdoptPiece:
    """A piece already holds exactly what the new lease takes (one card, the same share, no CPUs): it becomes the
    lease's group as it is. No capacity moves, so nothing can take it meanwhile, and the grant costs no Ray call."""

    name: str
    lease_id: str
    shape: LeaseShape


Step = Union[RemoveLease, RemovePiece, HoldPiece, CreateLease, AdoptPiece]


def _take(pieces: list[Piece], units: int) -> tuple[list[Piece], int]:
    """The fewest pieces, largest first, that cover ``units``; and what they hold beyond it."""
    taken: list[Piece] = []
    got = 0
    for p in sorted(pieces, key=lambda p: (-p.units, p.name)):
        if got >= units:
            break
        taken.append(p)
        got += p.units
    return taken, max(0, got - units)


def plan(cards: Sequence[int], pieces: Sequence[Piece], current: Mapping[str, LeaseShape | None],
         desired: Mapping[str, LeaseShape]) -> list[Step]:
    """The steps that make a node's groups match ``desired`` (lease id -> shape), from the ``pieces`` and lease
    groups (``current``: lease id -> shape, None where a group found after a restart has an unknown shape)
    that exist. Deterministic (sorted by lease id and card). See the module docstring for the invariant."""
    known = set(cards)
    by_card: dict[int, list[Piece]] = {c: [] for c in known}
    for p in pieces:
        by_card.setdefault(p.card, []).append(p)
    steps: list[Step] = []
    # 0. New leases that take exactly what one existing piece holds (one card's share, no CPUs) adopt it: no
    #    capacity moves, so they go first, before anything that waits on Ray (a grant in the same beat as a
    #    release is handed its group without waiting for the released capacity to be held again).
    fresh = sorted(set(desired) - set(current))
    adopted: set[str] = set()
    for lid in fresh:
        shape = desired[lid]
        if len(shape.cards) == 1 and shape.cpus == 0:
            c, u = shape.cards[0]
            same = sorted((p for p in by_card.setdefault(c, []) if p.units == u), key=lambda p: p.name)
            if same:
                steps.append(AdoptPiece(same[0].name, lid, shape))
                by_card[c].remove(same[0])
                adopted.add(lid)
    # 1. Leases that ended here: remove each group and hold its share again at once.
    for lid in sorted(set(current) - set(desired)):
        steps.append(RemoveLease(lid))
        shape = current[lid]
        for c, u in (shape.cards if shape is not None else ()):
            if c in known and u > 0:
                key = f"<new {len(steps)}>"
                steps.append(HoldPiece(c, u, key))
                by_card[c].append(Piece(c, u, key))
    # 2. Hold what no existing group covers, card by card in index order (a fresh node, an agent that
    #    restarted, a step that failed earlier): Ray gives a new group the lowest free instance, so card c's
    #    piece takes instance c. New leases then take their share out of these pieces.
    existing: dict[int, int] = {c: 0 for c in known}
    for lid, shape in desired.items():
        if (lid in current or lid in adopted) and shape is not None:
            for c, u in shape.cards:
                existing[c] = existing.get(c, 0) + u
    for c in sorted(known):
        held = sum(p.units for p in by_card[c])
        want = max(0, GRID - existing[c])
        if held < want:
            key = f"<new {len(steps)}>"
            steps.append(HoldPiece(c, want - held, key))
            by_card[c].append(Piece(c, want - held, key))
    # 3. The other new leases: free their share from the pieces, make the group, hold the rest again.
    for lid in fresh:
        if lid in adopted:
            continue
        shape = desired[lid]
        rest: list[tuple[int, int]] = []
        for c, u in shape.cards:
            taken, over = _take(by_card.setdefault(c, []), u)
            for p in taken:
                steps.append(RemovePiece(p.name))
                by_card[c].remove(p)
            if over:
                rest.append((c, over))
        steps.append(CreateLease(lid, shape))
        for c, over in rest:
            key = f"<new {len(steps)}>"
            steps.append(HoldPiece(c, over, key))
            by_card[c].append(Piece(c, over, key))
    # 4. Every card held to exactly what no lease covers.
    used: dict[int, int] = {c: 0 for c in known}
    for shape in desired.values():
        for c, u in shape.cards:
            used[c] = used.get(c, 0) + u
    for c in sorted(known):
        target = max(0, GRID - used.get(c, 0))
        held = sum(p.units for p in by_card[c])
        if held > target:
            taken, _ = _take(by_card[c], held - target)
            for p in taken:
                steps.append(RemovePiece(p.name))
                by_card[c].remove(p)
            held = sum(p.units for p in by_card[c])
        if held < target:
            steps.append(HoldPiece(c, target - held, f"<new {len(steps)}>"))
    return steps


def piece_name(node: str, card: int, units: int, nonce: str) -> str:
    """``/`` separates the parts: node names (DNS labels with dots) and lease ids never hold one."""
    return f"{HOLD_PREFIX}{node}/{card}/{units}/{nonce}"


def lease_group_name(node: str, lease_id: str) -> str:
    """The lease group's name: what a holder looks it up by (node and lease id are in its hand-out)."""
    return f"{LEASE_PREFIX}{node}/{lease_id}"


def parse_piece(name: str, node: str) -> Piece | None:
    """The piece a group name of this node's stands for; None for any other name."""
    head = f"{HOLD_PREFIX}{node}/"
    if not name.startswith(head):
        return None
    parts = name[len(head):].split("/")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return Piece(int(parts[0]), int(parts[1]), name)


def parse_lease_group(name: str, node: str) -> str | None:
    head = f"{LEASE_PREFIX}{node}/"
    rest = name[len(head):]
    return rest if name.startswith(head) and rest and "/" not in rest else None
