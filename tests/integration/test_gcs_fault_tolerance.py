"""The lease ledger survives the GCS: a local Ray head whose GCS keeps its tables in Redis, as KubeRay's
GCS fault tolerance runs it, loses no lease, job or fencing token when its GCS server is killed and
restarted, nor when the head actor is killed and restarted on top of that.

What KubeRay does with ``gcsFaultToleranceOptions`` (docs/kubernetes.md), done here by hand:
``RAY_REDIS_ADDRESS`` and ``RAY_external_storage_namespace`` in the environment of ``ray start --head``
(Ray 2.60 reads both: ``ray._private.node`` turns the first into the GCS's external storage, the
second is a ``RayConfig`` entry). Debian's ``redis-server`` runs on 127.0.0.1 on a free port, with its
own directory; the Ray head runs in a session of its own (``setsid``), so cleanup kills exactly the
processes this test started -- never ``ray stop``.

Two kills:

1. SIGKILL of ``gcs_server`` (the process a head pod's restart loses), then the same command line
   and environment started again: it reloads every table, the orchestrator's GCS KV included, from
   Redis; the raylet and the actors reconnect.
2. ``ray.kill`` of the head actor (Ray restarts it, ``max_restarts=-1``): it restores its ledger and
   job table from that KV.
3. ``ray.kill`` of the head actor for good: the head pod's supervisor (``python -m orchestrator.deploy.kuberay
   head --supervise``, the orchestrator-head sidecar's command, run here as a real process) exits non-zero,
   as the kubelet needs to restart it; the same command run again starts the head, which restores it all.

After each: every lease (state, fencing token, allocation), every job (state, attempt), the queue
and the fencing counter are what they were, and the raw KV holds the same keys. A control asserts
that Redis really holds the GCS's keys, so the test cannot pass against an in-memory GCS.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from orchestrator.core.config import ClusterConfig, RuntimeSettings, SimNode
from orchestrator.core.job import JobSpec
from orchestrator.core.lease import key_digest, token_counter
from orchestrator.core.request import GpuRequest
from orchestrator.deploy.local import LOOPBACK_SITE, CODE_ROOT, free_port, session_members

pytestmark = [pytest.mark.ray, pytest.mark.slow]

NODE = SimNode(name="ft-a100", model="A100-80GB", gpus=2, cpus=2, memory="8GiB")
SETTINGS = RuntimeSettings(namespace="rgo-ft", head_name="rgo-head-ft", heartbeat_interval_s=0.5,
                           agent_ttl_s=30.0, reconcile_interval_s=0.2)
#: How long a restarted GCS may take to come back before the raylet gives up (Ray's default is 60 s).
RECONNECT_S = 60


@dataclass
class FtCluster:
    tmp: Path
    redis_port: int
    redis_cli: list[str]
    gcs_address: str
    storage_namespace: str
    sessions: list[int]  # session ids of everything started here (the head's, a restarted GCS's)


def _wait(what: str, check: Any, timeout: float, every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = check()
            if got:
                return got
        except Exception as e:  # noqa: BLE001  (still coming up)
            last = e
        else:
            last = None
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout:g}s (last error: {last!r})")
        time.sleep(every)


def _kill_sessions(sids: list[int]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = [pid for sid in sids for pid in session_members(sid)]
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while left and time.monotonic() < deadline:
            left = [pid for sid in sids for pid in session_members(sid)]
            time.sleep(0.2)
        if not left:
            return


@pytest.fixture(scope="module")
def ft_cluster() -> Iterator[FtCluster]:
    redis_server, redis_cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if redis_server is None or redis_cli is None:
        pytest.skip("needs Debian's redis-server and redis-cli (apt-get install redis-server; .ci/run does)")
    import ray

    if ray.is_initialized():
        ray.shutdown()  # another module's driver; this one connects to its own cluster
    tmp = Path(tempfile.mkdtemp(prefix="rgo-ft-", dir="/tmp"))  # short: Ray's socket paths stay < 107 bytes
    env = pytest.MonkeyPatch()  # module scope: restored by hand in `finally`
    redis = None
    cluster = None
    try:
        (tmp / "redis").mkdir()
        (tmp / "ray").mkdir()
        redis_port = free_port()
        redis = subprocess.Popen(
            [redis_server, "--port", str(redis_port), "--bind", "127.0.0.1", "--dir", str(tmp / "redis"),
             "--save", "", "--appendonly", "yes", "--protected-mode", "yes"],
            stdout=(tmp / "redis.log").open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
        cli = [redis_cli, "-p", str(redis_port)]
        _wait("redis-server", lambda: subprocess.run([*cli, "ping"], capture_output=True, text=True).stdout.strip()
              == "PONG", 20)
        token = tmp / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        storage_ns = f"rgo-ft-{secrets.token_hex(4)}"
        for k, v in {
            "RAY_TMPDIR": str(tmp), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
            "RAY_USAGE_STATS_ENABLED": "0", "ORCHESTRATOR_KEEP_LOOPBACK": "1",
            # What KubeRay sets on the head container for gcsFaultToleranceOptions.
            "RAY_REDIS_ADDRESS": f"127.0.0.1:{redis_port}", "RAY_external_storage_namespace": storage_ns,
        }.items():
            env.setenv(k, v)
        env.setenv("PATH", os.path.dirname(sys.executable), prepend=os.pathsep)  # job commands say `python`
        env.setenv("PYTHONPATH", os.pathsep.join((LOOPBACK_SITE, str(CODE_ROOT))), prepend=os.pathsep)
        gcs_port = free_port()
        argv = [sys.executable, "-m", "orchestrator.deploy.raylet", "start", "--head",
                "--node-ip-address", "127.0.0.1", "--port", str(gcs_port),
                "--num-cpus", str(NODE.cpus), "--num-gpus", str(NODE.gpus),
                "--resources", json.dumps(NODE.ray_resources()),
                "--labels", ",".join(f"{k}={v}" for k, v in sorted(NODE.ray_labels().items())),
                "--object-store-memory", str(128 * 1024 * 1024), "--include-dashboard", "false",
                "--dashboard-agent-listen-port", "0", "--ray-client-server-port", str(free_port()),
                "--min-worker-port", "0", "--max-worker-port", "0", "--temp-dir", str(tmp / "ray"),
                "--disable-usage-stats"]
        # Not --block: `ray start --block` kills the whole node when one of its processes dies, and
        # the GCS dying is the point here. Its own session keeps every process it starts findable.
        head = subprocess.Popen(argv, stdout=(tmp / "ray-start.log").open("wb"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        cluster = FtCluster(tmp, redis_port, cli, f"127.0.0.1:{gcs_port}", storage_ns, [head.pid])
        rc = head.wait(timeout=120)
        assert rc == 0, (tmp / "ray-start.log").read_text()[-4000:]
        from orchestrator.rayport import ray_api

        ray_api.keep_loopback()
        ray_api._refresh_auth()
        ray.init(address=cluster.gcs_address, namespace="rgo-ft-tests", logging_level="ERROR", log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        if cluster is not None:
            _kill_sessions(cluster.sessions)
        if redis is not None:
            redis.terminate()
            try:
                redis.wait(timeout=10)
            except subprocess.TimeoutExpired:
                redis.kill()
        env.undo()
        shutil.rmtree(tmp, ignore_errors=True)


def _gcs_pid(cluster: FtCluster) -> int:
    for sid in cluster.sessions:
        for pid in session_members(sid):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "gcs_server":
                    return pid
            except OSError:
                continue
    raise AssertionError("no gcs_server among the processes this test started")


def _restart_gcs(cluster: FtCluster) -> tuple[int, int]:
    """SIGKILL the GCS server and start it again exactly as Ray had: same argv, same environment."""
    old = _gcs_pid(cluster)
    argv = [a.decode() for a in Path(f"/proc/{old}/cmdline").read_bytes().split(b"\0") if a]
    env = dict(kv.decode().split("=", 1) for kv in Path(f"/proc/{old}/environ").read_bytes().split(b"\0") if b"=" in kv)
    assert env.get("RAY_REDIS_ADDRESS") == f"127.0.0.1:{cluster.redis_port}"
    os.kill(old, signal.SIGKILL)
    _wait("the killed gcs_server to go", lambda: not Path(f"/proc/{old}").exists()
          or "Z" in Path(f"/proc/{old}/stat").read_text().split(")")[-1].split()[0], 10)
    log = (cluster.tmp / "gcs-restarted.log").open("ab")
    new = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    cluster.sessions.append(new.pid)
    return old, new.pid


def _redis_keys(cluster: FtCluster) -> int:
    out = subprocess.run([*cluster.redis_cli, "--scan"], capture_output=True, text=True, timeout=30).stdout
    return len([k for k in out.splitlines() if cluster.storage_namespace in k])


def _ledger(client: Any) -> dict[str, Any]:
    """The hard state a client can see: leases, queue, jobs and the fencing counter."""
    st = client.status()
    leases = {d["lease_id"]: (d["state"], d.get("fencing_token"), json.dumps(d.get("allocation"), sort_keys=True))
              for d in st["leases"]}
    queue = [q["lease_id"] for q in st["queue"]]
    jobs = {j["job_id"]: (j["state"], j.get("attempt"), j.get("lease_id")) for j in client.list_jobs()}
    return {"leases": leases, "queue": queue, "jobs": jobs, "fencing_counter": st["head"]["fencing_counter"]}


def _kv(namespace: str) -> dict[str, Any]:
    """The head's hard state as the GCS holds it: its journal, read as a restarted head reads it."""
    from orchestrator.rayport.store import load_journal

    journal = load_journal(namespace)
    return {k: journal.get(k) for k in journal.keys("")}


def _supervisor(cluster: FtCluster) -> subprocess.Popen:
    """The head pod's orchestrator-head sidecar, as a real process: the same supervisor command (render.py's
    ``head.command``), with the cluster file the ConfigMap would hold. Each call is one container (re)start."""
    cfg = cluster.tmp / "cluster.yaml"
    cfg.write_text(json.dumps(ClusterConfig(settings=SETTINGS, nodes=(NODE,)).model_dump(mode="json")))
    argv = [sys.executable, "-m", "orchestrator.deploy.kuberay", "head", "--supervise", "0.5",
            "--address", cluster.gcs_address, "--config", str(cfg), "--timeout", "120"]
    # the Secret the sidecar reads (render.py's _head_secret_env): the same token secret for every head it starts,
    # so a head started again derives the tokens its holders have from the journal
    env = {**os.environ, "ORCHESTRATOR_HEAD_SECRET": "ab" * 32}
    proc = subprocess.Popen(argv, stdout=(cluster.tmp / "supervisor.log").open("ab"), stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)
    cluster.sessions.append(proc.pid)
    return proc


def _start_head(cluster: FtCluster) -> tuple[Any, Any, subprocess.Popen]:
    from orchestrator.rayport import ray_api
    from orchestrator.rayport.client import HeadClient

    sup = _supervisor(cluster)
    handle = _wait("the supervisor to start the head", lambda: ray_api.named_actor_alive(
        SETTINGS.head_name, SETTINGS.namespace) and ray_api.get_head(SETTINGS.namespace, SETTINGS.head_name), 120)
    return handle, HeadClient(handle=handle), sup


def test_leases_jobs_and_the_fencing_counter_survive_a_gcs_restart_and_a_head_restart(ft_cluster: FtCluster) -> None:
    import ray

    handle, head, sup = _start_head(ft_cluster)
    try:
        _wait("the agent of ft-a100 to register", lambda: any(
            n["name"] == NODE.name and n["state"] != "lost" for n in head.status()["nodes"]), 120)
        # Two whole cards: one lease active, one granted, one pending behind them; a job queued behind those,
        # and one cancelled (an ended job must survive too).
        mine = {"requester_digest": key_digest("ft-key")}  # the token is returned only with this key
        a = head.wait_lease(head.request_lease({"lease_id": "ft-a", "request": "1", **mine}), 60, "ft-key")
        head.activate("ft-a", a["fencing_token"], key="ft-key")
        b = head.wait_lease(head.request_lease({"lease_id": "ft-b", "request": "1", **mine}), 60, "ft-key")
        head.request_lease({"lease_id": "ft-c", "request": "1", **mine})
        queued = head.submit_job(JobSpec(name="ft-queued", entrypoint="python -c pass", gpu=GpuRequest.whole(1),
                                         priority="batch").model_dump(mode="json"), job_id="ft-queued")
        head.submit_job(JobSpec(name="ft-cancelled", entrypoint="python -c pass", gpu=GpuRequest.whole(1),
                                priority="batch").model_dump(mode="json"), job_id="ft-cancelled")
        head.cancel_job("ft-cancelled")
        _wait("the queue to settle", lambda: head.get_job("ft-queued")["state"] == "queued"
              and head.get_job("ft-cancelled")["state"] == "cancelled", 30)
        before = _ledger(head)
        assert before["leases"]["ft-a"][0] == "active" and before["leases"]["ft-b"][0] == "granted"
        assert before["leases"]["ft-c"][0] == "pending" and "ft-c" in before["queue"]
        assert before["fencing_counter"] >= token_counter(b["fencing_token"]) and b["fencing_token"] > a["fencing_token"]
        assert queued["job_id"] == "ft-queued"
        kv_before = _kv(SETTINGS.namespace)
        assert f"{SETTINGS.namespace}/lease/ft-a" in kv_before
        # The control: the GCS really keeps its tables in this Redis, under KubeRay's namespace.
        assert _redis_keys(ft_cluster) > 0, "the GCS wrote nothing to Redis: not a Redis-backed GCS"

        # 1. Kill the GCS server and start it again from Redis.
        old_pid, new_pid = _restart_gcs(ft_cluster)
        assert old_pid != new_pid
        _wait("the restarted GCS to answer", lambda: _kv(SETTINGS.namespace), RECONNECT_S, every=0.5)
        after_gcs = _wait("the head to answer again", lambda: _ledger(head), RECONNECT_S, every=0.5)
        assert after_gcs == before
        assert set(_kv(SETTINGS.namespace)) == set(kv_before)
        assert _gcs_pid(ft_cluster) == new_pid  # the answers came through the restarted GCS

        # 2. Kill the head actor; Ray restarts it and it restores from the (restarted) GCS.
        first = ray.get(handle.ping.remote(), timeout=30)["ok"]["started_at"]
        ray.kill(handle, no_restart=False)
        _wait("the head to restart", lambda: ray.get(handle.ping.remote(), timeout=10)["ok"]["started_at"] != first,
              90, every=0.5)
        after_head = _wait("the restarted head's ledger", lambda: _ledger(head), 60, every=0.5)
        assert after_head == before
        assert sup.poll() is None, (ft_cluster.tmp / "supervisor.log").read_text()[-3000:]  # rode out both

        # 3. Kill the head for good: its supervisor exits non-zero (the kubelet's cue to restart the sidecar),
        # and the same command, run again, starts the head again from the GCS.
        ray.kill(handle, no_restart=True)
        assert sup.wait(timeout=30) == 4, (ft_cluster.tmp / "supervisor.log").read_text()[-2000:]
        handle, head, sup = _start_head(ft_cluster)
        after_supervisor = _wait("the head the supervisor started again", lambda: _ledger(head), 60, every=0.5)
        assert after_supervisor == before

        # The fencing counter goes on from where it was: the old tokens still hold, a new grant is above them all.
        head.cancel_job("ft-queued")
        head.release("ft-a", a["fencing_token"], key="ft-key")
        c = head.wait_lease("ft-c", 60, "ft-key")  # the token only to its requester
        assert token_counter(c["fencing_token"]) > before["fencing_counter"] and c["fencing_token"] > b["fencing_token"]
        head.release("ft-b", b["fencing_token"], key="ft-key")
        head.release("ft-c", c["fencing_token"], key="ft-key")
    finally:
        from orchestrator.rayport import ray_api

        ray_api.kill_named(ray_api.agent_name(NODE.name), SETTINGS.namespace)
        ray_api.kill_named(SETTINGS.head_name, SETTINGS.namespace)
