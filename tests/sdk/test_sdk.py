"""The SDK against the real head in-process (tests/headless.py): discovery, refusals before any call,
job handles, the lease block. No Ray; Ray's job API is stood in for by local processes."""

from __future__ import annotations

import threading

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from headless import InProcessHead

from orchestrator.core.config import DEMO_CONFIG, load_config
from orchestrator.core.env import RAY_JOB_CONFIG as RAY_JOB_ENV
from orchestrator.core.lease import key_digest
from orchestrator.core.errors import InvalidRequestError, LeaseTimeoutError, StaleFencingTokenError, UnknownObjectError
from orchestrator.core.job import JobSpec
from orchestrator.core.request import GpuRequest
from orchestrator.core.statefile import State
from orchestrator.sdk import Client, JobWaitTimeoutError, as_spec, discover, lease

from .fakes import FakeClock


@pytest.fixture
def client(head: InProcessHead) -> Client:
    return Client(head=head)


def _blocker(client: Client, gpus: str = "4", name: str = "blocker") -> str:
    """A job holding the only node with ``gpus`` free cards (a100-0) until the test ends."""
    h = client.submit({"name": name, "entrypoint": "sleep 600", "gpu": gpus, "priority": "inference"})
    _until(client, h.job_id, "running")
    return h.job_id


def _until(client: Client, job_id: str, state: str, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while (d := client.job(job_id).status())["state"] != state:
        assert time.monotonic() < deadline, f"{job_id} stuck in {d['state']}: {d['message']}"
        time.sleep(0.02)
    return d


# ---- discovery -----------------------------------------------------------------------------------
@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    State("127.0.0.1:6390", "rgo-s", "head-s", attached=False, env={"RAY_AUTH_MODE": "token"}).save(tmp_path)
    return tmp_path


def test_discover_an_explicit_address_wins_and_the_state_file_still_names_the_head(state_dir: Path) -> None:
    t = discover("10.0.0.1:6379", state_dir=state_dir, environ={})
    assert (t.address, t.namespace, t.head_name, t.source) == ("10.0.0.1:6379", "rgo-s", "head-s", "--address")


def test_discover_reads_the_state_file_up_wrote(state_dir: Path) -> None:
    t = discover(state_dir=state_dir, environ={})
    assert (t.address, t.namespace, t.head_name) == ("127.0.0.1:6390", "rgo-s", "head-s")
    assert t.env == {"RAY_AUTH_MODE": "token"} and str(state_dir) in t.source


def test_discover_inside_a_ray_job_uses_the_jobs_cluster_and_the_heads_env(state_dir: Path) -> None:
    env = {RAY_JOB_ENV: "{}", "ORCHESTRATOR_NAMESPACE": "rgo-job", "ORCHESTRATOR_HEAD_NAME": "h"}
    t = discover(state_dir=state_dir, environ=env)
    assert (t.address, t.namespace, t.head_name, t.env) == (None, "rgo-job", "h", {})
    assert discover(state_dir=state_dir, environ={}, connected=True).address is None


def test_discover_falls_back_to_auto(tmp_path: Path) -> None:
    t = discover(state_dir=tmp_path / "none", environ={})
    assert (t.address, t.namespace, t.head_name) == ("auto", "rgo", "rgo-head")


def test_import_orchestrator_stays_light_and_exports_the_sdk_lazily() -> None:
    code = ("import sys, inspect, orchestrator; assert 'ray' not in sys.modules and 'orchestrator.sdk' not in sys.modules;"
            "assert inspect.isfunction(orchestrator.lease) and orchestrator.lease.__module__ == 'orchestrator.sdk.leases';"
            "from orchestrator import Client, lease, JobSpec, GpuRequest;"
            "assert lease.__doc__.startswith('Block until') and Client.__module__ == 'orchestrator.sdk.jobs';"
            "assert 'ray' not in sys.modules\n"
            "try:\n import orchestrator.lease\nexcept ModuleNotFoundError: print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


# ---- refusals ------------------------------------------------------------------------------------
@pytest.mark.parametrize("gpu, field", [
    ("mig:9g.99gb", "profile"),                     # a MIG profile no GPU model offers
    ("mps:130%", "gpu.sm_percent"),                 # an SM share over 100%
    ("mps:30%,-2GiB", "gpu.memory"),                # negative memory
    ("mem=lots,isolation=hard", "gpu.memory"),      # unparsable memory
    ("mem=20GiB,compute=0.3,isolation=firm", "gpu.isolation"),
])
def test_bad_gpu_requests_are_refused_before_any_call(client: Client, head: InProcessHead, gpu: str, field: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        client.submit({"name": "x", "entrypoint": "true", "gpu": gpu})
    assert e.value.field == field and str(e.value.value) in str(e.value)
    with pytest.raises(InvalidRequestError):
        with lease(gpu, head=head):
            pass
    assert head.calls == []


def test_an_empty_command_is_refused_before_any_call(client: Client, head: InProcessHead) -> None:
    with pytest.raises(InvalidRequestError) as e:
        client.submit({"name": "x", "entrypoint": "  "})
    assert e.value.field == "entrypoint" and "empty command" in str(e.value)
    assert head.calls == []


def test_the_heads_refusals_come_back_typed_naming_the_field(client: Client, head: InProcessHead) -> None:
    with pytest.raises(InvalidRequestError) as e:
        client.submit(JobSpec(name="x", entrypoint="true", priority="urgent"))
    assert e.value.field == "priority" and "inference" in e.value.allowed and "batch" in e.value.allowed
    with pytest.raises(InvalidRequestError) as e:
        client.submit({"name": "x", "entrypoint": "true", "gpu": "mig:7g.80gb"})  # a real profile, not in this cluster
    assert e.value.field == "gpu.profile" and "1g.10gb" in e.value.allowed
    assert head.methods() == ["submit_job", "submit_job"] and head.list_jobs() == []  # refused: nothing queued


# ---- jobs ----------------------------------------------------------------------------------------
def test_submit_picks_an_idempotent_job_id_and_sends_the_spec_as_json(client: Client, head: InProcessHead) -> None:
    _blocker(client)  # four whole cards wait behind it (a job that fits is admitted in its submit call)
    spec = JobSpec(name="train", entrypoint="sleep 600", gpu=GpuRequest.whole(4), priority="training",
                   checkpoint_dir="/ck", runtime_env={"env_vars": {"A": "1"}})
    h = client.submit(spec)
    assert re.fullmatch(r"train-[0-9a-f]{6}", h.job_id)
    method, (sent, job_id) = [c for c in head.calls if c[0] == "submit_job"][-1]
    assert method == "submit_job" and job_id == h.job_id and JobSpec(**sent) == spec
    assert h.state == "queued" and h.info["priority_class"] == "training" and h.info["gpu"] == "4x whole"
    again = client.submit(spec, job_id=h.job_id)  # what a retried call does
    assert again.job_id == h.job_id and [j["job_id"] for j in head.list_jobs() if j["name"] == "train"] == [h.job_id]
    with pytest.raises(InvalidRequestError) as e:  # the same id for another spec is refused, not returned
        client.submit(spec.model_copy(update={"priority": "batch"}), job_id=h.job_id)
    assert e.value.field == "job_id"


def test_as_spec_takes_a_dict_with_a_gpu_string() -> None:
    assert as_spec({"name": "a", "entrypoint": "x", "gpu": "timeslice:0.25"}).gpu == GpuRequest.timeslice(0.25)
    assert as_spec({"name": "a", "entrypoint": "x", "gpu": 2}).gpu == GpuRequest.whole(2)


def test_wait_follows_the_job_to_its_end_and_reports_each_change(client: Client) -> None:
    h = client.submit({"name": "j", "entrypoint": "sleep 0.3"})
    seen: list[str] = []
    final = h.wait(30, poll_s=0.02, max_poll_s=0.05, on_change=lambda d: seen.append(d["state"]))
    assert final["state"] == "succeeded" and seen[-1] == "succeeded" and "running" in seen
    assert [t["state"] for t in final["history"]] == ["queued", "admitted", "running", "succeeded"]
    assert final["ray_submission_id"] == f"{h.job_id}.a1" and final["lease"]["state"] == "released"


def test_a_failing_entrypoint_ends_the_job_failed_with_its_logs(client: Client) -> None:
    h = client.submit({"name": "bad", "entrypoint": "echo oops; exit 3"})
    final = h.wait(30, poll_s=0.02, max_poll_s=0.05)
    assert final["state"] == "failed" and "FAILED" in final["message"] and h.logs() == "oops\n"


def test_wait_times_out_with_the_explanation(client: Client, head: InProcessHead) -> None:
    _blocker(client)
    h = client.submit({"name": "j", "entrypoint": "true", "gpu": "4", "priority": "batch"})
    head.wait_for(lambda: h.explain()["pending"] is not None, 10, "the scheduler has looked at the job")
    clock = FakeClock()
    with pytest.raises(JobWaitTimeoutError) as e:
        h.wait(5, clock=clock, sleep=clock.sleep)
    assert e.value.retryable and e.value.state == "queued" and "4x whole" in str(e.value)
    assert 5 <= clock.t <= 5.01 and max(clock.slept) <= 2.0  # backs off, never past the deadline


def test_logs_cancel_explain_and_unknown_ids(client: Client, head: InProcessHead) -> None:
    done = client.submit({"name": "echo", "entrypoint": "echo hello"})
    assert done.wait(30, poll_s=0.02)["state"] == "succeeded" and done.logs() == "hello\n"
    _blocker(client)
    h = client.submit({"name": "j", "entrypoint": "true", "gpu": "4", "priority": "batch"})
    head.wait_for(lambda: h.explain()["pending"] is not None, 10, "the scheduler has looked at the job")
    ex = h.explain()
    assert ex["pending"]["position"] == 0 and ex["pending"]["reasons"] and "pending" in ex["summary"]
    assert h.cancel()["state"] == "cancelled" and h.state == "cancelled"
    assert h.cancel()["state"] == "cancelled" and h.info["lease"]["state"] == "released"  # idempotent; lease freed
    with pytest.raises(UnknownObjectError):
        client.job("nope")


def test_jobs_nodes_leases_and_queue(client: Client, head: InProcessHead) -> None:
    _blocker(client)
    a = client.submit({"name": "a", "entrypoint": "true", "gpu": "4", "priority": "batch"})
    head.request_lease({"lease_id": "l-1", "request": "1", "owner": "o"})
    head.wait_lease("l-1", 10)
    assert sorted(j["name"] for j in client.jobs()) == ["a", "blocker"]
    assert [n["name"] for n in client.nodes()] == ["a100-0", "a100-1", "h100-0"]
    assert "l-1" in [le["lease_id"] for le in client.leases()]
    head.wait_for(lambda: any(q["why_pending"] for q in client.queue()), 10, "a reason for the waiting job")
    assert [q["owner"] for q in client.queue()] == [f"job:{a.job_id}"]  # l-1 fits, so it is not queued
    tree = {q["queue"]: q for q in client.queues()}
    assert tree["default"]["asked_gpus"] >= 4 and tree["default"]["cause"].startswith("fair.")


def test_the_queue_tree_table_indents_children_and_says_why() -> None:
    from rich.console import Console

    from orchestrator.cli.job_views import queues_table

    rows = [{"queue": "org", "depth": 0, "guarantee_gpus": 2, "weight": 1, "limit_gpus": None, "used_gpus": 6,
             "asked_gpus": 8, "fair_share_gpus": 4, "reason": "queue org holds 6 GPUs, above its fair share of 4"},
            {"queue": "team", "depth": 1, "guarantee_gpus": 0, "weight": 3, "limit_gpus": 5, "used_gpus": 6,
             "asked_gpus": 8, "fair_share_gpus": 4, "reason": "below"}]
    console = Console(width=200, record=True)
    console.print(queues_table(rows))
    text = console.export_text()
    assert "\n org " in text and "\n   team " in text  # the child indented under its parent
    assert "above its fair share of 4" in text and " 5 " in text


# ---- the lease block -----------------------------------------------------------------------------
def test_the_fencing_token_goes_to_the_requester_only(head: InProcessHead) -> None:
    """Tokens are capabilities: status, get_lease, the job views and explain show them redacted."""
    head.submit_job({"name": "j", "entrypoint": "sleep 600", "gpu": {"kind": "whole", "count": 1}}, "j-1")
    head.wait_for(lambda: head.service.get_job("j-1")["state"] == "running", 10, "j-1 running")
    with lease(GpuRequest.whole(1), lease_id="l-own", head=head) as le:
        mine = le.fencing_token
        assert mine >= 1 and le.refresh()["fencing_token"] == mine  # the requester's key shows it
        views = [head.status()["leases"], [head.get_lease("l-own"), head.get_lease("l-own", "a guess")],
                 [j["lease"] for j in head.list_jobs()], [head.get_job("j-1")["lease"]]]
        shown = [d for view in views for d in view]
        assert {d["lease_id"] for d in shown} >= {"l-own", head.get_job("j-1")["lease"]["lease_id"]}
        for d in shown:
            assert d["fencing_token"] is None and d["token_redacted"] is True, d["lease_id"]
            if d.get("handout"):
                assert d["handout"]["env_vars"]["ORCHESTRATOR_FENCING_TOKEN"] == "<redacted>"
        assert "fencing_token" not in json.dumps(head.explain_lease("l-own")).replace('"fencing_token": null', "")
        # What another driver can do with what it sees: nothing.
        with pytest.raises(StaleFencingTokenError):
            head.release("l-own", None, "someone else")
        assert head.get_lease("l-own")["state"] == "active"


def test_lease_grants_activates_yields_and_releases(head: InProcessHead) -> None:
    with lease(GpuRequest.mig("1g.10gb"), priority="training", owner="me", lease_id="l-a", head=head) as le:
        assert le.lease_id == "l-a" and le.node == "a100-1" and le.fencing_token >= 1
        assert le.cuda_visible_devices.startswith("MIG-") and le.env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1"
        opts = le.actor_options(num_cpus=1, extra_env={"X": "1"})
        assert 0 < opts["num_gpus"] < 1 and opts["num_cpus"] == 1
        assert opts["runtime_env"]["env_vars"]["X"] == "1" and opts["scheduling_strategy"].soft is False
        assert head.get_lease("l-a")["state"] == "active"
        # the holder actor is named and registered as the lease's workload: the agent can reach it
        assert (opts["name"], opts["namespace"]) == ("rgo-lease-l-a", "rgo")
        assert head.get_lease("l-a")["workload"] == "actor:rgo/rgo-lease-l-a"
    req = head.calls[0][1][0]
    assert req["priority_class"] == "training" and req["owner"] == "me" and GpuRequest(**req["request"]) == GpuRequest.mig("1g.10gb")
    # one call queues and grants at once (it fits: no wait); with no holder actor the lease is activated once granted
    assert [m for m in head.methods() if m != "get_lease"] == ["acquire_lease_now", "activate", "activate", "release"]
    final = head.get_lease("l-a")
    assert final["state"] == "released" and final["history"][-1]["reason"] == "holder left the lease block"


def test_leaving_the_block_with_an_error_releases_and_says_why(head: InProcessHead) -> None:
    with pytest.raises(KeyError):
        with lease("1", lease_id="l-b", head=head):
            raise KeyError("boom")
    assert head.get_lease("l-b")["history"][-1]["reason"] == "holder left the lease block with KeyError"


def test_a_lease_not_granted_in_time_is_withdrawn(head: InProcessHead) -> None:
    head.request_lease({"lease_id": "hog", "request": "4"})  # a100-0's four cards: the only node with four
    assert head.wait_lease("hog", 10)["state"] == "granted"
    with pytest.raises(LeaseTimeoutError) as e:
        with lease("4", lease_id="l-c", timeout=0.5, head=head):
            pytest.fail("not granted: the block must not run")
    assert "4x whole" in str(e.value)
    name, args = head.calls[-1]  # withdrawn with the requester's key (the head refuses a release without it)
    assert (name, args[:3]) == ("release", ("l-c", None, "not granted within 0.5s; withdrawn by its requester"))
    assert head.get_lease("l-c")["state"] == "released"
    assert head.get_lease("l-c")["state"] == "released"


def test_a_lease_that_must_wait_is_waited_on_then_activated(head: InProcessHead) -> None:
    head.request_lease({"lease_id": "hog2", "request": "4", "requester_digest": key_digest("k")})  # a100-0's four
    hog = head.wait_lease("hog2", 10, "k")
    assert hog["state"] == "granted"
    threading.Timer(0.3, head.release, ("hog2", hog["fencing_token"], "done")).start()
    with lease("4", lease_id="l-w", timeout=10, head=head) as le:
        assert le.node == "a100-0" and head.get_lease("l-w")["state"] == "active"
    mine = [m for m, args in head.calls if args[:1] == ("l-w",) or (args and isinstance(args[0], dict)
                                                                   and args[0].get("lease_id") == "l-w")]
    assert mine[:3] == ["acquire_lease_now", "wait_lease", "activate"], mine


def test_an_unknown_priority_class_is_refused_by_the_head(head: InProcessHead) -> None:
    with pytest.raises(InvalidRequestError) as e:
        with lease("1", priority="urgent", head=head):
            pass
    assert e.value.field == "priority"


def test_preemption_requested_is_rate_limited_and_sticky(tmp_path: Path) -> None:
    cfg = load_config(DEMO_CONFIG)
    training = cfg.scheduler.classes["training"].model_copy(update={"min_runtime_s": 0.0})
    cfg = cfg.model_copy(update={"scheduler": cfg.scheduler.model_copy(
        update={"classes": {**cfg.scheduler.classes, "training": training}})})
    head = InProcessHead(cfg, workdir=tmp_path)
    try:
        with lease({"kind": "whole", "count": 2, "node": "h100-0"}, priority="training", lease_id="l-d", head=head,
                   poll_s=10) as le:
            clock = FakeClock(100.0)
            le._poll._clock = clock
            assert le.preemption_requested() is False
            clock.t += 5
            assert le.preemption_requested() is False  # cached: no call within poll_s
            assert head.methods().count("get_lease") == 1
            head.request_lease({"lease_id": "urgent", "request": {"kind": "whole", "count": 1, "node": "h100-0"},
                                "priority_class": "inference"})
            head.wait_for(lambda: head.service.get_lease("l-d")["state"] == "checkpointing", 10, "l-d asked to yield")
            assert le.preemption_requested() is False  # still cached
            clock.t += 6
            assert le.preemption_requested() is True
            clock.t += 60
            assert le.preemption_requested() is True and head.methods().count("get_lease") == 2
            le.release("checkpointed")
        assert head.methods()[-1] == "release" and head.methods().count("release") == 1  # not released twice
        head.wait_for(lambda: head.service.get_lease("urgent")["state"] == "granted", 10, "the preemptor granted")
    finally:
        head.close()
