"""The integration tier's shared fixture: one real 3-node Ray cluster per test process, shared by its modules.

``ray_cluster`` gives each module the worker's ``ray.cluster_utils.Cluster`` on 127.0.0.1 with one node
per node of ``configs/cluster.demo.yaml`` (Ray's ``GPU`` one per card, one ``rgo-gpu-<i>`` per card, our
node resource, our labels and the native hook, as ``orchestrator up`` gives its raylets), and connects this
process as its driver. Everything Ray and its workers write goes to a fresh folder under
/tmp (``RAY_TMPDIR`` and ``TMPDIR``; short, because Ray's unix socket paths must stay under
107 bytes), which is removed when the process ends. A module's driver connection and environment last only
as long as the module; each module starts on an idle cluster (every card and CPU free), checked, not assumed. Token auth stays on, with a token in
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
from typing import Any, Iterator

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


def _set_env(values: dict[str, str | None]) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _cluster_env(tmp: Path, saved: dict[str, str | None]) -> dict[str, str | None]:
    """What this process's environment holds while a module drives the cluster in ``tmp``."""
    return dict(RAY_TMPDIR=str(tmp), TMPDIR=str(tmp), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(tmp / "auth_token"),
                RAY_USAGE_STATS_ENABLED="0", ORCHESTRATOR_KEEP_LOOPBACK="1",
                # job entrypoints say `python ...`: the venv's interpreter
                PATH=os.pathsep.join(p for p in (os.path.dirname(sys.executable), saved.get("PATH") or "") if p),
                # every Ray process of the cluster keeps loopback loopback (see rayport/loopback)
                PYTHONPATH=os.pathsep.join(p for p in (LOOPBACK_SITE, str(CODE_ROOT), saved.get("PYTHONPATH") or "")
                                           if p))


@pytest.fixture(scope="session")
def _ray_processes() -> Iterator[RayCluster]:
    """The cluster's processes, started once per test process (one per xdist worker) and shared by every module
    it runs: a 3-node cluster takes ~12 s to start and 2 to stop on 2 cores, and a dozen modules use one.
    Between modules only the driver connection and this process's environment are undone (``ray_cluster``);
    a module that leaves anything running is told so by the next module's check, not hidden."""
    tmp = Path(tempfile.mkdtemp(prefix="rgo-it-", dir="/tmp"))
    saved = {k: os.environ.get(k) for k in _ENV_KEYS}
    (tmp / "ray").mkdir()  # Ray's own temp root under RAY_TMPDIR (it writes ray_current_cluster there)
    token = tmp / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    _set_env(_cluster_env(tmp, saved))
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
    finally:
        for k in (*native, "CUDA_VISIBLE_DEVICES", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"):
            os.environ.pop(k, None)
        _set_env(saved)
    try:
        yield RayCluster(cluster, config, cluster.address, tmp)
    finally:
        cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


#: How long a module's setup waits for the previous module's driver-owned actors to die and give their
#: resources back (Ray frees them a moment after that driver disconnected) before it says what is still there.
_SETTLE_S = 60.0


def _busy() -> dict[str, float]:
    import ray

    total, free = ray.cluster_resources(), ray.available_resources()
    return {k: total[k] - free.get(k, 0.0) for k in total
            if (k in ("CPU", "GPU") or k.startswith("rgo-")) and free.get(k, 0.0) < total[k] - 1e-6}


#: Ray's own cluster-wide singletons, made on first use by Ray's libraries and kept for the cluster's life (Ray Train
#: and Data's autoscaling coordinator): the cluster's, not a module's; they hold no resources.
_RAY_SINGLETONS = {"AutoscalingCoordinator"}


def _alive_actors(*, detached_only: bool = False) -> list[Any]:
    from ray.util.state import list_actors

    alive = list_actors(filters=[("state", "=", "ALIVE")], detail=True, limit=1000)
    return [a for a in alive if (a.is_detached or not detached_only) and a.ray_namespace not in _RAY_SINGLETONS]


def _wait_for_idle_cluster() -> None:
    """Block until the cluster is as a fresh one: no actor alive, every card and CPU free; else fail naming what
    is still there (the modules share one cluster)."""
    import time

    deadline = time.monotonic() + _SETTLE_S
    while True:
        busy, alive = _busy(), _alive_actors()
        if not busy and not alive:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"the shared Ray cluster is not idle {_SETTLE_S:.0f} s into this module: {busy} still held; "
                        f"alive actors: {[f'{a.class_name} {a.name} ({a.ray_namespace})' for a in alive]}",
                        pytrace=False)
        time.sleep(0.25)


def _leftovers() -> list[str]:
    """What a module left that outlives its driver: detached actors (a head, an agent, Serve's controller and
    proxies) and detached placement groups (an agent's holds); each is removed, so the next module starts clean."""
    import ray
    from ray.util.placement_group import PlacementGroup
    from ray.util.state import list_placement_groups

    found = []
    actors = _alive_actors(detached_only=True)
    if any(a.ray_namespace == "serve" for a in actors):
        from orchestrator.rayport import serve_api

        serve_api.shutdown()
        found.append("Ray Serve (serve.shutdown() it)")
    for a in actors:
        found.append(f"detached actor {a.class_name} {a.name!r} in {a.ray_namespace!r}")
        if a.name:
            try:
                ray.kill(ray.get_actor(a.name, namespace=a.ray_namespace), no_restart=True)
            except ValueError:
                pass  # gone meanwhile (serve.shutdown() above)
    for g in list_placement_groups(filters=[("state", "!=", "REMOVED")], detail=True, limit=1000):
        if g.is_detached:
            found.append(f"detached placement group {g.name!r}")
            ray.util.remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(g.placement_group_id))))
    return found


@pytest.fixture(scope="module")
def ray_cluster(_ray_processes: RayCluster) -> Iterator[RayCluster]:
    """The worker's shared cluster with this process connected to it as the module's driver, in the environment
    the cluster was started with. The module must leave nothing behind that outlives its driver: what it does
    leave is removed and reported as the module's error (a teardown error of its last test), so the modules
    after it still start on a fresh-as-new cluster."""
    rc = _ray_processes
    saved = {k: os.environ.get(k) for k in _ENV_KEYS}
    _set_env(_cluster_env(rc.tmpdir, saved))
    import ray

    from orchestrator.rayport import ray_api

    left: list[str] = []
    try:
        ray_api.keep_loopback()
        ray_api._refresh_auth()
        # as our drivers connect (ray_api.connect): the setup hook acts only in a Serve controller the service starts
        ray.init(address=rc.address, namespace="rgo-tests", logging_level="ERROR", log_to_driver=False,
                 runtime_env={"worker_process_setup_hook": E.SERVE_SETUP_HOOK})
        _wait_for_idle_cluster()
        yield rc
        left = _leftovers()
    finally:
        ray.shutdown()
        _set_env(saved)
    if left:
        pytest.fail("this module left running on the shared cluster (removed now): " + "; ".join(left), pytrace=False)


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
