"""Job submission on a real 3-node Ray cluster: the SDK, the CLI, and a plain `ray job submit` taking a lease.

One head on the module's shared cluster (``tests/integration/conftest.py``).
What only a real cluster shows: a job of each GPU kind admitted on its lease
and run by Ray's job API with the lease's ``CUDA_VISIBLE_DEVICES``; a job
that waits, explained and cancelled; the head's refusals coming back typed
through the actor boundary; the CLI's exit codes and JSON against a live
head; and a driver started by Ray's own ``ray job submit`` that takes a lease
with ``orchestrator.core.lease`` and starts an actor on the leased device. The
logic behind them is unit-tested in ``tests/sdk`` (and ``tests/runtime``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from heads import remove_head

from orchestrator.core.ids import attempt_id
from orchestrator.core.errors import InvalidRequestError, JobApiUnavailableError
from orchestrator.core.job import JobSpec
from orchestrator.core.config import RuntimeSettings

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
SETTINGS = RuntimeSettings(namespace="rgo-sub", heartbeat_interval_s=0.5, agent_ttl_s=5.0, reconcile_interval_s=0.1)
PRINT_CVD = f"{sys.executable} -c \"import os; print('CVD=' + os.environ.get('CUDA_VISIBLE_DEVICES', ''))\""


@pytest.fixture(scope="module")
def head(job_env: None, ray_cluster: Any) -> Iterator[Any]:
    import ray

    from orchestrator.rayport import ray_api
    from orchestrator.rayport.actors import start_head
    from orchestrator.rayport.client import HeadClient

    handle = start_head(SETTINGS, ray_cluster.config, node_id=ray_api.head_node_id())
    deadline = time.monotonic() + 120
    while ray_api.unwrap(ray.get(handle.ping.remote()))["registered_nodes"] != ["a100-0", "a100-1", "h100-0"]:
        assert time.monotonic() < deadline, "agents did not register"
        time.sleep(0.25)
    yield HeadClient(handle=handle)
    remove_head(SETTINGS, ray_cluster.config)


@pytest.fixture(scope="module")
def client(head: Any) -> Any:
    from orchestrator import Client

    return Client(namespace=SETTINGS.namespace)  # this process is already a driver: it is used as it is


def _live_leases(head: Any) -> list[str]:
    return [le["lease_id"] for le in head.status()["leases"]]


def test_a_job_of_each_gpu_kind_runs_on_its_lease(client: Any, head: Any) -> None:
    kinds = {"whole": "1", "mig": "mig:1g.10gb", "mps": "mps:30%,20GiB", "timeslice": "timeslice:0.25",
             "unified": "mem=20GiB,compute=0.3,isolation=hard"}
    t0 = time.monotonic()
    handles = {k: client.submit({"name": f"kind-{k}", "entrypoint": PRINT_CVD, "gpu": g}) for k, g in kinds.items()}
    final = {k: h.wait(180) for k, h in handles.items()}
    print(f"\n{len(kinds)} jobs submitted -> all ended in {time.monotonic() - t0:.1f}s")
    for k, d in final.items():
        assert d["state"] == "succeeded", (k, d["message"], handles[k].logs())
        assert d["ray_submission_id"] == attempt_id(d["job_id"], 1) == f"{d['job_id']}.a1" and d["attempt"] == 1
        states = [t["state"] for t in d["history"]]
        assert states == ["queued", "admitted", "running", "succeeded"], (k, states)
        lease = head.get_lease(d["lease_id"])
        assert lease["state"] == "released"
        cvd = lease["handout"]["env_vars"]["CUDA_VISIBLE_DEVICES"]
        assert f"CVD={cvd}\n" in handles[k].logs(), k
    assert head.get_lease(final["mig"]["lease_id"])["handout"]["env_vars"]["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
    assert head.get_lease(final["unified"]["lease_id"])["allocation"]["kind"] == "mig"  # isolation=hard -> a MIG slice
    assert head.get_lease(final["mps"]["lease_id"])["handout"]["env_vars"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert {j["job_id"] for j in client.jobs()} >= {d["job_id"] for d in final.values()}
    # The head's batched status read (one multi-get of Ray's job table in the GCS) agrees with Ray's job API.
    from orchestrator.rayport import ray_api

    runner = ray_api.RayJobRunner()
    subs = [d["ray_submission_id"] for d in final.values()]
    assert runner.status_many([*subs, "never-submitted.a1"]) == {
        **{s: str(runner.client.get_job_status(s).value) for s in subs}, "never-submitted.a1": None}
    assert set(runner.status_many(subs).values()) == {"SUCCEEDED"}


def test_ray_takes_an_id_again_only_for_the_same_job_and_deletes_a_dropped_ones_record(head: Any) -> None:
    """Against Ray's real job API: a submission id Ray has is taken when its record carries our metadata (a
    retry whose first answer was lost), and is Ray's record of an earlier job of the same id (dropped by the
    head) otherwise: deleted once Ray's job manager has let go of it, then submitted again; ``delete`` empties
    Ray's table of it."""
    from orchestrator.rayport import ray_api

    runner, sid = ray_api.RayJobRunner(), "reused-id.a1"
    first = {"orchestrator_job": "reused-id", "orchestrator_submitted_at": "1.5"}
    second = {"orchestrator_job": "reused-id", "orchestrator_submitted_at": "2.5"}

    def ended() -> str:
        deadline = time.monotonic() + 60
        while (st := runner.status_many([sid])[sid]) not in ("SUCCEEDED", "FAILED", "STOPPED"):
            assert time.monotonic() < deadline, st
            time.sleep(0.2)
        return st

    runner.submit(sid, "echo first", {}, {}, {"num_gpus": 0}, first)
    assert ended() == "SUCCEEDED"
    runner.submit(sid, "echo first", {}, {}, {"num_gpus": 0}, first)  # a retry of the same submission: taken
    assert runner.client.get_job_info(sid).metadata == first
    # Another job of that id: put off while Ray's job manager may still watch the first one (taken at once, a
    # loaded machine's job manager marked it FAILED every time), then the first is deleted and it runs.
    with pytest.raises(JobApiUnavailableError, match="may still watch the earlier job"):
        runner.submit(sid, "echo second", {}, {}, {"num_gpus": 0}, second)
    deadline = time.monotonic() + 60
    while True:  # as the job layer does: the same submission again, after a backoff
        try:
            runner.submit(sid, "echo second", {}, {}, {"num_gpus": 0}, second)
            break
        except JobApiUnavailableError:
            assert time.monotonic() < deadline
            time.sleep(1)
    assert runner.client.get_job_info(sid).metadata == second and ended() == "SUCCEEDED"
    assert "second" in runner.client.get_job_logs(sid)
    runner.delete(sid)
    assert runner.status_many([sid]) == {sid: None}


def test_the_heads_refusals_come_back_typed_before_queueing(client: Any) -> None:
    before = len(client.jobs())
    for spec, field in (({"priority": "urgent"}, "priority"),              # an unknown priority class
                        ({"gpu": "mig:7g.80gb"}, "gpu.profile"),           # a profile the cluster's layouts lack
                        ({"gpu": "mig:1g.12gb"}, "gpu.profile"),           # a profile no GPU here offers (H100 94GB)
                        ({"gpu": "8"}, "gpu.count")):                      # more cards than any node has
        with pytest.raises(InvalidRequestError) as e:
            client.submit({"name": "refused", "entrypoint": "true", **spec})
        assert e.value.field == field, spec
        assert e.value.allowed, spec
    assert len(client.jobs()) == before  # nothing was queued


def test_a_waiting_job_is_explained_then_cancelled(client: Any, head: Any) -> None:
    # The demo cluster has one 1g.20gb slice: the first job holds it, the second waits behind it.
    holder = client.submit({"name": "holder", "entrypoint": f"{sys.executable} -c 'import time; time.sleep(120)'",
                            "gpu": "mig:1g.20gb", "priority": "batch"})
    deadline = time.monotonic() + 90
    while holder.status()["state"] != "running":
        assert time.monotonic() < deadline, holder.info
        time.sleep(0.25)
    waiting = client.submit(JobSpec(name="waiter", entrypoint="true", gpu={"kind": "mig", "profile": "1g.20gb"},
                                    priority="batch"))
    deadline = time.monotonic() + 30
    while (ex := waiting.explain())["pending"] is None:  # until the scheduler has looked at it
        assert time.monotonic() < deadline, ex
        time.sleep(0.1)
    assert ex["state"] == "queued" and ex["pending"] is not None, ex
    assert ex["pending"]["position"] == 0 and ex["pending"]["reasons"], ex
    assert ex["summary"].startswith("pending at queue position 1"), ex["summary"]
    running = holder.explain()
    assert running["placement"]["node"] == "a100-1" and running["placement"]["kind"] == "mig", running
    assert waiting.cancel()["state"] == "cancelled"
    t0 = time.monotonic()
    assert holder.cancel()["state"] == "cancelled"
    lease_id = holder.info["lease_id"]
    while lease_id in _live_leases(head):
        assert time.monotonic() - t0 < 30
        time.sleep(0.2)
    assert head.get_lease(lease_id)["state"] == "released"
    # The head stops the Ray job off its loop, once the cancellation is in the GCS: its driver must not
    # sleep on for two minutes on a card the head has freed.
    from orchestrator.rayport import ray_api

    sub_id = holder.status()["ray_submission_id"]
    while (st := ray_api.RayJobRunner().status_many([sub_id])[sub_id]) != "STOPPED":
        assert time.monotonic() - t0 < 30, st
        time.sleep(0.2)


def _cli(command: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.jobs", command, "--ray-namespace", SETTINGS.namespace, *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_the_cli_submits_waits_and_reads_back(head: Any, ray_cluster: Any, tmp_path: Path) -> None:
    addr = ray_cluster.address
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "note.txt").write_text("from-the-working-dir")
    t0 = time.monotonic()
    r = _cli("submit", "--gpu", "mps:30%,20GiB", "--name", "cli-mps", "--env", "GREETING=hi", "--wait", "--json",
             "--working-dir", str(wd), "--address", addr, "--", sys.executable, "-c",
             "import os; print(os.environ['GREETING'], os.environ['CUDA_MPS_ACTIVE_THREAD_PERCENTAGE'], "
             "open('note.txt').read())")
    print(f"\nsubmit --wait took {time.monotonic() - t0:.1f}s")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)  # exactly one JSON object
    assert d["state"] == "succeeded" and d["name"] == "cli-mps"
    assert "running" in r.stderr and "succeeded" in r.stderr  # progress, on stderr
    job_id = d["job_id"]
    r = _cli("logs", job_id, "--address", addr, "--attempt", "1")
    assert r.returncode == 0 and "hi 30 from-the-working-dir" in r.stdout, r.stderr
    # `jobs --watch` from a real process: JSON lines on stdout while connected, SIGTERM ends it with exit 0.
    watch = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.jobs", "jobs", "--ray-namespace",
                              SETTINGS.namespace, "--address", addr, "--watch", "-o", "json", "--state", "succeeded"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    first = json.loads(watch.stdout.readline())
    assert first["state"] == "succeeded", first
    watch.send_signal(signal.SIGTERM)
    # the rest through the same buffered reader readline() used (communicate() reads the pipe itself and would lose
    # what that reader had already taken in: half a line)
    out, err = watch.stdout.read(), watch.stderr.read()
    assert watch.wait(timeout=30) == 0, err[-2000:]
    assert all(json.loads(ln)["state"] == "succeeded" for ln in out.splitlines())
    r = _cli("explain", job_id, "--json", "--address", addr)
    assert r.returncode == 0 and json.loads(r.stdout)["state"] == "succeeded", r.stderr
    r = _cli("jobs", "--json", "--address", addr)
    assert r.returncode == 0 and job_id in [j["job_id"] for j in json.loads(r.stdout)]
    r = _cli("submit", "--priority", "urgent", "--address", addr, "--", "true")
    assert r.returncode == 2 and "invalid priority='urgent'" in r.stderr and "inference" in r.stderr
    r = _cli("cancel", "no-such-job", "--address", addr)
    assert r.returncode == 2 and "no such job" in r.stderr and job_id in r.stderr


def test_a_local_working_dir_is_uploaded_by_the_submitter_and_never_read_again(head: Any, tmp_path: Path) -> None:
    """The submitter zips and uploads the folder (Ray's packaging, into the GCS); the head gets the gcs:// URI.
    The folder is deleted right after the upload: a head (or Ray job) that read the local path would fail."""
    import shutil

    from orchestrator import Client
    from orchestrator.rayport.packages import upload_working_dir

    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "note.txt").write_text("shipped")
    uploaded: list[str] = []

    def upload_then_delete(runtime_env: Any) -> dict[str, Any]:
        out = upload_working_dir(runtime_env)
        uploaded.append(out["working_dir"])
        shutil.rmtree(wd)
        return out

    client = Client(namespace=SETTINGS.namespace, upload=upload_then_delete)
    job = client.submit({"name": "wd", "entrypoint": f"{sys.executable} -c \"print(open('note.txt').read())\"",
                         "gpu": "timeslice:0.1", "runtime_env": {"working_dir": str(wd)}})
    final = job.wait(120)
    assert final["state"] == "succeeded", (final["message"], job.logs())
    assert "shipped" in job.logs() and len(uploaded) == 1 and uploaded[0].startswith("gcs://_ray_pkg_")


def test_a_json_command_prints_only_its_json_while_ray_prints_the_clusters_errors(head: Any, ray_cluster: Any) -> None:
    # Every driver prints the cluster's error messages (a raylet that died, a worker killed) to its stdout from a
    # thread of Ray's own. `submit --wait --json` is connected for the job's whole run: what Ray prints meanwhile
    # goes to stderr, and stdout stays the one JSON object. The messages are published here as Ray's raylets
    # publish theirs, to every driver.
    import ray

    from ray._private.utils import publish_error_to_driver

    cmd = [sys.executable, "-m", "orchestrator.cli.jobs", "submit", "--ray-namespace", SETTINGS.namespace, "--gpu",
           "timeslice:0.1", "--name", "cli-quiet", "--wait", "--json", "--address", ray_cluster.address, "--",
           "sleep", "4"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    gcs = ray._private.worker.global_worker.gcs_client
    while proc.poll() is None:
        publish_error_to_driver("rgo_test", "a raylet died (published by the test)", gcs)
        time.sleep(0.25)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert json.loads(out)["state"] == "succeeded", out[:500]
    assert "a raylet died (published by the test)" in err  # Ray did print it: on stderr


def test_orchestrator_lease_inside_this_driver(head: Any) -> None:
    import ray

    import orchestrator

    @ray.remote
    class Seen:
        def cvd(self) -> str:
            return os.environ.get("CUDA_VISIBLE_DEVICES", "")

    with orchestrator.lease("timeslice:0.5", priority="inference", timeout=60,
                            namespace=SETTINGS.namespace) as lease:
        assert head.get_lease(lease.lease_id)["state"] == "active"
        assert head.get_lease(lease.lease_id)["holder"]  # the fate-sharing holder actor
        actor = Seen.options(**lease.actor_options()).remote()
        assert ray.get(actor.cvd.remote(), timeout=90) == lease.cuda_visible_devices
        ray.kill(actor)
    assert head.get_lease(lease.lease_id)["state"] == "released"
    assert ray.is_initialized()  # a driver that was connected stays connected


def test_plain_ray_job_submit_takes_a_lease_from_inside_the_job(head: Any, ray_cluster: Any) -> None:
    from ray.dashboard.utils import ray_address_to_api_server_url

    api = ray_address_to_api_server_url(ray_cluster.address)
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    runtime_env = {"env_vars": {"ORCHESTRATOR_NAMESPACE": SETTINGS.namespace}}
    t0 = time.monotonic()
    r = subprocess.run([str(Path(sys.executable).parent / "ray"), "job", "submit", "--address", api,
                        "--runtime-env-json", json.dumps(runtime_env), "--",
                        sys.executable, str(REPO / "jobs" / "lease_example.py"), "--gpu", "mig:1g.10gb"],
                       capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    print(f"\nray job submit of jobs/lease_example.py took {time.monotonic() - t0:.1f}s")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("CUDA_VISIBLE_DEVICES="))
    print(line)
    assert line.startswith("CUDA_VISIBLE_DEVICES=MIG-")
    seen = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("SEEN "))[5:])
    assert seen["CUDA_VISIBLE_DEVICES"] == line.split("=", 1)[1]
    # the holder runs in its lease's placement group and asks Ray for the slice's share of GPU (docs/ray-native.md)
    assert any(k == "GPU" or k.startswith("GPU_group_") for k in seen["assigned"]), seen["assigned"]
    assert seen["gpu_ids"] == [seen["CUDA_VISIBLE_DEVICES"]], seen  # Ray's API names the MIG slice
    lease_id = next(ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("lease ") and "granted" in ln)
    d = head.get_lease(lease_id)
    assert d["state"] == "released" and d["history"][-1]["reason"] == "holder left the lease block"
    assert d["owner"].startswith("driver:")
