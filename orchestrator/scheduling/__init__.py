"""Decisions: pure functions from an immutable cluster snapshot to a plan.

What lives here: the snapshot (:mod:`.snapshot`), the placement engine
(:mod:`.engine`) and its policies (:mod:`.policies`, :mod:`.fgd`), the target
workload distribution FGD scores against (:mod:`.workloads`), the preemption
planner (:mod:`.preemption`), quota admission (:mod:`.admission`) and the
scheduling cycle that joins them (:mod:`.cycle`).  Every decision carries a
:class:`~orchestrator.core.reasons.Reason`.

May import: :mod:`orchestrator.core` and numpy.  Nothing here performs I/O,
reads the clock, or knows that Ray exists; the simulator and the head run the
same code.
"""
