"""Candidate slots: where an alternative could go on interned GPU states, and what it leaves there.

The engine scores *states*, not nodes (:mod:`.engine`); this module
enumerates, for a batch of interned GPU states, every *slot* an alternative
could take there and the rows before and after it, vectorised over the
states. What fits and what changes on a card is :mod:`.gpufit`'s one
definition; this module only decides which cards a slot names.

A *slot* is one int naming where a candidate goes on its node: for whole
cards the bitmask of their GPU columns, for a MIG instance
``column * MIG_SLOT + start``, for a share its GPU column.
:func:`enumerate_slots` makes them; :func:`slot_take` reads them back.

Invariants: every function is a pure function of the family's static part,
the state ids and the alternative (so the engine and the policies may memoise
by state id); candidates come in a fixed order (alternatives' profiles, then
placements, then row-major), so the engine's choice among equals is
deterministic; the free compute a policy sees (:meth:`CandidateView.free`,
:func:`state_free`) is at most one card's worth per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from orchestrator.core.catalogue import MODEL_NAMES, gpu_model
from orchestrator.core.reasons import Cause, Reason
from orchestrator.core.request import Alternative, ShareKind
from orchestrator.scheduling.gpufit import free_milli, mig_fits, share_fit, with_change
from orchestrator.scheduling.snapshot import MODEL_INDEX, SnapshotStatic, StateColumn

MIG_SLOT = 8

# Why a state has no candidate for an alternative: a small code per state (0: it has one),
# so that the engine's memo keeps it in an int16 column; FIT_REASONS names each code.
(R_NOGPU, R_UNHEALTHY, R_WHOLE, R_NVLINK, R_COMPUTE, R_MEMORY, R_NOMPS, R_NOMIG, R_MIGFULL,
 R_MODE) = range(1, 11)
FIT_REASONS: tuple[Reason | None, ...] = (
    None,
    Reason(Cause.FIT_NO_GPU, "no GPUs on the node"),
    Reason(Cause.FIT_UNHEALTHY, "all GPUs unhealthy"),
    Reason(Cause.FIT_WHOLE, "fewer free whole GPUs than requested"),
    Reason(Cause.FIT_NVLINK, "no NVLink island with enough free GPUs"),
    Reason(Cause.FIT_COMPUTE, "no GPU with enough free compute"),
    Reason(Cause.FIT_MEMORY, "not enough free GPU memory"),
    Reason(Cause.FIT_NO_MPS, "GPU model does not support MPS"),
    Reason(Cause.FIT_NO_MIG, "no MIG-enabled GPU"),
    Reason(Cause.FIT_MIG_FULL, "MIG: no free valid placement for the profile"),
    Reason(Cause.FIT_MODE, "cards in another sharing mode"),
)


def alt_key(alt: Alternative) -> tuple:
    """Hashable identity of an alternative, for memo tables keyed by it (the engine's and a policy's)."""
    return (alt.kind, alt.count, alt.milli, alt.memory_mib, alt.profiles, alt.nvlink)


@dataclass(slots=True)
class CandidateView:
    """M candidate placements, each on one interned GPU state, for a policy to score.

    ``before``/``after`` map a field name (``mode``, ``used_milli``, ``used_mem``,
    ``mig_mask``, ``mig_compute``, ``holders``, ``healthy``) to an (M, G) array;
    ``take`` is the (M, G) mask of GPUs the candidate uses; ``present`` the
    GPUs that exist; ``model`` (M,) the model index; ``gpu_memory`` (M,) MiB per GPU.
    ``state`` is the interned state id of each candidate and ``slot`` its slot.
    ``static`` is the snapshot family's static part (for per-state tables a
    policy keeps); ``memo`` is scratch space a policy may fill in ``gpu_score``
    and read back in ``remember_best``.
    """

    state: np.ndarray
    slot: np.ndarray
    take: np.ndarray
    present: np.ndarray
    model: np.ndarray
    gpu_memory: np.ndarray
    island: np.ndarray
    before: dict[str, np.ndarray]
    after: dict[str, np.ndarray]
    timeslice_capacity_milli: int
    static: SnapshotStatic
    memo: dict = field(default_factory=dict)

    def free(self, which: str = "before") -> np.ndarray:
        """(M, G) free milli per GPU (MIG cards: by free compute slices; absent or unhealthy: 0)."""
        return _request_free(self.before if which == "before" else self.after, self.present,
                             self.timeslice_capacity_milli)


def _request_free(rows: dict[str, np.ndarray], present: np.ndarray, ts_cap: int) -> np.ndarray:
    # A time-sliced card offers at most one card's worth to any one request.
    return np.minimum(free_milli(rows["mode"], rows["used_milli"], rows["mig_compute"], present & rows["healthy"],
                                 ts_cap), 1000)


def state_rows(st: SnapshotStatic, ids: np.ndarray) -> dict[str, np.ndarray]:
    """The per-GPU rows of interned states ``ids`` (copies)."""
    return {f: a[ids] for f, a in st.rep_rows.items()}


def state_free(st: SnapshotStatic, ids: np.ndarray) -> np.ndarray:
    """(K, G) free milli per GPU of interned states ``ids`` (as :meth:`CandidateView.free` shows them)."""
    rows = {f: st.rep_rows[f][ids] for f in ("mode", "used_milli", "mig_compute", "healthy")}
    return _request_free(rows, st.present[st.rep_node[ids]], st.timeslice_capacity_milli)


def state_free_totals(st: SnapshotStatic, sids: np.ndarray) -> np.ndarray:
    """Free milli summed over the GPUs of interned states ``sids`` (kept per snapshot family)."""
    col = st.cache(("candidates.free_totals",), lambda: StateColumn(-1, np.int64))
    t = col.at_least(st.n_states)
    v = t[sids]
    miss = v < 0
    if miss.any():
        ids = np.unique(sids[miss])
        t[ids] = state_free(st, ids).sum(axis=1)
        v = t[sids]
    return v


def state_free_after(st: SnapshotStatic, ids: np.ndarray, slots: np.ndarray, alt: Alternative) -> np.ndarray:
    """(K, G) free milli per GPU of states ``ids`` after ``alt`` takes ``slots`` there
    (what :meth:`CandidateView.free` ``("after")`` shows for that candidate)."""
    reps = st.rep_node[ids]
    present = st.present[reps]
    take = slot_take(slots, alt, present.shape[1])
    after = rows_after(state_rows(st, ids), take, slots, alt, st.gpu_memory[reps], st.model[reps])
    return _request_free(after, present, st.timeslice_capacity_milli)


def slot_take(slots: np.ndarray, alt: Alternative, g: int) -> np.ndarray:
    """(K, g) mask of the GPU columns that ``alt`` takes at each of ``slots``."""
    cols = np.arange(g)[None, :]
    slots = np.asarray(slots, dtype=np.int64)
    if alt.kind is ShareKind.WHOLE:
        return ((slots[:, None] >> cols) & 1).astype(bool) if alt.count else np.zeros((len(slots), g), dtype=bool)
    if alt.kind is ShareKind.MIG:
        return cols == (slots // MIG_SLOT)[:, None]
    return cols == slots[:, None]


def memory_need(alt: Alternative, gpu_memory: np.ndarray) -> np.ndarray:
    """(K,) GPU memory (MiB) a share of ``alt`` takes on cards of ``gpu_memory`` MiB."""
    if alt.memory_mib is not None:
        return np.full(len(gpu_memory), alt.memory_mib, dtype=np.int64)
    if alt.kind is ShareKind.MPS:
        # MPS without an explicit limit: the card's memory in proportion to the SM share.
        return (gpu_memory * alt.milli) // 1000
    return np.zeros(len(gpu_memory), dtype=np.int64)


def rows_after(before: dict[str, np.ndarray], take: np.ndarray, slot: np.ndarray, alt: Alternative,
               gpu_memory: np.ndarray, model: np.ndarray) -> dict[str, np.ndarray]:
    """The rows of K candidates after ``alt`` takes ``slot`` (its ``take`` columns) on each;
    ``before`` is left as it is (see :func:`~orchestrator.scheduling.gpufit.with_change`)."""
    kind = alt.kind
    if kind is ShareKind.WHOLE:
        if not alt.count:
            return dict(before)
        return with_change(before, take, kind, milli=1000, memory_mib=gpu_memory[:, None])
    if kind is ShareKind.MIG:
        profs = [alt.profile_for(MODEL_NAMES[m]) for m in model]
        start = slot % MIG_SLOT
        mask = np.array([p.mask(int(s)) for p, s in zip(profs, start)], dtype=np.int64)  # type: ignore[union-attr]
        slices = np.array([p.compute_slices for p in profs], dtype=np.int64)  # type: ignore[union-attr]
        mem = np.array([p.memory_mib for p in profs], dtype=np.int64)  # type: ignore[union-attr]
        return with_change(before, take, kind, mig_mask=mask[:, None], mig_slices=slices[:, None],
                           memory_mib=mem[:, None])
    return with_change(before, take, kind, milli=alt.milli, memory_mib=memory_need(alt, gpu_memory)[:, None])


def mig_placements(st: SnapshotStatic, reps: np.ndarray, mig_mask: np.ndarray, mig_compute: np.ndarray,
                   usable: np.ndarray, profiles: tuple[tuple[str, str], ...]) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """Where a MIG instance fits on the cards of nodes ``reps`` (rows ``mig_mask``/``mig_compute``):
    ``[(rows, columns, start), ...]`` per profile and placement, in that order; ``usable`` marks the
    healthy MIG-enabled cards. ``profiles`` maps model name -> profile (an alternative's)."""
    model = st.model[reps]
    fixed = st.mig_fixed[reps]
    out = []
    for model_name, prof_name in profiles:
        prof = gpu_model(model_name).profile(prof_name)
        on_model = usable & (model == MODEL_INDEX[model_name])[:, None]
        bits = st.layout_bits.get(prof.name)
        bits = None if bits is None else bits[reps]
        for start in prof.placements:
            m, g = np.nonzero(on_model & mig_fits(mig_mask, mig_compute, fixed, bits, prof, start))
            if len(m):
                out.append((m, g, start))
    return out


def enumerate_slots(st: SnapshotStatic, ids: np.ndarray, alt: Alternative,
                    before: dict[str, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every candidate slot of the states ``ids`` for ``alt`` (vectorised over them).

    Returns ``reason`` (per state: why it has no candidate, 0 if it has one),
    and per candidate the row ``cm`` into ``ids``, the ``slot`` and the ``take``
    mask of GPUs it uses. ``before`` is ``state_rows(st, ids)`` when the caller has it."""
    reps = st.rep_node[ids]
    before = state_rows(st, ids) if before is None else before
    present = st.present[reps]
    healthy = present & before["healthy"]
    gmem = st.gpu_memory[reps]
    reason = np.zeros(len(ids), dtype=np.int16)
    kind = alt.kind
    nothing = kind is ShareKind.WHOLE and alt.count == 0
    cand_m: list[np.ndarray] = []
    cand_slot: list[np.ndarray] = []
    cand_take: list[np.ndarray] = []

    if nothing:
        cand_m, cand_slot, cand_take = [np.arange(len(ids))], [np.zeros(len(ids), dtype=np.int64)], [np.zeros_like(present)]
    elif kind is ShareKind.WHOLE:
        _, _, free_card = share_fit(before["mode"], before["used_milli"], before["used_mem"], kind=kind, milli=1000,
                                    memory_mib=gmem[:, None], gpu_memory=gmem[:, None],
                                    timeslice_capacity_milli=st.timeslice_capacity_milli)
        free_card &= healthy & ~st.mig_enabled[reps]
        if alt.memory_mib:
            free_card &= (gmem >= alt.memory_mib)[:, None]
        _whole_slots(free_card, st.island[reps], alt, reason, cand_m, cand_slot, cand_take)
    elif kind in (ShareKind.MPS, ShareKind.TIMESLICE):
        eligible = healthy & ~st.mig_enabled[reps]
        if kind is ShareKind.MPS:
            eligible &= st.mps_ok[reps][:, None]
        mode_ok, compute_ok, mem_ok = (eligible & m for m in share_fit(
            before["mode"], before["used_milli"], before["used_mem"], kind=kind, milli=alt.milli,
            memory_mib=memory_need(alt, gmem)[:, None], gpu_memory=gmem[:, None],
            timeslice_capacity_milli=st.timeslice_capacity_milli))
        reason[:] = np.select(
            [~mode_ok.any(axis=1) & (kind is ShareKind.MPS) & ~st.mps_ok[reps], ~mode_ok.any(axis=1),
             ~compute_ok.any(axis=1), ~mem_ok.any(axis=1)],
            [R_NOMPS, R_MODE, R_COMPUTE, R_MEMORY], 0)
        m, g = np.nonzero(mem_ok)
        cand_m, cand_slot, cand_take = [m], [g.astype(np.int64)], [_one_hot(m, g, present.shape[1])]
    elif kind is ShareKind.MIG:
        mig = healthy & st.mig_enabled[reps]
        reason[:] = np.where(~mig.any(axis=1), R_NOMIG, R_MIGFULL)
        for m, g, start in mig_placements(st, reps, before["mig_mask"], before["mig_compute"], mig, alt.profiles):
            cand_m.append(m)
            cand_slot.append((g * MIG_SLOT + start).astype(np.int64))
            cand_take.append(_one_hot(m, g, present.shape[1]))
    if not nothing:
        no_gpu = ~present.any(axis=1)
        reason = np.where(no_gpu, R_NOGPU, np.where(~no_gpu & ~healthy.any(axis=1), R_UNHEALTHY, reason))
    if not cand_m:
        return reason, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros((0, present.shape[1]), dtype=bool)
    return reason, np.concatenate(cand_m), np.concatenate(cand_slot), np.concatenate(cand_take)


def _one_hot(m: np.ndarray, g: np.ndarray, width: int) -> np.ndarray:
    take = np.zeros((len(m), width), dtype=bool)
    take[np.arange(len(m)), g] = True
    return take


def _whole_slots(free_card: np.ndarray, isl: np.ndarray, alt: Alternative, reason: np.ndarray,
                 cand_m: list, cand_slot: list, cand_take: list) -> None:
    """Whole-card candidates: one per state, the cards :func:`choose_whole` picks."""
    nfree = free_card.sum(axis=1)
    reason[:] = np.where(nfree < alt.count, R_WHOLE, 0)
    if alt.count == 1:
        # choose_whole for one card, vectorised: the free card whose island has the
        # fewest free cards, then the lowest island, then the lowest index.
        g = free_card.shape[1]
        same = (isl[:, :, None] == isl[:, None, :]) & free_card[:, None, :]
        key = same.sum(axis=2) * (g * (g + 1)) + (isl.astype(np.int64) + 1) * g + np.arange(g)[None, :]
        rows = np.flatnonzero(nfree >= 1)
        col = np.argmin(np.where(free_card, key, np.iinfo(np.int64).max)[rows], axis=1)
        cand_m.append(rows)
        cand_slot.append((1 << col).astype(np.int64))
        cand_take.append(_one_hot(np.arange(len(rows)), col, g))
        return
    for m in np.flatnonzero(nfree >= alt.count):
        take = choose_whole(free_card[m], isl[m], alt.count, need_nvlink=alt.nvlink)
        if take is None:
            reason[m] = R_NVLINK
            continue
        cand_m.append(np.array([m]))
        cand_slot.append(np.array([int(np.sum(take * (1 << np.arange(len(take)))))], dtype=np.int64))
        cand_take.append(take[None, :])


def choose_whole(free: np.ndarray, island: np.ndarray, count: int, need_nvlink: bool) -> np.ndarray | None:
    """Pick ``count`` free cards, all in one NVLink island when possible.

    Among islands with enough free cards, the one with the fewest free cards
    wins (keeps big islands whole for big requests); without one, a
    ``need_nvlink`` request fails and others take the lowest indices. Cards no
    island lists (id -1) are grouped for the preference but are not linked, so
    they never satisfy ``need_nvlink``.
    """
    take = np.zeros(len(free), dtype=bool)
    best, best_free = None, None
    for k in np.unique(island[free]):
        if need_nvlink and k < 0:
            continue
        members = np.flatnonzero(free & (island == k))
        if len(members) >= count and (best_free is None or len(members) < best_free):
            best, best_free = members, len(members)
    if best is not None:
        take[best[:count]] = True
        return take
    if need_nvlink and count > 1:
        return None
    take[np.flatnonzero(free)[:count]] = True
    return take


def random_slot(st: SnapshotStatic, sid: int, alt: Alternative, rng: np.random.Generator, best: int) -> int:
    """A uniformly random slot among those that fit on state ``sid`` (the paper's Random GPU
    selection); whole-card sets have one candidate, so they keep ``best``."""
    if alt.kind not in (ShareKind.MPS, ShareKind.TIMESLICE):
        return best
    _, _, cs, _ = enumerate_slots(st, np.array([sid]), alt)
    return int(cs[int(rng.integers(len(cs)))]) if len(cs) else best
