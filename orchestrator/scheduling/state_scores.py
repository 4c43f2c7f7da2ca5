"""The placement engine's memo of interned GPU states: per (policy, alternative), each state's best slot and score.

Step 3 of :mod:`.engine` ("score states, not nodes"): every node's GPU state is interned
(``snapshot.gstate``); for each distinct state not seen before with this (policy, alternative), the
candidate slots are enumerated (:func:`~.candidates.enumerate_slots`), their before/after rows built and
the policy asked for a score; the best slot of each state is kept in a :class:`StateTable`, which lives in
the snapshot family's cache (key ``("engine", policy.key, alt_key)``).

Invariant: a table's row for a state is a pure function of the family's static part, the state's bytes, the
policy and the alternative, so keeping it never changes an answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from orchestrator.core.request import Alternative
from orchestrator.scheduling.candidates import CandidateView, enumerate_slots, rows_after, state_rows
from orchestrator.scheduling.policy import PlacementPolicy
from orchestrator.scheduling.snapshot_static import SnapshotStatic, StateColumn

INF = np.inf


@dataclass(slots=True)
class StateTable:
    """Memo of (policy, alternative) over interned states: best score, best slot, reason code."""

    score: StateColumn = field(default_factory=lambda: StateColumn(INF, np.float64))
    slot: StateColumn = field(default_factory=lambda: StateColumn(-1, np.int64))
    reason: StateColumn = field(default_factory=lambda: StateColumn(0, np.int16))
    done: StateColumn = field(default_factory=lambda: StateColumn(False, bool))
    upto: int = 0  # every state id below this one is done

    def grow(self, n: int) -> None:
        for col in (self.score, self.slot, self.reason, self.done):
            col.at_least(n)


# A fresh family of snapshots (or a new alternative) with more unscored states than this
# scores only the states its nodes are in; fewer are scored all at once, by id range.
RANGE_SCORING = 512


def ensure_scored(st: SnapshotStatic, states: np.ndarray, alt: Alternative, policy: PlacementPolicy,
                   table: StateTable) -> None:
    """Make sure every state in ``states`` has its (policy, alternative) memo.

    Ids are handed out in order, so the states created since this table was
    last brought up to date are an id range: a request usually finds one or
    two, and scoring them all skips a lookup over every node."""
    n = st.n_states
    table.grow(n)
    if table.upto == n:
        return
    done = table.done.values
    if n - table.upto <= RANGE_SCORING:
        ids = np.arange(table.upto, n)
        ids = ids[~done[ids]]
        table.upto = n
    else:
        missing = states[~done[states]]
        ids = np.unique(missing) if len(missing) else missing
    if len(ids):
        score_states(st, ids, alt, policy, table)


def score_states(st: SnapshotStatic, ids: np.ndarray, alt: Alternative, policy: PlacementPolicy,
                  table: StateTable) -> None:
    """Fill ``table`` for the given new state ids (vectorised over them)."""
    before = state_rows(st, ids)
    reason, cm, cs, ct = enumerate_slots(st, ids, alt, before)
    score, slot, codes = table.score.values, table.slot.values, table.reason.values
    table.done.values[ids] = True
    score[ids] = INF
    codes[ids] = reason
    if not len(cm):
        return
    reps = st.rep_node[ids]
    model = st.model[reps][cm]
    gmem = st.gpu_memory[reps][cm]
    b = {f: a[cm] for f, a in before.items()}
    view = CandidateView(state=ids[cm], slot=cs, take=ct, present=st.present[reps][cm], model=model, gpu_memory=gmem,
                         island=st.island[reps][cm], before=b, after=rows_after(b, ct, cs, alt, gmem, model),
                         timeslice_capacity_milli=st.timeslice_capacity_milli, static=st)
    sc = np.asarray(policy.gpu_score(view, alt), dtype=np.float64)
    # Best per state: lowest score, then lowest slot (deterministic).
    order = np.lexsort((cs, sc, cm))
    cm_o = cm[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = cm_o[1:] != cm_o[:-1]
    win = order[first]
    score[ids[cm[win]]] = 0.0 if policy.capabilities.slot_rank_only else sc[win]
    slot[ids[cm[win]]] = cs[win]
    codes[ids[cm[win]]] = 0
    policy.remember_best(view, alt, win)
