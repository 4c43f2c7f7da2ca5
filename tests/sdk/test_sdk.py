"""The SDK against a fake head: discovery, refusals before any call, job handles, the lease block. No Ray."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.core.errors import InvalidRequestError, LeaseTimeoutError, UnknownObjectError
from orchestrator.core.job import JobSpec
from orchestrator.core.request import GpuRequest
from orchestrator.core.statefile import State
from orchestrator.core.env import RAY_JOB_CONFIG as RAY_JOB_ENV
from orchestrator.sdk import Client, JobWaitTimeoutError, as_spec, discover, lease

from .fakes import FakeClock, FakeHead


@pytest.fixture
def head() -> FakeHead:
    return FakeHead()


@pytest.fixture
def client(head: FakeHead) -> Client:
    return Client(head=head)


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
def test_bad_gpu_requests_are_refused_before_any_call(client: Client, head: FakeHead, gpu: str, field: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        client.submit({"name": "x", "entrypoint": "true", "gpu": gpu})
    assert e.value.field == field and str(e.value.value) in str(e.value)
    with pytest.raises(InvalidRequestError):
        with lease(gpu, head=head):
            pass
    assert head.calls == []


def test_an_empty_command_is_refused_before_any_call(client: Client, head: FakeHead) -> None:
    with pytest.raises(InvalidRequestError) as e:
        client.submit({"name": "x", "entrypoint": "  "})
    assert e.value.field == "entrypoint" and "empty command" in str(e.value)
    assert head.calls == []


def test_the_heads_refusals_come_back_typed_naming_the_field(client: Client) -> None:
    with pytest.raises(InvalidRequestError) as e:
        client.submit(JobSpec(name="x", entrypoint="true", priority="urgent"))
    assert e.value.field == "priority" and "inference" in e.value.allowed and "batch" in e.value.allowed
    with pytest.raises(InvalidRequestError) as e:
        client.submit({"name": "x", "entrypoint": "true", "gpu": "mig:7g.80gb"})  # real profile, not in this cluster
    assert e.value.field == "gpu.profile" and "1g.10gb" in e.value.allowed


# ---- jobs ----------------------------------------------------------------------------------------
def test_submit_picks_an_idempotent_job_id_and_sends_the_spec_as_json(client: Client, head: FakeHead) -> None:
    spec = JobSpec(name="train", entrypoint="python jobs/train.py", gpu=GpuRequest.mps(30, 20480), priority="training",
                   checkpoint_dir="/ck", runtime_env={"env_vars": {"A": "1"}})
    h = client.submit(spec)
    assert re.fullmatch(r"train-[0-9a-f]{6}", h.job_id)
    method, (sent, job_id) = head.calls[0]
    assert method == "submit_job" and job_id == h.job_id and JobSpec(**sent) == spec
    assert h.state == "queued" and h.info["priority_class"] == "training" and h.info["gpu"] == "mps:30%,20480MiB"
    again = client.submit(spec, job_id=h.job_id)  # what a retried call does
    assert again.job_id == h.job_id and len(head.jobs) == 1


def test_as_spec_takes_a_dict_with_a_gpu_string() -> None:
    assert as_spec({"name": "a", "entrypoint": "x", "gpu": "timeslice:0.25"}).gpu == GpuRequest.timeslice(0.25)
    assert as_spec({"name": "a", "entrypoint": "x", "gpu": 2}).gpu == GpuRequest.whole(2)


def test_wait_follows_the_job_to_its_end_and_reports_each_change(client: Client, head: FakeHead) -> None:
    h = client.submit({"name": "j", "entrypoint": "true"})
    head.script(h.job_id, ("admitted", "lease granted"), ("running", "submitted to Ray"),
                ("succeeded", "Ray job SUCCEEDED"))
    clock, seen = FakeClock(), []
    final = h.wait(30, on_change=lambda d: seen.append(d["state"]), clock=clock, sleep=clock.sleep)
    assert final["state"] == "succeeded" and seen == ["admitted", "running", "succeeded"]
    assert [t["state"] for t in final["history"]] == ["queued", "admitted", "running", "succeeded"]


def test_wait_times_out_with_the_explanation(client: Client, head: FakeHead) -> None:
    h = client.submit({"name": "j", "entrypoint": "true", "gpu": "8"})
    clock = FakeClock()
    with pytest.raises(JobWaitTimeoutError) as e:
        h.wait(5, clock=clock, sleep=clock.sleep)
    assert e.value.retryable and e.value.state == "queued" and "no node fits 8x whole" in str(e.value)
    assert 5 <= clock.t <= 5.01 and max(clock.slept) <= 2.0  # backs off, never past the deadline


def test_logs_cancel_explain_and_unknown_ids(client: Client, head: FakeHead) -> None:
    h = client.submit({"name": "j", "entrypoint": "true"})
    head.logs[h.job_id] = "hello\n"
    assert h.logs() == "hello\n"
    assert h.explain()["pending"]["position"] == 0
    assert h.cancel()["state"] == "cancelled" and h.state == "cancelled"
    assert h.cancel()["state"] == "cancelled"  # idempotent
    with pytest.raises(UnknownObjectError):
        client.job("nope")


def test_jobs_nodes_leases_and_queue(client: Client, head: FakeHead) -> None:
    client.submit({"name": "a", "entrypoint": "true"})
    head.request_lease({"lease_id": "l-1", "request": "1", "owner": "o"})
    assert [j["name"] for j in client.jobs()] == ["a"]
    assert client.nodes()[0]["name"] == "a100-0"
    assert [le["lease_id"] for le in client.leases()] == ["l-1"]
    assert client.queue()[0]["why_pending"] == "no node fits"


# ---- the lease block -----------------------------------------------------------------------------
def test_lease_grants_activates_yields_and_releases(head: FakeHead) -> None:
    with lease(GpuRequest.mig("1g.10gb"), priority="training", owner="me", lease_id="l-a", head=head) as le:
        assert le.lease_id == "l-a" and le.node == "a100-0" and le.fencing_token == 7
        assert le.cuda_visible_devices.startswith("GPU-") and le.env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1"
        opts = le.actor_options(num_cpus=1, extra_env={"X": "1"})
        assert opts["num_gpus"] == 1.0 and opts["num_cpus"] == 1
        assert opts["runtime_env"]["env_vars"]["X"] == "1" and opts["scheduling_strategy"].soft is False
        assert head.leases["l-a"]["state"] == "active"
    req = head.calls[0][1][0]
    assert req["priority_class"] == "training" and req["owner"] == "me" and GpuRequest(**req["request"]) == GpuRequest.mig("1g.10gb")
    assert head.methods() == ["request_lease", "wait_lease", "activate", "release"]
    assert head.leases["l-a"]["state"] == "released" and head.leases["l-a"]["release_reason"] == "holder left the lease block"


def test_leaving_the_block_with_an_error_releases_and_says_why(head: FakeHead) -> None:
    with pytest.raises(KeyError):
        with lease("1", lease_id="l-b", head=head):
            raise KeyError("boom")
    assert head.leases["l-b"]["release_reason"] == "holder left the lease block with KeyError"


def test_a_lease_not_granted_in_time_is_withdrawn(head: FakeHead) -> None:
    head.grant = False
    with pytest.raises(LeaseTimeoutError) as e:
        with lease("2", lease_id="l-c", timeout=1.5, head=head):
            pytest.fail("not granted: the block must not run")
    assert "not enough free GPUs" in str(e.value)
    assert head.calls[-1] == ("release", ("l-c", None, "not granted within 1.5s; withdrawn by its requester"))


def test_an_unknown_priority_class_is_refused_by_the_head(head: FakeHead) -> None:
    with pytest.raises(InvalidRequestError) as e:
        with lease("1", priority="urgent", head=head):
            pass
    assert e.value.field == "priority"


def test_preemption_requested_is_rate_limited_and_sticky(head: FakeHead) -> None:
    with lease("1", lease_id="l-d", head=head, poll_s=10) as le:
        clock = FakeClock(100.0)
        le._poll._clock = clock
        head.lease_states = ["active"]
        assert le.preemption_requested() is False
        clock.t += 5
        assert le.preemption_requested() is False  # cached: no call within poll_s
        assert head.methods().count("get_lease") == 1
        head.lease_states = ["checkpointing"]
        clock.t += 6
        assert le.preemption_requested() is True
        clock.t += 60
        assert le.preemption_requested() is True and head.methods().count("get_lease") == 2
        le.release("checkpointed")
    assert head.methods()[-1] == "release" and head.methods().count("release") == 1  # not released twice
