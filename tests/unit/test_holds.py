"""The agent's holds (control/holds.py): every unit of a node's Ray ``GPU`` stays inside a group, and a group is
only ever made while the capacity outside every group is on the cards it stands for."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from orchestrator.control.holds import (GRID, AdoptPiece, CreateLease, HoldPiece, LeaseShape, Piece, RemoveLease, RemovePiece,
                                        lease_group_name, lease_shape, parse_lease_group, parse_piece, piece_name, plan)
from orchestrator.core.allocation import Allocation
from orchestrator.core.request import ShareKind

CARDS = (0, 1, 2, 3)


class Node:
    """A model of Ray's books for one node: the groups that exist and the capacity outside them."""

    def __init__(self) -> None:
        self.pieces: dict[str, Piece] = {}
        self.leases: dict[str, LeaseShape] = {}
        self.n = 0

    def free(self) -> dict[int, int]:
        out = {c: GRID for c in CARDS}
        for p in self.pieces.values():
            out[p.card] -= p.units
        for s in self.leases.values():
            for c, u in s.cards:
                out[c] -= u
        return out

    def apply(self, steps: list, *, ending: dict[str, LeaseShape]) -> None:
        keys: dict[str, str] = {}
        moving: set[int] = set()  # cards of the lease whose capacity is moving now
        for step in steps:
            if isinstance(step, RemoveLease):
                moving = {c for c, _ in ending[step.lease_id].cards}
                del self.leases[step.lease_id]
            elif isinstance(step, RemovePiece):
                p = self.pieces.pop(keys.get(step.name, step.name))
                moving.add(p.card)
            elif isinstance(step, HoldPiece):
                free = self.free()
                assert free[step.card] >= step.units, (step, free)
                # cards held for the first time are held in index order: Ray gives a group its lowest free instance
                stray = {c: f for c, f in free.items() if f and c not in moving | {step.card} and not
                         (f == GRID and c > step.card and not moving)}
                assert not stray, f"{step}: capacity outside every group on other cards {stray}: Ray could place it there"
                self.n += 1
                name = f"p{self.n}"
                keys[step.key] = name
                self.pieces[name] = Piece(step.card, step.units, name)
            elif isinstance(step, AdoptPiece):
                p = self.pieces.pop(keys.get(step.name, step.name))
                assert step.shape.cards == ((p.card, p.units),) and step.shape.cpus == 0, (step, p)
                self.leases[step.lease_id] = step.shape
                moving = set()
            elif isinstance(step, CreateLease):
                free = self.free()
                cards = {c for c, _ in step.shape.cards}
                for c, u in step.shape.cards:
                    assert free[c] >= u, (step, free)
                stray = {c: f for c, f in free.items() if f and c not in cards}
                assert not stray, f"{step}: capacity outside every group on other cards {stray}"
                self.leases[step.lease_id] = step.shape
                moving = set(cards)


def _shapes(draw: st.DrawFn, used: dict[int, int], prefix: str) -> dict[str, LeaseShape]:
    out: dict[str, LeaseShape] = {}
    for i in range(draw(st.integers(0, 5))):
        whole = draw(st.booleans())
        if whole:
            k = draw(st.integers(1, 2))
            cards = [c for c in CARDS if used[c] == 0][:k]
            if len(cards) < k:
                continue
            for c in cards:
                used[c] = GRID
            out[f"{prefix}{i}"] = LeaseShape(tuple((c, GRID) for c in cards))
        else:
            c = draw(st.sampled_from(CARDS))
            u = draw(st.integers(1, GRID))
            if used[c] + u > GRID:
                continue
            used[c] += u
            out[f"{prefix}{i}"] = LeaseShape(((c, u),), cpus=draw(st.sampled_from([0.0, 1.0])))
    return out


@st.composite
def transitions(draw: st.DrawFn) -> tuple[dict[str, LeaseShape], dict[str, LeaseShape]]:
    """Two ledgers of one node, the second keeping some of the first's leases and adding new ones."""
    used = {c: 0 for c in CARDS}
    before = _shapes(draw, used, "a")
    kept = {k: v for k, v in before.items() if draw(st.booleans())}
    used = {c: 0 for c in CARDS}
    for s in kept.values():
        for c, u in s.cards:
            used[c] += u
    return before, {**kept, **_shapes(draw, used, "b")}


@settings(max_examples=300, deadline=None)
@given(transitions())
def test_every_unit_stays_in_a_group_and_each_group_lands_on_its_own_cards(t) -> None:
    before, after = t
    node = Node()
    node.apply(plan(CARDS, [], {}, before), ending={})
    assert node.free() == {c: 0 for c in CARDS}, "after a plan, every unit of Ray's GPU is in a group"
    assert node.leases == before
    steps = plan(CARDS, list(node.pieces.values()), dict(node.leases), after)
    node.apply(steps, ending=before)
    assert node.free() == {c: 0 for c in CARDS}
    assert node.leases == after
    # and once there, nothing churns
    assert plan(CARDS, list(node.pieces.values()), dict(node.leases), after) == []


def test_a_fresh_node_is_held_card_by_card_and_a_grant_frees_only_its_share() -> None:
    steps = plan(CARDS, [], {}, {})
    assert [(s.card, s.units) for s in steps if isinstance(s, HoldPiece)] == [(c, GRID) for c in CARDS]
    node = Node()
    node.apply(steps, ending={})
    grant = plan(CARDS, list(node.pieces.values()), {}, {"mps": LeaseShape(((2, 3000),))})
    kinds = [type(s).__name__ for s in grant]
    assert kinds == ["RemovePiece", "CreateLease", "HoldPiece"], kinds  # free the card, take it, hold the rest
    assert grant[2] == HoldPiece(2, 7000, grant[2].key)


def test_a_grant_of_exactly_a_piece_adopts_it_and_moves_nothing() -> None:
    node = Node()
    node.apply(plan(CARDS, [], {}, {}), ending={})
    steps = plan(CARDS, list(node.pieces.values()), {}, {"w": LeaseShape(((2, GRID),))})
    assert [type(s).__name__ for s in steps] == ["AdoptPiece"], steps
    # with CPUs the group needs a bundle of its own
    steps = plan(CARDS, list(node.pieces.values()), {}, {"w": LeaseShape(((2, GRID),), cpus=1.0)})
    assert [type(s).__name__ for s in steps] == ["RemovePiece", "CreateLease"], steps


def test_a_release_is_held_again_before_anything_else() -> None:
    node = Node()
    shape = LeaseShape(((1, GRID),))
    node.apply(plan(CARDS, [], {}, {"w": shape}), ending={})
    steps = plan(CARDS, list(node.pieces.values()), {"w": shape}, {})
    assert steps[0] == RemoveLease("w") and isinstance(steps[1], HoldPiece) and steps[1].card == 1
    assert len(steps) == 2


def test_a_grant_that_adopts_a_piece_goes_before_a_release_in_the_same_plan() -> None:
    # A holder killed and the next one granted before the agent heard of either: the grant moves no capacity,
    # so it must not wait behind the release's new piece being placed (the executor waits before every step
    # that moves capacity).
    node = Node()
    old = LeaseShape(((0, GRID),))
    node.apply(plan(CARDS, [], {}, {"old": old}), ending={})
    steps = plan(CARDS, list(node.pieces.values()), {"old": old}, {"new": LeaseShape(((1, GRID),))})
    assert [type(s).__name__ for s in steps] == ["AdoptPiece", "RemoveLease", "HoldPiece"], steps
    node.apply(steps, ending={"old": old})
    assert node.free() == {c: 0 for c in CARDS}


def test_a_group_found_after_a_restart_with_no_shape_is_removed_and_its_cards_held_again() -> None:
    pieces = [Piece(c, GRID, f"p{c}") for c in (0, 1, 3)]
    steps = plan(CARDS, pieces, {"old": None}, {})
    assert steps == [RemoveLease("old"), HoldPiece(2, GRID, steps[1].key)]


def test_lease_shape_per_kind() -> None:
    base = dict(node=-1, node_name="n", model="A100-80GB", memory_mib=0)
    whole = Allocation(kind=ShareKind.WHOLE, gpus=(1, 0), gpu_indices=(1, 0), gpu_uuids=("b", "a"), milli=2000,
                       cpu_milli=2000, **base)
    assert lease_shape(whole) == LeaseShape(((0, GRID), (1, GRID)), 2.0)
    assert lease_shape(whole).bundle() == {"GPU": 2.0, "CPU": 2.0}
    mps = Allocation(kind=ShareKind.MPS, gpus=(3,), gpu_indices=(3,), gpu_uuids=("d",), sm_percent=30, milli=300,
                     **base)
    assert lease_shape(mps).bundle() == {"GPU": 0.3}
    mig = Allocation(kind=ShareKind.MIG, gpus=(2,), gpu_indices=(2,), gpu_uuids=("c",), milli=428,
                     mig_profile="3g.40gb", mig_start=0, **base)
    assert lease_shape(mig).cards == ((2, 4285),)


def test_names_round_trip_and_other_nodes_names_are_not_ours() -> None:
    name = piece_name("a100-0", 3, 7000, "abcd")
    assert parse_piece(name, "a100-0") == Piece(3, 7000, name)
    assert parse_piece(name, "a100-1") is None
    g = lease_group_name("a100-0", "job-1#2")
    assert parse_lease_group(g, "a100-0") == "job-1#2" and parse_lease_group(g, "h100-0") is None
    # node names may hold dots: node "a" never takes node "a.b"'s groups for its own
    assert parse_lease_group(lease_group_name("a.b", "x"), "a") is None
    assert parse_piece(piece_name("a.b", 0, GRID, "n"), "a") is None
