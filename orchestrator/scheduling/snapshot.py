"""The immutable cluster snapshot the placement engine decides over.

A snapshot is a set of numpy arrays, one row per node and one column per GPU
slot (nodes with fewer GPUs than the widest node have absent columns). The
*static* part (names, models, which GPUs exist, MIG mode and fixed MIG
layouts, NVLink islands, capacities) is shared by every snapshot derived from
the same :meth:`ClusterSnapshot.build`; the *dynamic* part (what is used) is
copied on :meth:`ClusterSnapshot.apply` and :meth:`ClusterSnapshot.release`,
which return new snapshots and never change their receiver. All arrays are
read-only.

Units: GPU compute in milli-GPUs (1000 = one card), memory in MiB, CPU in
milli-cores.

Per-GPU sharing mode (:class:`Mode`): a card without MIG starts FREE and takes
the mode of its first lease -- WHOLE, MPS or TIMESLICE -- until its last
lease leaves, so MPS clients and time-sliced processes never share a card
(NVIDIA's device plugin configures one sharing strategy per card, too). A
MIG-enabled card is always MIG. What fits on a card and what a change does
there is :mod:`.gpufit`'s one definition; :meth:`ClusterSnapshot.apply`
checks and applies through it.

Invariants (the property tests check them after any sequence of operations):

* a WHOLE card has exactly one holder and ``used_milli == 1000``;
* MIG instances on a card never overlap (``mig_mask``), start only at valid
  placements, use at most 7 compute slices, and on a card with a fixed layout
  are exactly instances of that layout;
* on an MPS card ``used_milli <= 1000`` (SM percentages sum to <= 100%) and
  ``used_mem`` <= the card's memory;
* on a TIMESLICE card ``used_milli <= timeslice_capacity_milli`` (the
  configured oversubscription);
* node CPU and memory are never over-committed;
* ``release(a)`` after ``apply(a)`` restores the arrays exactly.

Every node's GPU-only state is interned to a small integer (``gstate``); nodes
in identical GPU states get the same id, which is what lets the engine score
thousands of nodes by scoring a handful of distinct states once each.

Memos have two owners, each with one small API: :meth:`SnapshotStatic.cache`
for tables about a family's interned states (the engine's, a policy's) and
:meth:`ClusterSnapshot.derived` for views of one snapshot. Both hold only pure
functions of their keys, so a memo never changes an answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Sequence, TypeVar

import numpy as np

from orchestrator.core.allocation import Allocation
from orchestrator.core.catalogue import (
    CATALOGUE,
    MIG_COMPUTE_SLICES,
    MODEL_INDEX,
    MODEL_NAMES,
    gpu_model,
)
from orchestrator.core.errors import CapacityError, InvalidRequestError
from orchestrator.core.inventory import NodeInventory
from orchestrator.core.request import ShareKind
from orchestrator.scheduling.gpufit import (
    GPU_DTYPES,
    GPU_FIELDS,
    KIND_MODE,
    Mode,
    apply_change,
    free_milli,
    mig_fits,
    share_fit,
)

__all__ = ["MODEL_INDEX", "ClusterSnapshot", "Mode", "NodeSpec", "SnapshotStatic", "StateColumn"]

T = TypeVar("T")
_MIG = int(Mode.MIG)


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


def _gpu_field_property(name: str) -> property:
    """A read-only (N, G) view of one per-GPU field, derived from the interned states."""
    return property(lambda self: self._gpu_field(name), doc=f"(N, G) ``{name}`` of every GPU (read-only, derived)")


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


@dataclass(frozen=True, eq=False)
class ClusterSnapshot:
    """An immutable view of the cluster's capacity and what is used; see the module docstring.

    The per-GPU arrays (``mode``, ``used_milli``, ``used_mem``, ``mig_mask``,
    ``mig_compute``, ``holders``, ``healthy``; each (N, G)) are not stored:
    a node's GPU rows are those of its interned state, so they are derived
    on first use as ``rows[gstate]``. A change therefore copies three (N,)
    vectors, not a cluster's worth of arrays.
    """

    static: SnapshotStatic
    gstate: np.ndarray
    cpu_used: np.ndarray
    mem_used: np.ndarray
    version: int = 0
    _derived: dict = field(default_factory=dict, compare=False, repr=False)

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def build(cls, nodes: Iterable[NodeSpec | NodeInventory], *, timeslice_capacity_milli: int = 1000) -> "ClusterSnapshot":
        """A snapshot with nothing allocated. ``timeslice_capacity_milli`` is the time-slice
        oversubscription: 1000 means the fractions on one card sum to at most 1.0."""
        if timeslice_capacity_milli < 1000:
            raise InvalidRequestError("timeslice_capacity_milli", timeslice_capacity_milli, ">= 1000")
        specs = [NodeSpec.from_inventory(x) if isinstance(x, NodeInventory) else x for x in nodes]
        st = SnapshotStatic(specs, timeslice_capacity_milli)
        n, g = st.n, st.g
        dyn = {f: np.zeros((n, g), dtype=GPU_DTYPES[f]) for f in GPU_FIELDS}
        dyn["mode"][st.mig_enabled] = Mode.MIG
        dyn["healthy"][:] = st.present & ~st.initial_unhealthy
        gstate = np.array([st.intern(i, {f: dyn[f][i] for f in GPU_FIELDS}) for i in range(n)], dtype=np.int32)
        return cls(st, gstate=_ro(gstate), cpu_used=_ro(np.zeros(n, dtype=np.int64)),
                   mem_used=_ro(np.zeros(n, dtype=np.int64)))

    def _gpu_field(self, f: str) -> np.ndarray:
        return self.derived(("field", f), lambda: _ro(self.static.rep_rows[f][self.gstate]))

    mode = _gpu_field_property("mode")
    used_milli = _gpu_field_property("used_milli")
    used_mem = _gpu_field_property("used_mem")
    mig_mask = _gpu_field_property("mig_mask")
    mig_compute = _gpu_field_property("mig_compute")
    holders = _gpu_field_property("holders")
    healthy = _gpu_field_property("healthy")

    def gpu_row(self, i: int) -> dict[str, np.ndarray]:
        """Node ``i``'s per-GPU rows (copies)."""
        sid = self.gstate[i]
        return {f: self.static.rep_rows[f][sid].copy() for f in GPU_FIELDS}

    # ---- queries ------------------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return self.static.n

    @property
    def node_names(self) -> tuple[str, ...]:
        return self.static.names

    def node_index(self, name: str) -> int:
        try:
            return self.static.index[name]
        except KeyError:
            raise InvalidRequestError("node", name, "a node of the cluster") from None

    def locate(self, a: Allocation) -> Allocation:
        """``a`` with its row and columns in this snapshot (an allocation decoded from JSON, or one
        located in an older snapshot whose nodes differ). Raises ``InvalidRequestError`` for a node or
        GPU index this snapshot lacks."""
        n = self.node_index(a.node_name)
        idx = self.static.gpu_index[n]
        cols = []
        for g in a.gpu_indices:
            hit = np.flatnonzero(idx == g)
            if not hit.size:
                raise InvalidRequestError("allocation.gpu_indices", g, [int(i) for i in idx if i >= 0],
                                          detail=f"no such GPU on node {a.node_name}")
            cols.append(int(hit[0]))
        return a.at(n, tuple(cols))

    def capacity_milli(self) -> int:
        """Total GPU compute of healthy GPUs, in milli-GPUs."""
        return int(self.static.present.sum()) * 1000

    def allocated_milli(self) -> int:
        """GPU milli allocated: MIG slices count their compute share; time-slices count at most 1000 a card."""
        st = self.static
        used = np.minimum(self.used_milli, 1000)
        mig = self.mode == Mode.MIG
        used = np.where(mig, (self.mig_compute.astype(np.int64) * 1000) // MIG_COMPUTE_SLICES, used)
        return int(used[st.present].sum())

    def free_milli(self) -> np.ndarray:
        """(N, G) free compute per GPU for a new share of the card's current mode (0 where absent)."""
        return free_milli(self.mode, self.used_milli, self.mig_compute, self.static.present & self.healthy,
                          self.static.timeslice_capacity_milli)

    def same_state(self, other: "ClusterSnapshot") -> bool:
        """True when every dynamic array equals ``other``'s (the static part must be shared)."""
        return self.static is other.static and all(
            np.array_equal(getattr(self, f), getattr(other, f)) for f in ("gstate", "cpu_used", "mem_used")
        )

    # ---- changes ------------------------------------------------------------------------------
    def apply(self, a: Allocation) -> "ClusterSnapshot":
        """A new snapshot with ``a`` added. Raises :class:`CapacityError` if it does not fit
        (a stale plan); the receiver is never changed."""
        return self._change(a, +1)

    def release(self, a: Allocation) -> "ClusterSnapshot":
        """A new snapshot with ``a`` removed (exact inverse of :meth:`apply`)."""
        return self._change(a, -1)

    def with_health(self, node: str, gpu_index: int, healthy: bool) -> "ClusterSnapshot":
        """A new snapshot with one GPU's health changed (leases on it stay; new ones avoid it)."""
        i = self.node_index(node)
        cols = np.flatnonzero(self.static.gpu_index[i] == gpu_index)
        if not len(cols):
            raise InvalidRequestError("gpu_index", gpu_index, list(self.static.gpu_index[i][self.static.present[i]]))
        row = self.gpu_row(i)
        row["healthy"][cols[0]] = healthy and bool(self.static.present[i, cols[0]])
        return self._with(i, row, self.cpu_used, self.mem_used)

    def _with(self, i: int, row: dict[str, np.ndarray], cpu_used: np.ndarray, mem_used: np.ndarray) -> "ClusterSnapshot":
        gstate = self.gstate.copy()
        gstate[i] = self.static.intern(i, row)
        return ClusterSnapshot(self.static, gstate=_ro(gstate), cpu_used=_ro(cpu_used), mem_used=_ro(mem_used),
                               version=self.version + 1)

    def apply_many(self, allocations: Sequence[Allocation]) -> tuple["ClusterSnapshot", list[int]]:
        """Every allocation that fits applied in order, and the positions of those that did not.

        The snapshot equals the one successive :meth:`apply` calls would leave, skipping each that
        raises (:class:`CapacityError`; ``InvalidRequestError`` for a MIG profile the node's model
        lacks); but the vectors are copied once and each changed node's
        state is interned once, so re-applying a whole ledger costs O(allocations + nodes), not
        O(allocations x nodes). The receiver is never changed."""
        cpu = self.cpu_used.copy()
        mem = self.mem_used.copy()
        rows: dict[int, dict[str, np.ndarray]] = {}
        failed: list[int] = []
        for k, a in enumerate(allocations):
            i = a.node
            if 0 <= i < self.static.n and i not in rows:
                rows[i] = self.gpu_row(i)
            before = (int(cpu[i]), int(mem[i]), {f: v.copy() for f, v in rows[i].items()}) if i in rows else None
            try:
                self._change_into(a, +1, cpu, mem, rows.get(i))
            except (CapacityError, InvalidRequestError, IndexError):  # what a lone apply() would raise
                failed.append(k)
                if before is not None:
                    cpu[i], mem[i], rows[i] = before
        gstate = self.gstate.copy()
        for i, row in rows.items():
            gstate[i] = self.static.intern(i, row)
        if not rows:
            return self, failed
        return ClusterSnapshot(self.static, gstate=_ro(gstate), cpu_used=_ro(cpu), mem_used=_ro(mem),
                               version=self.version + 1), failed

    def _change(self, a: Allocation, sign: int) -> "ClusterSnapshot":
        cpu = self.cpu_used.copy()
        mem = self.mem_used.copy()
        row = self.gpu_row(a.node) if 0 <= a.node < self.static.n else None
        self._change_into(a, sign, cpu, mem, row)
        assert row is not None
        return self._with(a.node, row, cpu, mem)

    def _change_into(self, a: Allocation, sign: int, cpu: np.ndarray, mem: np.ndarray,
                     row: dict[str, np.ndarray] | None) -> None:
        """Apply (``sign`` +1) or release (-1) ``a`` to the working vectors and node row given;
        raises :class:`CapacityError` (possibly half-way: the caller discards or restores them)."""
        st = self.static
        i = a.node
        if not (0 <= i < st.n) or st.names[i] != a.node_name or row is None:
            raise CapacityError(f"allocation names node {a.node_name!r} which this snapshot does not have at {i}")
        cpu[i] += sign * a.cpu_milli
        mem[i] += sign * a.host_memory_mib
        if sign > 0 and (cpu[i] > st.cpu_total[i] or mem[i] > st.mem_total[i]):
            raise CapacityError(f"node {a.node_name}: CPU or host memory over-committed")
        if sign < 0 and (cpu[i] < 0 or mem[i] < 0):
            raise CapacityError(f"node {a.node_name}: releasing more CPU or memory than allocated")
        for j in a.gpus:
            if not st.present[i, j]:
                raise CapacityError(f"node {a.node_name}: no GPU in column {j}")
            if a.kind is ShareKind.MIG:
                self._change_mig(row, i, j, a, sign)
            else:
                self._change_share(row, i, j, a, sign)

    def _change_mig(self, row: dict[str, np.ndarray], i: int, j: int, a: Allocation, sign: int) -> None:
        st = self.static
        start = a.mig_start or 0
        if row["mode"][j] != _MIG:
            raise CapacityError(f"node {a.node_name} GPU {j}: MIG is not enabled")
        prof = gpu_model(MODEL_NAMES[st.model[i]]).profile(a.mig_profile or "")
        mask = prof.mask(start)
        if sign > 0:
            bits = st.layout_bits.get(prof.name)
            if not mig_fits(row["mig_mask"][j], row["mig_compute"][j], st.mig_fixed[i, j],
                            None if bits is None else bits[i, j], prof, start):
                layout = " (the card's fixed MIG layout)" if st.mig_fixed[i, j] else ""
                raise CapacityError(f"node {a.node_name} GPU {j}: MIG {prof.name}@{a.mig_start} does not fit{layout}")
        elif (row["mig_mask"][j] & mask) != mask:
            raise CapacityError(f"node {a.node_name} GPU {j}: MIG {prof.name}@{a.mig_start} is not allocated")
        apply_change(row, j, ShareKind.MIG, mig_mask=mask, mig_slices=prof.compute_slices,
                     memory_mib=prof.memory_mib, sign=sign)

    def _change_share(self, row: dict[str, np.ndarray], i: int, j: int, a: Allocation, sign: int) -> None:
        st = self.static
        want = KIND_MODE[a.kind]
        mode = Mode(int(row["mode"][j]))
        if sign > 0:
            mode_ok, _, fits = share_fit(row["mode"][j], row["used_milli"][j], row["used_mem"][j], kind=a.kind,
                                         milli=a.milli, memory_mib=a.memory_mib, gpu_memory=int(st.gpu_memory[i]),
                                         timeslice_capacity_milli=st.timeslice_capacity_milli)
            if mode is Mode.MIG:
                raise CapacityError(f"node {a.node_name} GPU {j}: MIG-enabled cards take MIG slices only")
            if not mode_ok:
                raise CapacityError(f"node {a.node_name} GPU {j}: card is in {mode.name} mode, not {want.name}")
            if not fits:  # a held whole card, too: its compute is all used
                raise CapacityError(f"node {a.node_name} GPU {j}: {a.kind.value} share does not fit")
        elif mode is not want or row["holders"][j] <= 0:
            raise CapacityError(f"node {a.node_name} GPU {j}: nothing of kind {a.kind.value} to release")
        apply_change(row, j, a.kind, milli=a.milli, memory_mib=a.memory_mib, sign=sign)
        if sign < 0 and row["holders"][j] == 0 and (row["used_milli"][j] or row["used_mem"][j]):
            raise CapacityError(f"node {a.node_name} GPU {j}: release left residue (ledger inconsistent)")

    # ---- derived views (cached per snapshot; pure functions of it) -----------------------------
    def derived(self, key: Hashable, compute: Callable[[], T]) -> T:
        """Memoise a pure function of this snapshot (the engine's per-snapshot indexes)."""
        return _memo(self._derived, key, compute)
