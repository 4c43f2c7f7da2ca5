"""A real, deterministic PyTorch training job that survives preemption without losing work.

Run it plainly (``python jobs/train.py --steps 200 --checkpoint-dir /tmp/ck``),
through ``orchestrator submit --priority training -- python jobs/train.py ...``
or ``ray job submit -- python jobs/train.py``. Under the orchestrator it reads
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
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

CKPT_NAME = "checkpoint.pt"


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


def run(steps: int, *, seed: int = 0, width: int = 64, checkpoint_dir: str | None = None, resume_from: str | None = None,
        checkpoint_every: int = 0, step_delay_s: float = 0.0, log_every: int = 0,
        should_checkpoint: Callable[[], bool] | None = None, on_checkpoint: Callable[[str, int], None] | None = None,
        log: Callable[[str], None] = print) -> dict:
    """Train to ``steps``; stop early (after checkpointing) when ``should_checkpoint()`` says so."""
    t = Trainer(seed=seed, width=width)
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
              "loss": t.loss, "digest": t.digest(), "device": str(t.device)}
    if not preempted and checkpoint_dir:
        t.checkpoint(checkpoint_dir)
        (Path(checkpoint_dir) / "result.json").write_text(json.dumps(result))
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--checkpoint-dir", default=os.environ.get("ORCHESTRATOR_CHECKPOINT_DIR"))
    p.add_argument("--resume-from", default=os.environ.get("ORCHESTRATOR_RESUME_FROM"))
    p.add_argument("--checkpoint-every", type=int, default=0, help="Also checkpoint every N steps (0: only on request)")
    p.add_argument("--step-delay", type=float, default=0.0, help="Seconds to sleep per step (to make runs observable)")
    p.add_argument("--log-every", type=int, default=0, help="Print the step and loss every N steps (0: never)")
    a = p.parse_args(argv)
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
              on_checkpoint=on_ck, log=lambda s: print(s, flush=True))
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
