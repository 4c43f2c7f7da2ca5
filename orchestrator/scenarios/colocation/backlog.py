"""The co-location day's training backlog: lease-holding ``TrainingActor`` runs (``jobs/train.py``,
``requeue=True``) that train for the whole replay, paced at the workload model's speed on the share they
hold (:mod:`orchestrator.sim.perfmodel`); a preempted run checkpoints, waits in the queue and resumes from
its checkpoint. The bookkeeping (attempts, checkpoints, steps lost) is what the day's figures count.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.core.api import HeadApi
from orchestrator.core.errors import LeaseTimeoutError
from orchestrator.rayport import ray_api
from orchestrator.scenarios.actors import load_train
from orchestrator.scenarios.colocation.schemes import DAY_S, OPEN_ENDED, Say, TrainingJob
from orchestrator.sdk.leases import LeaseHandle, lease
from orchestrator.sim.perfmodel import ShareSpeed, TrainingModel

@dataclass
class _Attempt:
    lease_id: str
    kind: str
    card_share: float
    step_time_s: float
    resumed_at: int
    pid: int
    last_step: int
    started_at: float


@dataclass
class _Run:
    job: TrainingJob
    attempts: list[_Attempt] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)  # the step each preemption's checkpoint holds
    waiting_since: float | None = None
    error: str | None = None
    lease: LeaseHandle | None = None


class TrainingBacklog:
    """Training runs that hold leases for the whole replay and resume from their checkpoints after preemption."""

    def __init__(self, head: HeadApi, namespace: str, workdir: Path, jobs: tuple[TrainingJob, ...],
                 model: TrainingModel, say: Say) -> None:
        self.head, self.namespace, self.workdir, self.model, self.say = head, namespace, workdir, model, say
        self.train = load_train()
        self.cls = ray_api.remote_class(self.train.TrainingActor, by_value=self.train)
        self.runs = [_Run(j) for j in jobs]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self, settle_s: float = 60.0) -> None:
        """Ask for the runs' leases one after another, in the order given (the biggest first, so the cluster
        fills as planned rather than as the threads race); each run's actor starts on its own thread."""
        for run in self.runs:
            t = threading.Thread(target=self._train, args=(run,), name=f"train-{run.job.seed}", daemon=True)
            t.start()
            self._threads.append(t)
            deadline = time.monotonic() + settle_s
            while time.monotonic() < deadline and not run.error and run.lease is None:
                try:
                    if self.head.get_lease(f"train-{run.job.seed}")["state"] in ("pending", "granted", "active"):
                        break
                except Exception:
                    pass  # not requested yet
                time.sleep(0.05)

    def steps(self) -> int:
        """Steps trained so far, across attempts, not counting steps trained again after a resume."""
        with self._lock:
            return sum(self._run_steps(r) for r in self.runs)

    @staticmethod
    def _run_steps(r: _Run) -> int:
        if not r.attempts:
            return 0
        return r.attempts[-1].last_step  # every resume starts from a checkpoint: the last step is the progress

    def lost_steps(self) -> int:
        """Steps trained past the checkpoint a run resumed from (work done twice)."""
        lost = 0
        with self._lock:
            for r in self.runs:
                for prev, nxt in zip(r.attempts, r.attempts[1:]):
                    lost += max(0, prev.last_step - nxt.resumed_at)
        return lost

    def preemptions(self) -> int:
        """Attempts that ended before the replay did: each was preempted (or drained) and resumed, or waits."""
        with self._lock:
            return sum(len(r.attempts) - 1 + (r.waiting_since is not None) for r in self.runs if r.attempts)

    def checkpoints(self) -> int:
        with self._lock:
            return sum(len(r.checkpoints) for r in self.runs)

    def holding(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"seed": r.job.seed, "kind": r.attempts[-1].kind, "share": r.attempts[-1].card_share}
                    for r in self.runs if r.attempts and r.lease is not None and r.waiting_since is None]

    def _train(self, run: _Run) -> None:
        """Lease sessions, one after another: a session ends when the replay stops, or when its lease is
        lost (its node's agent fell silent past the TTL on a starved machine): the run then asks afresh and
        resumes from its last checkpoint, and what it trained since counts as lost."""
        ck = self.workdir / f"train-{run.job.seed}"
        resume_from: str | None = None
        for session in range(1, 100):
            lid = f"train-{run.job.seed}" if session == 1 else f"train-{run.job.seed}.s{session}"
            try:
                with lease(run.job.request, priority="training", queue="training", requeue=True,
                           checkpoint_dir=str(ck), head=self.head, namespace=self.namespace,
                           owner=f"colocation:train-{run.job.seed}", lease_id=lid, timeout=DAY_S) as first:
                    self._session(run, first, resume_from)
                    return
            except Exception as e:
                if self._stop.is_set():
                    return
                if "lost" not in str(e):  # reported in the figures; the replay goes on
                    run.error = f"{type(e).__name__}: {e}"
                    self.say(f"train-{run.job.seed}: {run.error}")
                    return
                last = ck / "checkpoint.pt"
                resume_from = str(last) if last.exists() else None
                self.say(f"train-{run.job.seed}: lease lost ({e}); asking again, to resume from "
                         f"{'its last checkpoint' if resume_from else 'scratch'}")

    def _session(self, run: _Run, first: LeaseHandle, resume_from: str | None) -> None:
        gone = ray_api.actor_gone_errors()
        le: LeaseHandle | None = first
        while le is not None and not self._stop.is_set():
            run.lease, run.waiting_since = le, None
            share = ShareSpeed.of_env(le.env)
            step_time = self.model.step_time_s(share)
            actor = self.cls.options(**le.actor_options(max_concurrency=4, num_cpus=0)).remote(
                OPEN_ENDED, seed=run.job.seed, resume_from=resume_from, step_delay_s=step_time, paced=True)
            st = ray_api.get(actor.status.remote(), timeout=180)
            att = _Attempt(le.lease_id, share.kind, share.card_share, step_time, st["resumed_at"], st["pid"],
                           st["step"], time.monotonic())
            with self._lock:
                run.attempts.append(att)
            self.say(f"train-{run.job.seed}: {le.lease_id} on {share.kind} ({share.card_share:.2f} card) "
                     f"from step {att.resumed_at}, {step_time * 1000:.0f} ms/step")
            while not self._stop.wait(0.5):  # 7 runs polled: keep the driver's calls off the serving path's CPU
                try:
                    st = ray_api.get(actor.status.remote(), timeout=10)
                except gone:
                    break  # stopped by its agent: after its checkpoint, at its deadline, or its lease lost
                with self._lock:
                    att.last_step = st["step"]
            if self._stop.is_set():
                try:
                    att.last_step = ray_api.get(actor.status.remote(), timeout=10)["step"]
                except Exception:
                    pass  # the replay is over; the last step seen stands
                ray_api.kill(actor)
                return
            run.waiting_since, run.lease = time.monotonic(), None
            path = le.refresh().get("checkpoint_path")
            meta = Path(str(path) + ".meta.json") if path else None
            if meta is not None and meta.exists():
                step = json.loads(meta.read_text())["step"]
                with self._lock:
                    att.last_step = max(att.last_step, step)
                    run.checkpoints.append(step)
            le = self._wait_resumed(le)
            resume_from = le.resume_from if le is not None else None

    def _wait_resumed(self, le: LeaseHandle) -> LeaseHandle | None:
        while not self._stop.is_set():
            try:
                return le.wait_resumed(2.0)
            except LeaseTimeoutError:
                continue  # still queued (the day's window, or no room yet): ask again, or stop
        return None

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)
