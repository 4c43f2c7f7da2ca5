"""A real, deterministic PyTorch training job that survives preemption without losing work.

Run it plainly (``python jobs/train.py --steps 200 --checkpoint-dir /tmp/ck``),
through ``orchestrator submit --priority training -- python jobs/train.py ...``
or ``ray job submit -- python jobs/train.py``; or, with ``--actor``, as a Ray
actor holding a lease (:class:`TrainingActor`, :func:`run_as_actor`), which
the node's agent asks to checkpoint and stops when the lease is preempted. Under the orchestrator it reads
its job context from the environment (``ORCHESTRATOR_JOB_ID``,
``ORCHESTRATOR_CHECKPOINT_DIR``, ``ORCHESTRATOR_RESUME_FROM``) and polls the
head for a checkpoint request between steps; when asked, it checkpoints,
acknowledges with the checkpoint's path and exits with code 0 and status
"preempted", and the orchestrator later resumes it -- possibly on another
shape of GPU share -- from that checkpoint.

Determinism, so that a run preempted any number of times ends with weights
bit-identical to an uninterrupted run:

* the data of step ``k`` is drawn from a generator seeded by ``(seed, k)``, so
  it does not depend on how the run was cut;
* the checkpoint holds the model, the optimiser, the step, and the torch,
  numpy and Python RNG states; it is written to a temporary file and renamed,
  so a crash mid-write leaves the previous checkpoint intact;
* one intra-op thread and ``torch.use_deterministic_algorithms(True)``.
  (On CUDA, also ``CUBLAS_WORKSPACE_CONFIG=:4096:8``.)

Without torch (the package's plain install, which ``orchestrator demo --headless`` needs no more than) the
same model trains in NumPy on the CPU (:class:`NumpyTrainer`, ``--backend numpy``), with the same data, the
same momentum SGD and the same promises; ``--backend auto`` (the default) takes torch when it is installed.
A run's digest is comparable only with runs of the same backend (``result["backend"]`` says which).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import random
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

try:
    import torch
    from torch import nn
except ImportError:  # the plain install: NumpyTrainer trains the same model
    torch = None  # type: ignore[assignment]

CKPT_NAME = "checkpoint.pt"
BACKENDS = ("auto", "torch", "numpy")


def make_model(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(32, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 1))


def batch(seed: int, step: int, device: torch.device, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(size, 32, generator=g)
    y = torch.sin(x[:, :4].sum(dim=1, keepdim=True)) + 0.1 * torch.randn(size, 1, generator=g)
    return x.to(device), y.to(device)


def weights_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class Trainer:
    """Owns the model, optimiser and RNG state; ``checkpoint(dir) -> path`` is the Preemptible protocol."""

    backend = "torch"

    def __init__(self, seed: int = 0, width: int = 64, lr: float = 0.05, device: str | None = None) -> None:
        torch.use_deterministic_algorithms(True)
        torch.set_num_threads(1)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.seed = seed
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        self.model = make_model(width).to(self.device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        self.step = 0
        self.loss = float("nan")
        self.last_checkpoint_step = 0

    def train_step(self) -> float:
        x, y = batch(self.seed, self.step, self.device)
        # Dropout-like noise from the global RNG: proves RNG state is restored too.
        noise = torch.rand(1).item() * 1e-3
        self.opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(self.model(x), y) * (1 + noise)
        loss.backward()
        self.opt.step()
        self.step += 1
        self.loss = float(loss.item())
        return self.loss

    def checkpoint(self, directory: str | os.PathLike) -> str:
        """Write a checkpoint atomically; return its path."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        path = d / CKPT_NAME
        tmp = d / f".{CKPT_NAME}.{os.getpid()}.tmp"
        torch.save({
            "step": self.step, "seed": self.seed, "model": self.model.state_dict(), "opt": self.opt.state_dict(),
            "torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(), "python_rng": random.getstate(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }, tmp)
        os.replace(tmp, path)
        self.last_checkpoint_step = self.step
        return str(path)

    def restore(self, path: str | os.PathLike) -> None:
        state = torch.load(path, map_location=self.device, weights_only=False)
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        torch.set_rng_state(state["torch_rng"])
        np.random.set_state(state["numpy_rng"])
        random.setstate(state["python_rng"])
        if state.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self.step = self.last_checkpoint_step = int(state["step"])

    def digest(self) -> str:
        return weights_digest(self.model)


class NumpyTrainer:
    """:class:`Trainer`'s model, data, loss and momentum SGD in NumPy (float64, CPU): for an install without
    torch. Same interface; its checkpoint is a pickle of the parameters, the momentum buffers, the step and
    the NumPy and Python RNG states, written to a temporary file and renamed."""

    backend = "numpy"

    def __init__(self, seed: int = 0, width: int = 64, lr: float = 0.05, momentum: float = 0.9) -> None:
        self.device = "cpu (numpy)"
        self.seed, self.lr, self.momentum = seed, lr, momentum
        random.seed(seed)
        np.random.seed(seed)
        init = np.random.default_rng(seed)
        self.params: dict[str, np.ndarray] = {}
        for i, (fan_in, fan_out) in enumerate(((32, width), (width, width), (width, 1))):
            bound = 1.0 / np.sqrt(fan_in)  # torch.nn.Linear's default initialisation
            self.params[f"w{i}"] = init.uniform(-bound, bound, (fan_in, fan_out))
            self.params[f"b{i}"] = init.uniform(-bound, bound, fan_out)
        self.velocity: dict[str, np.ndarray] | None = None  # the momentum buffers, from the first step on
        self.step = 0
        self.loss = float("nan")
        self.last_checkpoint_step = 0

    def train_step(self) -> float:
        g = np.random.default_rng(self.seed * 1_000_003 + self.step)
        x = g.standard_normal((64, 32))
        y = np.sin(x[:, :4].sum(axis=1, keepdims=True)) + 0.1 * g.standard_normal((64, 1))
        noise = np.random.random() * 1e-3  # from the global RNG: proves its state is restored too
        p = self.params
        h1 = np.tanh(x @ p["w0"] + p["b0"])
        h2 = np.tanh(h1 @ p["w1"] + p["b1"])
        err = h2 @ p["w2"] + p["b2"] - y
        loss = float(np.mean(err ** 2) * (1 + noise))
        d_out = 2.0 * err / err.size * (1 + noise)
        d_h2 = (d_out @ p["w2"].T) * (1 - h2 ** 2)
        d_h1 = (d_h2 @ p["w1"].T) * (1 - h1 ** 2)
        grads = {"w2": h2.T @ d_out, "b2": d_out.sum(axis=0), "w1": h1.T @ d_h2, "b1": d_h2.sum(axis=0),
                 "w0": x.T @ d_h1, "b0": d_h1.sum(axis=0)}
        if self.velocity is None:  # torch.optim.SGD: the first step's buffer is the gradient itself
            self.velocity = {k: v.copy() for k, v in grads.items()}
        else:
            for k, v in grads.items():
                self.velocity[k] = self.momentum * self.velocity[k] + v
        for k in p:
            p[k] = p[k] - self.lr * self.velocity[k]
        self.step += 1
        self.loss = loss
        return loss

    def checkpoint(self, directory: str | os.PathLike) -> str:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        path = d / CKPT_NAME
        tmp = d / f".{CKPT_NAME}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump({"backend": self.backend, "step": self.step, "seed": self.seed, "params": self.params,
                         "velocity": self.velocity, "numpy_rng": np.random.get_state(),
                         "python_rng": random.getstate()}, f)
        os.replace(tmp, path)
        self.last_checkpoint_step = self.step
        return str(path)

    def restore(self, path: str | os.PathLike) -> None:
        with open(path, "rb") as f:
            state = pickle.load(f)
        if not isinstance(state, dict) or state.get("backend") != self.backend:
            raise ValueError(f"{path} is not a checkpoint of the numpy backend; resume with the backend that wrote it")
        self.params, self.velocity = state["params"], state["velocity"]
        np.random.set_state(state["numpy_rng"])
        random.setstate(state["python_rng"])
        self.step = self.last_checkpoint_step = int(state["step"])

    def digest(self) -> str:
        h = hashlib.sha256()
        for name, a in sorted(self.params.items()):
            h.update(name.encode())
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()


def make_trainer(seed: int = 0, width: int = 64, backend: str = "auto") -> Any:
    """A :class:`Trainer` (torch) or a :class:`NumpyTrainer`; ``auto``: torch when it is installed."""
    if backend not in BACKENDS:
        raise ValueError(f"invalid backend={backend!r} (allowed: {', '.join(BACKENDS)})")
    if backend == "torch" or (backend == "auto" and torch is not None):
        if torch is None:
            raise ImportError("backend torch: torch is not installed (pip install 'ray-gpu-orchestrator[train]')")
        return Trainer(seed=seed, width=width)
    return NumpyTrainer(seed=seed, width=width)


def run(steps: int, *, seed: int = 0, width: int = 64, checkpoint_dir: str | None = None, resume_from: str | None = None,
        checkpoint_every: int = 0, step_delay_s: float = 0.0, log_every: int = 0,
        should_checkpoint: Callable[[], bool] | None = None, on_checkpoint: Callable[[str, int], None] | None = None,
        log: Callable[[str], None] = print, backend: str = "auto") -> dict:
    """Train to ``steps``; stop early (after checkpointing) when ``should_checkpoint()`` says so."""
    t = make_trainer(seed=seed, width=width, backend=backend)
    if resume_from and Path(resume_from).exists():
        t.restore(resume_from)
        log(f"resumed from {resume_from} at step {t.step}")
    preempted = False
    while t.step < steps:
        t.train_step()
        if log_every and t.step % log_every == 0:
            log(f"step {t.step} loss {t.loss:.6f}")
        if checkpoint_every and checkpoint_dir and t.step % checkpoint_every == 0:
            t.checkpoint(checkpoint_dir)
        if step_delay_s:
            time.sleep(step_delay_s)
        if should_checkpoint is not None and t.step < steps and should_checkpoint():
            if not checkpoint_dir:
                raise RuntimeError("asked to checkpoint but no checkpoint directory was given")
            t0 = time.perf_counter()
            path = t.checkpoint(checkpoint_dir)
            log(f"checkpointed at step {t.step} to {path} in {time.perf_counter() - t0:.3f}s")
            if on_checkpoint is not None:
                on_checkpoint(path, t.step)
            preempted = True
            break
    result = {"status": "preempted" if preempted else "completed", "step": t.step, "steps": steps,
              "loss": t.loss, "digest": t.digest(), "device": str(t.device), "backend": t.backend}
    if not preempted and checkpoint_dir:
        t.checkpoint(checkpoint_dir)
        (Path(checkpoint_dir) / "result.json").write_text(json.dumps(result))
    return result


class TrainingActor:
    """The trainer as a Ray actor that holds a lease and really yields (the Preemptible protocol).

    Start it with ``ray.remote(TrainingActor).options(**lease.actor_options(max_concurrency=4))`` (the
    agent's ``checkpoint`` call must run while training does). Training runs on a thread of its own,
    one step at a time; ``checkpoint(dir)`` asks it to stop at the next step boundary, write a checkpoint
    and return its path -- the step it wrote is the step a resumed actor (``resume_from=path``) starts at,
    so no step is lost. ``rogue=True`` makes an actor that ignores the request (its ``checkpoint`` never
    returns): what a victim that does not cooperate looks like to the orchestrator. ``paced=True`` makes
    ``step_delay_s`` the whole step's duration (the workload model's step time on a simulated share,
    :mod:`orchestrator.sim.perfmodel`) rather than a pause after it: the actor sleeps what the step's own
    compute left of it, so it trains at the modelled speed whatever this machine's CPU does.

    Invariant: after ``checkpoint`` returns, the model is never stepped again by this actor.
    """

    def __init__(self, steps: int, seed: int = 0, width: int = 64, resume_from: str | None = None,
                 step_delay_s: float = 0.0, rogue: bool = False, paced: bool = False) -> None:
        import threading

        self.steps, self.step_delay_s, self.rogue, self.paced = steps, step_delay_s, rogue, paced
        self.trainer = make_trainer(seed=seed, width=width)
        self.resumed_at = 0
        if resume_from and Path(resume_from).exists():
            self.trainer.restore(resume_from)
            self.resumed_at = self.trainer.step
        self.checkpoint_s: float | None = None
        self._asked: str | None = None  # the directory a checkpoint was asked into
        self._written: str | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._train, name="train", daemon=True)
        self._thread.start()

    def _train(self) -> None:
        t = self.trainer
        while t.step < self.steps:
            with self._cond:
                if self._asked is not None:
                    t0 = time.perf_counter()
                    path = t.checkpoint(self._asked)
                    self.checkpoint_s = time.perf_counter() - t0
                    # beside it, for whoever measures the preemption (the actor is stopped right after)
                    Path(path + ".meta.json").write_text(json.dumps({"step": t.step, "checkpoint_s": self.checkpoint_s}))
                    self._written = path
                    self._cond.notify_all()
                    return
            t0 = time.perf_counter()
            t.train_step()
            if self.step_delay_s:
                time.sleep(max(0.0, self.step_delay_s - (time.perf_counter() - t0)) if self.paced else self.step_delay_s)

    def checkpoint(self, directory: str) -> str:
        """Stop at the next step boundary, write a checkpoint under ``directory``, return its path."""
        if self.rogue:
            time.sleep(10**6)  # ignores the request; the agent stops it at its grace deadline
        with self._cond:
            if self._written is None and not self.done():
                self._asked = directory
                while self._written is None and self._thread.is_alive():
                    self._cond.wait(0.5)
            if self._written is None:  # finished first: the final state is the checkpoint
                self._written = self.trainer.checkpoint(directory)
            return self._written

    def done(self) -> bool:
        return self.trainer.step >= self.steps

    def set_steps(self, steps: int) -> int:
        """Train to ``steps`` instead (not below the step reached): the weights at step n do not depend on
        the target, so the run still matches an undisturbed run of n steps. Returns the new target."""
        self.steps = max(int(steps), self.trainer.step)
        return self.steps

    def status(self) -> dict:
        t = self.trainer
        return {"step": t.step, "steps": self.steps, "done": self.done(), "resumed_at": self.resumed_at,
                "checkpointed": self._written, "checkpoint_s": self.checkpoint_s, "pid": os.getpid(),
                "digest": t.digest() if self.done() else None,
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}


def run_as_actor(steps: int, *, checkpoint_dir: str, gpu: object = "1", seed: int = 0, width: int = 64,
                 step_delay_s: float = 0.0, timeout_s: float = 3600.0, log: Callable[[str], None] = print,
                 **lease_kw: object) -> dict:
    """Train under a lease as a :class:`TrainingActor`, across preemptions, to ``steps``.

    The lease is asked with ``requeue=True``: when it is preempted the node's agent asks the actor to
    checkpoint and stops it, the head queues the lease again, and when it is granted again -- possibly on
    another shape of share, a MIG slice after a whole card -- a new actor resumes from the checkpoint.
    ``gpu`` is anything ``orchestrator.lease`` takes (``"1"``, ``"mem=20GiB,isolation=hard"``, a
    ``GpuRequest``); ``lease_kw`` goes to it too (``head=``, ``namespace=``...). Returns the final status
    with ``attempts``: each attempt's lease id, share kind and devices, and the step it started at."""
    import ray

    import orchestrator

    if __name__ != "__main__":  # imported from a file path: the workers cannot import it, so ship it
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    remote = ray.remote(TrainingActor)
    deadline = time.monotonic() + timeout_s
    attempts: list[dict] = []
    lease_kw.setdefault("priority", "training")
    with orchestrator.lease(gpu, requeue=True, checkpoint_dir=checkpoint_dir, **lease_kw) as first:
        le, resume_from = first, None
        while True:
            actor = remote.options(**le.actor_options(max_concurrency=4, num_cpus=0)).remote(
                steps, seed=seed, width=width, resume_from=resume_from, step_delay_s=step_delay_s)
            st = ray.get(actor.status.remote())
            attempts.append({"lease_id": le.lease_id, "kind": le.allocation.get("kind"), "node": le.node,
                             "cuda_visible_devices": st["cuda_visible_devices"], "resumed_at": st["resumed_at"]})
            log(f"{le.lease_id}: training on {le.allocation.get('kind')} {st['cuda_visible_devices']} "
                f"from step {st['resumed_at']}")
            while not st["done"]:
                try:
                    st = ray.get(actor.status.remote(), timeout=30)
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                    break  # preempted: the agent stopped it after its checkpoint
                if time.monotonic() > deadline:
                    raise TimeoutError(f"training did not finish within {timeout_s:g}s")
                time.sleep(0.1)
            if st["done"]:
                ray.kill(actor)
                if le is not first:
                    le.release("training finished")
                return {**st, "attempts": attempts}
            le = le.wait_resumed(max(1.0, deadline - time.monotonic()))
            resume_from = le.resume_from
            log(f"preempted; granted again as {le.lease_id}, resuming from {resume_from}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="torch, numpy (no torch needed), or auto: torch when it is installed")
    p.add_argument("--checkpoint-dir", default=os.environ.get("ORCHESTRATOR_CHECKPOINT_DIR"))
    p.add_argument("--resume-from", default=os.environ.get("ORCHESTRATOR_RESUME_FROM"))
    p.add_argument("--checkpoint-every", type=int, default=0, help="Also checkpoint every N steps (0: only on request)")
    p.add_argument("--step-delay", type=float, default=0.0, help="Seconds to sleep per step (to make runs observable)")
    p.add_argument("--log-every", type=int, default=0, help="Print the step and loss every N steps (0: never)")
    p.add_argument("--actor", action="store_true",
                   help="Train as a Ray actor holding an orchestrator lease (needs --checkpoint-dir): preempted, it "
                        "checkpoints and yields, and resumes when granted again")
    p.add_argument("--gpu", default="1", help="The lease's request with --actor (as `orchestrator submit --gpu`)")
    a = p.parse_args(argv)
    if a.actor:
        if not a.checkpoint_dir:
            p.error("--actor needs --checkpoint-dir")
        res = run_as_actor(a.steps, checkpoint_dir=a.checkpoint_dir, gpu=a.gpu, seed=a.seed, width=a.width,
                           step_delay_s=a.step_delay, log=lambda s: print(s, flush=True))
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    if a.resume_from is None and a.checkpoint_dir and (Path(a.checkpoint_dir) / CKPT_NAME).exists():
        a.resume_from = str(Path(a.checkpoint_dir) / CKPT_NAME)
    should, on_ck = None, None
    if os.environ.get("ORCHESTRATOR_JOB_ID"):
        from orchestrator.sdk.context import job_context

        ctx = job_context()
        should, on_ck = ctx.preemption_requested, ctx.acknowledge_checkpoint
    print(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}", flush=True)
    res = run(a.steps, seed=a.seed, width=a.width, checkpoint_dir=a.checkpoint_dir, resume_from=a.resume_from,
              checkpoint_every=a.checkpoint_every, step_delay_s=a.step_delay, log_every=a.log_every,
              should_checkpoint=should,
              on_checkpoint=on_ck, log=lambda s: print(s, flush=True), backend=a.backend)
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
