"""An elastic gang job on the head, in-process (fake Ray job API, fake agents, the real controller and job layer):
placed at the most workers that fit, the rest withdrawn; grown through a checkpoint into cards that free up; shrunk
through a checkpoint when higher-priority work wants a card, resuming at once smaller; no churn in between."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.control.controller import HeadController
from orchestrator.control.jobs import JobManager
from orchestrator.control.ledger import LedgerEntry
from orchestrator.sdk.inputs import as_spec

from .conftest import FakeClock, SimAgent
from . import test_jobs
from .test_jobs import FakeRayJobs, cycle, spec

jm, ray_jobs = test_jobs.jm, test_jobs.ray_jobs  # the job layer's fixtures, shared


def _workers(jm: JobManager, job_id: str) -> list[tuple[str, str]]:
    return [(x["lease_id"].rsplit("-", 1)[1], x["state"]) for x in jm.get(job_id)["worker_leases"]]


def _handouts(ray_jobs: FakeRayJobs, submission: str) -> list[dict[str, Any]]:
    return json.loads(ray_jobs.submitted[submission]["env"]["ORCHESTRATOR_GANG"])


def _ack(jm: JobManager, job_id: str, path: str) -> None:
    w0 = jm.ctl.ledger.get(jm.get(job_id)["lease"]["lease_id"])
    jm.ack_checkpoint(job_id, path, step=10, token=w0.lease.fencing_token)


def test_an_elastic_gang_job_grows_into_freed_cards_and_shrinks_for_inference(
        ctl: HeadController, jm: JobManager, agents: dict[str, SimAgent], clock: FakeClock, ray_jobs: FakeRayJobs,
        tmp_path: Any) -> None:
    # The demo cluster has 8 whole cards (a100-0: 4, a100-1: 2 besides its MIG cards, h100-0: 2); inference takes 6.
    inf = [jm.submit(spec(f"i{i}", priority="inference"))["job_id"] for i in range(6)]
    cycle(ctl, jm, agents, 2)
    assert all(jm.get(j)["state"] == "running" for j in inf)
    g = jm.submit(as_spec({"name": "el", "entrypoint": "python jobs/train_gang.py", "gpu": "1-4x1",
                           "priority": "training", "checkpoint_dir": str(tmp_path / "el")}))["job_id"]
    cycle(ctl, jm, agents, 2)
    job = jm.get(g)
    assert job["state"] == "running" and job["gpu"].startswith("gang 1-4x") and job["min_workers"] == 1
    assert _workers(jm, g) == [("w0", "active"), ("w1", "active")], "the attempt is the workers granted"
    trimmed = ctl.ledger.get(f"{g}.a1-w3").lease.history
    assert [t.state.value for t in trimmed] == ["pending", "released"] and "not granted this attempt" in trimmed[-1].reason
    assert "at 2 of 1-4 workers" in ctl.ledger.get(f"{g}.a1-w0").grant_reason()
    assert len(_handouts(ray_jobs, f"{g}.a1")) == 2, "the driver gets the hand-outs of the workers it runs with"

    # Two inference jobs end: the gang may grow only once its attempt ran scheduler.elastic.grow_after_s (300 s).
    for j in inf[:2]:
        ray_jobs.statuses[jm.get(j)["ray_submission_id"]] = "SUCCEEDED"
    cycle(ctl, jm, agents, 3)
    assert jm.get(g)["state"] == "running" and jm.get(g)["attempt"] == 1, "too early to resize"
    clock.advance(301)
    cycle(ctl, jm, agents)
    assert jm.get(g)["state"] == "preempting"
    w0 = ctl.ledger.get(f"{g}.a1-w0")
    assert w0.preempt_cause == "victim.grow" and "grows from 2 to 4" in w0.preempt_reason
    assert LedgerEntry.from_json(w0.to_json()).lease.elastic == (1, 4), "a restored head still knows the range"
    (tmp_path / "el").mkdir()
    _ack(jm, g, str(tmp_path / "el" / "c1"))
    cycle(ctl, jm, agents, 3)
    job = jm.get(g)
    assert job["state"] == "running" and job["attempt"] == 2, jm.explain(g)
    assert _workers(jm, g) == [(f"w{i}", "active") for i in range(4)]
    assert len(_handouts(ray_jobs, f"{g}.a2")) == 4
    assert ray_jobs.submitted[f"{g}.a2"]["env"]["ORCHESTRATOR_RESUME_FROM"] == str(tmp_path / "el" / "c1")

    # Rounds with nothing new, long past grow_after_s: nothing moves (at its most).
    for _ in range(4):
        clock.advance(400)
        cycle(ctl, jm, agents, 2)
    assert jm.get(g)["attempt"] == 2 and jm.get(g)["state"] == "running" and not jm.get(g)["preemptions"][1:]

    # Inference wants a card and none is idle: the gang checkpoints and resumes at once at 3 (victim.shrink).
    urgent = jm.submit(spec("urgent", priority="inference"))["job_id"]
    cycle(ctl, jm, agents)
    assert jm.get(g)["state"] == "preempting"
    w0 = ctl.ledger.get(f"{g}.a2-w0")
    assert w0.preempt_cause == "victim.shrink" and "shrinks from 4 to 3" in w0.preempt_reason
    _ack(jm, g, str(tmp_path / "el" / "c2"))
    cycle(ctl, jm, agents, 3)
    assert jm.get(urgent)["state"] == "running"
    job = jm.get(g)
    assert job["state"] == "running" and job["attempt"] == 3
    assert _workers(jm, g) == [(f"w{i}", "active") for i in range(3)]
    assert ctl.get_lease(f"{g}.a3-w3")["state"] == "released"
    assert len(_handouts(ray_jobs, f"{g}.a3")) == 3
    assert ray_jobs.submitted[f"{g}.a3"]["env"]["ORCHESTRATOR_RESUME_FROM"] == str(tmp_path / "el" / "c2")
    for _ in range(4):  # every card taken: no grow, no churn
        clock.advance(400)
        cycle(ctl, jm, agents, 2)
    assert jm.get(g)["attempt"] == 3 and jm.get(g)["state"] == "running"
