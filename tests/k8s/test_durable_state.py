"""What must outlive a pod: checkpoints on a shared claim, the GCS (and with it the lease ledger) in Redis.

Rendering and config errors are checked here; that a Redis-backed GCS really
keeps the ledger across a GCS restart is proven on a live local cluster in
tests/integration/test_gcs_fault_tolerance.py. The one live part here runs
the Redis container's own start command with Debian's redis-server, to show
the rendered command line (password from the Secret, append-only file) works.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.errors import ConfigError
from orchestrator.deploy.k8s.config import K8sConfig, deep_merge, load_config, parse_config
from orchestrator.deploy.k8s.render import REDIS_PASSWORD_KEY, render_objects

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "k8s.yaml"
POOLS = [{"name": "g", "sharing": "whole", "gpu_model": "T4", "gpus_per_node": 1}]


def _cfg(**over: Any) -> K8sConfig:
    return parse_config(deep_merge({"pools": POOLS}, over))[0]


def _error(**over: Any) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        _cfg(**over)
    return e.value


def _kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def _ray_pods(cluster_spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [cluster_spec["headGroupSpec"]["template"]["spec"],
            *(g["template"]["spec"] for g in cluster_spec["workerGroupSpecs"])]


# ------------------------------------------------------------------ checkpoints

def test_every_pod_of_the_training_cluster_mounts_one_rwx_claim_at_one_path() -> None:
    base, overlays = load_config(CONFIG)
    objs = render_objects(base)
    (claim,) = [c for c in _kind(objs, "PersistentVolumeClaim") if c["metadata"]["name"].endswith("-checkpoints")]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["storageClassName"] == base.checkpoints.storage_class == "nfs-csi"
    pods = _ray_pods(_kind(objs, "RayCluster")[0]["spec"])
    assert len(pods) == 1 + len(base.pools)
    for pod in pods:
        vols = {v["name"]: v for v in pod["volumes"]}
        assert vols["checkpoints"]["persistentVolumeClaim"] == {"claimName": claim["metadata"]["name"]}
        mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert mounts["checkpoints"] == "/mnt/checkpoints"
    # The serving cluster does not checkpoint.
    for pod in _ray_pods(_kind(objs, "RayService")[0]["spec"]["rayClusterConfig"]):
        assert "checkpoints" not in {v["name"] for v in pod["volumes"]}
    # The dev overlay (kind, one node) takes its class and access mode from the config too.
    (dev_claim,) = [c for c in _kind(render_objects(overlays["dev"]), "PersistentVolumeClaim")
                    if c["metadata"]["name"].endswith("-checkpoints")]
    assert (dev_claim["spec"]["storageClassName"], dev_claim["spec"]["accessModes"]) == ("standard", ["ReadWriteOnce"])


def test_the_job_checkpoints_to_one_path_below_the_mount_for_every_attempt() -> None:
    base = load_config(CONFIG)[0]
    (job,) = _kind(render_objects(base), "RayJob")
    argv = shlex.split(job["spec"]["entrypoint"])
    sep = argv.index("--")
    submit, command = argv[:sep], argv[sep + 1:]
    opt = {submit[i]: submit[i + 1] for i in range(2, len(submit) - 1) if submit[i].startswith("--") and
           not submit[i + 1].startswith("--")}
    # A fixed job id: a retried submitter gets the same job (and so the same checkpoint dir) back.
    assert opt["--job-id"] == "train"
    assert opt["--checkpoint-dir"] == "/mnt/checkpoints/train"
    assert opt["--checkpoint-dir"].startswith(base.checkpoints.mount_path + "/")
    assert command[:2] == ["python", "/opt/orchestrator/jobs/train.py"]
    # The orchestrator hands that one directory to every attempt of the job (orchestrator/control/jobs/manager.py).
    from orchestrator.cli.jobs import build_spec

    spec = build_spec(command, gpu=opt["--gpu"], priority=opt["--priority"], name=opt["--name"], queue="default",
                      checkpoint_dir=opt["--checkpoint-dir"], env=[], working_dir=None)
    assert spec.checkpoint_dir == "/mnt/checkpoints/train"


def test_an_existing_claim_is_mounted_and_not_rendered() -> None:
    cfg = _cfg(checkpoints={"claim_name": "team-ckpt", "storage_class": None, "mount_path": "/ckpt"})
    objs = render_objects(cfg)
    assert not [c for c in _kind(objs, "PersistentVolumeClaim") if "ckpt" in c["metadata"]["name"]]
    head = _ray_pods(_kind(objs, "RayCluster")[0]["spec"])[0]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "team-ckpt"}} in head["volumes"]
    assert "--checkpoint-dir /ckpt/train" in _kind(objs, "RayJob")[0]["spec"]["entrypoint"]


@pytest.mark.parametrize(("over", "field", "allowed"), [
    ({"checkpoints": {"storage_class": None}}, "checkpoints.storage_class", "ReadWriteMany"),
    ({"checkpoints": {"storage_class": "nfs", "mount_path": "/tmp/ck"}}, "checkpoints.mount_path", "outside /tmp"),
    ({"checkpoints": {"access_mode": "ReadOnlyMany"}}, "checkpoints.access_mode", "ReadWriteMany"),
    ({"checkpoints": {"size": "lots"}}, "checkpoints.size", "quantity"),
    ({"training_job": {"gpu": "two"}}, "training_job.gpu", ""),
    ({"image": "ray-gpu-orchestrator"}, "image", "explicit tag"),
    ({"image": "ray-gpu-orchestrator:latest"}, "image", "fixed tag"),
    ({"image": "ray-gpu-orchestrator:0.1.0-ray2.50.0-py311-gpu"}, "ray_version", "2.50.0"),
    ({"pip_packages": ["ray-gpu-orchestrator"]}, "pip_packages", ""),
    ({"gcs_fault_tolerance": {"redis": {"deploy": False}}}, "gcs_fault_tolerance.redis.address", "host:port"),
    ({"gcs_fault_tolerance": {"redis": {"deploy": False, "address": "redis"}}},
     "gcs_fault_tolerance.redis.address", "host:port"),
    ({"gcs_fault_tolerance": {"redis": {"address": "redis:6379"}}}, "gcs_fault_tolerance.redis.address", "unset"),
    ({"gcs_fault_tolerance": {"redis": {"image": "redis"}}}, "gcs_fault_tolerance.redis.image", "explicit tag"),
    ({"pools": [{"name": "s", "sharing": "whole", "gpu_model": "T4", "simulated": {"model": "T4"}}]},
     "pools.0.simulated", "unset"),
    ({"pools": [{"name": "s", "sharing": "cpu", "simulated": {"model": "T4"}, "max_replicas": 2}]},
     "pools.0.max_replicas", "0 or 1"),
    ({"quota": {"cpu": "4"}, "head": {"resources": {"cpu": "4", "memory": "1Gi"}}}, "quota.cpu", "5"),  # head 4, its sidecar 0.5, Redis 0.5
])
def test_bad_durable_state_config_names_the_field(over: dict[str, Any], field: str, allowed: str) -> None:
    e = _error(**over)
    assert e.field == field, str(e)
    assert allowed in str(e), str(e)


# ------------------------------------------------------------------ GCS fault tolerance

def test_both_ray_clusters_keep_the_gcs_in_the_rendered_redis() -> None:
    base = load_config(CONFIG)[0]
    objs = render_objects(base)
    (secret,) = _kind(objs, "Secret")
    (service,) = _kind(objs, "Service")
    (deployment,) = _kind(objs, "Deployment")
    want = {"redisAddress": f"{service['metadata']['name']}:6379",
            "redisPassword": {"valueFrom": {"secretKeyRef": {"name": secret["metadata"]["name"],
                                                             "key": REDIS_PASSWORD_KEY}}}}
    assert _kind(objs, "RayCluster")[0]["spec"]["gcsFaultToleranceOptions"] == want
    assert _kind(objs, "RayService")[0]["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"] == want
    # No password in the repository: the Secret is rendered without data (apply fills it once).
    assert "data" not in secret and "stringData" not in secret
    # The Redis keeps an append-only file on its own claim, and only one Redis ever writes it.
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    claim = next(v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if v["name"] == "data")
    (data,) = [c for c in _kind(objs, "PersistentVolumeClaim") if c["metadata"]["name"] == claim]
    assert data["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "--appendonly yes" in pod["containers"][0]["command"][-1]


def test_only_the_ray_heads_may_reach_redis() -> None:
    objs = render_objects(load_config(CONFIG)[0])
    (redis_pod,) = [t["spec"]["template"] for t in _kind(objs, "Deployment")]
    policies = _kind(objs, "NetworkPolicy")
    ray_policy = next(p for p in policies if p["metadata"]["name"] == "gpu-orchestrator-ingress")
    sel = ray_policy["spec"]["podSelector"]["matchLabels"]
    # The Ray pods' policy (every port between Ray pods) must not select Redis, or every worker could reach it.
    assert any(redis_pod["metadata"]["labels"].get(k) != v for k, v in sel.items())
    redis_policy = next(p for p in policies if p["metadata"]["name"].endswith("-redis-ingress"))
    assert redis_policy["spec"]["ingress"] == [{
        "from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "gpu-orchestrator",
                                                  "app.kubernetes.io/component": "ray-head"}}}],
        "ports": [{"protocol": "TCP", "port": 6379}],
    }]


def test_a_managed_redis_replaces_the_rendered_one_and_off_means_off() -> None:
    cfg = _cfg(gcs_fault_tolerance={"redis": {"deploy": False, "address": "redis.example.internal:6380",
                                              "password_secret": "managed-redis"}})
    objs = render_objects(cfg)
    assert not _kind(objs, "Deployment") and not _kind(objs, "Secret") and not _kind(objs, "Service")
    assert _kind(objs, "RayCluster")[0]["spec"]["gcsFaultToleranceOptions"] == {
        "redisAddress": "redis.example.internal:6380",
        "redisPassword": {"valueFrom": {"secretKeyRef": {"name": "managed-redis", "key": "password"}}}}
    no_password = _cfg(gcs_fault_tolerance={"redis": {"deploy": False, "address": "redis:6379"}})
    assert _kind(render_objects(no_password), "RayCluster")[0]["spec"]["gcsFaultToleranceOptions"] == {
        "redisAddress": "redis:6379"}
    off = render_objects(_cfg(gcs_fault_tolerance={"enabled": False}))
    assert "gcsFaultToleranceOptions" not in _kind(off, "RayCluster")[0]["spec"] and not _kind(off, "Deployment")


def test_the_quota_counts_the_redis() -> None:
    cfg = _cfg(head={"resources": {"cpu": "4", "memory": "16Gi"}})
    need = cfg.minimum_requests()
    assert need["cpu"] == pytest.approx(5)  # head 4 + its orchestrator-head sidecar 500m + Redis 500m
    assert _cfg(head={"resources": {"cpu": "4", "memory": "16Gi"}},
                gcs_fault_tolerance={"enabled": False}).minimum_requests()["cpu"] == pytest.approx(4.5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_redis_containers_own_command_starts_a_password_protected_aof_redis(tmp_path: Path) -> None:
    """The rendered start command, run as written but with the pod's paths mapped into tmp_path."""
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("needs Debian's redis-server and redis-cli (.ci/run installs the redis-server package)")
    (deployment,) = _kind(render_objects(load_config(CONFIG)[0]), "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["/bin/sh", "-c"]
    port = _free_port()
    (tmp_path / "data").mkdir()
    script = (container["command"][2].replace("/tmp/", f"{tmp_path}/").replace("--dir /data", f"--dir {tmp_path}/data")
              .replace("--port 6379", f"--port {port}"))
    assert script != container["command"][2]
    env = {"PATH": os.environ["PATH"], "REDIS_PASSWORD": "s3cret-hex"}
    proc = subprocess.Popen(["/bin/sh", "-c", script + " --bind 127.0.0.1"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        def cli(*args: str, auth: str | None) -> str:
            e = {"PATH": os.environ["PATH"], **({"REDISCLI_AUTH": auth} if auth else {})}
            return subprocess.run(["redis-cli", "-p", str(port), *args], env=e, capture_output=True, text=True,
                                  timeout=10).stdout.strip()

        deadline = time.monotonic() + 20
        while cli("ping", auth="s3cret-hex") != "PONG":
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            assert time.monotonic() < deadline, "redis did not answer"
            time.sleep(0.1)
        assert "NOAUTH" in cli("ping", auth=None)
        assert cli("set", "k", "v", auth="s3cret-hex") == "OK"
        assert cli("config", "get", "appendonly", auth="s3cret-hex").splitlines() == ["appendonly", "yes"]
        # The password is in the config file (mode 600), not on the command line.
        assert "s3cret-hex" not in Path(f"/proc/{proc.pid}/cmdline").read_text()
        assert (tmp_path / "redis.conf").stat().st_mode & 0o077 == 0
    finally:
        proc.terminate()  # redis-server is the exec'd process: SIGTERM shuts it down and flushes the AOF
        proc.wait(timeout=20)
    assert list((tmp_path / "data").rglob("*.aof")), "append-only file written under --dir"
