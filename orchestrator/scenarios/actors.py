"""The preemption scenario with *actor* holders, on a real local cluster (``orchestrator demo --holder actor``).

Training fills the demo cluster's eight whole cards as three Ray actors
(``jobs/train.py``'s :class:`TrainingActor`, 4, 2 and 2 cards), each holding
an SDK lease asked with ``requeue=True``. Then, ``rounds`` times, an inference
actor needs one card. The head picks a victim; the node's agent calls the
victim's ``checkpoint(dir)``, stops the actor once the path comes back (or at
its grace deadline), confirms, and only then are the cards handed on. The
victim's lease is queued again; when the inference leaves, the driver starts a
new actor from the checkpoint. Every training run must end with weights
bit-identical to an undisturbed run.

``victim="rogue"``: the training actors ignore the request (their
``checkpoint`` never returns), so each victim is killed by its agent at the
grace deadline and restarts from scratch; what is measured then is how soon
after the deadline the agent confirmed the stop and that no card was ever
used twice.

Figures, beside those of the job scenario (:mod:`.preemption`):

* ``revoked``: victims stopped by their agent (every one here: an actor is
  always stopped by the agent, after its checkpoint or at its deadline);
* ``revoke_after_grace_p99_s``: from a victim's grace deadline to the
  agent's confirmation that it stopped (the agent's ``stopped_at``), for
  victims that reached their deadline (rogues);
* ``double_use_events``: samples, every ``sample_s``, in which a card was
  held by two leases at once, counting as holders both the processes alive
  on it (each holder's pid and ``CUDA_VISIBLE_DEVICES``: on simulated GPUs
  this stands in for NVML's per-device process list) and the leases the
  ledger says hold it (revoking ones included).

Wall clocks: the head's history, the deadline and the agents' ``stopped_at``
are all ``time.time()`` on one host.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from orchestrator.core import datafiles
from orchestrator.core.api import HeadApi
from orchestrator.core.request import GpuRequest
from orchestrator.core.stats import rounded_quantile as pct
from orchestrator.rayport import ray_api
from orchestrator.rayport.agent import process_alive
from orchestrator.sdk.leases import LeaseHandle, lease

TRAIN = datafiles.job_script("train.py")
OPEN_ENDED = 10**9  # a training run's target while the rounds go on


def load_example(path: Path, name: str) -> Any:
    """An example script under ``jobs/`` as a module ``name`` that Ray ships to workers by value (the
    examples are not a package)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def load_train() -> Any:
    """``jobs/train.py`` as a module (see :func:`load_example`)."""
    return load_example(TRAIN, "rgo_example_train")


class _Inference:
    """The inference holder: it only has to run on its card and say which process it is."""

    def where(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}


@dataclass(frozen=True)
class ActorScenarioConfig:
    rounds: int = 1
    steps: int = 300  # trained after the last round (training is open-ended until then)
    step_delay_s: float = 0.02
    inference_s: float = 2.0
    victim: Literal["cooperative", "rogue"] = "cooperative"
    training: tuple[tuple[int, int], ...] = ((1, 4), (2, 2), (3, 2))  # (seed, whole cards)
    settle_s: float = 1.0
    sample_s: float = 0.1


@dataclass
class _Run:
    """One training run: its leases and actors, attempt after attempt (written by its own thread)."""

    seed: int
    cards: int
    attempts: list[dict[str, Any]] = field(default_factory=list)  # lease_id, pid, devices, resumed_at, last_step
    final: dict[str, Any] | None = None
    error: str | None = None
    lease: LeaseHandle | None = None
    request: GpuRequest | None = None  # what its lease asks; None: ``cards`` whole cards anywhere


@dataclass
class ActorPreemption:
    victim_lease: str
    inference_lease: str
    decision_to_grant_s: float
    checkpoint_s: float | None
    checkpoint_step: int | None
    grace_deadline: float | None
    stopped_at: float | None
    lost_steps: int | None = None
    decided_at: float = 0.0
    acked_at: float | None = None  # the victim's lease ended (checkpoint acknowledged, or the deadline)
    granted_at: float = 0.0


class DoubleUseChecker:
    """Samples, every ``interval_s``, who holds each card: live holder processes and the ledger's leases."""

    def __init__(self, head: HeadApi, holders: Callable[[], list[tuple[str, int, str]]], interval_s: float = 0.1) -> None:
        self.head, self.holders, self.interval_s = head, holders, interval_s
        self.samples = 0
        self.events: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="double-use", daemon=True)

    def start(self) -> "DoubleUseChecker":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:  # the head busy or restarting: skip this sample
                continue

    def sample(self) -> None:
        users: dict[str, dict[str, list[str]]] = {}  # device -> lease -> who says it holds it
        for lease_id, pid, devices in self.holders():
            if process_alive(pid):
                for d in filter(None, devices.split(",")):
                    users.setdefault(d, {}).setdefault(lease_id, []).append(f"pid {pid}")
        for le in self.head.status()["leases"]:
            if le["state"] in ("granted", "active", "checkpointing") or le.get("revoking"):
                for d in (le.get("allocation") or {}).get("gpu_uuids", ()):
                    users.setdefault(d, {}).setdefault(le["lease_id"], []).append(f"ledger {le['state']}")
        self.samples += 1
        for d, who in users.items():
            if len(who) > 1:
                self.events.append({"at": time.time(), "device": d, "leases": sorted(who), "seen": who})


class ActorScenario:
    """Runs the actor scenario against a running head; ``say`` receives one line per event."""

    def __init__(self, head: HeadApi, namespace: str, workdir: Path, cfg: ActorScenarioConfig,
                 say: Callable[[str], None] = print) -> None:
        self.head, self.namespace, self.workdir, self.cfg, self.say = head, namespace, Path(workdir), cfg, say
        self.train = load_train()
        self.trainer_cls = ray_api.remote_class(self.train.TrainingActor, by_value=self.train)
        self.inference_cls = ray_api.remote_class(_Inference)
        self.runs: list[_Run] = []
        #: the step each run (by seed) trains to: open-ended while rounds go on (no run may finish before the
        #: last one), then the step it reached plus ``cfg.steps``; its reference run uses it too
        self.targets: dict[int, int] = {}
        self._lock = threading.Lock()
        self._inference: list[tuple[str, int, str]] = []
        self.t0 = time.monotonic()

    # ---- one training run: start, watch, resume after every preemption -----------------------------
    def _train(self, run: _Run, ready: threading.Event, granted: threading.Event) -> None:
        cfg = self.cfg
        gone = ray_api.actor_gone_errors()
        ck = self.workdir / f"actor-train-{run.seed}"
        t0 = time.monotonic()
        try:
            with lease(run.request or GpuRequest.whole(run.cards), priority="training", requeue=True, checkpoint_dir=str(ck),
                       head=self.head, namespace=self.namespace, owner=f"bench:train-{run.seed}",
                       lease_id=f"train-{run.seed}") as first:
                le, resume_from = first, None
                granted.set()
                while True:
                    run.lease = le
                    granted_s = time.monotonic() - t0
                    target = self.targets.get(run.seed, OPEN_ENDED)
                    actor = self.trainer_cls.options(**le.actor_options(max_concurrency=4, num_cpus=0)).remote(
                        target, seed=run.seed, resume_from=resume_from, step_delay_s=cfg.step_delay_s,
                        rogue=cfg.victim == "rogue")
                    st = ray_api.get(actor.status.remote(), timeout=120)
                    att = {"lease_id": le.lease_id, "pid": st["pid"], "devices": st["cuda_visible_devices"],
                           "resumed_at": st["resumed_at"], "last_step": st["step"], "granted_s": granted_s,
                           "started_s": time.monotonic() - t0}
                    with self._lock:
                        run.attempts.append(att)
                    ready.set()
                    while not st["done"]:
                        time.sleep(0.1)
                        try:
                            if target != self.targets.get(run.seed, OPEN_ENDED):  # the rounds are over
                                target = ray_api.get(actor.set_steps.remote(self.targets[run.seed]), timeout=10)
                            st = ray_api.get(actor.status.remote(), timeout=10)
                        except gone:
                            break  # stopped by the agent: after its checkpoint, or at its deadline
                        att["last_step"] = st["step"]
                    if st["done"]:
                        run.final = st
                        if le is not first:
                            le.release("training finished")
                        ray_api.kill(actor)
                        return
                    t0 = time.monotonic()
                    le = le.wait_resumed(600)
                    resume_from = le.resume_from
        except Exception as e:  # reported, and the figures say the run did not finish
            run.error = f"{type(e).__name__}: {e}"
            ready.set()
            granted.set()

    def start_run(self, run: _Run) -> tuple[threading.Thread, threading.Event]:
        """Train ``run`` on a thread of its own, resuming after every preemption until ``targets[run.seed]``
        (open-ended until set); returns the thread and the event set once its first actor is up."""
        ready, granted = threading.Event(), threading.Event()
        with self._lock:
            self.runs.append(run)
        t = threading.Thread(target=self._train, args=(run, ready, granted), name=f"train-{run.seed}", daemon=True)
        t.start()
        return t, ready

    def _holders(self) -> list[tuple[str, int, str]]:
        with self._lock:
            out = [(a["lease_id"], a["pid"], a["devices"]) for r in self.runs for a in r.attempts]
            return out + list(self._inference)

    # ---- the script -----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        threads, started = [], []
        # Leases one after another, in the order given (the biggest first, so the cluster fills as planned);
        # the actors start together: one that imports torch takes 5-30 s to start here.
        for seed, cards in cfg.training:
            run, ready, granted = _Run(seed, cards), threading.Event(), threading.Event()
            self.runs.append(run)
            t = threading.Thread(target=self._train, args=(run, ready, granted), name=f"train-{seed}", daemon=True)
            t.start()
            threads.append(t)
            started.append((run, ready))
            granted.wait(300)
        for run, ready in started:
            if not ready.wait(300) or run.error:
                raise RuntimeError(f"training {run.seed} did not start: {run.error}")
            att = run.attempts[-1]
            self.say(f"train-{run.seed}: {run.cards} card(s), lease granted in {att['granted_s']:.1f}s, "
                     f"training actor up in {att['started_s']:.1f}s")
        self.say(f"all {len(self.runs)} training actors running: every whole card is busy")
        checker = DoubleUseChecker(self.head, self._holders, cfg.sample_s).start()
        preemptions: list[ActorPreemption] = []
        try:
            for r in range(cfg.rounds):
                self._wait_stepping()
                time.sleep(cfg.settle_s)
                preemptions.append(self._round(r))
            self._wait_stepping()
            with self._lock:
                self.targets = {r.seed: r.attempts[-1]["last_step"] + cfg.steps for r in self.runs}
            self.say(f"rounds over: the training runs finish at steps {self.targets}")
            for t in threads:
                t.join(timeout=120 + cfg.steps * (cfg.step_delay_s + 0.02) * 4)
        finally:
            checker.stop()
        self._fill_stops(preemptions)
        return self._figures(preemptions, checker)

    def _wait_stepping(self, timeout: float = 180.0) -> None:
        """Until every unfinished run's current attempt has trained past where it started."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                waiting = [r for r in self.runs if r.final is None and r.error is None and (
                    not r.attempts or r.attempts[-1]["last_step"] <= r.attempts[-1]["resumed_at"]
                    or r.lease is None or r.lease.lease_id != r.attempts[-1]["lease_id"])]
            if not waiting:
                return
            time.sleep(0.1)
        raise TimeoutError("training did not resume within the timeout")

    def _round(self, r: int) -> ActorPreemption:
        cfg = self.cfg
        before = {run.seed: len(run.attempts) for run in self.runs}
        if any(run.final is not None or run.error for run in self.runs):
            raise RuntimeError(f"round {r + 1}: a training run ended before inference arrived: "
                               f"{[(run.seed, run.error) for run in self.runs if run.final or run.error]}")
        self.say(f"round {r + 1}: an inference actor needs one whole card")
        with lease(GpuRequest.whole(1), priority="inference", head=self.head, namespace=self.namespace,
                   owner="bench:inference", lease_id=f"serve-{r + 1}", timeout=300) as inf:
            actor = self.inference_cls.options(**inf.actor_options(num_cpus=0)).remote()
            try:
                where = ray_api.get(actor.where.remote(), timeout=120)
            except ray_api.actor_gone_errors() as e:
                raise RuntimeError(f"round {r + 1}: the inference actor did not come up ({type(e).__name__}); "
                                   f"Ray's actors: {ray_api.actor_states(self.namespace, 'rgo-lease-')}; "
                                   f"ledger: {[(x['lease_id'], x['state'], x.get('revoking')) for x in self.head.status()['leases']]}") from e
            with self._lock:
                self._inference.append((inf.lease_id, where["pid"], where["cuda_visible_devices"]))
            granted = next(t["at"] for t in self.head.get_lease(inf.lease_id)["history"] if t["state"] == "granted")
            victims = [run for run in self.runs if run.attempts and self.head.get_lease(
                run.attempts[before[run.seed] - 1]["lease_id"]).get("preempt_for") == inf.lease_id]
            if len(victims) != 1:
                seen = {}
                for run in self.runs:
                    if run.attempts:
                        d = self.head.get_lease(run.attempts[before[run.seed] - 1]["lease_id"])
                        seen[d["lease_id"]] = f"{d['state']} ({d['history'][-1]['reason']})"
                raise RuntimeError(f"round {r + 1}: expected one victim, saw {[v.seed for v in victims]}: {seen}; "
                                   f"inference on {inf.allocation}")
            v = self.head.get_lease(victims[0].attempts[before[victims[0].seed] - 1]["lease_id"])
            decided = next(t["at"] for t in v["history"] if t["state"] in ("checkpointing", "preempted"))
            meta = self._checkpoint_meta(v.get("checkpoint_path"))
            p = ActorPreemption(v["lease_id"], inf.lease_id, granted - decided, meta.get("checkpoint_s"),
                                meta.get("step"), v.get("preempt_deadline") if cfg.victim == "rogue" else None, None,
                                decided_at=decided, granted_at=granted,
                                acked_at=next((t["at"] for t in v["history"] if t["state"] == "preempted"), None))
            self.say(f"round {r + 1}: {v['lease_id']} yielded ({v['history'][-1]['reason']}); "
                     f"inference granted {p.decision_to_grant_s:.2f}s after the decision")
            time.sleep(cfg.inference_s)
            ray_api.kill(actor)
            deadline = time.monotonic() + 30  # release only once its process has gone, as a careful holder does
            while process_alive(where["pid"]) and time.monotonic() < deadline:
                time.sleep(0.02)
        victim = victims[0]
        deadline = time.monotonic() + 300
        while len(victim.attempts) <= before[victim.seed] and victim.final is None and victim.error is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"train-{victim.seed} did not resume")
            time.sleep(0.1)
        if len(victim.attempts) > before[victim.seed]:
            old, new = victim.attempts[before[victim.seed] - 1], victim.attempts[before[victim.seed]]
            stopped = p.checkpoint_step if p.checkpoint_step is not None else old["last_step"]
            p.lost_steps = max(0, stopped - new["resumed_at"])
            self.say(f"round {r + 1}: {new['lease_id']} resumed at step {new['resumed_at']} "
                     f"(stopped at {stopped}): {p.lost_steps} step(s) lost")
        return p

    @staticmethod
    def _checkpoint_meta(path: str | None) -> dict[str, Any]:
        import json

        if not path:
            return {}
        meta = Path(path + ".meta.json")
        return json.loads(meta.read_text()) if meta.exists() else {}

    def _fill_stops(self, preemptions: list[ActorPreemption]) -> None:
        """The agents' confirmation times, read once at the end."""
        stopped: dict[str, float] = {}
        for name in self._agent_names():
            try:
                agent = ray_api.get_actor(name, self.namespace)
                stopped.update(ray_api.get(agent.info.remote(), timeout=30)["stopped_at"])
            except Exception as e:  # an agent lost meanwhile: its victims show no confirmation time
                self.say(f"{name}: no revocation times ({type(e).__name__})")
        for p in preemptions:
            p.stopped_at = stopped.get(p.victim_lease)
            rel = lambda t: f"{t - p.decided_at:+.3f}s" if t else "?"  # noqa: E731
            self.say(f"{p.victim_lease}: asked 0s, ended {rel(p.acked_at)}, stopped by its agent {rel(p.stopped_at)}, "
                     f"cards granted {rel(p.granted_at)} (checkpoint write {p.checkpoint_s or 0:.3f}s)")

    def _agent_names(self) -> list[str]:
        return [ray_api.agent_name(n["name"]) for n in self.head.status()["nodes"]]

    def _figures(self, preemptions: list[ActorPreemption], checker: DoubleUseChecker) -> dict[str, Any]:
        d2g = [p.decision_to_grant_s for p in preemptions]
        over = [p.decision_to_grant_s - (p.checkpoint_s or 0.0) for p in preemptions]
        ck = [p.checkpoint_s for p in preemptions if p.checkpoint_s is not None]
        after = [p.stopped_at - p.grace_deadline for p in preemptions if p.stopped_at and p.grace_deadline]
        lost = [p.lost_steps for p in preemptions if p.lost_steps is not None]
        finished = [r for r in self.runs if r.final is not None]
        ref = {r.seed: self.train.run(self.targets[r.seed], seed=r.seed, log=lambda s: None)["digest"]
               for r in self.runs}
        same = bool(finished) and len(finished) == len(self.runs) and all(
            r.final["digest"] == ref[r.seed] for r in finished)  # type: ignore[index]
        for r in self.runs:
            state = "error: " + r.error if r.error else (
                "bit-identical to an undisturbed run" if r.final and r.final["digest"] == ref[r.seed] else "DIFFERENT")
            self.say(f"train-{r.seed}: {len(r.attempts)} attempt(s), weights {state}")
        return {
            "mode": "orchestrator", "holder": "actor", "victim": self.cfg.victim, "preemptions": len(preemptions),
            "decision_to_grant_p50_s": pct(d2g, 0.5), "decision_to_grant_p99_s": pct(d2g, 0.99),
            "orchestration_overhead_p50_s": pct(over, 0.5), "orchestration_overhead_p99_s": pct(over, 0.99),
            "checkpoint_s_median": pct(ck, 0.5), "work_lost_steps": int(sum(lost)),
            "work_lost_steps_per_preemption": round(sum(lost) / len(lost), 2) if lost else 0.0,
            "resumed_bit_identical": same,
            "revoked": sum(1 for p in preemptions if p.stopped_at is not None),
            "revoke_after_grace_p50_s": pct(after, 0.5), "revoke_after_grace_p99_s": pct(after, 0.99),
            "double_use_events": len(checker.events), "double_use_samples": checker.samples,
            "double_use_first": checker.events[:3],
            "wall_s": round(time.monotonic() - self.t0, 1),
        }
