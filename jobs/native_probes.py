"""Ray's own GPU APIs, as a user writes them, each printing what it saw: the probes of bench/native.py and
tests/integration/test_native.py (docs/ray-native.md). Nothing here knows the orchestrator.

    python jobs/native_probes.py plain|train|tune|serve

Each prints one ``NATIVE_<WHAT>={json}`` line: the GPU ids and ``CUDA_VISIBLE_DEVICES`` each task, Train
worker, Tune trial or Serve replica saw. CUDA is absent on simulated GPUs: nothing here touches a device.
"""

from __future__ import annotations

import json
import os
import sys
import time

import ray


#: How long each task, worker, trial and replica call holds its card: long enough for a sampler to see it.
HOLD_S = float(os.environ.get("NATIVE_HOLD_S", "1.5"))


def seen() -> dict:
    time.sleep(HOLD_S)
    return {"gpu_ids": [str(i) for i in ray.get_gpu_ids()], "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "node": ray.get_runtime_context().get_node_id(), "lease": os.environ.get("ORCHESTRATOR_LEASE_ID")}


def plain() -> dict:
    @ray.remote(num_gpus=1)
    def whole() -> dict:
        return seen()

    @ray.remote(num_gpus=0.5)
    def half() -> dict:
        return seen()

    return {"whole": ray.get([whole.remote(), whole.remote()], timeout=300), "half": ray.get(half.remote(), timeout=300)}


def train() -> dict:
    import shutil
    import tempfile

    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    out_dir = tempfile.mkdtemp(prefix="native-train-")  # removed at the end: a probe leaves nothing behind

    def loop(config: dict) -> None:
        import ray.train

        rank = ray.train.get_context().get_world_rank()
        with open(os.path.join(config["out"], f"rank-{rank}.json"), "w") as f:
            json.dump(seen(), f)
        ray.train.report({"rank": rank})

    try:
        trainer = TorchTrainer(loop, train_loop_config={"out": out_dir}, torch_config=TorchConfig(backend="gloo"),
                               scaling_config=ScalingConfig(num_workers=2, use_gpu=True),
                               run_config=RunConfig(name=f"native-{os.getpid()}", storage_path=out_dir))
        result = trainer.fit()
        workers = [json.load(open(os.path.join(out_dir, f))) for f in sorted(os.listdir(out_dir))
                   if f.startswith("rank-")]
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    return {"workers": workers, "error": repr(result.error) if result.error else None}


def tune() -> dict:
    import shutil
    import tempfile

    from ray import tune as t

    def trial(config: dict) -> dict:
        return {"seen": json.dumps(seen()), "x": config["x"]}

    storage = tempfile.mkdtemp(prefix="native-tune-")
    try:
        tuner = t.Tuner(t.with_resources(trial, {"gpu": 1, "cpu": 0}), param_space={"x": t.grid_search([1, 2])},
                        run_config=t.RunConfig(storage_path=storage, name=f"native-{os.getpid()}"))
        results = tuner.fit()
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    return {"trials": [r.metrics.get("seen") for r in results], "errors": [repr(r.error) for r in results if r.error]}


def serve() -> dict:
    from ray import serve as s

    @s.deployment(num_replicas=2, ray_actor_options={"num_gpus": 0.5, "num_cpus": 0})
    class Where:
        def __call__(self, request=None) -> dict:
            return seen()

    handle = s.run(Where.bind(), name="native", route_prefix=None)
    out = {"replicas": [handle.remote().result(timeout_s=120) for _ in range(6)]}
    s.delete("native")
    return out


def serve_hold() -> dict:
    """One replica asking for a whole card, asked every 0.5 s for ``NATIVE_SERVE_S`` seconds: which card answered
    when (a preemption moves the replica to another card; Serve starts it again on a lease of its own). With
    ``NATIVE_SERVE_MOVED`` = n it stops sooner: once the last n answers came from a card other than the first
    answer's and the file ``NATIVE_SERVE_STOP`` names exists (when it names one) -- the test that preempts the
    replica creates it once it has seen the new replica's lease, and no longer waits out the seconds."""
    from ray import serve as s

    @s.deployment(num_replicas=1, ray_actor_options={"num_gpus": 1, "num_cpus": 0})
    class Where:
        def __call__(self, request=None) -> dict:
            return {"gpu_ids": [str(i) for i in ray.get_gpu_ids()], "lease": os.environ.get("ORCHESTRATOR_LEASE_ID")}

    handle = s.run(Where.bind(), name="hold", route_prefix=None)
    answers, errors = [], 0
    end = time.monotonic() + float(os.environ.get("NATIVE_SERVE_S", "40"))
    moved = int(os.environ.get("NATIVE_SERVE_MOVED", "0"))
    stop = os.environ.get("NATIVE_SERVE_STOP")
    print("NATIVE_SERVING", flush=True)
    while time.monotonic() < end:
        try:
            a = handle.remote().result(timeout_s=30)
            answers.append({"t": round(time.monotonic(), 2), **a})
        except Exception:  # the replica being moved
            errors += 1
        tail = answers[-moved:] if moved else []
        if (len(tail) == moved and answers[:-moved] and all(x["gpu_ids"] != answers[0]["gpu_ids"] for x in tail)
                and (stop is None or os.path.exists(stop))):
            break
        time.sleep(0.5)
    s.delete("hold")
    return {"answers": answers, "errors": errors}


def serve_wait() -> dict:
    """Serve's controller while its replicas' leases wait in the queue (the test holds every card): an application
    whose two replicas wait is deleted (their leases must be withdrawn), another's two replicas wait until the test
    frees two cards. Meanwhile ``serve.status()`` is timed: the controller must keep answering."""
    from ray import serve as s

    def status_ms(seconds: float) -> list[float]:
        out, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            s.status()
            out.append(round((time.monotonic() - t0) * 1000, 1))
            time.sleep(0.25)
        return out

    @s.deployment(ray_actor_options={"num_gpus": 1, "num_cpus": 0})
    class Where:
        def __call__(self, request=None) -> dict:
            return {"gpu_ids": [str(i) for i in ray.get_gpu_ids()], "lease": os.environ.get("ORCHESTRATOR_LEASE_ID"),
                    "cvd": os.environ.get("CUDA_VISIBLE_DEVICES")}

    s.run_many([s.RunTarget(Where.options(num_replicas=2).bind(), name="gone", route_prefix=None)],
               wait_for_ingress_deployment_creation=False, wait_for_applications_running=False)
    print("NATIVE_GONE_ASKED", flush=True)
    waited = status_ms(8)
    s.delete("gone")
    print("NATIVE_GONE_DELETED", flush=True)
    s.run_many([s.RunTarget(Where.options(num_replicas=2).bind(), name="waits", route_prefix=None)],
               wait_for_ingress_deployment_creation=False, wait_for_applications_running=False)
    print("NATIVE_WAITS_ASKED", flush=True)
    waited += status_ms(4)
    end = time.monotonic() + float(os.environ.get("NATIVE_SERVE_S", "240"))
    while s.status().applications["waits"].status != "RUNNING" and time.monotonic() < end:
        time.sleep(0.5)
    handle = s.get_app_handle("waits")
    answers = [handle.remote().result(timeout_s=60) for _ in range(8)]
    s.delete("waits")
    return {"status_ms": waited, "answers": answers}


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "plain"
    ray.init()
    t0 = time.monotonic()
    out = {"plain": plain, "train": train, "tune": tune, "serve": serve, "serve-hold": serve_hold,
           "serve-wait": serve_wait}[what]()
    out["seconds"] = round(time.monotonic() - t0, 2)
    print(f"NATIVE_{what.upper().replace('-', '_')}=" + json.dumps(out, default=str), flush=True)
