"""The training holders' side of the simulated day: preemptible runs that train, checkpoint and lose work.

:class:`TrainingSide` is a part of :class:`~orchestrator.sim.dayrun.DayRun` and holds no state of its own:
it reads and writes the day's (set by ``DayRun.__init__``, annotated below) and asks the head through the
day's ``head``. What it models is described in :mod:`orchestrator.sim.dayrun` (**training runs**).

Invariants:

* a run asks for its lease once (``training`` class and queue, requeued on preemption by the head itself);
  every later attempt is the head's requeue, found again by the lease's ``owner``;
* ``train_speed`` is the summed ``speed`` of the runs whose phase is ``training``, kept by :meth:`_phase`,
  the only place a phase changes once a run has asked (besides ``refused``, set when admission refuses it);
* a run's work is brought up to date before every phase change, so GPU-time is counted at the speed it had;
* a checkpoint asked by the head is acknowledged (and counted) only while its lease is still ``CHECKPOINTING``,
  with that lease's fencing token; a lease stopped without one loses ``work - saved``, added to the tally's
  lost work, and the run's work goes back to ``saved``;
* a checkpoint request counts a preemption; a stop counts one only when no checkpoint was asked first.
"""

from __future__ import annotations

from typing import Any, Callable

from orchestrator.control.service import HeadService
from orchestrator.core.allocation import Allocation
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.lease import LeaseState
from orchestrator.sim.dayrecords import KEY, Run, SimParams, Tally, share_of


class TrainingSide:
    """The training runs' part of :class:`~orchestrator.sim.dayrun.DayRun`; see the module docstring."""

    # all set by DayRun.__init__
    head: HeadService
    p: SimParams
    digest: str
    runs: dict[str, Run]
    train_speed: float
    min_runtime_s: float
    grace_s: float
    changed: bool
    to_beat: set[str]
    tally: Tally
    _timer: Callable[..., None]  # DayRun's: (at, what, ident[, version])

    def _request_training(self, run: Run) -> None:
        try:
            self.head.request_lease({"lease_id": run.owner, "request": run.request, "owner": run.owner,
                                     "priority_class": "training", "queue": "training",
                                     "requester_digest": self.digest, "requeue_on_preempt": True,
                                     "checkpoint_dir": f"/ckpt/{run.owner}"})
        except InvalidRequestError:  # no card of this scheme's cluster could ever hold it: refused at admission
            run.phase = "refused"
        self.changed = True

    def _run_of(self, lid: str) -> Run | None:
        e = self.head.ctl.ledger.find(lid)
        return self.runs.get(e.spec.owner or "") if e is not None else None

    def _run_granted(self, run: Run, lid: str, a: Allocation, now: float) -> None:
        """An attempt of ``run`` was granted (and activated) on ``a``: it resumes, and may be a victim once its
        minimum runtime has passed."""
        run.lease_id, run.speed = lid, share_of(a).speed
        self._phase(run, "resuming", now)
        self._timer(now + self.p.resume_s, "run", run.owner, run.version)
        self._timer(now + self.min_runtime_s + 1e-3, "cycle", lid)

    # ---- a run's phases ------------------------------------------------------------------------------
    def _run_timer(self, run: Run, now: float) -> None:
        """``run``'s current timer is due: started up, a checkpoint written, or a periodic checkpoint to write."""
        if run.phase == "resuming":  # the first periodic checkpoint is staggered: runs never save all at once
            self._phase(run, "training", now)
            self._timer(now + self.p.checkpoint_every_s * (1 + run.offset), "run", run.owner, run.version)
        elif run.phase == "saving":
            run.saved = run.saving
            self._phase(run, "training", now)
            self._timer(now + self.p.checkpoint_every_s, "run", run.owner, run.version)
        elif run.phase == "training":  # a periodic checkpoint
            self._phase(run, "saving", now)
            run.saving = run.work
            self._timer(now + self.p.checkpoint_s, "run", run.owner, run.version)
        elif run.phase == "checkpointing" and run.lease_id:
            run.saved = run.saving
            e = self.head.ctl.ledger.get(run.lease_id)
            if e.lease.state is LeaseState.CHECKPOINTING:
                self.head.ack_preemption(run.lease_id, e.lease.fencing_token, f"/ckpt/{run.owner}/{run.saved:.0f}",
                                         key=KEY)
                self.tally.checkpoints += 1
                self._ended(run, e, now)

    def _accrue(self, run: Run, now: float) -> None:
        if run.phase == "training":
            run.work += run.speed * (now - run.since)
        run.since = now

    def _phase(self, run: Run, phase: str, now: float) -> None:
        """Move ``run`` to ``phase`` at ``now``: its work brought up to date, the summed speed kept, timers voided."""
        self._accrue(run, now)
        if run.phase == "training":
            self.train_speed -= run.speed
        if phase == "training":
            self.train_speed += run.speed
        run.phase = phase
        run.version += 1

    def _ended(self, run: Run, e: Any, now: float) -> None:
        """The run's lease ended: its node confirms the stop at its next beat; the run waits for its next attempt."""
        if e.lease.allocation is not None:
            self.to_beat.add(e.lease.allocation.node_name)
        self._phase(run, "waiting", now)
        run.lease_id, run.speed = None, 0.0
        self.changed = True


    # ---- preemption -----------------------------------------------------------------------------------
    def _checkpoint_asked(self, lid: str, now: float) -> None:
        """The head asked lease ``lid`` to checkpoint (a preemption or a MIG drain)."""
        run = self._run_of(lid)
        if run is not None and run.lease_id == lid:
            self.tally.preemptions += 1
            self._phase(run, "checkpointing", now)
            run.saving = max(run.work, run.saved)
            # nothing new since the last checkpoint: acknowledged at once, nothing to write
            self._timer(now + (self.p.checkpoint_s if run.work > run.saved else 0.0), "run", run.owner,
                        run.version)
            self._timer(now + self.grace_s + 1e-3, "cycle", lid)  # past it, the head stops the run

    def _stopped(self, lid: str, now: float) -> None:
        """The head stopped lease ``lid`` without (or past the grace of) a checkpoint: the work since the last
        one is lost."""
        run = self._run_of(lid)
        if run is not None and run.lease_id == lid:
            if run.phase != "checkpointing":
                self.tally.preemptions += 1
            self._accrue(run, now)
            self.tally.lost_work += run.work - run.saved
            run.work = run.saved
            self._ended(run, self.head.ctl.ledger.get(lid), now)
