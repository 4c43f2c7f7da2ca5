"""Ray Train on a gang lease: a ``TorchTrainer`` whose workers each run on their own leased cards,
preempted through the orchestrator's queue and resumed from a Ray Train ``Checkpoint``.

The driver side (:func:`fit`)::

    with orchestrator.sdk.leases.gang_lease("2x2", priority="training", requeue=True) as gang:
        result = fit(gang, steps=300, storage=..., stop_file=...)     # returns early when asked to stop
        if gang.preemption_requested():
            gang.ack_preempted(result.checkpoint.path)                # cards handed on, gang requeued
            gang = gang.wait_resumed()                                # maybe on other nodes
            result = fit(gang, steps=300, ..., resume_from=gang.resume_from)

Each Train worker (:func:`train_loop`) first binds itself to its own lease's devices
(``CUDA_VISIBLE_DEVICES`` and the rest, :func:`orchestrator.sdk.leases.worker_env`, by its Ray node and
its rank among the workers there), then trains a small DDP model with gloo on CPU (NCCL on GPUs where present). Between steps
rank 0 looks for ``stop_file``; all ranks agree through an all-reduce, and rank 0 reports a Ray Train
checkpoint (model, optimiser, step) and every rank returns: the run ends at a step boundary, so
nothing is lost.

Data: step ``k`` trains on one *global* batch of :data:`GLOBAL_BATCH` samples drawn from a generator seeded by
``(seed, k)`` alone, split across the ranks (``torch.tensor_split``: rank ``r`` of ``W`` takes the ``r``-th
contiguous part); each rank's loss is its squared errors summed x ``W`` / :data:`GLOBAL_BATCH`, which DDP's
gradient average turns into the global batch's mean-squared-error gradient whatever ``W`` is (uneven parts and
empty ones included). So the data and the maths of a step do not depend on the world size, and an **elastic**
gang job (``--gpu 1-4x1``: a new attempt at another size after a grow or a shrink) resumes from the checkpoint
(model, optimiser, step) with **0 steps lost** at any world size.

What is bit-identical: a run preempted and resumed at the *same* world size ends bit-identical to an undisturbed
one of that size -- the model starts from ``torch.manual_seed(seed)`` on every rank; one thread,
``torch.use_deterministic_algorithms(True)``; gloo's all-reduce of two ranks is a sum of two numbers, which does not
depend on the order. What is not: across a resize the gradient of every step is the same *in exact arithmetic*
but its floating-point sums run in another order (per rank, then across ranks), so the weights agree to rounding
(3.6e-6 of the largest weight after 300 steps run at 2, then 4, then 3 workers against one worker
throughout: tests/unit/test_train_gang_data.py emulates it), not bit for bit; the steps run are the same ones.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

STATE = "state.pt"
#: Samples per step over all ranks, whatever the world size (a gang of W workers splits them W ways).
GLOBAL_BATCH = 48


def _batch(seed: int, step: int, rank: int, world: int) -> tuple[Any, Any]:
    """Rank ``rank``'s part of step ``step``'s global batch (see the module docstring)."""
    import torch

    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(GLOBAL_BATCH, 16, generator=g)
    y = torch.sin(x[:, :4].sum(dim=1, keepdim=True))
    return torch.tensor_split(x, world)[rank], torch.tensor_split(y, world)[rank]


def _model(seed: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))


def train_loop(config: dict[str, Any]) -> None:
    """One Train worker; see the module docstring. ``config``: steps, seed, stop_file, log_dir, handouts
    (the gang's, None off a lease), resume_from (a checkpoint directory, or None), step_sleep_s."""
    import ray
    import ray.train as rt
    import torch
    import torch.distributed as dist
    from ray.train import Checkpoint
    from ray.train.torch import prepare_model

    ctx = rt.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    node_id = ray.get_runtime_context().get_node_id()
    # This worker's rank among the workers on its Ray node. Not Train's local rank: Train counts workers
    # per node *IP*, and Ray nodes may share one (several raylets on one machine, as in our tests).
    nodes: list[Any] = [None] * ctx.get_world_size()
    dist.all_gather_object(nodes, node_id)
    local = sum(1 for r in range(rank) if nodes[r] == node_id)
    env: dict[str, str] = {}
    if config.get("handouts"):
        from orchestrator.sdk.leases import worker_env

        env = worker_env(config["handouts"], node_id, local)
        os.environ.update(env)  # before anything touches CUDA
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    log = Path(config["log_dir"])
    log.mkdir(parents=True, exist_ok=True)

    seed = int(config.get("seed", 0))
    # Train's device where CUDA is there (a card of this worker's lease); the CPU where it is not (simulated GPUs)
    device = rt.torch.get_device() if torch.cuda.is_available() else torch.device("cpu")
    model = prepare_model(_model(seed), move_to_device=device, parallel_strategy_kwargs={"broadcast_buffers": False})
    inner = getattr(model, "module", model)  # Train wraps the model in DDP only for more than one worker
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    resume = config.get("resume_from")
    if resume:
        state = torch.load(Path(resume) / STATE, weights_only=True)
        inner.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"])
    (log / f"worker-{rank}.json").write_text(json.dumps({
        "rank": rank, "local_rank": local, "node_id": node_id, "pid": os.getpid(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        "lease_id": env.get("ORCHESTRATOR_LEASE_ID", ""), "resumed_at": start, "world_size": world}))
    steps = int(config["steps"])
    stop_file = config.get("stop_file")
    sleep_s = float(config.get("step_sleep_s", 0.0))
    step = start
    while step < steps:
        x, y = (t.to(device) for t in _batch(seed, step, rank, world))
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).sum() * (world / GLOBAL_BATCH)  # DDP averages: the global batch's MSE
        loss.backward()
        opt.step()
        step += 1
        if rank == 0 and step % 10 == 0:
            (log / "progress").write_text(str(step))
        flag = torch.tensor([1.0 if rank == 0 and stop_file and os.path.exists(stop_file) else 0.0])
        dist.all_reduce(flag)
        if flag.item() > 0:
            break
        if sleep_s:
            time.sleep(sleep_s)
    metrics = {"step": step, "finished": step >= steps}
    if rank == 0:
        t0 = time.monotonic()
        out = log / f"ckpt-{step}"
        out.mkdir(parents=True, exist_ok=True)
        torch.save({"model": inner.state_dict(), "opt": opt.state_dict(), "step": step, "world_size": world},
                   out / STATE)
        rt.report(metrics, checkpoint=Checkpoint.from_directory(str(out)))  # persisted to storage on return
        (log / f"checkpoint-{step}.json").write_text(json.dumps({"step": step, "checkpoint_s": time.monotonic() - t0}))
    else:
        rt.report(metrics, checkpoint=None)


def fit(gang: Any | None, *, steps: int, storage: str, name: str, log_dir: str, stop_file: str | None = None,
        resume_from: str | None = None, num_workers: int = 2, seed: int = 0, step_sleep_s: float = 0.0) -> Any:
    """Run :func:`train_loop` under a ``TorchTrainer``: on ``gang`` (a :class:`~orchestrator.sdk.leases.GangHandle`,
    its ``scaling_config()`` pinning each Train worker to its lease's node), or, with ``gang=None``, on
    ``num_workers`` workers anywhere (the undisturbed reference). Returns Ray Train's ``Result``; its
    ``checkpoint.path`` is what to acknowledge a preemption with and to resume from."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    # A preempted gang hands its cards on once ``fit`` returns, which is when Train's controller sees its
    # workers finish; it looks every 2 s by default. Looking every 0.2 s (two small actor calls) cuts a
    # preemption's decision-to-grant from 3.6 s to 0.8 s here (bench/preemption.py --holder gang). Read by
    # the controller, which Ray Train starts with the driver's RAY_TRAIN_* variables.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")

    scaling = ScalingConfig(**gang.scaling_config()) if gang is not None else ScalingConfig(
        num_workers=num_workers, use_gpu=False, resources_per_worker={"CPU": 1})
    config = {"steps": steps, "seed": seed, "stop_file": stop_file, "log_dir": log_dir, "resume_from": resume_from,
              "handouts": gang.handouts if gang is not None else None, "step_sleep_s": step_sleep_s}
    trainer = TorchTrainer(train_loop, train_loop_config=config, scaling_config=scaling,
                           torch_config=TorchConfig(backend="gloo"),
                           run_config=RunConfig(storage_path=storage, name=name))
    return trainer.fit()


def load_weights(checkpoint_dir: str) -> dict[str, Any]:
    """The model weights of a checkpoint :func:`train_loop` wrote."""
    import torch

    return torch.load(Path(checkpoint_dir) / STATE, weights_only=True)["model"]


def run_as_job(*, steps: int, storage: str | None, step_sleep_s: float, seed: int, workers: int) -> dict[str, Any]:
    """The driver of a gang *job*: ``orchestrator submit --gpu 2x2 --checkpoint-dir D -- python jobs/train_gang.py``.

    The head runs this on worker 0's node once every worker of the gang is granted; the gang's hand-outs are
    in its environment (:class:`orchestrator.sdk.leases.JobGang`). It holds the cards with the gang's
    placement group, runs :func:`fit` on it, and watches the job's context: when the head asks the job to
    yield (it takes the gang as one victim), the run stops at a step boundary with a Ray Train checkpoint,
    which the driver acknowledges; the head then requeues the job and a later attempt resumes from that
    checkpoint (``ORCHESTRATOR_RESUME_FROM``), possibly on other nodes. Run without the orchestrator it
    trains on ``workers`` workers anywhere (the undisturbed reference). Under the orchestrator Ray Train's
    ``num_workers`` is the number of hand-outs the attempt got (:meth:`JobGang.scaling_config`): an elastic gang
    job's attempt runs with the ``k`` workers the head granted it, and the next attempt, after a grow or a shrink,
    with its own ``k``, resuming from the checkpoint with no step lost. Returns what it prints last."""
    import threading

    import ray

    from orchestrator.sdk.context import job_context
    from orchestrator.sdk.leases import JobGang

    ctx = job_context()
    gang = JobGang.from_env()
    root = Path(ctx.checkpoint_dir or storage or "/tmp/rgo-train-gang")
    run = f"{ctx.job_id or 'unmanaged'}-a{ctx.attempt}"
    stop_file = root / f"stop-{run}"
    if not ray.is_initialized():
        ray.init()
    done = threading.Event()

    def watch() -> None:  # the head's request becomes the run's stop file, read by rank 0 between steps
        while not done.wait(0.2):
            if ctx.preemption_requested():
                stop_file.parent.mkdir(parents=True, exist_ok=True)
                stop_file.write_text("the orchestrator asked this job to checkpoint and yield")
                return

    threading.Thread(target=watch, daemon=True).start()
    try:
        if gang is not None:
            gang.hold()
        result = fit(gang, steps=steps, storage=str(root / "storage"), name=run, log_dir=str(root / "logs" / run),
                     stop_file=str(stop_file), resume_from=ctx.resume_from, num_workers=workers, seed=seed,
                     step_sleep_s=step_sleep_s)
    finally:
        done.set()
        if gang is not None:
            gang.drop()
    out = {"job_id": ctx.job_id, "attempt": ctx.attempt, "step": result.metrics["step"],
           "workers": len(gang.handouts) if gang is not None else workers,
           "finished": bool(result.metrics["finished"]), "checkpoint": result.checkpoint.path,
           "resumed_from": ctx.resume_from, "nodes": gang.nodes if gang is not None else None}
    if not out["finished"] and ctx.managed:
        ctx.acknowledge_checkpoint(result.checkpoint.path, int(result.metrics["step"]))
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=run_as_job.__doc__.split("\n")[0] if run_as_job.__doc__ else None)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--storage", help="where checkpoints go when the job has no checkpoint directory")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds slept per step (to watch it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2, help="Train workers when run without the orchestrator")
    a = p.parse_args(argv)
    out = run_as_job(steps=a.steps, storage=a.storage, step_sleep_s=a.step_sleep, seed=a.seed, workers=a.workers)
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
