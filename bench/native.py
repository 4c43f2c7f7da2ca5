"""Ray's own GPU APIs on leases, on a real local cluster with simulated GPUs (prints figures; not a test).

Starts the demo cluster (``configs/cluster.demo.yaml``) with ``orchestrator up``'s own code in a state
directory of its own, then runs, as users would:

* ``plain_num_gpus_task``, ``train_use_gpu``, ``tune_gpu_trial``, ``serve_num_gpus``: ``jobs/native_probes.py``
  submitted with Ray's own job API (what ``ray job submit`` does): a driver that holds no lease, whose
  ``num_gpus`` tasks, Train worker group, Tune trials and Serve replicas each get a lease of their own;
  each is ``"ok"`` when every holder saw exactly one card through ``ray.get_gpu_ids()`` and
  ``CUDA_VISIBLE_DEVICES`` agreed, else the error;
* ``train_use_gpu_in_job``: the same Train run as ``orchestrator submit --gpu 2``: its worker group takes
  the job's lease;
* ``double_use_events``: samples (every 0.5 s, all the while) in which a card had two holders or a holder
  without a lease (``orchestrator.bench.native.CardChecker``), with ``double_use_samples`` and
  ``gpu_holders_seen``;
* ``actor_start_p50_ms_plain_ray``: an actor asking for no GPU, from ``.remote()`` to its first answer, on the
  node where the orchestrated one before it ran; ``actor_start_p50_ms_orchestrated``: an actor asking
  ``num_gpus=1`` from a driver without a lease (its own
  lease asked, granted, its group placed, the actor started), interleaved in the same run, each after
  ``--settle`` seconds (a start on a settled cluster); and their ratio. The ``actor_start_back_to_back_*``
  figures start each right after the one before was killed (its lease still held until the head sees its
  holder dead, and its node's agent busy giving the card back). With the lease's two legs for each (``lease_grant_p50_ms``: asked to granted;
  ``lease_group_p50_ms``: granted to its group found placed; ``..._back_to_back_...`` likewise).

    .venv/bin/python bench/native.py --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from orchestrator.core.config import DEMO_CONFIG, load_config
from orchestrator.core.jsonout import stdout_to_stderr

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "jobs"


def run(state: Any, starts: int, say: Any, settle_s: float = 2.0, probes: bool = True) -> dict[str, Any]:
    import ray

    from orchestrator.bench import native as nb
    from orchestrator.rayport import cards, native, ray_api
    from orchestrator.rayport.client import HeadClient

    ray_api.connect(state.address, state.namespace)
    head = HeadClient(state.namespace)
    nodes = [n["name"] if isinstance(n, dict) else n for n in head.status().get("nodes", [])] or ["a100-0", "a100-1", "h100-0"]
    nodes = [n for n in nodes if isinstance(n, str)]
    checker = nb.CardChecker(head, state.namespace, nodes).start()
    client = ray_api.RayJobRunner().client
    out: dict[str, Any] = {}
    try:
        for what in nb.PROBES if probes else ():
            t0 = time.monotonic()
            sid = client.submit_job(entrypoint=nb.probe_entrypoint(sys.executable, JOBS, what),
                                    runtime_env=nb.job_env(state.namespace))
            deadline = time.monotonic() + 300
            while str(client.get_job_status(sid).value) not in ("SUCCEEDED", "FAILED", "STOPPED"):
                if time.monotonic() > deadline:
                    client.stop_job(sid)
                    break
                time.sleep(0.5)
            logs = client.get_job_logs(sid)
            verdict = nb.judge(what, nb.read_probe(logs, what))
            if verdict == "no output":
                verdict = "error: " + (logs.strip().splitlines() or ["no log"])[-1][-300:]
            key = {"plain": "plain_num_gpus_task", "train": "train_use_gpu", "tune": "tune_gpu_trial",
                   "serve": "serve_num_gpus"}[what]
            out[key] = verdict
            say(f"{key}: {verdict} ({time.monotonic() - t0:.1f}s)")
        if probes:
            from orchestrator.sdk.jobs import Client  # noqa: F401 -- imported late: the SDK connects on its own

            job = Client(namespace=state.namespace).submit({"name": "native-train", "gpu": "2",
                                                            "entrypoint": nb.probe_entrypoint(sys.executable, JOBS, "train")})
            final = job.wait(300)
            verdict = nb.judge("train", nb.read_probe(job.logs(), "train")) if final["state"] == "succeeded" else \
                f"job {final['state']}: {final.get('message')}"
            out["train_use_gpu_in_job"] = verdict
            say(f"train_use_gpu_in_job: {verdict}")
        # actor start: plain Ray against the lease path, interleaved
        auto = native.lease_from_env({"ORCHESTRATOR_RAY_AUTO_LEASE": "1", "ORCHESTRATOR_NAMESPACE": state.namespace})
        native.install(auto)

        class Where:
            def node(self) -> str:
                return ray.get_runtime_context().get_node_id()

        Plain = ray.remote(num_cpus=0)(Where)
        Leased = ray.remote(num_gpus=1, num_cpus=0)(Where)

        for tag, pause in (("", settle_s), ("_back_to_back", 0.0)):
            plain: list[float] = []
            leased: list[float] = []
            where: list[str] = []
            first = len(auto.timings)
            for _ in range(starts):
                # the leased actor first; then plain Ray's on the same node (its worker pool in the same state)
                time.sleep(pause)
                leased += cards.actor_start_ms(lambda: Leased.remote(), 1, seen=where)
                time.sleep(pause)
                plain += cards.actor_start_ms(lambda: Plain.options(scheduling_strategy=ray_api.pin(where[-1])).remote(), 1)
            out[f"actor_start{tag}_p50_ms_plain_ray"] = nb.p50(plain)
            out[f"actor_start{tag}_p50_ms_orchestrated"] = nb.p50(leased)
            out[f"actor_start{tag}_ratio"] = round(nb.p50(leased) / nb.p50(plain), 2)
            legs = auto.timings[first:]
            out[f"lease_grant{tag}_p50_ms"] = nb.p50([t["grant_ms"] for t in legs])
            out[f"lease_group{tag}_p50_ms"] = nb.p50([t["group_ms"] for t in legs])
        out["actor_starts"] = starts
    finally:
        checker.stop()
    out["double_use_events"] = len(checker.events)
    out["double_use_samples"] = checker.samples
    out["gpu_holders_seen"] = checker.holders_seen
    if checker.events:
        out["double_use_first"] = checker.events[:3]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--starts", type=int, default=10, help="actor starts of each kind")
    p.add_argument("--settle", type=float, default=2.0,
                   help="seconds before each timed start (the _back_to_back figures wait none)")
    p.add_argument("--no-probes", action="store_true", help="only the actor starts (a quicker look at them)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    from orchestrator.deploy.local import scratch_cluster

    say = lambda m: print(f"[native] {m}", file=sys.stderr)  # noqa: E731
    with stdout_to_stderr(), scratch_cluster(load_config(DEMO_CONFIG), "rgo-native-", progress=say) as state:
        try:
            out = run(state, a.starts, say, a.settle, probes=not a.no_probes)
        except BaseException:
            traceback.print_exc()  # now: Ray may end this process once the cluster below it is gone
            raise
        finally:
            from orchestrator.rayport import ray_api

            ray_api.disconnect()
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    keys = ("plain_num_gpus_task", "train_use_gpu", "tune_gpu_trial", "serve_num_gpus")
    return 0 if all(out.get(k) == "ok" for k in keys) and out["double_use_events"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
