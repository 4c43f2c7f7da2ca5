"""Decisions: pure functions from an immutable cluster snapshot to a plan.

What lives here: the ranking of a request's alternatives (:mod:`.alternatives`);
the snapshot (:mod:`.snapshot`, its static part in :mod:`.snapshot_static`) and the one definition of
what fits on a GPU and what a placement changes there (:mod:`.gpufit`); the
placement engine (:mod:`.engine`), the candidate slots it scores
(:mod:`.candidates`) and its contract with policies (:mod:`.policy`); the
policies (:mod:`.policies`, and FGD's in :mod:`.fgd`, its memo tables in :mod:`.frag_tables`, over the paper's maths in
:mod:`.fragmentation`, scored against :mod:`.workloads`); the preemption
planner (:mod:`.preemption`), refusals before queueing (:mod:`.admission`)
and the scheduling cycle that joins them (:mod:`.cycle`).  Every decision
carries a :class:`~orchestrator.core.reasons.Reason`.

Invariants: may import only :mod:`orchestrator.core` and numpy (checked by
import-linter), with no import circle inside the package. Nothing here performs I/O,
reads the clock, or knows that Ray exists; the simulator and the head run the
same code.
"""
