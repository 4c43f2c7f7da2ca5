"""The inference service on leases: Serve deployments whose replicas each run on one lease of ours.

Shape (design (a) of ``docs/colocation.md``, "The inference service on leases"):

* one **replica application** per leased replica, holding one
  :class:`LeasedReplica` deployment with ``num_replicas=1`` whose
  ``ray_actor_options`` come from that lease's hand-out: its share of the
  card's own Ray resource (``rgo-gpu-<i>``), a label selector for the lease's
  node, and the hand-out's environment (``CUDA_VISIBLE_DEVICES`` = the GPU or
  MIG UUID, ``ORCHESTRATOR_SHARE_KIND``, the MPS limits...). Serve takes one
  set of actor options per deployment, so a deployment per lease is how each
  replica gets *its own* card;
* one **ingress application** (:class:`Ingress`, route ``/``) that Serve's
  HTTP proxy calls. It routes each request to the replica with the fewest
  ongoing requests (ties: the one that has served fewest) and keeps the
  figures the scaling loop reads: ongoing requests per replica and the
  latency of recent requests (:class:`Router`).

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

Invariant: a request is counted *ongoing* at its replica from the moment the
ingress picks it until its answer (or error) comes back, so the sum over
replicas is the service's ongoing requests.

:class:`ReplicaCore` and :class:`Router` are plain Python, unit-tested
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
        import torch

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


class Router:
    """Least-loaded routing over named replicas, with the counters the scaling loop reads.

    ``pick`` chooses among replicas that are routable; a replica being removed is first made unroutable
    (``set_replicas`` without it) and keeps its ongoing count until its requests finish, so the manager can
    wait for it to drain. Invariant: ``ongoing[name] >= 0``; a name leaves the table only once unroutable
    and drained."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, window_s: float = LATENCY_WINDOW_S) -> None:
        self.clock, self.window_s = clock, window_s
        self.routable: list[str] = []
        self.ongoing: dict[str, int] = {}
        self.served: dict[str, int] = {}
        self.errors = 0
        self.recent: deque[tuple[float, float]] = deque()  # (finished at, latency s)
        self.total = 0
        # the time-integral of the total ongoing since the last load() read: its mean is the smoothed signal
        self._area, self._since, self._at = 0.0, clock(), clock()

    def set_replicas(self, names: Sequence[str]) -> None:
        self.routable = list(names)
        for n in names:
            self.ongoing.setdefault(n, 0)
            self.served.setdefault(n, 0)
        self._forget_drained()

    def pick(self) -> str | None:
        if not self.routable:
            return None
        return min(self.routable, key=lambda n: (self.ongoing[n], self.served[n], n))

    def _accumulate(self) -> float:
        now = self.clock()
        self._area += sum(self.ongoing.values()) * (now - self._at)
        self._at = now
        return now

    def begin(self, name: str) -> None:
        self._accumulate()
        self.ongoing[name] += 1

    def end(self, name: str, latency_s: float, ok: bool = True) -> None:
        self._accumulate()
        self.ongoing[name] -= 1
        self.served[name] += 1
        self.total += 1
        if not ok:
            self.errors += 1
        now = self.clock()
        self.recent.append((now, latency_s))
        self._trim(now)
        self._forget_drained()

    def _trim(self, now: float) -> None:
        while self.recent and self.recent[0][0] < now - self.window_s:
            self.recent.popleft()

    def _forget_drained(self) -> None:
        for n in [n for n, k in self.ongoing.items() if k == 0 and n not in self.routable]:
            del self.ongoing[n]

    def load(self, reset: bool = True) -> dict[str, Any]:
        """``ongoing`` per replica (routable or draining), their sum now, ``mean_ongoing`` (the time-average
        of that sum since the previous ``load`` with ``reset``: the smoothed signal the autoscaler reads),
        and the p99 (ms) of the requests that finished in the last window. ``reset=False`` reads without
        starting a new averaging window (a drain watching one replica's count)."""
        now = self._accumulate()
        mean = self._area / (now - self._since) if now > self._since else float(sum(self.ongoing.values()))
        if reset:
            self._area, self._since = 0.0, now
        self._trim(now)
        lat = sorted(x for _, x in self.recent)
        p99 = lat[min(len(lat) - 1, math.ceil(0.99 * len(lat)) - 1)] * 1000 if lat else None
        return {"ongoing": dict(self.ongoing), "total_ongoing": sum(self.ongoing.values()), "mean_ongoing": mean,
                "routable": list(self.routable), "p99_ms": p99, "window_requests": len(lat),
                "served": self.total, "errors": self.errors}


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000)
class LeasedReplica:
    """One replica on one lease (its actor options are given per application: see the module docstring)."""

    def __init__(self, lease_id: str, seed: int = 0, width: int = 256, max_batch_size: int = 8,
                 batch_wait_timeout_s: float = 0.01, perf: dict[str, float] | None = None) -> None:
        self.core = ReplicaCore(lease_id, seed=seed, width=width, model=InferenceModel(**(perf or {})))
        self._batch.set_max_batch_size(max_batch_size)
        self._batch.set_batch_wait_timeout_s(batch_wait_timeout_s)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def _batch(self, requests: list[Any]) -> list[Any]:
        return await self.core.run_batch(requests)

    async def infer(self, rows: Any) -> Any:
        return await self._batch(rows)

    def stats(self) -> dict[str, Any]:
        return self.core.stats()

    def whoami(self) -> dict[str, Any]:
        """Its Ray actor name and namespace (how the node's agent reaches it), pid and devices."""
        from ray import get_runtime_context

        ctx = get_runtime_context()
        return {"actor_name": ctx.get_actor_name(), "namespace": ctx.namespace, "pid": os.getpid(),
                "cuda_visible_devices": os.environ.get(E.CUDA_VISIBLE_DEVICES, "")}


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10_000)
class Ingress:
    """``POST /`` with ``{"inputs": [[32 numbers], ...]}``: routed to the least-loaded leased replica.

    Answers ``{"outputs": [...], "replica": name}``; 503 while no replica is routable; 400 for bad input."""

    def __init__(self) -> None:
        self.router = Router()
        self.handles: dict[str, Any] = {}

    def set_replicas(self, apps: dict[str, str]) -> list[str]:
        """Route to these replicas from now on: replica name -> its Serve application's name."""
        for name, app in apps.items():
            if name not in self.handles:
                self.handles[name] = serve.get_app_handle(app)
        self.router.set_replicas(sorted(apps))
        return self.router.routable

    def load(self, reset: bool = True) -> dict[str, Any]:
        return self.router.load(reset)

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        t0 = time.monotonic()
        try:
            rows = (await request.json())["inputs"]
        except Exception as e:
            return JSONResponse({"error": f"body must be JSON with 'inputs': {e}"}, status_code=400)
        name = self.router.pick()
        if name is None:
            return JSONResponse({"error": "no replica is serving"}, status_code=503)
        self.router.begin(name)
        ok = False
        try:
            out = await self.handles[name].infer.remote(rows)
            ok = not isinstance(out, str)
        finally:
            self.router.end(name, time.monotonic() - t0, ok)
        if not ok:
            return JSONResponse({"error": out, "replica": name}, status_code=400)
        return {"outputs": out, "replica": name}


def replica_app(lease_id: str, actor_options: Mapping[str, Any], *, seed: int = 0, width: int = 256,
                max_batch_size: int = 8, batch_wait_timeout_s: float = 0.01, perf: InferenceModel | None = None) -> Any:
    """The Serve application of one leased replica (``actor_options``: :func:`rayport.serve_api.replica_options`;
    ``perf``: the batch cost model on simulated GPUs, default :class:`InferenceModel`)."""
    p = perf or InferenceModel()
    return LeasedReplica.options(num_replicas=1, ray_actor_options=dict(actor_options)).bind(
        lease_id, seed, width, max_batch_size, batch_wait_timeout_s, {"base_ms": p.base_ms, "per_item_ms": p.per_item_ms,
                                                                "sm_per_item": p.sm_per_item})


def ingress_app() -> Any:
    return Ingress.bind()
