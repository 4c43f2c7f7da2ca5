"""What fits on a GPU, and what a placement changes there: the one definition.

A card's usage is a handful of per-GPU *rows* (``mode``, ``used_milli``,
``used_mem``, ``mig_mask``, ``mig_compute``, ``holders``, ``healthy``: the
fields of :data:`GPU_FIELDS`). Every function here is elementwise over numpy
arrays of any shape, numpy scalars included, so the same code serves the
engine, which asks about thousands of candidate cards at once ((M, G)
arrays), and the snapshot, which checks and applies one allocation card by
card (one column of a node's rows: scalars, much cheaper than tiny arrays).

Sharing modes (:class:`Mode`): a card without MIG is FREE until its first
lease and then takes that lease's mode -- WHOLE, MPS or TIMESLICE -- until its
last lease leaves; a MIG-enabled card is always MIG.

Invariants this module keeps (and the snapshot's property tests check):

* a FREE card has ``used_milli == used_mem == holders == 0``, which is why a
  whole card fits exactly on a FREE card (:func:`share_fit`);
* a share fits only a card of its own mode or a FREE one, within the mode's
  compute capacity (:func:`share_capacity`) and the card's memory;
* a MIG instance fits only at a valid placement of its profile, over free
  memory slices, within 7 compute slices, and -- on a card with a fixed
  layout -- where that layout has the instance (:func:`mig_fits`);
* :func:`apply_change` with ``sign=-1`` after ``sign=+1`` restores the rows
  exactly (a card whose last holder leaves goes back to FREE).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Mapping

import numpy as np

from orchestrator.core.catalogue import MIG_COMPUTE_SLICES, MigProfile
from orchestrator.core.request import ShareKind


class Mode(IntEnum):
    FREE = 0
    WHOLE = 1
    MPS = 2
    TIMESLICE = 3
    MIG = 4


#: The mode a card takes for each kind of share.
KIND_MODE = {ShareKind.WHOLE: Mode.WHOLE, ShareKind.MPS: Mode.MPS, ShareKind.TIMESLICE: Mode.TIMESLICE,
             ShareKind.MIG: Mode.MIG}

# Plain ints for numpy: comparing an array with an IntEnum member makes numpy look special
# attributes up on the enum class, which costs more than the comparison on a card's row.
_FREE, _TIMESLICE, _MIG = int(Mode.FREE), int(Mode.TIMESLICE), int(Mode.MIG)
_KIND_CODE = {kind: int(mode) for kind, mode in KIND_MODE.items()}

#: Per-GPU dynamic fields and their dtypes; each is an (N, G) array of a snapshot.
GPU_FIELDS = ("mode", "used_milli", "used_mem", "mig_mask", "mig_compute", "holders", "healthy")
GPU_DTYPES = {"mode": np.int8, "used_milli": np.int32, "used_mem": np.int64, "mig_mask": np.int16,
              "mig_compute": np.int8, "holders": np.int16, "healthy": bool}

#: The fields a placement of each kind changes (the others stay as they were).
CHANGED_FIELDS = {ShareKind.WHOLE: ("mode", "used_milli", "used_mem", "holders"),
                  ShareKind.MPS: ("mode", "used_milli", "used_mem", "holders"),
                  ShareKind.TIMESLICE: ("mode", "used_milli", "used_mem", "holders"),
                  ShareKind.MIG: ("mig_mask", "mig_compute", "used_mem", "holders")}


def share_capacity(kind: ShareKind, timeslice_capacity_milli: int) -> int:
    """Compute (milli) one card offers shares of ``kind`` in all: time-slices may oversubscribe."""
    return timeslice_capacity_milli if kind is ShareKind.TIMESLICE else 1000


def free_milli(mode: np.ndarray, used_milli: np.ndarray, mig_compute: np.ndarray, usable: np.ndarray,
               timeslice_capacity_milli: int) -> np.ndarray:
    """Free compute per GPU for a new share of the card's current mode (MIG cards: by free compute
    slices); 0 where not ``usable`` (absent or unhealthy)."""
    cap = np.where(mode == _TIMESLICE, timeslice_capacity_milli, 1000)
    free = np.where(mode == _MIG, ((MIG_COMPUTE_SLICES - mig_compute.astype(np.int64)) * 1000) // MIG_COMPUTE_SLICES,
                    cap - used_milli)
    return np.where(usable, free, 0)


def share_fit(mode: np.ndarray, used_milli: np.ndarray, used_mem: np.ndarray, *, kind: ShareKind, milli: int,
              memory_mib: np.ndarray | int, gpu_memory: np.ndarray | int,
              timeslice_capacity_milli: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Whether a share of ``kind`` (``milli`` compute, ``memory_mib`` memory) fits a card without MIG,
    as three cumulative masks: the card's mode admits it, then its compute fits too, then its memory.

    A whole card is the share (1000 milli, all the card's memory): by the FREE-card invariant it fits
    exactly the FREE cards. Health and MIG mode are the caller's to check (a MIG card's mode is MIG,
    which admits no share)."""
    mode_ok = (mode == _FREE) | (mode == _KIND_CODE[kind])
    compute_ok = mode_ok & (used_milli + milli <= share_capacity(kind, timeslice_capacity_milli))
    memory_ok = compute_ok & (used_mem + memory_mib <= gpu_memory)
    return mode_ok, compute_ok, memory_ok


def mig_fits(mig_mask: np.ndarray, mig_compute: np.ndarray, fixed: np.ndarray, layout_bits: np.ndarray | None,
             prof: MigProfile, start: int) -> np.ndarray:
    """Whether an instance of ``prof`` at ``start`` fits MIG cards: the one MIG fit check.

    ``fixed`` marks cards with a fixed layout and ``layout_bits`` (None: no card has ``prof`` in its
    layout) holds, per card, bit ``s`` set when the layout has ``prof`` at ``s``."""
    if start not in prof.placements:
        return np.zeros(np.shape(fixed), dtype=bool)
    ok = ((mig_mask & prof.mask(start)) == 0) & (mig_compute + prof.compute_slices <= MIG_COMPUTE_SLICES)
    return ok & (~fixed if layout_bits is None else (~fixed | ((layout_bits >> start) & 1).astype(bool)))


def apply_change(rows: Mapping[str, np.ndarray], take: np.ndarray | int, kind: ShareKind, *, milli: int = 0,
                 memory_mib: np.ndarray | int = 0, mig_mask: np.ndarray | int = 0, mig_slices: np.ndarray | int = 0,
                 sign: int = 1) -> None:
    """Add (``sign=+1``) or remove (``-1``) one placement of ``kind`` on the ``take`` GPUs, in place.

    ``take`` is a mask of the GPUs (the engine's candidates) or one column (the snapshot applies an
    allocation card by card). Shares (whole cards included) add ``milli`` and ``memory_mib``; MIG
    instances set ``mig_mask``'s memory slices and add ``mig_slices`` compute slices and
    ``memory_mib``. Amounts are scalars or per-row columns ((M, 1) for M candidates). The caller
    has checked that it fits (or is held)."""
    if kind is ShareKind.MIG:
        if sign > 0:
            _apply(np.bitwise_or, rows["mig_mask"], take, mig_mask, 0)
        else:
            _apply(np.bitwise_and, rows["mig_mask"], take, np.invert(mig_mask), -1)
        _apply(np.add, rows["mig_compute"], take, sign * mig_slices, 0)
    else:
        _apply(np.add, rows["used_milli"], take, sign * milli, 0)
    _apply(np.add, rows["used_mem"], take, sign * memory_mib, 0)
    _apply(np.add, rows["holders"], take, sign, 0)
    if kind is not ShareKind.MIG:
        mode = rows["mode"]
        if sign > 0:
            mode[take] = _KIND_CODE[kind]
        else:
            mode[take] = np.where(rows["holders"][take] == 0, _FREE, mode[take])


def _apply(op: np.ufunc, a: np.ndarray, take: np.ndarray | int, amount: np.ndarray | int, identity: int) -> None:
    """``a = op(a, amount)`` on the ``take`` cells, in place: a scalar amount on those cells only,
    a per-row column through ``identity`` elsewhere (0 for add and or, all bits for and)."""
    if isinstance(amount, np.ndarray) and amount.ndim:
        op(a, np.where(take, amount, identity), out=a, casting="same_kind")
    else:
        a[take] = op(a[take], amount)


def with_change(rows: Mapping[str, np.ndarray], take: np.ndarray, kind: ShareKind, **change: object) -> dict[str, np.ndarray]:
    """The rows after :func:`apply_change`, leaving ``rows`` as they are: the changed fields are copied,
    the others shared (read-only views stay read-only)."""
    changed = CHANGED_FIELDS[kind]
    out = {f: (v.copy() if f in changed else v) for f, v in rows.items()}
    apply_change(out, take, kind, **change)  # type: ignore[arg-type]
    return out
