"""Placement policies: how the engine ranks candidate placements (lower is better).

A policy scores in two parts, both vectorised:

* ``gpu_score(view, alt)`` over candidate slots on interned GPU states (a
  :class:`~orchestrator.policy.placement.CandidateView` with the rows before
  and after the candidate). It may depend only on the view and the policy's
  own parameters: the engine memoises it per state.
* ``node_score(snapshot, nodes, alt, request)``: an optional node-wide term
  (free CPU, host memory) added to the best GPU score of each node's state.

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
  built on it. Both live in :mod:`orchestrator.policy.fgd`.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from orchestrator.model.request import Alternative, GpuRequest
from orchestrator.policy.snapshot import ClusterSnapshot, Mode


class Policy:
    """Base policy: every candidate scores 0. Subclasses override the two terms."""

    name = "none"

    def __init__(self, **params: Any) -> None:
        self.params = params

    #: The engine passes a :class:`~orchestrator.policy.placement.NodeContext` to ``node_score``.
    wants_context = False
    #: With an ``rng``, the engine gives a share a random fitting GPU of the chosen node.
    random_slot = False

    @property
    def key(self) -> tuple:
        """Hashable identity of the scoring function, for the engine's memo tables.

        Policies with equal parameters share one key. Computed once (a policy's
        parameters never change after construction) and kept small, because the
        engine hashes it on every request: the full parameters (a workload can
        be hundreds of task types) are interned to a number."""
        k = self.__dict__.get("_key")
        if k is None:
            full = (type(self).__qualname__, self.name, tuple(sorted((n, _hashable(v)) for n, v in self.params.items())))
            k = self.__dict__["_key"] = (self.name, _KEYS.setdefault(full, len(_KEYS)))
        return k

    def gpu_score(self, view: Any, alt: Alternative) -> np.ndarray:
        return np.zeros(len(view.state))

    def node_score(self, snap: ClusterSnapshot, nodes: np.ndarray, alt: Alternative, req: GpuRequest) -> np.ndarray | None:
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params})"


_KEYS: dict[tuple, int] = {}


def _hashable(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    return v


def _gpu_totals(view: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n_gpu = np.maximum(view.present.sum(axis=1), 1) * 1000
    return view.free("before").sum(axis=1), view.free("after").sum(axis=1), n_gpu


def _host_free_after(snap: ClusterSnapshot, nodes: np.ndarray, req: GpuRequest) -> tuple[np.ndarray, np.ndarray]:
    st = snap.static
    cpu_tot = np.maximum(st.cpu_total[nodes], 1)
    mem_tot = np.maximum(st.mem_total[nodes], 1)
    cpu = (cpu_tot - snap.cpu_used[nodes] - req.cpu_milli) / cpu_tot
    mem = (mem_tot - snap.mem_used[nodes] - req.host_memory_mib) / mem_tot
    return cpu, mem


class RandomPolicy(Policy):
    name = "random"


class BestFitPolicy(Policy):
    name = "bestfit"

    def gpu_score(self, view: Any, alt: Alternative) -> np.ndarray:
        _, after, tot = _gpu_totals(view)
        chosen = np.where(view.take, view.free("after"), 0).sum(axis=1)
        return after / tot / 3 + 1e-6 * chosen

    def node_score(self, snap: ClusterSnapshot, nodes: np.ndarray, alt: Alternative, req: GpuRequest) -> np.ndarray:
        cpu, mem = _host_free_after(snap, nodes, req)
        return (cpu + mem) / 3


class PackingPolicy(Policy):
    name = "packing"

    def gpu_score(self, view: Any, alt: Alternative) -> np.ndarray:
        used_before = (view.before["holders"] > 0) & view.present
        on_used_gpu = (view.take & used_before).any(axis=1)
        node_used = used_before.any(axis=1)
        tier = np.where(on_used_gpu, 0, np.where(node_used, 1, 2))
        _, after, tot = _gpu_totals(view)
        return tier + after / tot * 0.5


class SpreadPolicy(Policy):
    name = "spread"

    def gpu_score(self, view: Any, alt: Alternative) -> np.ndarray:
        _, after, tot = _gpu_totals(view)
        return -after / tot


class DotProductPolicy(Policy):
    name = "dotproduct"

    def gpu_score(self, view: Any, alt: Alternative) -> np.ndarray:
        before, _, tot = _gpu_totals(view)
        req = alt.count * 1000 if alt.kind.value == "whole" else max(alt.milli, 1)
        return -(req / tot) * (before / tot)

    def node_score(self, snap: ClusterSnapshot, nodes: np.ndarray, alt: Alternative, req: GpuRequest) -> np.ndarray:
        st = snap.static
        cpu_tot = np.maximum(st.cpu_total[nodes], 1)
        mem_tot = np.maximum(st.mem_total[nodes], 1)
        return -((req.cpu_milli / cpu_tot) * ((cpu_tot - snap.cpu_used[nodes]) / cpu_tot)
                 + (req.host_memory_mib / mem_tot) * ((mem_tot - snap.mem_used[nodes]) / mem_tot))


class ClusteringPolicy(Policy):
    name = "clustering"

    def gpu_score(self, view: Any, alt: Alternative) -> np.ndarray:
        used = view.before["used_milli"]
        shared = (view.before["mode"] == Mode.TIMESLICE) | (view.before["mode"] == Mode.MPS)
        same = shared & (used > 0) & (alt.milli > 0) & (used % max(alt.milli, 1) == 0)
        on_same = (view.take & same).any(axis=1)
        node_same = same.any(axis=1)
        tier = np.where(on_same, 0, np.where(node_same, 1, 2))
        return tier + PackingPolicy().gpu_score(view, alt) / 10


_REGISTRY: dict[str, Callable[..., Policy]] = {
    "random": RandomPolicy,
    "bestfit": BestFitPolicy,
    "packing": PackingPolicy,
    "spread": SpreadPolicy,
    "dotproduct": DotProductPolicy,
    "clustering": ClusteringPolicy,
}

POLICY_NAMES: tuple[str, ...] = ("random", "bestfit", "packing", "spread", "dotproduct", "clustering", "fgd", "default")


def get_policy(name: str, **params: Any) -> Policy:
    """A policy by name; ``fgd`` and ``default`` take a ``workload`` of ((task-type...), popularity) pairs."""
    from orchestrator.errors import InvalidRequestError

    if name in ("fgd", "default"):
        from orchestrator.policy import fgd  # the FGD family lives in its own module

        cls = fgd.FgdPolicy if name == "fgd" else fgd.DefaultPolicy
        return cls(**params)
    try:
        return _REGISTRY[name](**params)
    except KeyError:
        raise InvalidRequestError("policy", name, POLICY_NAMES) from None
