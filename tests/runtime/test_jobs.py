"""The head's job layer without Ray: a fake Ray job API (named as such), the controller, fake agents.

Scenario: training fills the cards, inference arrives, the minimal victim is
asked to checkpoint, acknowledges, is stopped and requeued; inference runs;
when it finishes, training resumes from its checkpoint. Plus the grace-period
path, cancel, explain and refusals.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.core.errors import InvalidRequestError, JobApiUnavailableError, UnknownObjectError
from orchestrator.core.job import JobSpec
from orchestrator.core.request import GpuRequest
from orchestrator.control.controller import HeadController
from orchestrator.control.jobs import JobManager, run_due
from orchestrator.control.store import MemoryStore
from orchestrator.core.config import RuntimeSettings

from .conftest import SimAgent, FakeClock


class FakeRayJobs:
    """A stand-in for Ray's job submission API: records submissions; tests set their status."""

    def __init__(self) -> None:
        self.submitted: dict[str, dict[str, Any]] = {}
        self.statuses: dict[str, str] = {}
        self.stopped: list[str] = []
        self.deleted: list[str] = []
        self.reads: list[list[str]] = []  # one entry per batched status read

    def submit(self, submission_id, entrypoint, runtime_env, label_selector, handout, metadata) -> None:
        if submission_id in self.submitted:
            return  # taken already: JobRunner.submit is idempotent per id
        self.submitted[submission_id] = dict(entrypoint=entrypoint, env=runtime_env["env_vars"],
                                             label_selector=label_selector, handout=handout)
        self.statuses[submission_id] = "RUNNING"

    def status(self, submission_id: str) -> str | None:
        return self.statuses.get(submission_id)

    def status_many(self, submission_ids) -> dict[str, str | None]:
        self.reads.append(list(submission_ids))
        return {s: self.statuses.get(s) for s in submission_ids}

    def stop(self, submission_id: str) -> None:
        self.stopped.append(submission_id)
        self.statuses[submission_id] = "STOPPED"

    def delete(self, submission_id: str) -> None:
        if submission_id not in self.statuses:
            raise RuntimeError(f"Job {submission_id} does not exist")
        if self.statuses[submission_id] not in ("SUCCEEDED", "FAILED", "STOPPED"):
            raise RuntimeError(f"Job {submission_id} is not in a terminal state")
        del self.statuses[submission_id]
        self.submitted.pop(submission_id, None)
        self.deleted.append(submission_id)

    def logs(self, submission_id: str) -> str:
        return f"logs of {submission_id}\n"


@pytest.fixture
def ray_jobs() -> FakeRayJobs:
    return FakeRayJobs()


@pytest.fixture
def jm(ctl: HeadController, store: MemoryStore, clock: FakeClock, ray_jobs: FakeRayJobs,
       agents: dict[str, SimAgent]) -> JobManager:
    return JobManager(ctl, store, ray_jobs, clock=clock, namespace="rgo", head_name="rgo-head")



def _token(jm: JobManager, job_id: str) -> int:
    """The fencing token the job has in its environment (the job layer holds it in-process)."""
    return jm.ctl.ledger.get(jm.get(job_id)["lease"]["lease_id"]).lease.fencing_token

def cycle(ctl: HeadController, jm: JobManager, agents: dict[str, SimAgent], n: int = 1, *, launch: bool = True) -> None:
    """``n`` rounds of heartbeats, a controller cycle and a job-layer step, each followed, as the head does once
    its store holds the step's writes, by the hand-out of what the step made due to Ray's job API (``run_due``;
    ``launch=False``: the test hands them out itself)."""
    for _ in range(n):
        for a in agents.values():
            a.beat()
        ctl.reconcile()
        jm.reconcile()
        if launch:
            run_due(jm)


def one_victim(ctl: HeadController, jm: JobManager, agents: dict[str, SimAgent], clock: FakeClock, tmp_path: Any) -> str:
    """Eight training jobs fill the whole cards; past their minimum runtime inference arrives: the one victim."""
    for i in range(8):
        jm.submit(spec(f"t{i}", ckpt=str(tmp_path / f"t{i}")))
    cycle(ctl, jm, agents, 2)
    clock.advance(60)
    jm.submit(spec("urgent", priority="inference"))
    cycle(ctl, jm, agents)
    (victim,) = [j["job_id"] for j in jm.list() if j["state"] == "preempting"]
    return victim


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
    node = jm.get("train-0-1")["lease"]["allocation"]["node"]
    card = jm.get("train-0-1")["lease"]["allocation"]["gpu_indices"][0]
    assert first["handout"]["resources"] == {f"rgo-gpu-{card}": 1.0} and first["handout"]["num_gpus"] == 1.0
    assert first["label_selector"] == {"ray.io/node-id": agents[node].ray_node_id}
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
    jm.ack_checkpoint(victim, str(ckpt), step=123, token=_token(jm, victim))
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
    # Each attempt keeps its own logs (its own Ray job): the current one by default, an earlier one by number.
    assert jm.logs(victim) == f"logs of {victim}.a2\n" == jm.logs(victim, 2)
    assert jm.logs(victim, 1) == f"logs of {victim}.a1\n"
    for bad in (0, 3):
        with pytest.raises(InvalidRequestError) as e:
            jm.logs(victim, bad)
        assert e.value.field == "attempt" and "1 to 2" in str(e.value)


def test_grace_period_over_stops_and_requeues(ctl, jm, agents, clock, ray_jobs, tmp_path) -> None:
    victim = one_victim(ctl, jm, agents, clock, tmp_path)
    clock.advance(61)  # the training class's grace period is 60 s
    # 3 cycles: preempted (fenced), the agent stops the Ray job, its confirmation frees the cards
    cycle(ctl, jm, agents, 3)
    v = jm.get(victim)
    assert v["state"] == "queued" and v["resume_from"] is None and v["attempt"] == 2
    first = ctl.get_lease(f"{victim}.a1")  # the attempt that was asked to checkpoint and never did
    assert first["state"] == "preempted" and "grace period over without a checkpoint" in first["history"][-1]["reason"]
    assert v["preemptions"][-1]["checkpoint_path"] is None
    assert jm.get("urgent-1")["state"] == "running"


def test_batch_is_stopped_at_once_without_checkpoint(ctl, jm, agents, clock, ray_jobs) -> None:
    for i in range(8):
        jm.submit(spec(f"b{i}", priority="batch"))
    cycle(ctl, jm, agents, 2)
    jm.submit(spec("urgent", priority="inference"))
    cycle(ctl, jm, agents, 3)  # preempted (fenced), stopped by the agent, confirmed: then granted
    assert jm.get("urgent-1")["state"] == "running"
    assert sum(1 for j in jm.list() if j["state"] == "queued" and j["preemptions"]) == 1
    (victim,) = [j for j in jm.list() if j["preemptions"]]
    stopped = [w for a in agents.values() for w in a.core.workloads.stopped]  # type: ignore[attr-defined]
    assert len(stopped) == 1 and stopped[0].startswith(f"job:{victim['job_id']}")


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


def test_a_cancelled_jobs_card_goes_on_only_once_its_agent_says_the_job_is_gone(ctl, jm, agents) -> None:
    # issue #38: cancel freed the card before Ray had stopped the job; preemption waited for the agent. Now both do.
    for i in range(8):  # the 8 whole cards outside MIG, all running
        jm.submit(spec(f"t{i}"))
    cycle(ctl, jm, agents, 2)
    assert all(j["state"] == "running" for j in jm.list())
    lease_id = jm.get("t0-1")["lease"]["lease_id"]
    assert jm.cancel("t0-1")["state"] == "cancelled"
    e = ctl.ledger.get(lease_id)
    assert e.lease.state.value == "released" and e.revoking  # ended, but its card is fenced
    jm.submit(spec("next"))
    ctl.reconcile()
    jm.reconcile()
    assert jm.get("next-1")["state"] == "queued"  # no card went on while the cancelled job may still run
    cycle(ctl, jm, agents, 2)  # the agent stops the job's workload and confirms; then the card goes on
    stopped = [w for a in agents.values() for w in a.core.workloads.stopped]  # type: ignore[attr-defined]
    assert any(w.startswith("job:t0-1") for w in stopped), stopped
    assert not ctl.ledger.get(lease_id).revoking and jm.get("next-1")["state"] == "running"


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


# ---- recovery paths ---------------------------------------------------------------------------------
def _running_on(jm: JobManager, job_id: str) -> str:
    d = jm.get(job_id)
    assert d["state"] == "running", d
    return d["lease"]["allocation"]["node"]


def test_a_running_job_whose_node_is_lost_is_stopped_and_resumes_from_its_checkpoint(
        ctl, jm, agents, clock, ray_jobs, tmp_path) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    job = jm.submit(spec("t", ckpt=str(ck)))["job_id"]
    cycle(ctl, jm, agents, 2)
    node = _running_on(jm, job)
    (ck / "checkpoint.pt").write_bytes(b"w")  # what jobs/train.py leaves behind
    for _ in range(6):  # past agent_ttl_s=5 for the silent node only, the head cycling all along
        clock.advance(1.0)
        for name, a in agents.items():
            if name != node:
                a.beat()
        ctl.reconcile()
    jm.reconcile()
    run_due(jm)  # the head hands Ray's job API the stop, once the store holds the requeue
    d = jm.get(job)
    assert d["state"] == "queued" and d["attempt"] == 2 and d["resume_from"] == str(ck / "checkpoint.pt")
    assert d["preemptions"][-1]["by"] == "node lost" and f"{job}.a1" in ray_jobs.stopped
    cycle(ctl, jm, agents, 2)  # the node's agent is back (same incarnation re-registers as new)
    assert jm.get(job)["state"] == "running"
    assert ray_jobs.submitted[f"{job}.a2"]["env"]["ORCHESTRATOR_RESUME_FROM"] == str(ck / "checkpoint.pt")


def test_a_lease_that_expires_before_admission_is_requested_again(ctl, jm, agents, clock) -> None:
    job = jm.submit(spec("t"))["job_id"]
    ctl.reconcile()  # granted, but the job layer has not seen it yet
    lease_id = jm.get(job)["lease_id"]
    assert ctl.get_lease(lease_id)["state"] == "granted"
    for _ in range(int(ctl.settings.grant_ttl_s / 4) + 1):  # agents keep beating; the job layer is stalled
        clock.advance(4)
        for a in agents.values():
            a.beat()
        ctl.reconcile()
    assert ctl.get_lease(lease_id)["state"] == "expired"
    jm.reconcile()
    d = jm.get(job)
    assert d["state"] == "queued" and d["attempt"] == 2 and "before it was admitted" in d["message"]
    cycle(ctl, jm, agents, 2)
    assert jm.get(job)["state"] == "running"


def test_ray_refusing_a_submission_fails_the_job_and_frees_its_lease(ctl, jm, agents, ray_jobs, monkeypatch) -> None:
    def refuse(*a, **k):
        raise RuntimeError("runtime_env setup failed: no such working_dir")

    monkeypatch.setattr(ray_jobs, "submit", refuse)
    job = jm.submit(spec("t"))["job_id"]
    cycle(ctl, jm, agents, 2)
    d = jm.get(job)
    assert d["state"] == "failed" and "no such working_dir" in d["message"] and d["lease"]["state"] == "released"


def test_an_already_submitted_attempt_is_adopted_not_failed(ctl, jm, agents, ray_jobs) -> None:
    """A head that crashed between recording the submission id and hearing Ray's answer submits again:
    Ray says "already exists", and the job runs on."""
    job_id = "t-1"
    ray_jobs.submit(f"{job_id}.a1", "sleep", {"env_vars": {}}, {}, 1.0, {})  # the earlier head's submission
    jm.submit(spec("t"), job_id=job_id)
    cycle(ctl, jm, agents, 2)
    d = jm.get(job_id)
    assert d["state"] == "running" and d["ray_submission_id"] == f"{job_id}.a1" and d["lease"]["state"] == "active"


class FlakyRayJobs(FakeRayJobs):
    """The fake job API, unavailable for its next ``down`` submissions; ``lands`` makes a failed one land
    anyway (Ray took it, its answer was lost on the way back)."""

    def __init__(self, down: int, lands: bool = False) -> None:
        super().__init__()
        self.down, self.lands, self.calls = down, lands, 0

    def submit(self, submission_id, *args) -> None:
        self.calls += 1
        if self.down > 0:
            self.down -= 1
            if self.lands:
                super().submit(submission_id, *args)
            raise JobApiUnavailableError(submission_id, "RuntimeError: Request failed with status code 500: "
                                                        "No available agent to submit job, please try again later.")
        super().submit(submission_id, *args)


def test_a_job_api_that_cannot_take_the_job_now_is_asked_again_with_backoff_and_the_job_runs(
        ctl, store, agents, clock) -> None:
    """Ray's job API answering 5xx (or not answering) does not fail the job: it stays admitted on its lease,
    says why, and is submitted again, under the same id, after 1, 2, 4 s."""
    ray_jobs = FlakyRayJobs(down=3)
    jm = JobManager(ctl, store, ray_jobs, clock=clock, namespace="rgo", head_name="rgo-head")
    job = jm.submit(spec("t"))["job_id"]
    cycle(ctl, jm, agents, 2)
    d = jm.get(job)
    assert d["state"] == "admitted" and d["lease"]["state"] == "granted" and ray_jobs.calls == 1
    assert "No available agent" in d["message"] and "again in 1s" in d["message"]
    assert "No available agent" in jm.explain(job)["summary"]
    for wait, calls in ((1, 2), (2, 3), (4, 4)):
        cycle(ctl, jm, agents, 3)
        assert ray_jobs.calls == calls - 1, "asked again before its backoff was over"
        clock.advance(wait)
        cycle(ctl, jm, agents)
        assert ray_jobs.calls == calls
    d = jm.get(job)
    assert d["state"] == "running" and d["lease"]["state"] == "active" and d["message"] == ""
    assert list(ray_jobs.submitted) == [d["ray_submission_id"]]


def test_a_submission_that_landed_though_its_answer_was_lost_is_adopted(ctl, store, agents, clock) -> None:
    ray_jobs = FlakyRayJobs(down=1, lands=True)
    jm = JobManager(ctl, store, ray_jobs, clock=clock, namespace="rgo", head_name="rgo-head")
    job = jm.submit(spec("t"))["job_id"]
    cycle(ctl, jm, agents, 2)
    clock.advance(1)
    cycle(ctl, jm, agents)
    d = jm.get(job)
    assert d["state"] == "running" and ray_jobs.calls == 2 and len(ray_jobs.submitted) == 1


def test_a_job_api_unavailable_past_the_retry_window_fails_the_job_and_frees_its_lease(
        ctl, store, agents, clock) -> None:
    ray_jobs = FlakyRayJobs(down=10 ** 6)
    jm = JobManager(ctl, store, ray_jobs, clock=clock, namespace="rgo", head_name="rgo-head", submit_retry_s=60)
    job = jm.submit(spec("t"))["job_id"]
    cycle(ctl, jm, agents, 2)
    for _ in range(12):
        clock.advance(10)
        cycle(ctl, jm, agents)
        if jm.get(job)["state"] != "admitted":
            break
    d = jm.get(job)
    assert d["state"] == "failed" and d["lease"]["state"] == "released"
    assert "did not take" in d["message"] and "No available agent" in d["message"]
    assert 4 <= ray_jobs.calls <= 7  # backoff: 1, 2, 4, 8, 16, 30 s ... within 60 s, not once per cycle


def _admitted_and_taken(ctl, store, agents, clock, ray_jobs) -> tuple[JobManager, str, Any]:
    """A head's job layer that submits at launch (the head actor's): one job admitted, its submission taken."""
    jm = JobManager(ctl, store, ray_jobs, clock=clock, namespace="rgo", head_name="rgo-head")
    job = jm.submit(spec("t"))["job_id"]
    cycle(ctl, jm, agents, 2, launch=False)
    assert jm.get(job)["state"] == "admitted"
    assert jm.launch_due()  # its submission waits for the head's flush, then the job API
    (sub,) = jm.take_submissions()
    assert not jm.launch_due()  # handed out once
    return jm, job, sub


def test_a_job_whose_submission_is_with_ray_is_not_submitted_again_and_runs_on_the_answer(
        ctl, store, agents, clock, ray_jobs) -> None:
    jm, job, sub = _admitted_and_taken(ctl, store, agents, clock, ray_jobs)
    cycle(ctl, jm, agents, 3, launch=False)  # Ray has not answered yet: the job waits, nothing is taken twice
    assert jm.take_submissions() == [] and jm.get(job)["state"] == "admitted"
    answer = jm.send_submission(sub)
    assert answer is None and list(ray_jobs.submitted) == [sub.submission_id]
    jm.sent(sub, answer)
    d = jm.get(job)
    assert d["state"] == "running" and d["lease"]["state"] == "active"
    assert not jm.launch_due()  # a job Ray took leaves nothing for the job API: the head needs no flush for it


def _chores_sent(jm: JobManager) -> list[str]:
    """What the head actor's launch does with the stops and deletes once the store holds their records: each
    sent, answered (``rayport.head.launch_off_loop``, here on one thread)."""
    return [jm.chore_done(c, jm.send_chore(c)) for c in jm.take_chores()]


def _submissions_sent(jm: JobManager) -> list[str]:
    """The same for the submissions due."""
    return [jm.sent(sub, jm.send_submission(sub)) for sub in jm.take_submissions()]


def test_a_job_cancelled_while_its_submission_was_with_ray_has_the_ray_job_stopped(
        ctl, store, agents, clock, ray_jobs) -> None:
    jm, job, sub = _admitted_and_taken(ctl, store, agents, clock, ray_jobs)
    jm.cancel(job)
    jm.sent(sub, jm.send_submission(sub))  # Ray took it after all
    assert ray_jobs.statuses[sub.submission_id] == "RUNNING", "stopped once the store holds the cancellation"
    assert jm.launch_due()  # the stop is due: the head flushes, then sends it
    assert _chores_sent(jm) == [f"{sub.submission_id}: stopped in Ray"]
    assert not jm.launch_due()
    d = jm.get(job)
    assert d["state"] == "cancelled" and d["lease"]["state"] == "released"
    assert ray_jobs.statuses[sub.submission_id] == "STOPPED"


def test_a_job_whose_node_was_lost_while_its_submission_was_with_ray_is_stopped_there_and_requeued(
        ctl, store, agents, clock, ray_jobs) -> None:
    jm, job, sub = _admitted_and_taken(ctl, store, agents, clock, ray_jobs)
    node = jm.get(job)["lease"]["allocation"]["node"]
    for _ in range(6):  # past agent_ttl_s for that node only
        clock.advance(1.0)
        for name, a in agents.items():
            if name != node:
                a.beat()
        ctl.reconcile()
    jm.sent(sub, jm.send_submission(sub))
    _chores_sent(jm)
    assert sub.submission_id in ray_jobs.stopped, "a Ray job on devices the job no longer holds must not run"
    jm.reconcile()
    d = jm.get(job)
    assert d["state"] == "queued" and d["attempt"] == 2


def test_one_jobs_error_does_not_stop_the_others(ctl, jm, agents, monkeypatch) -> None:
    a = jm.submit(spec("a"))["job_id"]
    b = jm.submit(spec("b"))["job_id"]
    real = jm._start

    def broken(job, lease):
        if job.job_id == a:
            raise OSError("disk full")
        return real(job, lease)

    monkeypatch.setattr(jm, "_start", broken)
    for ag in agents.values():
        ag.beat()
    ctl.reconcile()
    events = jm.reconcile()
    run_due(jm)
    assert any(e.startswith(f"{a}: reconcile error OSError: disk full") for e in events)
    assert jm.get(b)["state"] == "running"
    monkeypatch.setattr(jm, "_start", real)
    cycle(ctl, jm, agents)
    assert jm.get(a)["state"] == "running"  # admitted earlier; started on the next step


def test_a_preempting_job_whose_ray_job_ends_first_finishes_by_its_outcome(ctl, jm, agents, clock, ray_jobs, tmp_path) -> None:
    victim = one_victim(ctl, jm, agents, clock, tmp_path)
    ray_jobs.statuses[jm.get(victim)["ray_submission_id"]] = "SUCCEEDED"  # it finished before checkpointing
    cycle(ctl, jm, agents, 2)
    v = jm.get(victim)
    assert v["state"] == "succeeded" and v["attempt"] == 1 and v["lease"]["state"] in ("released", "preempted")
    assert jm.get("urgent-1")["state"] == "running"


def test_a_head_restart_with_jobs_in_flight_picks_every_job_up(settings, store, clock, demo, tmp_path) -> None:
    """The controller and job layer are rebuilt from the store (what a restarted head actor does)."""
    ctl = HeadController(settings, store, clock=clock)
    agents = {n.name: SimAgent(ctl, demo, n.name) for n in demo.nodes}
    for ag in agents.values():
        ag.register()
    runner = FakeRayJobs()
    jm = JobManager(ctl, store, runner, clock=clock, namespace="rgo", head_name="rgo-head")
    for i in range(8):
        jm.submit(spec(f"t{i}", ckpt=str(tmp_path / f"t{i}")))
    cycle(ctl, jm, agents, 2)
    clock.advance(60)
    jm.submit(spec("urgent", priority="inference"))
    jm.submit(spec("later", gpu="2"))  # queued behind everything
    cycle(ctl, jm, agents)
    before = {j["job_id"]: j["state"] for j in jm.list()}
    assert sorted(before.values()).count("preempting") == 1 and before["later-1"] == "queued"
    # the head dies; a new one restores from the same store, the agents re-register
    ctl2 = HeadController(settings, store, clock=clock)
    assert ctl2.restore() == len(ctl.ledger.entries)
    jm2 = JobManager(ctl2, store, runner, clock=clock, namespace="rgo", head_name="rgo-head")
    assert jm2.restore() == 10
    assert {j["job_id"]: j["state"] for j in jm2.list()} == before
    for ag in agents.values():
        ag.ctl = ctl2
    (victim,) = [j for j, s in before.items() if s == "preempting"]
    jm2.ack_checkpoint(victim, str(tmp_path / "v.pt"), 7, _token(jm2, victim))
    cycle(ctl2, jm2, agents, 3)
    after = {j["job_id"]: j for j in jm2.list()}
    assert after["urgent-1"]["state"] == "running" and after[victim]["state"] == "queued"
    assert after[victim]["resume_from"] == str(tmp_path / "v.pt")
    assert len([s for s in runner.submitted if s.startswith("urgent-1.")]) == 1  # started exactly once


def test_a_gang_job_runs_one_driver_holding_no_card_and_is_preempted_and_resumed_as_one(
        ctl, jm, agents, clock, ray_jobs, tmp_path) -> None:
    from orchestrator.sdk.inputs import as_spec

    gang = jm.submit(as_spec({"name": "g", "entrypoint": "python jobs/train_gang.py", "gpu": "2x2",
                              "priority": "training", "checkpoint_dir": str(tmp_path / "g")}))["job_id"]
    cycle(ctl, jm, agents, 2)
    job = jm.get(gang)
    assert job["state"] == "running" and job["gpu"].startswith("gang 2x[2x whole")
    w = job["worker_leases"]
    assert [x["lease_id"] for x in w] == [f"{gang}.a1-w0", f"{gang}.a1-w1"]
    assert all(x["state"] == "active" and x["workload"] == f"job:{gang}.a1" for x in w)
    assert {x["allocation"]["node"] for x in w} == {"a100-0"}  # fewest nodes: one node holds both workers
    (sub,) = ray_jobs.submitted.values()  # one driver for the whole gang
    assert sub["handout"]["resources"] == {} and sub["handout"]["num_gpus"] == 0.0  # it holds no card itself
    assert "CUDA_VISIBLE_DEVICES" not in sub["env"]
    handouts = json.loads(sub["env"]["ORCHESTRATOR_GANG"])
    assert [sorted(h["resources"]) for h in handouts] == [sorted(f"rgo-gpu-{i}" for i in x["allocation"]["gpu_indices"])
                                                          for x in w]
    assert sub["env"]["ORCHESTRATOR_LEASE_ID"] == f"{gang}.a1-w0"
    # Inference holds every other whole card; one more inference job can only take the gang, as one victim.
    inf = [jm.submit(spec(f"i{i}", priority="inference"))["job_id"] for i in range(4)]
    cycle(ctl, jm, agents, 2)
    assert all(jm.get(j)["state"] == "running" for j in inf)
    clock.advance(60)
    urgent = jm.submit(spec("urgent", priority="inference"))["job_id"]
    cycle(ctl, jm, agents)
    assert jm.get(gang)["state"] == "preempting" and jm.preemption_requested(gang)["requested"] is True
    assert [x["state"] for x in jm.get(gang)["worker_leases"]] == ["checkpointing", "checkpointing"]
    assert "preempting g-1" in jm.explain(urgent)["summary"] or jm.explain(urgent)["pending"]["being_preempted"]
    # One acknowledgement (worker 0's token) ends every worker's lease; the gang is requeued as one.
    ckpt = tmp_path / "g" / "ckpt"
    ckpt.mkdir(parents=True)
    token = jm.ctl.ledger.get(f"{gang}.a1-w0").lease.fencing_token
    jm.ack_checkpoint(gang, str(ckpt), step=40, token=token)
    cycle(ctl, jm, agents, 2)
    g = jm.get(gang)
    assert g["state"] == "queued" and g["attempt"] == 2 and g["resume_from"] == str(ckpt)
    assert [ctl.get_lease(f"{gang}.a1-w{i}")["state"] for i in range(2)] == ["preempted", "preempted"]
    assert f"{gang}.a1" in ray_jobs.stopped and jm.get(urgent)["state"] == "running"
    # a100-0 has 3 free cards, no other node 2: never a partial gang, and explain says what each worker waits on.
    cycle(ctl, jm, agents, 2)
    assert [x["state"] for x in jm.get(gang)["worker_leases"]] == ["pending", "pending"]
    ex = jm.explain(gang)
    assert [x["lease_id"] for x in ex["workers"]] == [f"{gang}.a2-w0", f"{gang}.a2-w1"]
    assert all(x["state"] == "pending" and x["reason"] for x in ex["workers"])
    assert "gang" in ex["summary"]
    # The inference jobs on h100-0 finish: the gang is granted again across two nodes and resumes.
    for j in inf:
        if jm.get(j)["lease"]["allocation"]["node"] == "h100-0":
            ray_jobs.statuses[jm.get(j)["ray_submission_id"]] = "SUCCEEDED"
    cycle(ctl, jm, agents, 3)
    g = jm.get(gang)
    assert g["state"] == "running", jm.explain(gang)
    assert {x["allocation"]["node"] for x in g["worker_leases"]} == {"a100-0", "h100-0"}
    assert ray_jobs.submitted[f"{gang}.a2"]["env"]["ORCHESTRATOR_RESUME_FROM"] == str(ckpt)
    # One worker's node is lost (h100-0's agent goes silent): the whole gang stops and is requeued.
    for _ in range(6):  # past agent_ttl_s=5 for h100-0 only
        clock.advance(1.0)
        for name, a in agents.items():
            if name != "h100-0":
                a.beat()
        ctl.reconcile()
        jm.reconcile()
        run_due(jm)
    g = jm.get(gang)
    assert g["state"] == "queued" and g["attempt"] == 3 and f"{gang}.a2" in ray_jobs.stopped
    assert g["preemptions"][-1]["by"] == "node lost"
    assert [ctl.get_lease(f"{gang}.a2-w{i}")["state"] for i in range(2)] == ["released", "lost"]


def test_a_gang_job_that_can_never_fit_or_names_a_node_is_refused_naming_the_field(jm) -> None:
    from orchestrator.sdk.inputs import as_spec

    with pytest.raises(InvalidRequestError) as e:
        as_spec({"name": "g", "entrypoint": "x", "gpu": "0x2"})
    assert e.value.field == "gpu.workers"
    with pytest.raises(InvalidRequestError) as e:
        JobSpec(name="g", entrypoint="x", gpu=GpuRequest.parse("2").model_copy(update={"node": "a100-0"}), workers=2)
    assert e.value.field == "gang.worker.node"
    with pytest.raises(InvalidRequestError) as e:
        as_spec({"name": "g", "entrypoint": "x", "gpu": "2x2", "workers": 3})
    assert e.value.field == "workers"


def test_every_running_jobs_ray_status_comes_from_one_batched_read_per_tick(ctl, jm, agents, clock, ray_jobs) -> None:
    # Issue #18 item 4: one HTTP call per job per tick does not hold at a thousand jobs.
    ids = [jm.submit(spec(f"b{i}", gpu="timeslice:0.25", priority="batch"))["job_id"] for i in range(6)]
    cycle(ctl, jm, agents, 2)
    assert all(jm.get(j)["state"] == "running" for j in ids)
    subs = sorted(jm.get(j)["ray_submission_id"] for j in ids)
    ray_jobs.reads.clear()
    jm.status_poll_s = 0.5
    clock.advance(1)
    ray_jobs.statuses[subs[0]] = "SUCCEEDED"
    jm.reconcile()
    assert len(ray_jobs.reads) == 1 and sorted(ray_jobs.reads[0]) == subs  # every job, one read
    assert jm.get(ids[0])["state"] == "succeeded"
    jm.reconcile()
    jm.reconcile()
    assert len(ray_jobs.reads) == 1  # not again within status_poll_s
    clock.advance(0.5)
    ray_jobs.statuses[subs[1]] = "FAILED"
    jm.reconcile()
    assert len(ray_jobs.reads) == 2 and len(ray_jobs.reads[1]) == 5  # the finished one is not asked about
    assert jm.get(ids[1])["state"] == "failed"


def test_a_failing_status_read_keeps_the_last_answers_and_says_so_once(ctl, jm, agents, clock, ray_jobs,
                                                                       monkeypatch, caplog) -> None:
    ids = [jm.submit(spec(f"s{i}", gpu="timeslice:0.25", priority="batch"))["job_id"] for i in range(2)]
    cycle(ctl, jm, agents, 2)
    jm.status_poll_s = 0.5
    real = ray_jobs.status_many

    def broken(submission_ids):
        raise ConnectionError("the GCS is away")

    monkeypatch.setattr(ray_jobs, "status_many", broken)
    with caplog.at_level("WARNING", logger="orchestrator.control.jobs"):
        for _ in range(3):
            clock.advance(1)
            jm.reconcile()
    said = [r.getMessage() for r in caplog.records if "status of" in r.getMessage()]
    assert len(said) == 1 and "ConnectionError: the GCS is away" in said[0]  # once, not every tick
    assert all(jm.get(j)["state"] == "running" for j in ids)  # nothing decided on a failed read
    monkeypatch.setattr(ray_jobs, "status_many", real)
    ray_jobs.statuses[jm.get(ids[0])["ray_submission_id"]] = "SUCCEEDED"
    clock.advance(1)
    jm.reconcile()
    assert jm.get(ids[0])["state"] == "succeeded"
    monkeypatch.setattr(ray_jobs, "status_many", broken)
    caplog.clear()
    with caplog.at_level("WARNING", logger="orchestrator.control.jobs"):
        clock.advance(1)
        jm.reconcile()
    assert [r for r in caplog.records if "status of" in r.getMessage()]  # failing again after a success: said again


def test_ended_jobs_leave_the_head_and_the_store_at_the_cutoff_and_their_names_are_not_given_again(
        ctl, jm, agents, store, clock, ray_jobs) -> None:
    # Issue #18 (nothing leaks): a head that runs thousands of jobs a day kept every one, in memory and in
    # the GCS, and restored them all on each restart. (The head calls prune_ended with the cutoff of the
    # controller's prune pass: tests/runtime/test_service.py.)
    done, failed, runs = (jm.submit(spec("b", gpu="timeslice:0.25", priority="batch"))["job_id"] for _ in range(3))
    assert (done, failed, runs) == ("b-1", "b-2", "b-3")
    cycle(ctl, jm, agents, 2)
    ray_jobs.statuses[jm.get(done)["ray_submission_id"]] = "SUCCEEDED"
    ray_jobs.statuses[jm.get(failed)["ray_submission_id"]] = "FAILED"
    cycle(ctl, jm, agents)
    assert {jm.get(j)["state"] for j in (done, failed)} == {"succeeded", "failed"}
    ended = clock()
    assert jm.prune_ended(ended) == []  # ended at the cutoff, not before it: kept
    assert {j["job_id"] for j in jm.list()} == {done, failed, runs}
    clock.advance(50)
    assert jm.prune_ended(ended + 1) == [done, failed]  # in the order they ended
    assert [j["job_id"] for j in jm.list()] == [runs]  # the running one stays, however old
    for j in (done, failed):
        with pytest.raises(UnknownObjectError):
            jm.get(j)
        assert store.get(f"rgo/job/{j}") is None
    assert jm.submit(spec("b", gpu="timeslice:0.25", priority="batch"))["job_id"] == "b-4"  # b-1 is not reused
    again = JobManager(ctl, store, ray_jobs, clock=clock, namespace="rgo", head_name="rgo-head")
    assert again.restore() == 2  # a restarted head restores neither
    assert again.submit(spec("b", gpu="timeslice:0.25", priority="batch"))["job_id"] == "b-5"


def test_a_restored_head_drops_ended_jobs_in_the_order_they_ended_not_submitted(ctl, jm, agents, store, clock,
                                                                                 ray_jobs) -> None:
    first = jm.submit(spec("early", gpu="timeslice:0.25", priority="batch"))["job_id"]
    second = jm.submit(spec("late", gpu="timeslice:0.25", priority="batch"))["job_id"]
    cycle(ctl, jm, agents, 2)
    ray_jobs.statuses[jm.get(second)["ray_submission_id"]] = "SUCCEEDED"  # the later one ends first
    cycle(ctl, jm, agents)
    ended_second = clock()
    clock.advance(100)
    ray_jobs.statuses[jm.get(first)["ray_submission_id"]] = "SUCCEEDED"
    cycle(ctl, jm, agents)
    again = JobManager(ctl, store, ray_jobs, clock=clock, namespace="rgo", head_name="rgo-head")
    assert again.restore() == 2
    assert again.prune_ended(ended_second + 50) == [second]
    assert again.get(first)["state"] == "succeeded"


# ---- stopping Ray jobs off the head's loop ------------------------------------------------------------
class FlakyStops(FakeRayJobs):
    """Ray's job API stood in for: ``stop`` answers "no available agent" (HTTP 503) the first ``fails`` times."""

    def __init__(self, fails: int) -> None:
        super().__init__()
        self.fails = fails
        self.stop_calls = 0

    def stop(self, submission_id: str) -> None:
        self.stop_calls += 1
        if self.stop_calls <= self.fails:
            raise JobApiUnavailableError(submission_id, "HTTP 503: No available agent")
        super().stop(submission_id)


def test_a_cancelled_jobs_ray_job_is_stopped_after_its_record_and_a_stop_ray_cannot_take_is_asked_again(
        ctl, store, agents, clock) -> None:
    # The head actor stops Ray jobs off its loop, once the store holds the record that needs the stop: the call
    # made on the loop held every call and cycle for up to the job API's 30 s timeout.
    ray_jobs = FlakyStops(fails=2)
    jm = JobManager(ctl, store, ray_jobs, clock=clock, namespace="rgo", head_name="rgo-head")
    job = jm.submit(spec("t"))["job_id"]
    cycle(ctl, jm, agents, 2, launch=False)
    _submissions_sent(jm)
    sub_id = jm.get(job)["ray_submission_id"]
    assert jm.get(job)["state"] == "running"
    assert jm.cancel(job)["state"] == "cancelled" and ray_jobs.stop_calls == 0  # the cancel made no call to Ray
    assert store.get(f"rgo/job/{job}")["state"] == "cancelled"
    assert "asking again in 1s" in _chores_sent(jm)[0]
    assert jm.take_chores() == []  # not before its backoff
    clock.advance(1)
    assert "asking again in 2s" in _chores_sent(jm)[0]
    clock.advance(2)
    assert _chores_sent(jm) == [f"{sub_id}: stopped in Ray"] and ray_jobs.statuses[sub_id] == "STOPPED"
    clock.advance(60)
    assert jm.take_chores() == []  # once stopped, never asked again


def test_a_stop_ray_never_takes_is_given_up_after_the_retry_window_and_said(ctl, store, agents, clock, caplog) -> None:
    ray_jobs = FlakyStops(fails=1000)
    jm = JobManager(ctl, store, ray_jobs, clock=clock, namespace="rgo", head_name="rgo-head",
                    submit_retry_s=60)
    job = jm.submit(spec("t"))["job_id"]
    cycle(ctl, jm, agents, 2, launch=False)
    _submissions_sent(jm)
    jm.cancel(job)
    events: list[str] = []
    for _ in range(40):
        events += _chores_sent(jm)
        clock.advance(5)
    assert "gave up the stop in Ray" in events[-1] and 4 <= ray_jobs.stop_calls <= 8
    assert "it may still run" in caplog.text


def test_a_restarted_head_stops_what_the_crashed_one_may_not_have_stopped(ctl, store, agents, clock, tmp_path) -> None:
    # A stop leaves after the record that needs it: a crash in between must not leave a cancelled job's (or a
    # preempted attempt's) Ray job running on devices the head has given to someone else.
    ray_jobs = FakeRayJobs()
    jm = JobManager(ctl, store, ray_jobs, clock=clock, namespace="rgo", head_name="rgo-head")
    victim = one_victim(ctl, jm, agents, clock, tmp_path)
    clock.advance(61)  # past the grace period: stopped and requeued as attempt 2
    cycle(ctl, jm, agents, 2)
    gone = next(j["job_id"] for j in jm.list() if j["state"] == "running" and j["job_id"] != victim)
    jm.cancel(gone)
    assert jm.get(victim)["attempt"] == 2
    ray_jobs.stopped.clear()
    again = JobManager(ctl, store, ray_jobs, clock=clock, namespace="rgo", head_name="rgo-head")
    again.restore()
    assert sorted(c.submission_id for c in again.take_chores()) == sorted([f"{victim}.a1", f"{gone}.a1"])
    assert ray_jobs.stopped == [], "the restored head stops only from its launch, after the restore is durable"
    # Stops are asked for submit_retry_s (300 s) at most: a restart well after that re-stops nothing (a day of
    # cancelled jobs would otherwise be as many HTTP calls, queued before the submissions).
    clock.advance(300 + 61)
    later = JobManager(ctl, store, ray_jobs, clock=clock, namespace="rgo", head_name="rgo-head")
    later.restore()
    assert later.take_chores() == []


def test_a_dropped_jobs_ray_records_are_deleted_so_its_id_runs_again(store, clock, demo) -> None:
    # Ray never empties its job table; and a job id submitted again after the head dropped the first job of it
    # (ended_retention_s) reused the first one's Ray submission ids: Ray said "already exists", which was taken
    # as this submission landing, so the new job "ran" nothing and ended with the old one's status.
    settings = RuntimeSettings(heartbeat_interval_s=1.0, agent_ttl_s=5.0, grant_ttl_s=60.0, ended_retention_s=60)
    ctl = HeadController(settings, store, clock=clock)
    agents = {n.name: SimAgent(ctl, demo, n.name) for n in demo.nodes}
    for a in agents.values():
        a.register()
    ray_jobs = FakeRayJobs()
    jm = JobManager(ctl, store, ray_jobs, clock=clock, namespace="rgo", head_name="rgo-head")

    def step() -> list[str]:  # what the head actor's loop does: a cycle, then the job API's calls
        for a in agents.values():
            a.beat()
        report = ctl.reconcile()
        if report.pruned_before is not None:
            jm.prune_ended(report.pruned_before)
        jm.reconcile()
        _submissions_sent(jm)
        return _chores_sent(jm)

    jm.submit(spec("nightly"), job_id="nightly")
    step()
    assert jm.get("nightly")["state"] == "running"
    ray_jobs.statuses["nightly.a1"] = "SUCCEEDED"
    step()
    assert jm.get("nightly")["state"] == "succeeded" and ray_jobs.deleted == []
    events: list[str] = []
    for _ in range(15):
        clock.advance(5)
        events += step()
    assert "nightly.a1: deleted in Ray" in events and ray_jobs.deleted == ["nightly.a1"]
    with pytest.raises(UnknownObjectError):
        jm.get("nightly")
    jm.submit(spec("nightly"), job_id="nightly")
    step()
    assert jm.get("nightly")["state"] == "running" and ray_jobs.statuses["nightly.a1"] == "RUNNING"
    assert "nightly.a1" in ray_jobs.submitted, "the new job's driver was submitted, not taken for the old one"


# ---- the live page's read of the jobs ---------------------------------------------------------------------------
def test_the_job_board_agrees_with_the_full_list_and_grows_with_its_limit_not_the_jobs(
        ctl, jm, agents, clock, ray_jobs, tmp_path) -> None:
    # The live page read list_jobs every second: every job kept, history and lease included (8,000 jobs:
    # ~300 ms of the head's loop and a 7 MB reply). job_board reads the same facts off the jobs themselves.
    victim = one_victim(ctl, jm, agents, clock, tmp_path)
    clock.advance(61)
    cycle(ctl, jm, agents, 2)  # the victim stopped and requeued: a resumption
    for i in range(6):
        clock.advance(1)
        j = jm.submit(spec(f"short{i}", priority="batch"))["job_id"]
        if i % 2 == 0:
            jm.cancel(j)
    clock.advance(1)  # the oldest job's transition is the newest of all
    oldest = next(j["job_id"] for j in jm.list() if j["state"] == "running" and j["job_id"] != victim)
    jm.cancel(oldest)
    jobs = jm.list()
    live = [j["job_id"] for j in jobs if j["state"] in ("queued", "admitted", "running", "preempting")]
    ended = [j["job_id"] for j in jobs if j["job_id"] not in live]
    assert jm.get(victim)["attempt"] == 2 and len(ended) == 4
    board = jm.board(limit=len(live) + 2)
    assert board["counts"] == {
        "jobs": len(jobs),
        "waiting_for_lease": sum(1 for j in jobs if j["state"] == "queued" and not j["lease_id"]),
        "ever_ran": sum(1 for j in jobs if any(h["state"] == "running" for h in j["history"])),
        "resumed_live": sum(1 for j in jobs if j["attempt"] > 1 and j["state"] in ("queued", "admitted", "running")),
        "resumptions": sum(j["attempt"] - 1 for j in jobs)}
    assert board["counts"]["resumptions"] == 1 and board["counts"]["ever_ran"] >= 8
    every = sorted(((h["at"], j["job_id"], k, {"at": h["at"], "job_id": j["job_id"], "state": h["state"],
                                                 "reason": h["reason"]})
                    for j in jobs for k, h in enumerate(j["history"])), key=lambda t: t[:3], reverse=True)
    assert board["decisions"] == [d for *_, d in every[:40]]  # newest first; a job's later entry first at one time
    assert board["decisions"][0]["job_id"] == oldest
    assert jm.board(limit=3, decisions=5)["decisions"] == [d for *_, d in every[:5]]  # read off 5 jobs' histories
    rows = [r["job_id"] for r in board["jobs"]]
    assert set(live) <= set(rows) and rows == [j["job_id"] for j in jobs if j["job_id"] in rows]  # submission order
    assert set(rows) - set(live) == set(ended[-2:])  # the latest ended fill what is left
    row = next(r for r in board["jobs"] if r["job_id"] == victim)
    full = jm.get(victim)
    assert row == {k: full[k] for k in ("job_id", "name", "state", "gpu", "priority_class", "attempt")} | {
        "preemptions": len(full["preemptions"])}
    assert board["lease_jobs"] == {j["lease_id"]: j["job_id"] for j in jobs if j["job_id"] in live}
    assert len(jm.board(limit=3)["jobs"]) == 3
    for bad in (0, 5001, "10", True):
        with pytest.raises(InvalidRequestError) as e:
            jm.board(limit=bad)  # type: ignore[arg-type]
        assert e.value.field == "limit"


def test_deletes_of_dropped_jobs_trickle_two_at_a_time_and_never_hold_back_a_stop(ctl, store, agents, clock) -> None:
    # After a long outage one prune drops a day of jobs: their deletes (HTTP calls on the job API's one thread)
    # must not queue ahead of submissions and stops.
    ray_jobs = FakeRayJobs()
    jm = JobManager(ctl, store, ray_jobs, clock=clock, namespace="rgo", head_name="rgo-head")
    ids = [jm.submit(spec(f"s{i}", priority="batch"))["job_id"] for i in range(6)]
    cycle(ctl, jm, agents, 2, launch=False)
    _submissions_sent(jm)
    for j in ids[:5]:
        ray_jobs.statuses[f"{j}.a1"] = "SUCCEEDED"
    cycle(ctl, jm, agents, launch=False)
    assert [jm.get(j)["state"] for j in ids] == ["succeeded"] * 5 + ["running"]
    clock.advance(1)
    assert sorted(jm.prune_ended(clock())) == sorted(ids[:5])
    jm.cancel(ids[5])
    first = jm.take_chores()
    assert [c.kind.value for c in first] == ["stop", "delete", "delete"]
    assert jm.take_chores() == []  # two deletes out: no third
    assert not jm.launch_due()  # so the head has nothing to flush for: a waiting delete is not due
    jm.chore_done(first[1], jm.send_chore(first[1]))
    (third,) = jm.take_chores()
    assert third.kind.value == "delete"
    for c in [first[0], first[2], third]:
        jm.chore_done(c, jm.send_chore(c))
    while _chores_sent(jm):
        pass
    assert sorted(ray_jobs.deleted) == sorted(f"{j}.a1" for j in ids[:5])
