"""Preemption on a real Ray cluster, with real training jobs and real checkpoint files.

The scenario of the mission: training fills every whole card of the demo
cluster (three jobs of 4, 2 and 2 cards), an inference job arrives that needs
one card; the minimal victim set -- one training job, the one that loses least
work -- is asked to checkpoint, acknowledges, is stopped and requeued; the
inference job runs; when it leaves, the victim resumes from its checkpoint.
Every training job must end with weights bit-identical to an undisturbed run
of the same seed, and the victim's history must say who preempted it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from orchestrator.core.job import JobSpec
from orchestrator.core.request import GpuRequest
from orchestrator.core.config import RuntimeSettings
from orchestrator.deploy.local import free_port

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "jobs" / "train.py"
STEPS = 300
SETTINGS = RuntimeSettings(namespace="rgo-preempt", head_name="rgo-head-preempt", heartbeat_interval_s=0.5,
                           agent_ttl_s=5.0, reconcile_interval_s=0.2)
#: The head's /metrics port, chosen when its fixture starts it, not at collection (by then another module's Ray
#: processes may have taken it).
METRICS: dict[str, int] = {}


@pytest.fixture(scope="module")
def head(ray_cluster: Any) -> Iterator[Any]:
    import ray

    from orchestrator.rayport import ray_api
    from orchestrator.rayport.actors import start_head
    from orchestrator.rayport.client import HeadClient

    cfg = ray_cluster.config
    sched = cfg.scheduler.model_copy(update={"policy": "bestfit", "classes": {
        **cfg.scheduler.classes,
        "training": cfg.scheduler.classes["training"].model_copy(update={"min_runtime_s": 1.0, "grace_period_s": 60.0}),
        # for the head-kill test: a checkpointing class whose victims get only 8 s to yield
        "training-short": cfg.scheduler.classes["training"].model_copy(update={"min_runtime_s": 1.0, "grace_period_s": 8.0}),
    }})
    METRICS["port"] = free_port()
    settings = SETTINGS.model_copy(update={"metrics_port": METRICS["port"]})
    handle = start_head(settings, cfg.model_copy(update={"scheduler": sched}), node_id=ray_api.head_node_id())
    client = HeadClient(handle=handle)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if len(ray_api.unwrap(ray.get(handle.ping.remote()))["registered_nodes"]) == 3:
            break
        time.sleep(0.25)
    yield client
    for node in cfg.nodes:
        ray_api.kill_named(ray_api.agent_name(node.name), SETTINGS.namespace)
    ray_api.kill_named(SETTINGS.head_name, SETTINGS.namespace)
    ray_api.GcsKv(f"rgo.{SETTINGS.namespace}").delete_prefix("")


def _steps(head: Any, job_id: str) -> int:
    """Training steps the job's log shows so far (jobs/train.py logs ``step N ...``)."""
    import re

    return max((int(m) for m in re.findall(r"^step (\d+) ", head.job_logs(job_id), re.M)), default=0)


def wait(head: Any, job_id: str, states: set[str], timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        j = head.get_job(job_id)
        if j["state"] in states:
            return j
        if time.monotonic() > deadline:
            raise AssertionError(f"{job_id} stuck in {j['state']}: {j['message']} {head.explain_job(job_id)}")
        time.sleep(0.3)


def reference_digest(seed: int) -> str:
    sys.path.insert(0, str(REPO / "jobs"))
    try:
        import train
    finally:
        sys.path.pop(0)
    return train.run(STEPS, seed=seed, log=lambda s: None)["digest"]


def test_inference_preempts_the_minimal_training_set_which_resumes_bit_identical(head: Any, tmp_path: Path) -> None:
    trainings = {}
    for seed, cards in ((1, 4), (2, 2), (3, 2)):
        ck = tmp_path / f"train-{seed}"
        spec = JobSpec(name=f"train-{seed}", gpu=GpuRequest.whole(cards), priority="training", checkpoint_dir=str(ck),
                       entrypoint=f"{sys.executable} {TRAIN} --steps {STEPS} --seed {seed} --step-delay 0.03 --log-every 1",
                       runtime_env={"env_vars": {"ORCHESTRATOR_POLL_S": "0.1"}})
        trainings[head.submit_job(spec.model_dump(mode="json"))["job_id"]] = (seed, ck)
    for job_id in trainings:
        wait(head, job_id, {"running"})
    # Every whole card is now held by training; let them pass their minimum runtime (1 s) and make progress.
    deadline = time.monotonic() + 120
    while not all(_steps(head, j) >= 5 for j in trainings):
        assert time.monotonic() < deadline, {j: _steps(head, j) for j in trainings}
        time.sleep(0.3)
    serve = JobSpec(name="serve", gpu=GpuRequest.whole(1), priority="inference",
                    entrypoint=f"{sys.executable} -c \"import os,time; time.sleep(3); print('served on', os.environ['CUDA_VISIBLE_DEVICES'])\"")
    t0 = time.monotonic()
    inf = head.submit_job(serve.model_dump(mode="json"))["job_id"]
    running = wait(head, inf, {"running", "succeeded"}, timeout=120)
    decision_to_run = time.monotonic() - t0
    victims = [j for j in trainings if head.get_job(j)["preemptions"]]
    assert len(victims) == 1, [(head.get_job(j)["state"], head.get_job(j)["message"]) for j in trainings]
    victim = head.get_job(victims[0])
    # The minimal set: one 2-card job (a 4-card one would lose more work), preempted by the inference job.
    assert victim["gpu"] == "2x whole"
    assert victim["preemptions"][0]["by"] == inf
    assert Path(victim["preemptions"][0]["checkpoint_path"]).exists()
    explained = head.explain_job(victims[0])
    assert inf in explained["summary"] and explained["preemptions"][0]["by"] == inf
    assert running["placement_reason"]
    assert decision_to_run < 90
    # The head's Prometheus endpoint counted it (real HTTP, loopback).
    import urllib.request

    body = urllib.request.urlopen(f"http://127.0.0.1:{METRICS['port']}/metrics", timeout=5).read().decode()
    assert ('orchestrator_preemptions_total{cause="victim.priority",priority_class="training",queue="default",'
            'reason="checkpoint"} 1.0') in body
    assert "\norchestrator_gpus 10.0\n" in body
    done = wait(head, inf, {"succeeded"})
    assert "served on GPU-" in head.job_logs(inf)
    # Everyone finishes; weights equal undisturbed runs bit for bit, no step lost.
    for job_id, (seed, ck) in trainings.items():
        final = wait(head, job_id, {"succeeded", "failed"}, timeout=240)
        assert final["state"] == "succeeded", head.job_logs(job_id)
        result = json.loads((ck / "result.json").read_text())
        assert result["step"] == STEPS and result["status"] == "completed"
        assert result["digest"] == reference_digest(seed), f"{job_id} diverged from the undisturbed run"
    resumed = head.get_job(victims[0])
    assert resumed["attempt"] == 2 and "resumed from" in head.job_logs(victims[0])
    assert done["state"] == "succeeded"


def test_a_sigkilled_head_brings_every_job_to_its_end_exactly_once(head: Any, tmp_path: Path) -> None:
    """SIGKILL the head's worker with jobs queued, running and preempting; Ray restarts the actor, which
    restores from the GCS store. Every job ends as it would have, and no attempt is submitted to Ray twice."""
    import os
    import signal

    import ray

    from orchestrator.rayport import ray_api

    def submit(name: str, entrypoint: str, gpu: GpuRequest, priority: str) -> str:
        spec = JobSpec(name=name, entrypoint=entrypoint, gpu=gpu, priority=priority, checkpoint_dir=str(tmp_path / name))
        return head.submit_job(spec.model_dump(mode="json"))["job_id"]

    on_h100 = {"kind": "whole", "count": 2, "node": "h100-0"}
    stubborn = submit("stubborn", "sleep 300", GpuRequest(**on_h100), "training-short")  # never checkpoints
    short = submit("short", f"{sys.executable} -c 'import time; time.sleep(40)'", GpuRequest.mig("1g.10gb"), "batch")
    wait(head, stubborn, {"running"})
    wait(head, short, {"running"})
    behind = submit("behind", "true", GpuRequest(**on_h100), "batch")  # queued behind stubborn
    inf = submit("urgent", f"{sys.executable} -c 'import time; time.sleep(2)'",
                 GpuRequest(kind="whole", count=1, node="h100-0"), "inference")
    wait(head, stubborn, {"preempting"}, timeout=60)
    assert head.get_job(behind)["state"] == "queued" and head.get_job(short)["state"] == "running"
    before = ray_api.unwrap(ray.get(head.handle.ping.remote()))
    os.kill(before["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 120
    while True:  # Ray restarts the actor; it answers again from a new process
        try:
            after = head.ping()
            if after["pid"] != before["pid"]:
                break
        except Exception:
            pass
        assert time.monotonic() < deadline, "the head did not come back"
        time.sleep(0.5)
    assert after["restored_leases"] >= 4
    # stubborn's grace runs out (the deadline was stored): stopped, requeued behind the inference job
    assert wait(head, inf, {"succeeded"}, timeout=120)["attempt"] == 1
    assert wait(head, short, {"succeeded"}, timeout=120)["attempt"] == 1
    st = wait(head, stubborn, {"running"}, timeout=120)
    assert st["attempt"] == 2 and st["preemptions"][0]["by"] == inf and st["preemptions"][0]["checkpoint_path"] is None
    head.cancel_job(stubborn)
    assert wait(head, behind, {"succeeded"}, timeout=120)["attempt"] == 1
    assert head.get_job(stubborn)["state"] == "cancelled"
    # exactly once: Ray knows each attempt's submission id once, and no others of these jobs
    jobs = ray_api.job_submission_client(ray_api.api_server_url()).list_jobs()
    ours = sorted(j.submission_id for j in jobs if j.submission_id and j.submission_id.split(".a")[0]
                  in {stubborn, short, behind, inf})
    assert ours == sorted([f"{behind}.a1", f"{inf}.a1", f"{short}.a1", f"{stubborn}.a1", f"{stubborn}.a2"])
