"""The memo tables FGD and our ``default`` policy (:mod:`.fgd`) score nodes from: frag states interned per
GPU state, the frag state after each alternative, and the fragmentation of each frag state at each CPU and
memory level, filled lazily.

Invariant: the tables live in the snapshot family's cache
(:meth:`~orchestrator.scheduling.snapshot.SnapshotStatic.cache`, one per policy key) and every entry is a
pure function of its key, so they only ever save work; they never change an answer.
"""

from __future__ import annotations

import numpy as np

from orchestrator.core.request import Alternative
from orchestrator.scheduling.candidates import alt_key, state_free, state_free_after
from orchestrator.scheduling.fragmentation import FragModel
from orchestrator.scheduling.snapshot import ClusterSnapshot, SnapshotStatic, StateColumn


class FragTables:
    """FGD's memo for one family of snapshots (kept in the family's cache, one per policy key).

    * A *frag state* is what fragmentation depends on in a GPU state: the
      model and the multiset of free milli per GPU (sorted; absent and
      unhealthy GPUs count 0). Many GPU states share one; ids are interned.
    * ``of_state[sid]``: the frag state of interned GPU state ``sid`` (-1: not yet).
    * ``after[alt][sid]``: the frag state after ``alt`` takes the slot the
      engine chose on ``sid`` (-1: not yet).
    * ``frag[f, level]``: the fragmentation of frag state ``f`` at a CPU/memory
      level, filled lazily (NaN: not yet).

    Every entry is a pure function of its key, so the tables only ever save
    work; they never change an answer.
    """

    def __init__(self, fm: FragModel, st: SnapshotStatic) -> None:
        self.fm = fm
        self.st = st
        self.ids: dict[bytes, int] = {}
        self.n = 0
        self.total = np.zeros(64)
        self.supply = np.zeros((64, len(fm.shapes)))
        self.frag = np.full((64, len(fm.plev)), np.nan)
        self.of_state = StateColumn(-1, np.int64)
        self.after: dict[tuple, StateColumn] = {}
        self.n_levels = len(fm.plev)
        self._last: tuple | None = None  # (gstate, cpu_used, mem_used, frag) of the last snapshot seen
        # Level lookup tables: free CPU (memory) // q -> level index, q the gcd of the thresholds.
        self._lut_c = self._lut(fm.cpu_thr, int(st.cpu_total.max(initial=0)), fm.nm)
        self._lut_m = self._lut(fm.mem_thr, int(st.mem_total.max(initial=0)), 1) if fm.with_memory else None

    @staticmethod
    def _lut(thr: np.ndarray, top: int, scale: int) -> tuple[int, np.ndarray] | None:
        """(q, table): the level index (times ``scale``) of a free amount x is ``table[x // q]``,
        q the gcd of the thresholds (a small table stays in cache; a division is cheaper than
        a cache miss). None: too fine a grid (searchsorted instead)."""
        q = (int(np.gcd.reduce(thr)) if len(thr) else 1) or 1
        if top // q >= 1 << 22:
            return None
        return q, (np.searchsorted(thr, np.arange(top // q + 1) * q, side="right") * scale).astype(np.int32)

    def levels(self, cpu_free: np.ndarray, mem_free: np.ndarray) -> np.ndarray:
        """:meth:`FragModel.levels` through the lookup tables (the model's own search when a grid
        is too fine for one)."""
        fm = self.fm
        if self._lut_c is None or (fm.with_memory and self._lut_m is None):
            return fm.levels(cpu_free, mem_free)
        q, lut = self._lut_c
        lc = lut[cpu_free // q if q > 1 else cpu_free]
        if not fm.with_memory:
            return fm.level_of[lc + (fm.nm - 1)]
        q, lut = self._lut_m
        return fm.level_of[lc + lut[mem_free // q if q > 1 else mem_free]]

    # -- frag states ---------------------------------------------------------------------------------
    def intern(self, free: np.ndarray, model: np.ndarray) -> np.ndarray:
        """Frag-state ids of K rows of free milli (K, G) on models (K,)."""
        rows = np.empty((len(free), free.shape[1] + 1), dtype=np.int32)
        rows[:, 0] = model
        rows[:, 1:] = np.sort(free, axis=1)
        raw, w = rows.tobytes(), rows.shape[1] * 4
        keys = [raw[i:i + w] for i in range(0, len(raw), w)]
        get = self.ids.get
        out = [get(k) for k in keys]
        if None in out:
            new: list[int] = []
            for k, key in enumerate(keys):
                if out[k] is None:
                    f = self.ids.get(key)
                    if f is None:
                        f = self.ids[key] = self.n + len(new)
                        new.append(k)
                    out[k] = f
            need = self.n + len(new)
            if need > len(self.total):
                cap = max(need, 2 * len(self.total))
                self.total = np.concatenate([self.total, np.zeros(cap - len(self.total))])
                self.supply = np.concatenate([self.supply, np.zeros((cap - len(self.supply), self.supply.shape[1]))])
                self.frag = np.concatenate([self.frag, np.full((cap - len(self.frag), self.n_levels), np.nan)])
            sel = rows[np.asarray(new)]
            self.total[self.n:need], self.supply[self.n:need] = self.fm.supply(sel[:, 1:], sel[:, 0])
            self.n = need
        return np.asarray(out, dtype=np.int64)

    def states(self, sids: np.ndarray) -> np.ndarray:
        """Frag states of GPU states ``sids``."""
        of_state = self.of_state.at_least(self.st.n_states)
        f = of_state[sids]
        miss = f < 0
        if miss.any():
            ids = np.unique(sids[miss])
            of_state[ids] = self.intern(state_free(self.st, ids), self.st.model[self.st.rep_node[ids]])
            f = of_state[sids]
        return f

    def after_table(self, alt: Alternative) -> np.ndarray:
        """``after[alt]``, grown to the number of interned GPU states."""
        key = alt_key(alt)
        col = self.after.get(key)
        if col is None:
            col = self.after[key] = StateColumn(-1, np.int64)
        return col.at_least(self.st.n_states)

    def states_after(self, alt: Alternative, sids: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """Frag states after ``alt`` takes ``slots`` on GPU states ``sids`` (normally already
        known from :meth:`~orchestrator.scheduling.fgd.FgdPolicy.remember_best`; derived from the slot otherwise)."""
        a = self.after_table(alt)
        f = a[sids]
        if len(f) and f.min() < 0:
            miss = f < 0
            ids, first = np.unique(sids[miss], return_index=True)
            free = state_free_after(self.st, ids, slots[miss][first], alt)
            a[ids] = self.intern(free, self.st.model[self.st.rep_node[ids]])
            f = a[sids]
        return f

    def current(self, snap: ClusterSnapshot) -> np.ndarray:
        """(N,) every node's fragmentation in ``snap``.

        Kept from the last snapshot asked about and recomputed only where a
        node's GPU state, CPU or memory differs (values are compared, so any
        order of snapshots is fine): a placement changes one node."""
        st = snap.static
        last = self._last
        if last is not None and last[0] is snap.gstate and last[1] is snap.cpu_used and last[2] is snap.mem_used:
            return last[3]
        if last is None:
            nodes = np.arange(st.n)
            frag = np.empty(st.n)
        else:
            nodes = np.flatnonzero((snap.gstate != last[0]) | (snap.cpu_used != last[1]) | (snap.mem_used != last[2]))
            frag = last[3] if len(nodes) < st.n // 8 else last[3].copy()
        if len(nodes):
            frag[nodes] = self.lookup(self.states(snap.gstate[nodes]),
                                      self.levels(st.cpu_total[nodes] - snap.cpu_used[nodes],
                                                  st.mem_total[nodes] - snap.mem_used[nodes]))
        self._last = (snap.gstate, snap.cpu_used, snap.mem_used, frag)
        return frag

    def lookup(self, f: np.ndarray, level: np.ndarray) -> np.ndarray:
        """Fragmentation of frag states ``f`` at ``level`` (filling missing entries)."""
        flat = f * self.n_levels + level
        v = self.frag.reshape(-1)[flat]
        if np.isnan(v.sum()):
            miss = np.isnan(v)
            fm, lm = f[miss], level[miss]
            v[miss] = self.fm.combine(self.total[fm], self.supply[fm], lm)
            self.frag.reshape(-1)[flat[miss]] = v[miss]
        return v
