"""The immutable cluster snapshot the placement engine decides over.

A snapshot is a set of numpy arrays, one row per node and one column per GPU
slot (nodes with fewer GPUs than the widest node have absent columns). The
*static* part (names, models, which GPUs exist, MIG mode and fixed MIG
layouts, NVLink islands, capacities) is shared by every snapshot derived from
the same :meth:`ClusterSnapshot.build`; the *dynamic* part (what is used) is
copied on :meth:`ClusterSnapshot.apply` and :meth:`ClusterSnapshot.release`,
which return new snapshots and never change their receiver. All arrays are
read-only. The static part is :mod:`.snapshot_static` (``NodeSpec``,
``SnapshotStatic``, ``StateColumn``; importable from here too); this module is
the snapshot and the dynamic part.

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
from typing import Callable, Hashable, Iterable, Sequence

import numpy as np

from orchestrator.core.allocation import Allocation
from orchestrator.core.catalogue import MIG_COMPUTE_SLICES, MODEL_INDEX, MODEL_NAMES, gpu_model
from orchestrator.core.errors import CapacityError, InvalidRequestError
from orchestrator.core.inventory import NodeInventory
from orchestrator.core.request import ShareKind
from orchestrator.scheduling.gpufit import (
    GPU_DTYPES, GPU_FIELDS, KIND_MODE, Mode, apply_change, free_milli, mig_fits, share_fit,
)
from orchestrator.scheduling.snapshot_static import T, NodeSpec, SnapshotStatic, StateColumn, _memo, _ro

__all__ = ["MODEL_INDEX", "ClusterSnapshot", "Mode", "NodeSpec", "SnapshotStatic", "StateColumn"]


_MIG = int(Mode.MIG)


def _gpu_field_property(name: str) -> property:
    """A read-only (N, G) view of one per-GPU field, derived from the interned states."""
    return property(lambda self: self._gpu_field(name), doc=f"(N, G) ``{name}`` of every GPU (read-only, derived)")


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
        (a stale plan); the receiver is never changed. The one :meth:`prepare` made, if any (handed out once)."""
        ready = self._derived.pop(("applied", a), None)
        return ready if ready is not None else self._change(a, +1)

    def prepare(self, a: Allocation) -> None:
        """Compute ``apply(a)`` ahead, in idle time (the head's cycle, for the placement the next call is likely to
        make: :func:`~.engine.warm`); the next ``apply(a)`` returns it. An allocation that does not fit is left
        for ``apply`` to refuse. Invariant: the snapshot kept is the one ``apply`` computes (a pure function of
        the receiver and ``a``), and it is dropped from the receiver when handed out, so a chain of snapshots
        never holds its successors."""
        if ("applied", a) not in self._derived:
            try:
                self._derived[("applied", a)] = self._change(a, +1)
            except (CapacityError, InvalidRequestError):
                pass

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
