"""The static part of a cluster snapshot (:mod:`.snapshot`): what every snapshot derived from one
:meth:`~orchestrator.scheduling.snapshot.ClusterSnapshot.build` shares -- the node specs, the models, which
GPU slots exist, MIG mode and fixed layouts, NVLink islands, capacities, the interned GPU states and the
family's caches. Built once, read-only after (every array is), never copied by ``apply`` or ``release``.

Invariant: a cache entry (:meth:`SnapshotStatic.cache`) is a pure function of its key and of this static
part, so sharing it across the family saves work and never changes an answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Sequence, TypeVar

import numpy as np

from orchestrator.core.catalogue import CATALOGUE, MODEL_INDEX, MODEL_NAMES, gpu_model
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.inventory import NodeInventory
from orchestrator.scheduling.gpufit import GPU_DTYPES, GPU_FIELDS


T = TypeVar("T")


def _model_column(attr: str, dtype: type) -> np.ndarray:
    """One catalogue attribute per model index, read now: generic models register at run time."""
    return np.array([getattr(CATALOGUE[n], attr) for n in MODEL_NAMES], dtype=dtype)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A node as the engine sees it; built from an inventory or directly (benchmarks, traces).

    ``nvlink_islands`` None means: all GPUs form one island if the model has
    NVLink, else every GPU is its own island. ``mig_layout`` lists fixed MIG
    instances as ``(gpu, profile, start, uuid)``; a MIG-enabled GPU without
    entries there takes instances on demand at any valid placement.
    """

    name: str
    model: str | None
    gpus: int
    cpu_milli: int = 64_000
    memory_mib: int = 262_144
    mig_enabled: tuple[int, ...] = ()
    nvlink_islands: tuple[tuple[int, ...], ...] | None = None
    uuids: tuple[str, ...] | None = None
    mig_layout: tuple[tuple[int, str, int, str], ...] = ()
    unhealthy: tuple[int, ...] = ()
    gpu_indices: tuple[int, ...] | None = None

    @classmethod
    def from_inventory(cls, inv: NodeInventory) -> "NodeSpec":
        gpus = sorted(inv.gpus, key=lambda g: g.index)
        islands = tuple(tuple(sorted(s)) for s in inv.nvlink_islands()) if any(g.nvlink_peers for g in gpus) else tuple((g.index,) for g in gpus)
        pos = {g.index: i for i, g in enumerate(gpus)}
        return cls(
            name=inv.name,
            model=inv.model,
            gpus=len(gpus),
            cpu_milli=inv.cpu_milli,
            memory_mib=inv.memory_mib,
            mig_enabled=tuple(pos[g.index] for g in gpus if g.mig_enabled),
            nvlink_islands=tuple(tuple(pos[i] for i in isl) for isl in islands),
            uuids=tuple(g.uuid for g in gpus),
            mig_layout=tuple((pos[g.index], d.profile, d.start, d.uuid) for g in gpus for d in g.mig_devices),
            unhealthy=tuple(pos[g.index] for g in gpus if not g.healthy),
            gpu_indices=tuple(g.index for g in gpus),
        )


def _memo(store: dict, key: Hashable, make: Callable[[], T]) -> T:
    try:
        return store[key]
    except KeyError:
        v = store[key] = make()
        return v


def _ro(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


class SnapshotStatic:
    """The part of a snapshot no placement changes, shared by derived snapshots.

    Also holds the intern table of GPU states: append-only, a pure function of
    the state's bytes, so sharing it between snapshots keeps them immutable in
    every way that matters; and the family's memo tables (:meth:`cache`), the
    one place the engine and the policies keep what they learnt about states.
    """

    def __init__(self, specs: Sequence[NodeSpec], timeslice_capacity_milli: int) -> None:
        n = len(specs)
        g = max((s.gpus for s in specs), default=0) or 1
        self.names: tuple[str, ...] = tuple(s.name for s in specs)
        if len(set(self.names)) != n:
            raise InvalidRequestError("nodes.name", "duplicate", "unique node names")
        self.index = {name: i for i, name in enumerate(self.names)}
        self.n, self.g = n, g
        self.timeslice_capacity_milli = int(timeslice_capacity_milli)
        model = np.full(n, -1, dtype=np.int16)
        present = np.zeros((n, g), dtype=bool)
        mig = np.zeros((n, g), dtype=bool)
        mig_fixed = np.zeros((n, g), dtype=bool)
        island = np.full((n, g), -1, dtype=np.int16)
        gpu_index = np.full((n, g), -1, dtype=np.int32)
        self.layout_bits: dict[str, np.ndarray] = {}
        self.mig_uuid: dict[tuple[int, int, int], str] = {}
        self.uuids: list[tuple[str, ...]] = []
        unhealthy = np.zeros((n, g), dtype=bool)
        for i, s in enumerate(specs):
            if s.gpus:
                if s.model is None:
                    raise InvalidRequestError(f"nodes[{s.name}].model", None, sorted(CATALOGUE))
                model[i] = MODEL_INDEX[gpu_model(s.model).name]
            present[i, : s.gpus] = True
            gpu_index[i, : s.gpus] = s.gpu_indices if s.gpu_indices is not None else range(s.gpus)
            for j in s.mig_enabled:
                mig[i, j] = True
            islands = s.nvlink_islands
            if islands is None:
                islands = (tuple(range(s.gpus)),) if (s.gpus and CATALOGUE[MODEL_NAMES[model[i]]].nvlink) else tuple((j,) for j in range(s.gpus))
            for k, isl in enumerate(islands):
                for j in isl:
                    island[i, j] = k
            for j, prof, start, uuid in s.mig_layout:
                mig_fixed[i, j] = True
                bits = self.layout_bits.setdefault(prof, np.zeros((n, g), dtype=np.int16))
                bits[i, j] |= 1 << start
                self.mig_uuid[(i, j, start)] = uuid
            for j in s.unhealthy:
                unhealthy[i, j] = True
            self.uuids.append(s.uuids or tuple(f"GPU-{s.name}-{j}" for j in range(s.gpus)))
        self.model = _ro(model)
        self.present = _ro(present)
        self.mig_enabled = _ro(mig)
        self.mig_fixed = _ro(mig_fixed)
        self.island = _ro(island)
        self.gpu_index = _ro(gpu_index)
        for b in self.layout_bits.values():
            _ro(b)
        safe_model = np.where(model >= 0, model, 0)
        self.gpu_memory = _ro(np.where(model >= 0, _model_column("memory_mib", np.int64)[safe_model], 0).astype(np.int64))
        self.mps_ok = _ro(np.where(model >= 0, _model_column("mps", bool)[safe_model], False))
        self.cpu_total = _ro(np.array([s.cpu_milli for s in specs], dtype=np.int64))
        self.mem_total = _ro(np.array([s.memory_mib for s in specs], dtype=np.int64))
        self.initial_unhealthy = unhealthy
        # Static class of a node: everything static that a GPU-state score may depend on.
        self._static_key = [
            model[i].tobytes() + present[i].tobytes() + mig[i].tobytes() + mig_fixed[i].tobytes()
            + island[i].tobytes() + b"".join(self.layout_bits[p][i].tobytes() for p in sorted(self.layout_bits))
            for i in range(n)
        ]
        # Intern table of GPU states: key bytes -> id, and for each id one representative row.
        self._ids: dict[bytes, int] = {}
        self.n_states = 0
        cap = max(64, n)
        self.rep_node = np.zeros(cap, dtype=np.int64)
        self.rep_rows: dict[str, np.ndarray] = {f: np.zeros((cap, g), dtype=GPU_DTYPES[f]) for f in GPU_FIELDS}
        self._caches: dict[Hashable, Any] = {}

    def intern(self, i: int, rows: dict[str, np.ndarray]) -> int:
        """The id of node ``i``'s GPU state ``rows``; a new id (and a stored copy) when unseen."""
        key = self._static_key[i] + b"".join(rows[f].tobytes() for f in GPU_FIELDS)
        sid = self._ids.get(key)
        if sid is None:
            sid = self.n_states
            if sid == len(self.rep_node):
                self.rep_node = np.concatenate([self.rep_node, np.zeros_like(self.rep_node)])
                self.rep_rows = {f: np.concatenate([a, np.zeros_like(a)]) for f, a in self.rep_rows.items()}
            self._ids[key] = sid
            self.rep_node[sid] = i
            for f in GPU_FIELDS:
                self.rep_rows[f][sid] = rows[f]
            self.n_states = sid + 1
        return sid

    def cache(self, key: Hashable, make: Callable[[], T]) -> T:
        """The family's memo named ``key``, made by ``make()`` on first use.

        What is kept here must be a pure function of the static part and of
        what it is looked up with (interned state ids; a snapshot whose arrays
        it compares before reusing an answer), so a memo only ever saves work
        and never changes an answer. Keys start with their owner's name
        (``"engine"``, ``"fgd"``, ...)."""
        return _memo(self._caches, key, make)


class StateColumn:
    """One value per interned GPU state of a family, ``fill`` until computed; grows with the intern table."""

    __slots__ = ("_fill", "values")

    def __init__(self, fill: Any, dtype: Any) -> None:
        self._fill = fill
        self.values = np.full(64, fill, dtype=dtype)

    def at_least(self, n: int) -> np.ndarray:
        """The values, grown (with ``fill``) to cover at least ``n`` states."""
        v = self.values
        if len(v) < n:
            grown = np.full(max(n, 2 * len(v)), self._fill, dtype=v.dtype)
            grown[: len(v)] = v
            v = self.values = grown
        return v
