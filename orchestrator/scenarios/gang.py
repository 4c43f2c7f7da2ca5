"""The preemption scenario with a *gang* holder (``orchestrator demo --holder gang``): Ray Train on a gang lease.

Two inference leases hold h100-0 and two cards of a100-0, so a ``2x2`` gang
(two Train workers of two whole cards each) can only span a100-0 and a100-1;
then no whole card is free. ``rounds`` times, an inference lease needs one
whole card: the head takes the gang -- every worker at once, one victim --
and asks it to checkpoint. The driver (this scenario, as a user's driver
would) sees :meth:`GangHandle.preemption_requested`, tells the run to stop
(``jobs/train_gang.py``'s stop file: every rank stops at the same step
boundary and rank 0 reports a Ray Train ``Checkpoint``), acknowledges with
that checkpoint's path, and the cards go to inference. When inference
leaves, the gang, requeued, is granted again (possibly on other nodes) and a
new ``TorchTrainer`` resumes from the checkpoint. After the last round the
run trains ``steps`` more and must end with weights bit-identical to an
undisturbed ``TorchTrainer`` run of the same length.

Figures, with the names of the job and actor scenarios (:mod:`.preemption`,
:mod:`.actors`):

* ``decision_to_grant_p50_s``/``_p99_s``: from the head's decision (the
  gang's leases enter ``checkpointing``) to the inference lease's grant;
* ``checkpoint_s_median``: rank 0's checkpoint write and Ray Train's
  ``report`` of it (persisted to the run's storage when it returns);
* ``orchestration_overhead_p50_s``/``_p99_s``: decision to grant less that
  checkpoint time. For a gang this includes Ray Train's own stop: the step
  in flight, the all-reduce that agrees on stopping, and ``fit`` returning
  after the worker group is shut down -- a Ray Train run cannot hand its
  cards on before its workers have left them;
* ``work_lost_steps``: steps trained past the checkpoint a run resumed from
  (each resumed worker logs the step it loaded);
* ``resumed_bit_identical``: the final weights equal the undisturbed run's;
* ``trainer_start_s_median``: from a grant to the first step of the new
  ``TorchTrainer`` (Ray Train's controller and workers starting; not part
  of the orchestration overhead, reported so that it is not hidden).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from orchestrator.core import datafiles
from orchestrator.core.api import HeadApi
from orchestrator.core.extras import require
from orchestrator.core.request import GpuRequest
from orchestrator.core.stats import rounded_quantile as pct
from orchestrator.scenarios.actors import load_example
from orchestrator.sdk.leases import GangHandle, gang_lease, lease

TRAIN_GANG = datafiles.job_script("train_gang.py")
OPEN_ENDED = 10**9


def load_train_gang() -> Any:
    """``jobs/train_gang.py`` as a module Ray ships to its workers by value (an example, not a package)."""
    from orchestrator.rayport import ray_api

    mod = load_example(TRAIN_GANG, "rgo_example_train_gang")
    ray_api.ship_by_value(mod)
    return mod


@dataclass(frozen=True)
class GangScenarioConfig:
    rounds: int = 1
    steps: int = 200  # trained after the last round
    step_sleep_s: float = 0.02
    inference_s: float = 2.0
    gang: str = "2x2"
    #: inference leases that leave the gang no room but across two nodes, and no whole card free once it runs
    blockers: tuple[tuple[int, str], ...] = ((2, "h100-0"), (2, "a100-0"))
    settle_steps: int = 20  # steps each attempt trains before the next inference arrives


@dataclass
class GangRound:
    victim_leases: list[str]
    inference_lease: str
    decided_at: float
    granted_at: float
    checkpoint_s: float | None
    checkpoint_step: int
    resumed_at: int | None = None
    nodes_before: list[str | None] = field(default_factory=list)
    nodes_after: list[str | None] = field(default_factory=list)

    @property
    def decision_to_grant_s(self) -> float:
        return self.granted_at - self.decided_at


class GangScenario:
    """Runs the gang scenario against a running head; ``say`` receives one line per event."""

    def __init__(self, head: HeadApi, namespace: str, workdir: Path, cfg: GangScenarioConfig,
                 say: Callable[[str], None] = print) -> None:
        self.head, self.namespace, self.workdir, self.cfg, self.say = head, namespace, Path(workdir), cfg, say
        self.tg = load_train_gang()
        self.storage = str(self.workdir / "ray-train")
        self.stop_file = self.workdir / "stop"
        self.t0 = time.monotonic()
        self.trainer_starts: list[float] = []

    # ---- one attempt: a TorchTrainer on the gang, on a thread, until it returns ---------------------------
    def _start_fit(self, gang: GangHandle, attempt: int, steps: int) -> tuple[threading.Thread, list[Any], Path]:
        log = self.workdir / f"attempt-{attempt}"
        out: list[Any] = []

        def fit() -> None:
            try:
                out.append(self.tg.fit(gang, steps=steps, storage=self.storage, name=f"gang-{attempt}",
                                       log_dir=str(log), stop_file=str(self.stop_file),
                                       resume_from=gang.resume_from, step_sleep_s=self.cfg.step_sleep_s))
            except BaseException as e:  # reported by the caller: the run did not return a result
                out.append(e)

        t = threading.Thread(target=fit, name=f"gang-fit-{attempt}", daemon=True)
        t.start()
        return t, out, log

    @staticmethod
    def _progress(log: Path) -> int:
        try:
            return int((log / "progress").read_text())
        except (FileNotFoundError, ValueError):
            return -1

    def _wait_training(self, log: Path, out: list[Any], granted_at: float, at_least: int,
                       timeout: float = 300.0) -> None:
        """Until the attempt logging to ``log`` has trained ``at_least`` steps past where it resumed."""
        deadline = time.monotonic() + timeout
        first = None
        while time.monotonic() < deadline:
            if out:
                if at_least == 0 and not isinstance(out[0], BaseException):
                    return  # the last attempt: it may finish before this looks
                raise RuntimeError(f"the gang's run returned before it was preempted: {out[0]!r}")
            step = self._progress(log)
            workers = self._workers(log)
            if step >= 0 and first is None:
                first = time.time()
                self.trainer_starts.append(first - granted_at)
            if workers and step >= min(w["resumed_at"] for w in workers) + at_least:
                return
            time.sleep(0.1)
        raise TimeoutError(f"the gang's run ({log.name}) did not train {at_least} steps within {timeout:g}s")

    @staticmethod
    def _workers(log: Path) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted(log.glob("worker-*.json"))]

    @staticmethod
    def _granted_at(info: dict[str, Any]) -> float:
        return next(t["at"] for t in reversed(info["history"]) if t["state"] == "granted")

    # ---- the script -----------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        from contextlib import ExitStack

        cfg = self.cfg
        self.workdir.mkdir(parents=True, exist_ok=True)
        rounds: list[GangRound] = []
        with ExitStack() as stack:
            for cards, node in cfg.blockers:
                stack.enter_context(lease(GpuRequest.whole(cards, node=node), priority="inference", head=self.head,
                                          namespace=self.namespace, owner="bench:blocker", timeout=120))
            gang = stack.enter_context(gang_lease(cfg.gang, priority="training", head=self.head,
                                                  namespace=self.namespace, requeue=True, gang_id="bench",
                                                  owner="bench:gang", poll_s=0.05, timeout=300))
            self.say(f"gang {cfg.gang} granted on {', '.join(str(n) for n in gang.nodes)}: "
                     f"{self.head.get_lease(gang.lease_ids[0])['history'][-1]['reason']}")
            attempt, granted_at = 1, self._granted_at(self.head.get_lease(gang.lease_ids[0]))
            thread, out, log = self._start_fit(gang, attempt, OPEN_ENDED)
            for r in range(cfg.rounds):
                self._wait_training(log, out, granted_at, cfg.settle_steps)
                rnd, gang = self._round(r, gang, thread, out, log)
                rounds.append(rnd)
                attempt += 1
                granted_at = self._granted_at(self.head.get_lease(gang.lease_ids[0]))
                last = r == cfg.rounds - 1
                steps = rnd.checkpoint_step + cfg.steps if last else OPEN_ENDED
                thread, out, log = self._start_fit(gang, attempt, steps)
                self._wait_training(log, out, granted_at, 0 if last else cfg.settle_steps)
                rnd.resumed_at = min(w["resumed_at"] for w in self._workers(log))
                self.say(f"round {r + 1}: the gang resumed on {', '.join(str(n) for n in gang.nodes)} from step "
                         f"{rnd.resumed_at} (checkpointed at {rnd.checkpoint_step})")
            thread.join(timeout=600)
            final = out[0] if out else None
            if isinstance(final, BaseException) or final is None:
                raise RuntimeError(f"the gang's last run did not finish: {final!r}")
        target = int(final.metrics["step"])
        self.say(f"rounds over: the gang trained to step {target}; an undisturbed run of {target} steps for reference")
        ref = self.tg.fit(None, steps=target, storage=self.storage, name="reference",
                          log_dir=str(self.workdir / "reference"))
        return self._figures(rounds, final, ref)

    def _round(self, r: int, gang: GangHandle, thread: threading.Thread, out: list[Any],
               log: Path) -> tuple[GangRound, GangHandle]:
        """Inference arrives; the gang checkpoints through Ray Train and yields; inference runs and leaves;
        returns the round's figures and the resumed gang (its next attempt not started yet)."""
        cfg = self.cfg
        self.say(f"round {r + 1}: inference needs one whole card; every whole card is the gang's or a blocker's")
        granted: list[Any] = []
        leave = threading.Event()

        def infer() -> None:
            with lease(GpuRequest.whole(1), priority="inference", head=self.head, namespace=self.namespace,
                       owner="bench:inference", lease_id=f"serve-{r + 1}", timeout=300) as le:
                granted.append(le)
                leave.wait(300)

        preemptor = threading.Thread(target=infer, name=f"inference-{r + 1}", daemon=True)
        preemptor.start()
        deadline = time.monotonic() + 120
        while not gang.preemption_requested():
            if time.monotonic() > deadline:
                raise TimeoutError(f"round {r + 1}: the gang was not asked to checkpoint")
            time.sleep(0.02)
        self.stop_file.write_text("checkpoint now")
        thread.join(timeout=300)
        res = out[0] if out else None
        if res is None or isinstance(res, BaseException):
            raise RuntimeError(f"round {r + 1}: the preempted run did not return a result: {res!r}")
        step = int(res.metrics["step"])
        gang.ack_preempted(res.checkpoint.path)
        self.stop_file.unlink()
        deadline = time.monotonic() + 120
        while not granted:
            if time.monotonic() > deadline:
                raise TimeoutError(f"round {r + 1}: inference was not granted after the gang yielded")
            time.sleep(0.02)
        v = self.head.get_lease(gang.lease_ids[0])
        decided = next(t["at"] for t in v["history"] if t["state"] == "checkpointing")
        inf = self.head.get_lease(granted[0].lease_id)
        meta = log / f"checkpoint-{step}.json"
        ck_s = json.loads(meta.read_text())["checkpoint_s"] if meta.exists() else None
        rnd = GangRound(gang.lease_ids, inf["lease_id"], decided, self._granted_at(inf), ck_s, step,
                        nodes_before=list(gang.nodes))
        self.say(f"round {r + 1}: gang yielded at step {step} ({v['history'][-1]['reason']}); inference granted "
                 f"{rnd.decision_to_grant_s:.2f}s after the decision (checkpoint {ck_s or 0:.3f}s)")
        time.sleep(cfg.inference_s)
        leave.set()
        preemptor.join(60)
        resumed = gang.wait_resumed(300)
        rnd.nodes_after = list(resumed.nodes)
        return rnd, resumed

    def _figures(self, rounds: list[GangRound], final: Any, ref: Any) -> dict[str, Any]:
        torch = require("torch", "train")  # the gang trains with Ray Train's TorchTrainer

        d2g = [r.decision_to_grant_s for r in rounds]
        over = [r.decision_to_grant_s - (r.checkpoint_s or 0.0) for r in rounds]
        ck = [r.checkpoint_s for r in rounds if r.checkpoint_s is not None]
        lost = [max(0, r.checkpoint_step - r.resumed_at) for r in rounds if r.resumed_at is not None]
        a, b = self.tg.load_weights(final.checkpoint.path), self.tg.load_weights(ref.checkpoint.path)
        same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        self.say(f"gang: {len(rounds) + 1} attempt(s), weights "
                 f"{'bit-identical to an undisturbed run' if same else 'DIFFERENT from an undisturbed run'}")
        return {
            "mode": "orchestrator", "holder": "gang", "gang": self.cfg.gang, "preemptions": len(rounds),
            "decision_to_grant_p50_s": pct(d2g, 0.5), "decision_to_grant_p99_s": pct(d2g, 0.99),
            "orchestration_overhead_p50_s": pct(over, 0.5), "orchestration_overhead_p99_s": pct(over, 0.99),
            "checkpoint_s_median": pct(ck, 0.5), "work_lost_steps": int(sum(lost)),
            "work_lost_steps_per_preemption": round(sum(lost) / len(lost), 2) if lost else 0.0,
            "resumed_bit_identical": bool(same), "final_step": int(final.metrics["step"]),
            "trainer_start_s_median": pct(self.trainer_starts, 0.5),
            "moved_nodes": sum(1 for r in rounds if sorted(map(str, r.nodes_before)) != sorted(map(str, r.nodes_after))),
            "wall_s": round(time.monotonic() - self.t0, 1),
        }
