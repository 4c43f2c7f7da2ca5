"""The inference service on leases: Serve deployments whose replicas each run on one lease of ours.

Shape: **one Serve application** (:func:`service_app`), as a Ray Serve user would write it:

* the GPU deployment (:class:`LeasedReplica`) asks Ray for ``num_gpus`` per replica, with its lease's request,
  priority class and queue in ``ray_actor_options["runtime_env"]["env_vars"]``; Serve's controller, under the
  orchestrator's hook, asks the head for one lease per replica without waiting in its loop
  (:mod:`orchestrator.rayport.serve_leases`) and starts each replica inside its lease's placement group, so the
  replica's ``ray.get_gpu_ids()`` and ``CUDA_VISIBLE_DEVICES`` name exactly the leased card or slice. Its
  replica count is set from outside (Serve's external scaler API) by the service's autoscaler;
* the **ingress** (:class:`Ingress`, route ``/``) that Serve's HTTP proxy calls; it calls the GPU deployment
  through its handle (Serve's router picks the replica) and keeps the figures the scaling loop reads: ongoing
  requests and the latency of recent requests (:class:`LoadMeter`), and each replica's latest counters.

A replica (:class:`ReplicaCore`) runs a small PyTorch MLP on the lease's
device (``cuda`` when the process sees a real GPU, else the CPU) and batches
requests (``serve.batch``: one batch at a time per replica, as one device
runs one kernel stream). On **simulated** GPUs it then sleeps until the batch
has taken what :class:`~orchestrator.sim.perfmodel.InferenceModel` says it
takes on the lease's share (``ShareSpeed.of_env``: a small batch runs at full
speed on a slice that holds the SMs it needs, a big one is stretched; a
time-slice stretches every batch), so latency reflects the share. Each
replica counts requests, batches, busy seconds (the modelled batch times;
measured ones on a real GPU) and useful GPU-seconds
(``InferenceModel.useful_gpu_s``: the SM-time its batches were worth; on a
real GPU, busy seconds times the share held, an upper bound).

Invariant: a request is counted *ongoing* from the moment the ingress takes
it until its answer (or error) comes back.

:class:`ReplicaCore` and :class:`LoadMeter` are plain Python, unit-tested
without Serve. Importing this module starts nothing.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections import deque
from typing import Any, Callable, Mapping, Sequence

from ray import serve

from orchestrator.core import env as E
from orchestrator.core.extras import require
from orchestrator.core.stats import quantile
from orchestrator.sim.perfmodel import InferenceModel, ShareSpeed

INPUT_WIDTH = 32
#: Seconds of recent requests whose latency the router keeps for the p99 the autoscaler may read.
LATENCY_WINDOW_S = 5.0


class ReplicaCore:
    """One replica's model, device and counters; ``run_batch`` is what a batch costs on the lease's share.

    ``simulated`` (default: no CUDA device visible) means the share's speed is modelled: after the real
    compute the batch sleeps until ``InferenceModel.batch_s(len(batch), share)`` has passed. Counters only
    grow; ``busy_s`` is the modelled (simulated) or measured (real) time of every batch."""

    def __init__(self, lease_id: str, *, environ: Mapping[str, str] | None = None, seed: int = 0, width: int = 256,
                 model: InferenceModel | None = None, simulated: bool | None = None,
                 sleep: Callable[[float], Any] = asyncio.sleep) -> None:
        torch = require("torch", "train")  # the replica's model is a torch MLP

        env = os.environ if environ is None else environ
        self.lease_id = lease_id
        self.share = ShareSpeed.of_env(env)
        self.kind = env.get(E.SHARE_KIND, "whole")
        self.devices = env.get(E.CUDA_VISIBLE_DEVICES, "")
        self.simulated = (not torch.cuda.is_available()) if simulated is None else simulated
        self.device = torch.device("cpu" if self.simulated else "cuda")
        self.perf = model or InferenceModel()
        self._sleep = sleep
        torch.set_num_threads(1)
        g = torch.Generator().manual_seed(seed)
        self.w1 = (torch.randn(INPUT_WIDTH, width, generator=g) / math.sqrt(INPUT_WIDTH)).to(self.device)
        self.w2 = (torch.randn(width, 1, generator=g) / math.sqrt(width)).to(self.device)
        self.requests = self.batches = 0
        self.busy_s = 0.0
        self.useful_gpu_s = 0.0

    def forward(self, rows: Sequence[Sequence[float]]) -> list[float]:
        import torch

        x = torch.as_tensor(rows, dtype=torch.float32, device=self.device)
        if x.ndim != 2 or x.shape[1] != INPUT_WIDTH:
            raise ValueError(f"inputs must be rows of {INPUT_WIDTH} numbers, got shape {list(x.shape)}")
        with torch.no_grad():
            return (torch.tanh(x @ self.w1) @ self.w2)[:, 0].cpu().tolist()

    async def run_batch(self, requests: Sequence[Sequence[Sequence[float]]]) -> list[list[float] | str]:
        """One batch: each request is rows of numbers; the answer per request is its outputs or an error."""
        t0 = time.perf_counter()
        out: list[list[float] | str] = []
        for rows in requests:
            try:
                out.append(self.forward(rows))
            except (ValueError, TypeError, RuntimeError) as e:
                out.append(f"error: {e}")
        real = time.perf_counter() - t0
        if self.simulated:
            modelled = self.perf.batch_s(len(requests), self.share)
            if modelled > real:
                await self._sleep(modelled - real)
            self.busy_s += max(modelled, real)
            self.useful_gpu_s += self.perf.useful_gpu_s(len(requests))
        else:
            self.busy_s += real
            self.useful_gpu_s += real * min(1.0, self.share.card_share)
        self.requests += len(requests)
        self.batches += 1
        return out

    def stats(self) -> dict[str, Any]:
        return {"lease_id": self.lease_id, "kind": self.kind, "devices": self.devices, "simulated": self.simulated,
                "card_share": self.share.card_share, "speed": self.share.speed, "requests": self.requests,
                "batches": self.batches, "busy_s": round(self.busy_s, 6),
                "useful_gpu_s": round(self.useful_gpu_s, 6), "pid": os.getpid()}


class LoadMeter:
    """The service's load as the scaling loop reads it: requests ongoing (taken by the ingress, not yet answered),
    their time-average since the last read, and the latency of recent requests. Serve picks the replica; this
    only counts. Invariant: ``ongoing >= 0``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, window_s: float = LATENCY_WINDOW_S) -> None:
        self.clock, self.window_s = clock, window_s
        self.ongoing = 0
        self.errors = 0
        self.total = 0
        self.recent: deque[tuple[float, float]] = deque()  # (finished at, latency s)
        # the time-integral of ongoing since the last load() read: its mean is the smoothed signal
        self._area, self._since, self._at = 0.0, clock(), clock()

    def _accumulate(self) -> float:
        now = self.clock()
        self._area += self.ongoing * (now - self._at)
        self._at = now
        return now

    def begin(self) -> None:
        self._accumulate()
        self.ongoing += 1

    def end(self, latency_s: float, ok: bool = True) -> None:
        now = self._accumulate()
        self.ongoing -= 1
        self.total += 1
        self.errors += not ok
        self.recent.append((now, latency_s))
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self.recent and self.recent[0][0] < now - self.window_s:
            self.recent.popleft()

    def load(self, reset: bool = True) -> dict[str, Any]:
        """``ongoing`` now, ``mean_ongoing`` (the time-average of it since the previous ``load`` with ``reset``:
        the smoothed signal the autoscaler reads), and the p99 (ms) of the requests that finished in the last
        window. ``reset=False`` reads without starting a new averaging window (a peek)."""
        now = self._accumulate()
        mean = self._area / (now - self._since) if now > self._since else float(self.ongoing)
        if reset:
            self._area, self._since = 0.0, now
        self._trim(now)
        p99 = quantile((x for _, x in self.recent), 0.99)
        return {"ongoing": self.ongoing, "mean_ongoing": mean, "p99_ms": p99 * 1000 if p99 is not None else None,
                "window_requests": len(self.recent), "served": self.total, "errors": self.errors}


@serve.deployment(max_ongoing_requests=1000, graceful_shutdown_wait_loop_s=0.2, graceful_shutdown_timeout_s=10)
class LeasedReplica:
    """One replica of the service's one GPU deployment; its lease is the one Serve's controller asked for it
    (``serve-<app>-<deployment>-<replica id>``, :func:`orchestrator.rayport.serve_leases.replica_lease_id`)."""

    def __init__(self, seed: int = 0, width: int = 256, max_batch_size: int = 8, batch_wait_timeout_s: float = 0.01,
                 perf: dict[str, float] | None = None) -> None:
        from orchestrator.rayport.serve_leases import replica_lease_id

        lease_id = replica_lease_id(serve.get_replica_context().replica_id)
        self.core = ReplicaCore(lease_id, seed=seed, width=width, model=InferenceModel(**(perf or {})))
        self._batch.set_max_batch_size(max_batch_size)
        self._batch.set_batch_wait_timeout_s(batch_wait_timeout_s)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def _batch(self, requests: list[Any]) -> list[Any]:
        return await self.core.run_batch(requests)

    async def infer(self, rows: Any) -> Any:
        """The answer (outputs, or an error string) and this replica's counters after it (the ingress keeps the
        latest per lease: how the service's figures survive a replica that Serve has stopped)."""
        out = await self._batch(rows)
        return {"out": out, "stats": self.core.stats()}


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10_000)
class Ingress:
    """``POST /`` with ``{"inputs": [[32 numbers], ...]}``: Serve routes it to one of the GPU deployment's
    replicas (its power-of-two-choices router).

    Answers ``{"outputs": [...], "replica": lease id}``; 400 for bad input. While no replica runs Serve queues
    the request. Keeps the figures the scaling loop reads (:class:`LoadMeter`: ongoing requests, recent p99) and
    each replica's latest counters."""

    def __init__(self, replicas: Any) -> None:
        self.replicas = replicas
        self.meter = LoadMeter()
        self.stats: dict[str, dict[str, Any]] = {}

    def load(self, reset: bool = True) -> dict[str, Any]:
        return {**self.meter.load(reset), "replicas": dict(self.stats)}

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        t0 = time.monotonic()
        try:
            rows = (await request.json())["inputs"]
        except Exception as e:
            return JSONResponse({"error": f"body must be JSON with 'inputs': {e}"}, status_code=400)
        self.meter.begin()
        ok = False
        try:
            got = await self.replicas.infer.remote(rows)
            out, st = got["out"], got["stats"]
            self.stats[st["lease_id"]] = st
            ok = not isinstance(out, str)
        finally:
            self.meter.end(time.monotonic() - t0, ok)
        if not ok:
            return JSONResponse({"error": out, "replica": st["lease_id"]}, status_code=400)
        return {"outputs": out, "replica": st["lease_id"]}


#: The GPU deployment's name in the service's application.
REPLICA_DEPLOYMENT = "LeasedReplica"


def service_app(actor_options: Mapping[str, Any], replicas: int, *, seed: int = 0, width: int = 256,
                max_batch_size: int = 8, batch_wait_timeout_s: float = 0.01, perf: InferenceModel | None = None) -> Any:
    """The service's one application: the ingress (route ``/``) and the GPU deployment, ``replicas`` of it, each
    replica with ``actor_options`` (its ``num_gpus`` and the env naming its lease's request and priority class:
    Serve's controller asks for one lease per replica, :mod:`orchestrator.rayport.serve_leases`); ``perf``: the
    batch cost model on simulated GPUs, default :class:`InferenceModel`."""
    p = perf or InferenceModel()
    gpu = LeasedReplica.options(num_replicas=replicas, ray_actor_options=dict(actor_options)).bind(
        seed, width, max_batch_size, batch_wait_timeout_s,
        {"base_ms": p.base_ms, "per_item_ms": p.per_item_ms, "sm_per_item": p.sm_per_item})
    return Ingress.bind(gpu)
