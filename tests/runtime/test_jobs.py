"""The head's job layer without Ray: a fake Ray job API (named as such), the controller, fake agents.

Scenario: training fills the cards, inference arrives, the minimal victim is
asked to checkpoint, acknowledges, is stopped and requeued; inference runs;
when it finishes, training resumes from its checkpoint. Plus the grace-period
path, cancel, explain and refusals.
"""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.core.errors import InvalidRequestError, UnknownObjectError
from orchestrator.core.job import JobSpec
from orchestrator.core.request import GpuRequest
from orchestrator.control.controller import HeadController
from orchestrator.control.jobs import JobManager
from orchestrator.control.store import MemoryStore

from .conftest import FakeAgent, FakeClock


class FakeRayJobs:
    """A stand-in for Ray's job submission API: records submissions; tests set their status."""

    def __init__(self) -> None:
        self.submitted: dict[str, dict[str, Any]] = {}
        self.statuses: dict[str, str] = {}
        self.stopped: list[str] = []

    def submit(self, submission_id, entrypoint, runtime_env, entrypoint_resources, entrypoint_num_gpus, metadata) -> None:
        if submission_id in self.submitted:
            raise RuntimeError(f"Job with submission_id {submission_id} already exists")
        self.submitted[submission_id] = dict(entrypoint=entrypoint, env=runtime_env["env_vars"],
                                             resources=entrypoint_resources, num_gpus=entrypoint_num_gpus)
        self.statuses[submission_id] = "RUNNING"

    def status(self, submission_id: str) -> str | None:
        return self.statuses.get(submission_id)

    def stop(self, submission_id: str) -> None:
        self.stopped.append(submission_id)
        self.statuses[submission_id] = "STOPPED"

    def logs(self, submission_id: str) -> str:
        return f"logs of {submission_id}\n"


@pytest.fixture
def ray_jobs() -> FakeRayJobs:
    return FakeRayJobs()


@pytest.fixture
def jm(ctl: HeadController, store: MemoryStore, clock: FakeClock, ray_jobs: FakeRayJobs,
       agents: dict[str, FakeAgent]) -> JobManager:
    return JobManager(ctl, store, ray_jobs, clock=clock, namespace="rgo", head_name="rgo-head")


def cycle(ctl: HeadController, jm: JobManager, agents: dict[str, FakeAgent], n: int = 1) -> None:
    for _ in range(n):
        for a in agents.values():
            a.beat()
        ctl.reconcile()
        jm.reconcile()


def spec(name: str, gpu: str = "1", priority: str = "training", ckpt: str | None = None) -> JobSpec:
    return JobSpec(name=name, entrypoint=f"python jobs/train.py --name {name}", gpu=GpuRequest.parse(gpu),
                   priority=priority, checkpoint_dir=ckpt)


def test_preempt_checkpoint_requeue_resume(ctl, jm, agents, clock, ray_jobs, tmp_path) -> None:
    # 8 whole cards outside MIG: fill them with training.
    for i in range(8):
        jm.submit(spec(f"train-{i}", ckpt=str(tmp_path / f"t{i}")))
    cycle(ctl, jm, agents, 2)
    assert all(j["state"] == "running" for j in jm.list())
    first = ray_jobs.submitted["train-0-1.a1"]
    assert first["env"]["CUDA_VISIBLE_DEVICES"].startswith("GPU-")
    assert first["env"]["ORCHESTRATOR_JOB_ID"] == "train-0-1"
    assert first["num_gpus"] == 1.0 and list(first["resources"]) == [next(iter(first["resources"]))]
    # Inference arrives before the training's minimum runtime: nothing may be preempted yet.
    inf = jm.submit(spec("serve", priority="inference"))["job_id"]
    cycle(ctl, jm, agents)
    ex = jm.explain(inf)
    assert ex["state"] == "queued" and "minimum runtime" in ex["pending"]["preemption_blocked"]
    # Past the minimum runtime: exactly one victim is asked to checkpoint.
    clock.advance(60)
    cycle(ctl, jm, agents)
    preempting = [j for j in jm.list() if j["state"] == "preempting"]
    assert len(preempting) == 1
    victim = preempting[0]["job_id"]
    assert jm.preemption_requested(victim)["requested"] is True
    ex = jm.explain(inf)
    assert [v["owner"] for v in ex["pending"]["being_preempted"]] == [victim]
    assert "waiting for" in ex["summary"]
    # The victim checkpoints and acknowledges; it is stopped and requeued; inference is admitted.
    clock.advance(2)
    ckpt = tmp_path / "victim.pt"
    ckpt.write_bytes(b"x")
    jm.ack_checkpoint(victim, str(ckpt), step=123)
    cycle(ctl, jm, agents, 2)
    v = jm.get(victim)
    assert v["state"] == "queued" and v["resume_from"] == str(ckpt) and v["attempt"] == 2
    assert v["preemptions"][0]["by"] == inf and v["preemptions"][0]["checkpoint_path"] == str(ckpt)
    assert f"{victim}.a1" in ray_jobs.stopped
    assert jm.get(inf)["state"] == "running"
    exv = jm.explain(victim)
    assert f"preempted earlier by {inf}" in exv["summary"]
    # No churn: further cycles preempt nobody else.
    cycle(ctl, jm, agents, 3)
    assert sum(1 for j in jm.list() if j["state"] == "preempting") == 0
    # Inference finishes: training resumes from the checkpoint.
    ray_jobs.statuses[jm.get(inf)["ray_submission_id"]] = "SUCCEEDED"
    cycle(ctl, jm, agents, 2)
    assert jm.get(inf)["state"] == "succeeded"
    v = jm.get(victim)
    assert v["state"] == "running"
    assert ray_jobs.submitted[v["ray_submission_id"]]["env"]["ORCHESTRATOR_RESUME_FROM"] == str(ckpt)


def test_grace_period_over_stops_and_requeues(ctl, jm, agents, clock, ray_jobs, tmp_path) -> None:
    for i in range(8):
        jm.submit(spec(f"t{i}", ckpt=str(tmp_path / f"t{i}")))
    cycle(ctl, jm, agents, 2)
    clock.advance(60)
    jm.submit(spec("urgent", priority="inference"))
    cycle(ctl, jm, agents)
    (victim,) = [j["job_id"] for j in jm.list() if j["state"] == "preempting"]
    clock.advance(61)  # the training class's grace period is 60 s
    cycle(ctl, jm, agents, 2)
    v = jm.get(victim)
    assert v["state"] == "queued" and v["resume_from"] is None
    assert "grace period over" in v["lease"]["history"][-1]["reason"] or v["attempt"] == 2
    assert jm.get("urgent-1")["state"] == "running"


def test_batch_is_stopped_at_once_without_checkpoint(ctl, jm, agents, clock, ray_jobs) -> None:
    for i in range(8):
        jm.submit(spec(f"b{i}", priority="batch"))
    cycle(ctl, jm, agents, 2)
    jm.submit(spec("urgent", priority="inference"))
    cycle(ctl, jm, agents, 2)
    assert jm.get("urgent-1")["state"] == "running"
    assert sum(1 for j in jm.list() if j["state"] == "queued" and j["preemptions"]) == 1


def test_cancel_and_success_release_the_lease(ctl, jm, agents, ray_jobs) -> None:
    a = jm.submit(spec("a"))["job_id"]
    b = jm.submit(spec("b"))["job_id"]
    cycle(ctl, jm, agents, 2)
    assert jm.cancel(a)["state"] == "cancelled"
    assert jm.get(a)["lease"]["state"] == "released"
    assert jm.cancel(a)["state"] == "cancelled"  # idempotent
    ray_jobs.statuses[jm.get(b)["ray_submission_id"]] = "FAILED"
    cycle(ctl, jm, agents)
    assert jm.get(b)["state"] == "failed" and jm.get(b)["lease"]["state"] == "released"
    assert jm.logs(b).startswith("logs of")


def test_refusals_and_idempotent_submit(jm) -> None:
    with pytest.raises(InvalidRequestError) as e:
        jm.submit(spec("x", priority="urgent"))
    assert e.value.field == "priority"
    with pytest.raises(InvalidRequestError) as e:
        jm.submit(spec("x", gpu="mig:1g.5gb"))
    assert e.value.field == "gpu.profile"
    with pytest.raises(InvalidRequestError) as e:
        JobSpec.parse({"name": "x", "entrypoint": " "})  # the head's edge (HeadService.submit_job) parses once
    assert e.value.field == "entrypoint"
    one = jm.submit(spec("same"), job_id="fixed")
    assert jm.submit(spec("same"), job_id="fixed")["job_id"] == one["job_id"] == "fixed"
    with pytest.raises(UnknownObjectError):
        jm.get("nope")


def test_restore_from_store(ctl, jm, agents, store, clock, ray_jobs) -> None:
    jm.submit(spec("persist"))
    cycle(ctl, jm, agents, 2)
    again = JobManager(ctl, store, ray_jobs, clock=clock, namespace="rgo", head_name="rgo-head")
    assert again.restore() == 1
    assert again.get("persist-1")["state"] == "running"


def test_a_queued_job_whose_lease_is_missing_asks_for_it_again(ctl, jm, agents, store) -> None:
    # As after a head restart between writing the job and its lease: the job names a lease the head lacks.
    big = jm.submit(spec("big"))["job_id"]
    assert jm.get(big)["state"] == "queued" and jm.get(big)["lease"]["state"] == "pending"
    lease_id = jm.get(big)["lease_id"]
    ctl.ledger.drop(lease_id)  # the ledger without it, as restored from a store without it
    assert store.get(f"rgo/lease/{lease_id}") is None
    assert jm.get(big)["lease"] is None
    cycle(ctl, jm, agents)
    got = jm.get(big)
    assert got["state"] == "queued" and got["lease_id"] == lease_id and got["lease"]["state"] == "pending"
