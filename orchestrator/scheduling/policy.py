"""The engine/policy contract: :class:`PlacementPolicy`, its :class:`Capabilities`, and a base class.

A policy ranks candidate placements (lower is better) in two parts, both
vectorised:

* ``gpu_score(view, alt)`` over candidate slots on interned GPU states (a
  :class:`~orchestrator.scheduling.candidates.CandidateView`, rows before and
  after). It may depend only on the view and the policy's own parameters: the
  engine memoises its best slot per state, keyed by ``policy.key``.
* ``node_score(snapshot, nodes, alt, request, ctx)``: an optional node-wide
  term (free CPU, host memory) added to the best GPU score of each node's
  state; ``ctx`` is a :class:`NodeContext` when the policy's capabilities ask
  for one, else None. A node's term reads only that node -- its GPU state,
  free CPU and memory, and the static part -- never which other nodes are
  candidates: the engine keeps each request's totals per node and asks again
  only for the nodes that changed since (after a placement, one).

What the engine does differently for a policy is said once, in its
:class:`Capabilities`, never found out by probing attributes.

Invariants: ``key`` is equal for policies that score alike and never changes
after construction; ``gpu_score`` is a pure function of (view, alt, key);
``node_score`` is elementwise over ``nodes`` (a pure function of each node's
GPU state, free CPU and memory, the request and the key);
``remember_best`` and ``explain`` never change a score.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, Protocol, runtime_checkable

import numpy as np

from orchestrator.core.request import Alternative, GpuRequest
from orchestrator.scheduling.candidates import CandidateView
from orchestrator.scheduling.snapshot import ClusterSnapshot, SnapshotStatic


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What the engine does differently for a policy.

    ``node_context``: ``node_score`` is given a :class:`NodeContext` (and the
    placement's reason names the terms ``explain`` gives for the winner).
    ``random_slot``: with an ``rng``, a share goes to a random fitting GPU of
    the chosen node (the paper's Random GPU selection).
    ``slot_rank_only``: ``gpu_score`` only ranks the slots of a state; the
    engine keeps the best slot and counts its score as 0, so the node-wide
    term alone ranks the nodes.
    ``repack``: the replay may move small shares when a request fits nowhere
    (:mod:`orchestrator.sim.repack`).
    """

    node_context: bool = False
    random_slot: bool = False
    slot_rank_only: bool = False
    repack: bool = False


@dataclass(slots=True)
class NodeContext:
    """What the engine already knows about the candidate nodes, for a policy's ``node_score``.

    ``states`` (K,) the interned GPU state of each node; ``slots`` (K,) the best
    slot the engine memoised for that state (what the node would be given);
    ``cpu_free``/``mem_free`` (K,) the node's free host CPU (milli) and memory
    (MiB) before the request; ``static`` the snapshot's static part (for
    per-state tables a policy keeps). All arrays are read-only views.
    ``memo`` is scratch space for this one request: a policy may keep the terms
    of its ``node_score`` there, each a (K,) array with one value per candidate
    (the engine keeps them per node with the node's total), and name them in
    ``explain`` for the winner -- which is given a context of that one node.
    """

    static: SnapshotStatic
    states: np.ndarray
    slots: np.ndarray
    cpu_free: np.ndarray
    mem_free: np.ndarray
    memo: dict = field(default_factory=dict)


@runtime_checkable
class PlacementPolicy(Protocol):
    """What the engine needs of a policy (see the module docstring)."""

    name: str
    capabilities: Capabilities

    @property
    def key(self) -> Hashable:
        """Hashable identity of the scoring function, for the engine's memo tables."""
        ...

    def gpu_score(self, view: CandidateView, alt: Alternative) -> np.ndarray:
        """(M,) score of each candidate slot; lower is better."""
        ...

    def remember_best(self, view: CandidateView, alt: Alternative, win: np.ndarray) -> None:
        """Told which candidates (indices into ``view``) won their state, after ``gpu_score``."""
        ...

    def node_score(self, snap: ClusterSnapshot, nodes: np.ndarray, alt: Alternative, req: GpuRequest,
                   ctx: NodeContext | None) -> np.ndarray | None:
        """(K,) node-wide term for the candidate ``nodes``, or None for none; each node's
        value depends on that node alone (see the module docstring)."""
        ...

    def explain(self, ctx: NodeContext, k: int) -> str:
        """The terms of candidate ``k``'s node score, for the placement's reason ('' for none)."""
        ...


class Policy:
    """Base policy: every candidate scores 0. Subclasses override what they need."""

    name = "none"
    capabilities: Capabilities = Capabilities()  # frozen: shared safely; a policy may set its own

    def __init__(self, **params: Any) -> None:
        self.params = params

    @property
    def key(self) -> tuple:
        """Policies with equal parameters share one key. Computed once (a policy's
        parameters never change after construction) and kept small, because the
        engine hashes it on every request: the full parameters (a workload can
        be hundreds of task types) are interned to a number."""
        k = self.__dict__.get("_key")
        if k is None:
            full = (type(self).__qualname__, self.name, tuple(sorted((n, _hashable(v)) for n, v in self.params.items())))
            k = self.__dict__["_key"] = (self.name, _KEYS.setdefault(full, len(_KEYS)))
        return k

    def gpu_score(self, view: CandidateView, alt: Alternative) -> np.ndarray:
        return np.zeros(len(view.state))

    def remember_best(self, view: CandidateView, alt: Alternative, win: np.ndarray) -> None:
        return None

    def node_score(self, snap: ClusterSnapshot, nodes: np.ndarray, alt: Alternative, req: GpuRequest,
                   ctx: NodeContext | None) -> np.ndarray | None:
        return None

    def explain(self, ctx: NodeContext, k: int) -> str:
        return ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params})"


_KEYS: dict[tuple, int] = {}


def _hashable(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    return v
