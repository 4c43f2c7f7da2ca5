"""Preemption on a real Ray cluster, with real training jobs and real checkpoint files.

The scenario of the mission: training fills every whole card of the demo
cluster (three jobs of 4, 2 and 2 cards), an inference job arrives that needs
one card; the minimal victim set -- one training job, the one that loses least
work -- is asked to checkpoint, acknowledges, is stopped and requeued; the
inference job runs; when it leaves, the victim resumes from its checkpoint.
Every training job must end with weights bit-identical to an undisturbed run
of the same seed, and the victim's history must say who preempted it. The scenario itself is run by
``orchestrator demo`` from the installed wheel (tests/integration/test_wheel_demo.py, a module apart: it starts a
cluster of its own); here, on the worker's shared cluster, the head is SIGKILLed with jobs in flight.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from heads import remove_head

from orchestrator.core.job import JobSpec
from orchestrator.core.request import GpuRequest
from orchestrator.core.config import RuntimeSettings
from orchestrator.deploy.local import free_port

pytestmark = pytest.mark.ray

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
    else:  # a test on a head short of agents fails later, on a node it "does not know"
        remove_head(SETTINGS, cfg)
        pytest.fail("the head's 3 agents did not register within 120 s", pytrace=False)
    yield client
    remove_head(SETTINGS, cfg)


def wait(head: Any, job_id: str, states: set[str], timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        j = head.get_job(job_id)
        if j["state"] in states:
            return j
        if time.monotonic() > deadline:
            raise AssertionError(f"{job_id} stuck in {j['state']}: {j['message']} {head.explain_job(job_id)}")
        time.sleep(0.3)


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
