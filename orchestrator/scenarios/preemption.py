"""The preemption scenario of ``make demo`` and ``bench/preemption.py``, on a real local cluster.

Training fills the demo cluster's eight whole cards (jobs of 4, 2 and 2
cards); then, ``rounds`` times, an inference job that needs one card
arrives. The head preempts the minimal set of training -- one job -- which
checkpoints, yields, and resumes when the inference job leaves. At the end
every training job must have weights bit-identical to an undisturbed run.

``mode="kubernetes"`` plays the same scenario the way Kubernetes would: the
training runs as a class that is killed without notice (``batch``: no
checkpoint request) and restarts from its last *periodic* checkpoint, so the
steps since that checkpoint are lost.

Figures (all from the head's own records and the jobs' logs):

* ``decision_to_grant``: from the victim's lease entering CHECKPOINTING (or
  PREEMPTED, for kill-without-notice) to the inference lease being GRANTED;
* ``checkpoint_s``: the victim's own time to write its checkpoint (its log);
* ``orchestration_overhead``: decision-to-grant minus the checkpoint write;
* ``work_lost_steps``: steps the victim had done that its next attempt redid
  (last step logged by attempt k minus the step attempt k+1 resumed at).

This module is the client side: it talks to the head through
:class:`~orchestrator.rayport.client.HeadClient` and reads per-attempt logs
from Ray's job API; the cluster itself is started and stopped by the caller.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from orchestrator.core import datafiles, env
from orchestrator.core.api import HeadApi
from orchestrator.core.job import JobSpec
from orchestrator.core.request import GpuRequest
from orchestrator.core.stats import rounded_quantile as pct

TRAIN = datafiles.job_script("train.py")
INFERENCE = datafiles.job_script("inference.py")
TERMINAL = {"succeeded", "failed", "cancelled"}
_STEP = re.compile(r"^step (\d+) ", re.M)
_CKPT = re.compile(r"checkpointed at step (\d+) to \S+ in ([0-9.]+)s")
_RESUMED = re.compile(r"resumed from \S+ at step (\d+)")


@dataclass(frozen=True)
class ScenarioConfig:
    rounds: int = 1
    steps: int = 400
    step_delay_s: float = 0.03
    inference_s: float = 2.0
    mode: Literal["orchestrator", "kubernetes"] = "orchestrator"
    checkpoint_every: int = 50  # periodic checkpoints, kubernetes mode only
    training: tuple[tuple[int, int], ...] = ((1, 4), (2, 2), (3, 2))  # (seed, whole cards)
    settle_s: float = 2.0  # let training pass its minimum runtime before each arrival
    poll_s: float = 0.1
    report_inference: bool = False  # the inference job serves jobs/inference.py and reports its latencies
    inference_slo_ms: float = 50.0


@dataclass
class Preemption:
    victim: str
    attempt: int
    inference: str
    decision_to_grant_s: float
    checkpoint_s: float | None
    lost_steps: int | None


@dataclass
class ScenarioResult:
    mode: str
    preemptions: list[Preemption] = field(default_factory=list)
    digests_equal: bool | None = None
    wall_s: float = 0.0
    training_jobs: dict[str, str] = field(default_factory=dict)

    def figures(self) -> dict[str, Any]:
        d2g = [p.decision_to_grant_s for p in self.preemptions]
        ck = [p.checkpoint_s for p in self.preemptions if p.checkpoint_s is not None]
        over = [p.decision_to_grant_s - (p.checkpoint_s or 0.0) for p in self.preemptions]
        lost = [p.lost_steps for p in self.preemptions if p.lost_steps is not None]

        return {
            "mode": self.mode, "preemptions": len(self.preemptions),
            "decision_to_grant_p50_s": pct(d2g, 0.5), "decision_to_grant_p99_s": pct(d2g, 0.99),
            "orchestration_overhead_p50_s": pct(over, 0.5), "orchestration_overhead_p99_s": pct(over, 0.99),
            "checkpoint_s_median": pct(ck, 0.5),
            "work_lost_steps": int(sum(lost)) if lost else 0,
            "work_lost_steps_per_preemption": round(sum(lost) / len(lost), 2) if lost else 0.0,
            "resumed_bit_identical": self.digests_equal, "wall_s": round(self.wall_s, 1),
        }


class Scenario:
    """Runs one scenario against a running head; ``say`` receives one line per decision or event."""

    def __init__(self, head: HeadApi, workdir: Path, cfg: ScenarioConfig, say: Callable[[str], None] = print) -> None:
        self.head, self.cfg, self.workdir, self.say = head, cfg, Path(workdir), say
        self._seen: dict[str, int] = {}
        self.t0 = time.monotonic()

    # ---- the script -----------------------------------------------------------------------------
    def run(self) -> ScenarioResult:
        cfg = self.cfg
        res = ScenarioResult(cfg.mode)
        trainings: dict[str, tuple[int, Path]] = {}
        cls = "training" if cfg.mode == "orchestrator" else "batch"
        for seed, cards in cfg.training:
            ck = self.workdir / f"{cfg.mode}-train-{seed}"
            every = f" --checkpoint-every {cfg.checkpoint_every}" if cfg.mode == "kubernetes" else ""
            spec = JobSpec(name=f"train-{seed}", gpu=GpuRequest.whole(cards), priority=cls, checkpoint_dir=str(ck),
                           entrypoint=(f"{sys.executable} {TRAIN} --steps {cfg.steps} --seed {seed} "
                                       f"--step-delay {cfg.step_delay_s} --log-every 1{every}"),
                           runtime_env={"env_vars": {env.POLL_S: str(cfg.poll_s)}})
            job = self.head.submit_job(spec.model_dump(mode="json"))
            trainings[job["job_id"]] = (seed, ck)
            self.say(f"submitted {job['job_id']}: {cards} card(s), class {cls}")
        res.training_jobs = {j: str(ck) for j, (_, ck) in trainings.items()}
        for j in trainings:
            self._wait(j, {"running"})
        self.say(f"all {len(trainings)} training jobs running: every whole card is busy")
        for r in range(cfg.rounds):
            # Inference arrives while training is really training (past its start-up and minimum runtime), and well
            # before it ends: the wait for a logged step has a budget (a third of a job's stepping time), since the
            # logs come through Ray's job API, which a busy machine makes slow while the jobs go on stepping.
            budget = time.monotonic() + max(3.0, cfg.steps * cfg.step_delay_s / 3)
            for j in trainings:
                self._wait_stepping(j, until=budget)
            time.sleep(cfg.settle_s)
            res.preemptions.extend(self._round(r, trainings))
        for j in trainings:
            self._wait(j, TERMINAL, timeout=60 + cfg.steps * cfg.step_delay_s * 4)
        res.digests_equal = self._digests_equal(trainings)
        res.wall_s = time.monotonic() - self.t0
        return res

    def _round(self, r: int, trainings: dict[str, tuple[int, Path]]) -> list[Preemption]:
        cfg = self.cfg
        attempts = {j: self.head.get_job(j)["attempt"] for j in trainings}
        if cfg.report_inference:  # real requests, their latencies reported to the head's metrics (the page's curves)
            entry = (f"{sys.executable} {INFERENCE} --duration {cfg.inference_s} --report-every 0.5 "
                     f"--width 128 --slo-ms {cfg.inference_slo_ms}")
        else:
            entry = (f"{sys.executable} -c \"import os, time; time.sleep({cfg.inference_s}); "
                     f"print('served on', os.environ.get('CUDA_VISIBLE_DEVICES'))\"")
        spec = JobSpec(name=f"serve-{r + 1}", gpu=GpuRequest.whole(1), priority="inference", entrypoint=entry,
                       runtime_env={"env_vars": {env.POLL_S: str(cfg.poll_s)}})
        inf = self.head.submit_job(spec.model_dump(mode="json"))["job_id"]
        self.say(f"round {r + 1}: inference {inf} arrives and needs one whole card")
        self._wait(inf, {"running", "succeeded"})
        out = []
        for j in trainings:
            job = self.head.get_job(j)
            if job["attempt"] == attempts[j]:
                continue
            old = attempts[j]
            victim_lease = self.head.get_lease(f"{j}.a{old}")
            decided = next(t["at"] for t in victim_lease["history"] if t["state"] in ("checkpointing", "preempted"))
            inf_lease = self.head.get_lease(self.head.get_job(inf)["lease_id"])
            granted = next(t["at"] for t in inf_lease["history"] if t["state"] == "granted")
            logs_old = self._attempt_logs(j, old)
            m = _CKPT.search(logs_old)
            out.append(Preemption(j, old, inf, granted - decided, float(m.group(2)) if m else None, None))
        self._wait(inf, {"succeeded"})
        self.say(f"round {r + 1}: {inf} finished; the card goes back to training")
        for p in out:
            self._wait(p.victim, {"running", "succeeded"})
            p.lost_steps = self._lost_steps(p.victim, p.attempt)
        return out

    # ---- measurements ---------------------------------------------------------------------------
    def _attempt_logs(self, job_id: str, attempt: int, wait_s: float = 10.0) -> str:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return self.head.job_logs(job_id, attempt)  # each attempt's own Ray job
            except Exception:
                if time.monotonic() > deadline:
                    return ""
                time.sleep(0.2)

    def _wait_stepping(self, job_id: str, until: float) -> None:
        """Until the job's current attempt has logged a training step, the job has ended, or ``until`` (monotonic
        time) has come with the job running: then it is training as far as anyone can tell in time."""
        while True:
            self.narrate()
            job = self.head.get_job(job_id)
            if job["state"] in TERMINAL:
                return
            if job["state"] == "running" and (time.monotonic() >= until or _STEP.search(
                    self._attempt_logs(job_id, job["attempt"], wait_s=0))):
                return
            if time.monotonic() >= until + 120.0:
                raise TimeoutError(f"{job_id} was not running 120 s after its budget")
            time.sleep(0.3)

    def _lost_steps(self, job_id: str, attempt: int) -> int | None:
        old = self._attempt_logs(job_id, attempt)
        steps = [int(s) for s in _STEP.findall(old)]
        ck = _CKPT.search(old)
        last = max(steps + ([int(ck.group(1))] if ck else []), default=0)
        deadline = time.monotonic() + 60
        while True:
            new = self._attempt_logs(job_id, attempt + 1)
            m = _RESUMED.search(new)
            if m:
                return max(0, last - int(m.group(1)))
            if _STEP.search(new):  # restarted from scratch: everything is lost
                return last
            if time.monotonic() > deadline:
                return None
            time.sleep(0.3)

    def _digests_equal(self, trainings: dict[str, tuple[int, Path]]) -> bool:
        import json

        sys.path.insert(0, str(TRAIN.parent))
        try:
            import train  # noqa: PLC0415 - the example job, imported for its reference run
        finally:
            sys.path.pop(0)
        ok = True
        for j, (seed, ck) in trainings.items():
            result_file = ck / "result.json"
            if not result_file.exists():
                self.say(f"{j}: no result (state {self.head.get_job(j)['state']})")
                ok = False
                continue
            got = json.loads(result_file.read_text())
            ref = train.run(self.cfg.steps, seed=seed, log=lambda s: None)
            same = got["digest"] == ref["digest"]
            self.say(f"{j}: {got['step']} steps, weights {'bit-identical to' if same else 'DIFFER from'} an undisturbed run")
            ok &= same
        return ok

    # ---- waiting, and narrating every decision --------------------------------------------------
    def _wait(self, job_id: str, states: set[str], timeout: float = 180.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            self.narrate()
            job = self.head.get_job(job_id)
            if job["state"] in states:
                return job
            if job["state"] in TERMINAL:
                raise RuntimeError(f"{job_id} ended {job['state']}: {job['message']}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{job_id} still {job['state']} after {timeout:.0f}s: "
                                   f"{self.head.explain_job(job_id)['summary']}")
            time.sleep(0.2)

    def narrate(self) -> None:
        """Say every job transition not said yet, with the head's reason for it."""
        for job in self.head.list_jobs():
            hist = job["history"]
            for t in hist[self._seen.get(job["job_id"], 0):]:
                self.say(f"{job['job_id']:<12} -> {t['state']:<10} {t['reason']}")
            self._seen[job["job_id"]] = len(hist)
