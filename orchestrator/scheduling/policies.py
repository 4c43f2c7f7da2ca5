"""Placement policies: the paper's baselines, and the registry of every policy by name.

Each policy follows the engine's contract (:mod:`.policy`): a vectorised
``gpu_score`` over candidate slots of interned GPU states, memoised per state,
and an optional node-wide ``node_score``; what the engine does differently for
a policy is declared in its ``capabilities``.

Policies (the baselines follow the FGD paper's evaluation, section 6):

* ``random``     -- any feasible node, uniformly (ties everywhere).
* ``bestfit``    -- the node left with the least free resources, CPU, memory
  and GPU weighted equally; on that node the tightest GPU.
* ``packing``    -- an already-used GPU first, then an idle GPU on a used node,
  then an idle node.
* ``spread``     -- the node left with the most free GPU (the opposite).
* ``dotproduct`` -- Tetris: the largest dot product of the request and the
  node's free resources, both normalised by the node's capacity.
* ``clustering`` -- Gandiva-style affinity: a GPU already shared by tasks of
  the same size, then a node holding such GPUs, then packing.
* ``fgd``        -- fragmentation gradient descent (ATC'23); ``default`` -- ours,
  built on it. Both live in :mod:`orchestrator.scheduling.fgd`.

Invariants: every name in :data:`orchestrator.core.priorities.POLICY_NAMES`
has exactly one policy here; scores are pure functions of the candidate rows,
the node's free CPU/memory and the policy's parameters (lower is better), and
ties between nodes are left to the engine's deterministic rule.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.priorities import POLICY_NAMES
from orchestrator.core.request import Alternative, GpuRequest, ShareKind
from orchestrator.scheduling.candidates import CandidateView, state_free_totals
from orchestrator.scheduling.fgd import DefaultPolicy, FgdPolicy
from orchestrator.scheduling.gpufit import Mode
from orchestrator.scheduling.policy import Capabilities, NodeContext, Policy
from orchestrator.scheduling.snapshot import ClusterSnapshot


def _gpu_totals(view: CandidateView) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n_gpu = np.maximum(view.present.sum(axis=1), 1) * 1000
    return view.free("before").sum(axis=1), view.free("after").sum(axis=1), n_gpu


# ---- the paper's baselines ------------------------------------------------------------------------
#
# As the FGD artifact (``kubernetes-scheduler-simulator``, ``pkg/simulator/plugin``)
# defines them, run with its default GPU selection ``best`` (the tightest GPU
# that fits a share; whole cards: the engine's choice) unless noted. Their
# node scores are integers 0..100 (higher better there; negated here), so
# equal nodes tie and the engine's lowest-index rule breaks the tie, as the
# simulator's node order does. Normalisation constants are the artifact's
# largest node spec: 128 cores, 8 GPUs.

MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8_000


def _gpu_request(alt: Alternative) -> int:
    """Milli-GPUs the alternative takes in all (the artifact's ``MilliGpu * GpuNumber``)."""
    return alt.count * 1000 if alt.kind is ShareKind.WHOLE else int(alt.milli)


def _rank_within_state(view: CandidateView, key: np.ndarray) -> np.ndarray:
    """0 for each state's best candidate by ``key`` (lowest; the engine then takes the lowest
    slot among equals), 0.5 for the rest: a within-node choice that never breaks ties between nodes."""
    uniq, inv = np.unique(np.asarray(view.state), return_inverse=True)
    mins = np.full(len(uniq), np.inf)
    np.minimum.at(mins, inv, key)
    return np.where(key > mins[inv], 0.5, 0.0)


def _tightest(view: CandidateView) -> np.ndarray:
    """The artifact's ``best`` GPU selection: the share goes to the fitting GPU with the least free."""
    used_free = np.where(view.take, view.free("before"), np.iinfo(np.int64).max).min(axis=1)
    return _rank_within_state(view, used_free)


class RandomPolicy(Policy):
    """The artifact's Random: a uniformly random feasible node (the engine samples its ties with
    the ``rng``) and, for a share, a uniformly random GPU of it that fits (``gpuSelMethod: random``)."""

    name = "random"
    capabilities = Capabilities(random_slot=True)


class _TightestGpuPolicy(Policy):
    """The artifact's node-formula policies: the GPU within a node is the tightest fit
    (``gpu_score`` only ranks slots); the node is ranked by ``node_score``'s formula."""

    capabilities = Capabilities(node_context=True, slot_rank_only=True)

    def gpu_score(self, view: CandidateView, alt: Alternative) -> np.ndarray:
        return _tightest(view)


class BestFitPolicy(_TightestGpuPolicy):
    """``best_fit_score.go``: the node left with the least free CPU and GPU,
    ``int((1 - (0.5 (cpu_free - cpu) / 128000 + 0.5 (gpu_free - gpu) / 8000)) * 100)``
    (host memory not counted); the tightest GPU."""

    name = "bestfit"

    def node_score(self, snap: ClusterSnapshot, nodes: np.ndarray, alt: Alternative, req: GpuRequest,
                   ctx: NodeContext | None) -> np.ndarray:
        assert ctx is not None  # capabilities.node_context
        left = (0.5 * (ctx.cpu_free - req.cpu_milli) / MAX_SPEC_CPU
                + 0.5 * (state_free_totals(ctx.static, ctx.states) - _gpu_request(alt)) / MAX_SPEC_GPU)
        return -np.trunc((1.0 - left) * 100)


class DotProductPolicy(_TightestGpuPolicy):
    """``dot_product_score.go`` as the artifact runs it (``merge``, ``max``, GPU selection ``best``):
    the node whose free (CPU, GPU) -- before placing, normalised by the largest node spec --
    has the smallest dot product with the request: ``int((1 - dot / 2) * 100)``."""

    name = "dotproduct"

    def node_score(self, snap: ClusterSnapshot, nodes: np.ndarray, alt: Alternative, req: GpuRequest,
                   ctx: NodeContext | None) -> np.ndarray:
        assert ctx is not None  # capabilities.node_context
        dot = ((ctx.cpu_free / MAX_SPEC_CPU) * (req.cpu_milli / MAX_SPEC_CPU)
               + (state_free_totals(ctx.static, ctx.states) / MAX_SPEC_GPU) * (_gpu_request(alt) / MAX_SPEC_GPU))
        return -np.trunc((1.0 - dot / 2) * 100)


class PackingPolicy(Policy):
    """``gpu_packing_score.go``: an already-shared GPU first (``100 - sum(free% of the GPUs used) / 10``,
    at least 50), then free GPUs on a used node (``50 - free GPUs used``, at least 33), then an idle
    node (``33 - its GPUs``); CPU-only pods score 0 everywhere. The tightest GPU."""

    name = "packing"

    def gpu_score(self, view: CandidateView, alt: Alternative) -> np.ndarray:
        if _gpu_request(alt) <= 0:
            return np.zeros(len(view.state))
        free = view.free("before")
        n_gpu = view.present.sum(axis=1)
        fully_free = ((free >= 1000) & view.present).sum(axis=1)
        used = view.take
        new_cards = (used & (free >= 1000)).sum(axis=1)
        shared_pct = np.where(used, free * 100 // 1000, 0).sum(axis=1)
        score = np.where(fully_free == n_gpu, np.maximum(33 - fully_free, fully_free),
                         np.where(new_cards > 0, np.maximum(50 - new_cards, 33), np.maximum(100 - shared_pct // 10, 50)))
        return -score + _tightest(view)


# GPU affinity categories (``GetGpuAffinityFromPodAnnotation``), as far as a GPU state shows them.
_SHARE, _WHOLE = 1, 2


class ClusteringPolicy(Policy):
    """``gpu_clustering_score.go`` (Gandiva-style affinity): a node holding only the pod's category
    75-100, that category among others 50-75, an idle node 25-50, other categories 0-25, plus
    ``25 * (8000 - gpu_free) // 8000`` within the band; CPU-only pods 0. The tightest GPU.

    **Gap**: the artifact's categories are ``share-gpu``, ``1-gpu``, ``2-gpu``, ...,
    per pod; a GPU state shows shared cards and whole cards in use but not how
    many pods hold the whole ones, so all whole-card pods form one category here.
    """

    name = "clustering"

    def gpu_score(self, view: CandidateView, alt: Alternative) -> np.ndarray:
        req = _gpu_request(alt)
        if req <= 0:
            return np.zeros(len(view.state))
        mode = view.before["mode"]
        busy = view.before["holders"] > 0
        cats = (np.where((busy & ((mode == Mode.TIMESLICE) | (mode == Mode.MPS))).any(axis=1), _SHARE, 0)
                | np.where((busy & ((mode == Mode.WHOLE) | (mode == Mode.MIG))).any(axis=1), _WHOLE, 0))
        mine = _WHOLE if alt.kind in (ShareKind.WHOLE, ShareKind.MIG) else _SHARE
        band = np.where(cats & mine, np.where(cats == mine, 75, 50), np.where(cats == 0, 25, 0))
        left = view.free("before").sum(axis=1)
        return -(band + 25 * (MAX_SPEC_GPU - left) // MAX_SPEC_GPU) + _tightest(view)


class SpreadPolicy(Policy):
    """Not a paper baseline: the node left with the most free GPU (the opposite of packing)."""

    name = "spread"

    def gpu_score(self, view: CandidateView, alt: Alternative) -> np.ndarray:
        _, after, tot = _gpu_totals(view)
        return -after / tot


_REGISTRY: dict[str, Callable[..., Policy]] = {
    "fgd": FgdPolicy,
    "default": DefaultPolicy,
    "random": RandomPolicy,
    "bestfit": BestFitPolicy,
    "packing": PackingPolicy,
    "spread": SpreadPolicy,
    "dotproduct": DotProductPolicy,
    "clustering": ClusteringPolicy,
}

assert set(_REGISTRY) == set(POLICY_NAMES), "policy registry and core POLICY_NAMES disagree"


def get_policy(name: str, **params: Any) -> Policy:
    """A policy by name; ``fgd`` and ``default`` take a ``workload`` of ((task-type...), popularity) pairs."""
    make = _REGISTRY.get(name)
    if make is None:
        raise InvalidRequestError("policy", name, POLICY_NAMES)
    return make(**params)
