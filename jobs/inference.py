"""A small CPU "inference" workload: batches through a fixed 3-layer MLP, reporting throughput and latency.

It stands in for a latency-sensitive model server in the preemption scenario
(submitted with ``--priority inference``, it takes the devices a training job
held). Numpy only, one thread, so it runs anywhere; under the orchestrator it
prints the ``CUDA_VISIBLE_DEVICES`` its lease gave it.

    python jobs/inference.py --duration 10
    orchestrator submit --priority inference --gpu mig:3g.40gb -- python jobs/inference.py --duration 30

Every ``--report-every`` seconds it prints one line (requests/s, p50 and p99
latency of the interval); at the end, or on SIGTERM (``orchestrator cancel``,
``ray job stop``), one ``RESULT {json}`` line for the whole run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before numpy loads its BLAS: a fair share of a shared host
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402


def make_model(width: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = [(256, width), (width, width), (width, 16)]
    return [(rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32) for s in sizes]


def infer(model: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    for w in model[:-1]:
        x = np.maximum(x @ w, 0.0)
    return x @ model[-1]


def percentile_ms(samples: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) in ms, as every figure is computed (``orchestrator.core.stats``)."""
    from orchestrator.core.stats import quantile

    v = quantile(samples, q / 100)
    return v * 1000 if v is not None else 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=20.0, help="Seconds to serve (0: until stopped)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--report-every", type=float, default=2.0)
    p.add_argument("--slo-ms", type=float, default=None, help="Latency SLO: slower requests count as misses")
    p.add_argument("--service", default=None, help="Service name in the head's metrics (default: the job id; "
                   "a name the head's settings.inference_services does not register counts as 'other'); "
                   "under the orchestrator each interval's latencies are reported to the head")
    a = p.parse_args(argv)
    ctx = None
    if os.environ.get("ORCHESTRATOR_JOB_ID"):
        from orchestrator.sdk.context import job_context  # only under the orchestrator: plain runs need numpy alone

        ctx = job_context()
    service = a.service or os.environ.get("ORCHESTRATOR_JOB_ID", "inference")
    slo_s = a.slo_ms / 1000 if a.slo_ms else None
    stop = {"why": ""}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(why="SIGTERM"))
    print(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}", flush=True)
    model = make_model(a.width)
    rng = np.random.default_rng(1)
    batch = rng.standard_normal((a.batch, 256)).astype(np.float32)
    t0 = last = time.perf_counter()
    window: list[float] = []
    every: list[float] = []
    checksum = 0.0
    while not stop["why"]:
        s = time.perf_counter()
        checksum += float(infer(model, batch)[0, 0])
        lat = time.perf_counter() - s
        window.append(lat)
        every.append(lat)
        now = time.perf_counter()
        if now - last >= a.report_every:
            if ctx is not None:  # one request per sample in the batch, each with the batch's latency
                ctx.record_inference(service, [lat for lat in window for _ in range(a.batch)], slo_s)
            print(f"{now - t0:7.1f}s  {len(window) * a.batch / (now - last):9.0f} req/s  "
                  f"p50 {percentile_ms(window, 50):6.2f} ms  p99 {percentile_ms(window, 99):6.2f} ms", flush=True)
            window, last = [], now
        if a.duration and now - t0 >= a.duration:
            stop["why"] = "duration reached"
    if ctx is not None and window:
        ctx.record_inference(service, [lat for lat in window for _ in range(a.batch)], slo_s)
    elapsed = time.perf_counter() - t0
    result = {"status": "stopped" if stop["why"] == "SIGTERM" else "completed", "seconds": round(elapsed, 3),
              "requests": len(every) * a.batch, "req_per_s": round(len(every) * a.batch / elapsed, 1),
              "p50_ms": round(percentile_ms(every, 50), 3), "p99_ms": round(percentile_ms(every, 99), 3),
              "checksum": round(checksum, 6)}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
