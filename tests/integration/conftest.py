"""The integration tier's shared fixture: one real 3-node Ray cluster per test module.

``ray_cluster`` starts ``ray.cluster_utils.Cluster`` on 127.0.0.1 with one node
per node of ``configs/cluster.demo.yaml`` (Ray's ``GPU`` one per card, one ``rgo-gpu-<i>`` per card, our
node resource, our labels and the native hook, as ``orchestrator up`` gives its raylets), and connects this
process as its driver. Everything Ray and its workers write goes to a fresh folder under
/tmp (``RAY_TMPDIR`` and ``TMPDIR``; short, because Ray's unix socket paths must stay under
107 bytes), which is removed afterwards. Token auth stays on, with a token in
that folder, not in ``~/.ray``. Ports are picked free, so two modules (or two
developers) never collide.

Modules that use it mark their tests ``@pytest.mark.ray``; other integration
modules may reuse it as is. It does not start the orchestrator: see
``tests/integration/test_runtime.py`` for a head on top of it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from orchestrator.core import env as E
from orchestrator.core.config import DEMO_CONFIG, ClusterConfig, load_config, raylet_native_env
from orchestrator.deploy.local import LOOPBACK_SITE, OBJECT_STORE_BYTES, CODE_ROOT, free_port


@dataclass
class RayCluster:
    cluster: object  # ray.cluster_utils.Cluster
    config: ClusterConfig
    address: str
    tmpdir: Path


_ENV_KEYS = ("RAY_TMPDIR", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_USAGE_STATS_ENABLED", "PYTHONPATH",
             "ORCHESTRATOR_KEEP_LOOPBACK", "PATH", "TMPDIR")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    tmp = Path(tempfile.mkdtemp(prefix="rgo-it-", dir="/tmp"))
    saved = {k: os.environ.get(k) for k in _ENV_KEYS}
    (tmp / "ray").mkdir()  # Ray's own temp root under RAY_TMPDIR (it writes ray_current_cluster there)
    token = tmp / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    os.environ.update(RAY_TMPDIR=str(tmp), TMPDIR=str(tmp), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token),
                      RAY_USAGE_STATS_ENABLED="0", ORCHESTRATOR_KEEP_LOOPBACK="1",
                      # job entrypoints say `python ...`: the venv's interpreter
                      PATH=os.pathsep.join(p for p in (os.path.dirname(sys.executable), saved.get("PATH") or "") if p),
                      # every Ray process of the cluster keeps loopback loopback (see rayport/loopback)
                      PYTHONPATH=os.pathsep.join(p for p in (LOOPBACK_SITE, str(CODE_ROOT),
                                                             saved.get("PYTHONPATH") or "") if p))
    import ray
    from ray.cluster_utils import Cluster

    from orchestrator.rayport import ray_api

    ray_api.keep_loopback()
    ray_api._refresh_auth()
    config = load_config(DEMO_CONFIG)
    cluster = None
    # What `orchestrator up` gives its raylets so Ray's job drivers reach the orchestrator (docs/ray-native.md),
    # less the namespace: each module's head has its own, which a job names in its runtime env. Only the
    # raylets get it: this test process is a driver that holds no lease and must not ask for leases itself.
    native = {k: v for k, v in raylet_native_env(config.settings).items()
              if k not in ("ORCHESTRATOR_NAMESPACE", "ORCHESTRATOR_HEAD_NAME")}
    os.environ.update(native)
    try:
        for i, node in enumerate(config.nodes):
            os.environ.update(node.ray_env())  # this raylet's cards (core.config.SimNode.ray_env)
            args = dict(node_ip_address="127.0.0.1", num_cpus=node.cpus, num_gpus=node.ray_num_gpus,
                        resources=node.ray_resources(), labels=node.ray_labels(),
                        # 0: the agent binds its own port (one picked here may be taken before it binds;
                        # the agent then runs without HTTP and Ray's job API has no agent to submit to)
                        object_store_memory=OBJECT_STORE_BYTES, dashboard_agent_listen_port=0)
            if i == 0:
                # The dashboard process serves Ray's job API, which job submission needs.
                args.update(include_dashboard=True, dashboard_host="127.0.0.1", dashboard_port=free_port(),
                            ray_client_server_port=free_port(), temp_dir=str(tmp / "ray"))
                cluster = Cluster(initialize_head=True, head_node_args=args)
            else:
                cluster.add_node(**args)  # type: ignore[union-attr]
        assert cluster is not None
        cluster.wait_for_nodes()
        for k in (*native, "CUDA_VISIBLE_DEVICES", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"):
            os.environ.pop(k, None)
        # as our drivers connect (ray_api.connect): the setup hook acts only in a Serve controller the service starts
        ray.init(address=cluster.address, namespace="rgo-tests", logging_level="ERROR", log_to_driver=False,
                 runtime_env={"worker_process_setup_hook": E.SERVE_SETUP_HOOK})
        yield RayCluster(cluster, config, cluster.address, tmp)
    finally:
        for k in (*native, "CUDA_VISIBLE_DEVICES", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"):
            os.environ.pop(k, None)
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def job_env() -> Iterator[None]:
    """What `orchestrator up` gives its raylets so Ray's job drivers keep 127.0.0.1 (see rayport/loopback)."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "ORCHESTRATOR_KEEP_LOOPBACK")}
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (LOOPBACK_SITE, str(CODE_ROOT), saved["PYTHONPATH"]) if p)
    os.environ["ORCHESTRATOR_KEEP_LOOPBACK"] = "1"
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
