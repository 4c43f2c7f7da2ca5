"""The runtime on real Ray: the CLI's up/status/down cycle, then a head and agents on one shared 3-node cluster.

Few tests, each proving something only a real cluster can: raylets started
and stopped without ``ray stop``; agents pinned to their nodes registering
their simulated GPUs; a lease of each kind becoming an actor that sees its
devices in its own environment; a SIGKILLed agent noticed within the TTL; a
killed head resuming from the GCS store. The control logic behind them is
unit-tested in ``tests/runtime``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from orchestrator.core.config import RuntimeSettings
from orchestrator.core.lease import key_digest
from orchestrator.core.statefile import State
from orchestrator.deploy.local import session_members

from tests.integration.heads import running_head

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
SETTINGS = RuntimeSettings(namespace="rgo-it", heartbeat_interval_s=0.5, agent_ttl_s=6.0, reconcile_interval_s=0.1)  # room for a loaded 2-core machine


def _cli(*args: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.cluster", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_up_status_down_leaves_nothing_behind() -> None:
    """`orchestrator up`, `status --json`, `down`: 3 nodes, 10 GPUs, the MIG slots; then no process, no file. The
    state folder is nested deep enough that Ray's socket paths under it would pass the 107-byte limit (issue #39:
    a longer TMPDIR made every raylet exit at startup): `up` puts Ray's temp dirs in a short folder of its own."""
    from orchestrator.deploy.local import RAY_SESSION_TAIL, UNIX_SOCKET_MAX, ray_root

    base = Path(tempfile.mkdtemp(prefix="rgo-cli-", dir="/tmp"))
    state_dir = base / "a-state-folder-nested-deep-enough-that-rays-socket-paths-would-not-fit"
    short = ray_root(state_dir)
    assert short != state_dir and len(str(short / "r99")) + RAY_SESSION_TAIL <= UNIX_SOCKET_MAX
    home_ray_before = (Path.home() / ".ray").exists()
    tmp_ray_before = Path("/tmp/ray").exists()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(ORCHESTRATOR_STATE_DIR=str(state_dir), RAY_USAGE_STATS_ENABLED="0")
    t0 = time.monotonic()
    up = _cli("up", "--json", env=env)
    up_s = time.monotonic() - t0
    state = State.load(state_dir)
    try:
        assert up.returncode == 0, up.stderr
        got = json.loads(up.stdout)  # one JSON object on stdout; progress on stderr
        assert got["address"].startswith("127.0.0.1:") and got["nodes"] == ["a100-0", "a100-1", "h100-0"], got
        assert got["state_dir"] == str(state_dir) and got["job_api"].startswith("http://127.0.0.1:"), got
        assert "agents registered 3/3" in up.stderr
        assert any(p.name.startswith("session_") for p in (short / "ray").iterdir())  # Ray's session: the short root
        status = _cli("status", "--json", env=env, timeout=60)
        assert status.returncode == 0, status.stderr
        d = json.loads(status.stdout)  # exactly one JSON object
        assert [n["name"] for n in d["nodes"]] == ["a100-0", "a100-1", "h100-0"]
        gpus = [g for n in d["nodes"] for g in n["gpus"]]
        assert len(gpus) == 10 and {"index", "uuid", "model", "memory_mib", "mig"} <= set(gpus[0])
        assert sorted(len(g["mig"]) for g in gpus if g["mig"]) == [3, 4]
        assert d["leases"] == [] and d["queue"] == []
        # The head's /metrics on a loopback port of its own, though the config names none.
        assert d["metrics_url"].startswith("http://127.0.0.1:") and d["metrics_url"].endswith("/metrics"), d
        scraped = urllib.request.urlopen(d["metrics_url"], timeout=10).read().decode()
        assert "\norchestrator_gpus 10.0\n" in scraped
        print(f"\nup took {up_s:.1f}s")
        # A job on a node that is not Ray's head node (the MIG slice is on a100-1): its driver log is read
        # back. Each raylet here has a session folder of its own, where Ray's job API looks for it in vain.
        job = subprocess.run([sys.executable, "-m", "orchestrator.cli.jobs", "submit", "--gpu", "mig:1g.10gb",
                              "--wait", "--json", "--", sys.executable, "-c", "print('hello from', 'a100-1')"],
                             env=env, cwd=REPO, capture_output=True, text=True, timeout=240)
        assert job.returncode == 0, job.stderr
        done = json.loads(job.stdout)
        assert done["state"] == "succeeded" and done["lease"]["allocation"]["node"] == "a100-1", done
        logs = subprocess.run([sys.executable, "-m", "orchestrator.cli.jobs", "logs", done["job_id"]],
                              env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert logs.returncode == 0 and "hello from a100-1" in logs.stdout, (logs.stdout, logs.stderr)
        # A user's own driver, given nothing but `orchestrator env`'s exports: its plain num_gpus task gets a lease
        # of its own and sees its card (without the hook it would wait: every unit of Ray's GPU is held).
        exported = _cli("env", "--json", env=env)
        assert exported.returncode == 0, exported.stderr
        assert _cli("env", env=env).stdout.startswith("export ")
        script = ("import json, os, ray\nray.init()\n@ray.remote(num_gpus=1)\ndef f():\n"
                  "    return [str(i) for i in ray.get_gpu_ids()], os.environ.get('CUDA_VISIBLE_DEVICES')\n"
                  "print('SEEN', json.dumps(ray.get(f.remote(), timeout=60)))\n")
        user = subprocess.run([sys.executable, "-c", script], env={**env, **json.loads(exported.stdout)},
                              cwd=state_dir, capture_output=True, text=True, timeout=180)
        assert user.returncode == 0, user.stderr[-3000:]
        ids, visible = json.loads(next(x for x in user.stdout.splitlines() if x.startswith("SEEN ")).split(" ", 1)[1])
        assert len(ids) == 1 and ids[0].startswith("GPU-") and visible == ids[0], (ids, visible)
    finally:
        t1 = time.monotonic()
        down = _cli("down", "--json", env=env, timeout=120)
        print(f"down took {time.monotonic() - t1:.1f}s")
    assert down.returncode == 0, down.stderr
    stopped = json.loads(down.stdout)  # one JSON object: the workers first, the Ray head node (the GCS) last
    assert sorted(stopped["stopped"]) == ["a100-0", "a100-1", "h100-0"] and stopped["stopped"][-1] == "a100-0", stopped
    assert stopped["removed"] == str(state_dir), stopped
    assert state is not None and len(state.processes) == 3
    time.sleep(0.5)
    assert all(session_members(p.sid) == [] for p in state.processes), "a process of ours survived down"
    assert not state_dir.exists() and not short.exists(), "down left the state folder or Ray's short temp root"
    base.rmdir()
    assert (Path.home() / ".ray").exists() == home_ray_before, "up wrote ~/.ray"
    assert Path("/tmp/ray").exists() == tmp_ray_before, "up wrote /tmp/ray"


# ---- a head and agents on the shared cluster ------------------------------------------------------
@pytest.fixture(scope="module")
def head(ray_cluster: Any) -> Iterator[Any]:
    from orchestrator.rayport.client import HeadClient

    with running_head(SETTINGS, ray_cluster.config) as handle:
        yield HeadClient(handle=handle)


def test_agents_register_their_nodes_gpus(head: Any) -> None:
    d = head.status()
    assert [(n["name"], n["state"], len(n["gpus"])) for n in d["nodes"]] == [
        ("a100-0", "registered", 4), ("a100-1", "registered", 4), ("h100-0", "registered", 2)]
    import ray

    by_name = {n["name"]: n["ray_node_id"] for n in d["nodes"]}
    labelled = {x["Labels"].get("rgo.io/node"): x["NodeID"] for x in ray.nodes() if x["Alive"]}
    assert by_name == labelled  # each agent runs on its own node


def _probe() -> type:
    """A stand-in workload that reports what it sees from inside its own process.

    Made in a function so Ray ships the class by value (workers cannot import this test module).
    """

    class Probe:
        def seen(self) -> dict[str, Any]:
            import os

            import ray

            env = {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "ORCHESTRATOR_", "RAY_EXPERIMENTAL_NOSET"))}
            return {"env": env, "node_id": ray.get_runtime_context().get_node_id(), "gpu_ids": ray.get_gpu_ids(),
                    "actor_id": ray.get_runtime_context().get_actor_id(), "pid": os.getpid()}

    return Probe


#: The requester's key of the leases these tests ask for: wait_lease/get_lease with it show the fencing token.
KEY = "it-requester-key"


def _lease(head: Any, lease_id: str, gpu: Any, **kw: Any) -> dict[str, Any]:
    head.request_lease({"lease_id": lease_id, "request": gpu, "owner": "it", "requester_digest": key_digest(KEY), **kw})
    return head.wait_lease(lease_id, 30, KEY)


def test_an_actor_from_a_lease_of_each_kind_sees_its_devices_inside(head: Any) -> None:
    import ray

    from orchestrator.rayport import ray_api

    kinds = {"whole": "1", "mig": "mig:3g.40gb", "mps-a": "mps:30%,20GiB", "mps-b": "mps:30%,20GiB",
             "timeslice": "timeslice:0.5"}
    leases = {k: _lease(head, f"k-{k}", gpu) for k, gpu in kinds.items()}
    assert all(le["state"] == "granted" for le in leases.values())
    probe = ray.remote(_probe())
    actors = {k: probe.options(**ray_api.actor_options(le["handout"])).remote() for k, le in leases.items()}
    seen = {k: ray.get(a.seen.remote(), timeout=90) for k, a in actors.items()}
    for k, le in leases.items():
        a, env = le["allocation"], seen[k]["env"]
        assert seen[k]["node_id"] == le["handout"]["node_id"], k
        assert env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1"
        assert env["ORCHESTRATOR_LEASE_ID"] == le["lease_id"] and env["ORCHESTRATOR_FENCING_TOKEN"] == str(le["fencing_token"])
        want = a["mig_uuid"] if a["kind"] == "mig" else ",".join(a["gpu_uuids"])
        assert env["CUDA_VISIBLE_DEVICES"] == want, k  # Ray did not overwrite it
        # Ray's own GPU API tells the truth inside the lease (docs/ray-native.md): the leased card or MIG slice
        assert [str(i) for i in seen[k]["gpu_ids"]] == want.split(","), k
        head.activate(le["lease_id"], le["fencing_token"], seen[k]["actor_id"], key=KEY)
    assert leases["mig"]["allocation"]["node"] == "a100-1" and seen["mig"]["env"]["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
    for k in ("mps-a", "mps-b"):
        env = seen[k]["env"]
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
        assert env["CUDA_MPS_PIPE_DIRECTORY"].startswith("/tmp/nvidia-mps/gpu-")
    assert leases["mps-a"]["allocation"]["gpu_uuids"] == leases["mps-b"]["allocation"]["gpu_uuids"]  # one card, two shares
    # Ray's accounting agrees with the ledger: each lease's share of Ray's GPU is its own placement group, made
    # by its node's agent, and the holder runs in it; no unit of Ray's GPU is outside a group (control/holds.py)
    from ray.util.placement_group import placement_group_table

    groups = {}
    for node in {le["allocation"]["node"] for le in leases.values()}:
        info = ray.get(ray.get_actor(ray_api.agent_name(node), namespace=SETTINGS.namespace).info.remote())
        groups.update(info["holds"]["groups"])
    table = placement_group_table()
    for le in leases.values():
        pg = table[groups[le["lease_id"]]]
        assert pg["state"] == "CREATED" and abs(pg["bundles"][0]["GPU"] - le["handout"]["num_gpus"]) < 1e-9, (le, pg)
    assert ray.available_resources().get("GPU", 0) == 0  # no Ray GPU to take without a lease
    # a holder that dies loses its lease and frees the devices
    ray.kill(actors["timeslice"])
    deadline = time.monotonic() + 15
    while head.get_lease("k-timeslice", KEY)["state"] != "lost" and time.monotonic() < deadline:
        time.sleep(0.2)
    d = head.get_lease("k-timeslice", KEY)
    assert d["state"] == "lost" and d["history"][-1]["reason"] == "holder died"
    for k, le in leases.items():
        if k != "timeslice":
            head.release(le["lease_id"], le["fencing_token"], key=KEY)
            ray.kill(actors[k])


def test_whatever_the_ledger_grants_ray_places_and_nothing_else_takes_a_card(head: Any) -> None:
    """docs/runtime.md's order: MPS shares 40, 40, 60, 60% on one node, then whole cards until the ledger says
    the node is full. Every holder starts (Ray's per-card books match the ledger's), and Ray work without a
    lease -- a ``num_gpus`` actor, or one asking for a leased card's resource itself -- is left unplaced."""
    import ray

    from orchestrator.rayport import ray_api

    node = "a100-0"
    from orchestrator.core.errors import LeaseTimeoutError
    from orchestrator.core.request import GpuRequest

    granted = [_lease(head, f"o-mps-{i}", GpuRequest.mps(pct, node=node).model_dump(mode="json"))
               for i, pct in enumerate((40, 40, 60, 60))]
    for i in range(4):
        head.request_lease({"lease_id": f"o-whole-{i}", "request": GpuRequest.whole(1, node=node).model_dump(mode="json"),
                            "owner": "it", "requester_digest": key_digest(KEY)})
        try:
            granted.append(head.wait_lease(f"o-whole-{i}", 4, KEY))
        except LeaseTimeoutError:  # the node is full in the ledger's books: withdraw the request
            head.release(f"o-whole-{i}", head.get_lease(f"o-whole-{i}", KEY)["fencing_token"], key=KEY)
            break
    assert [le["state"] for le in granted] == ["granted"] * len(granted) and len(granted) >= 5, granted
    cards = {r for le in granted for r in le["handout"]["resources"]}
    assert cards == {f"rgo-gpu-{i}" for i in range(4)}  # the ledger filled the node
    probe = ray.remote(_probe())
    holders = [probe.options(**ray_api.actor_options(le["handout"])).remote() for le in granted]
    seen = ray.get([h.seen.remote() for h in holders], timeout=120)  # all placed: none PENDING_CREATION
    assert [s["env"]["ORCHESTRATOR_LEASE_ID"] for s in seen] == [le["lease_id"] for le in granted]
    node_id = granted[0]["handout"]["node_id"]
    outsiders = [probe.options(num_gpus=1, scheduling_strategy=ray_api.pin(node_id, soft=False)).remote(),
                 probe.options(resources={"rgo-gpu-0": 0.5}, scheduling_strategy=ray_api.pin(node_id, soft=False)).remote()]
    refs = [o.seen.remote() for o in outsiders]
    ready, _ = ray.wait(refs, num_returns=2, timeout=4)
    # neither is placed: every unit of the node's Ray GPU is in a lease's group or held by its agent
    # (control/holds.py), and the leased card's own resource is the holders'
    assert not ready, ready
    for a in outsiders + holders:
        ray.kill(a)
    for le in granted:
        head.release(le["lease_id"], le["fencing_token"], key=KEY)


def test_a_sigkilled_agent_is_noticed_within_the_ttl(head: Any) -> None:
    import ray

    from orchestrator.rayport import ray_api

    le = _lease(head, "ttl-1", {"kind": "whole", "count": 1, "node": "h100-0"}, requeue_on_loss=True)
    head.activate("ttl-1", le["fencing_token"], key=KEY)
    agent = ray.get_actor(ray_api.agent_name("h100-0"), namespace=SETTINGS.namespace)
    deadline = time.monotonic() + 30
    while (info := ray.get(agent.info.remote()))["allocated"] != ["ttl-1"]:  # the agent holds it (a heartbeat later)
        assert time.monotonic() < deadline, info
        time.sleep(0.1)
    t0 = time.monotonic()
    os.kill(info["pid"], signal.SIGKILL)
    while head.get_lease("ttl-1", KEY)["state"] != "lost":
        assert time.monotonic() - t0 < SETTINGS.agent_ttl_s + 5, "not noticed"
        time.sleep(0.05)
    noticed = time.monotonic() - t0
    print(f"\nagent SIGKILL noticed after {noticed:.2f}s (ttl {SETTINGS.agent_ttl_s}s)")
    assert noticed <= SETTINGS.agent_ttl_s + 2 * SETTINGS.heartbeat_interval_s + 1.0
    d = head.get_lease("ttl-1", KEY)
    assert "silent" in d["history"][-1]["reason"] and d["requeued_as"] == "ttl-1.a2"
    node = next(n for n in head.status()["nodes"] if n["name"] == "h100-0")
    assert node["state"] == "lost"
    # the head starts a fresh agent; the requeued attempt is granted on the node again
    retry = head.wait_lease("ttl-1", 60, KEY)
    back = time.monotonic() - t0
    print(f"agent back and the lease re-granted after {back:.2f}s")
    assert retry["lease_id"] == "ttl-1.a2" and retry["state"] == "granted"
    assert next(n for n in head.status()["nodes"] if n["name"] == "h100-0")["incarnation"] != info["incarnation"]
    head.release("ttl-1.a2", retry["fencing_token"], key=KEY)


def test_a_killed_head_restarts_and_resumes_from_the_gcs_store(head: Any) -> None:
    import ray

    le = _lease(head, "restart-1", "mig:1g.20gb")
    head.activate("restart-1", le["fencing_token"], key=KEY)
    counter = head.status()["head"]["fencing_counter"]
    from orchestrator.rayport.store import load_journal

    stored = load_journal(SETTINGS.namespace).keys(f"{SETTINGS.namespace}/lease/")  # as a restarted head reads it
    assert f"{SETTINGS.namespace}/lease/restart-1" in stored  # hard state is in the GCS before we act on it
    first_start = ray.get(head.handle.ping.remote())["ok"]["started_at"]
    channel = head._direct  # the activation went over the head's channel (rayport/channel.py)
    assert channel is not None and channel.broken is None
    ray.kill(head.handle, no_restart=False)
    deadline = time.monotonic() + 60
    while True:
        try:
            pong = ray.get(head.handle.ping.remote(), timeout=10)["ok"]
            if pong["started_at"] != first_start:
                break
        except Exception:
            pass
        assert time.monotonic() < deadline, "head did not come back"
        time.sleep(0.25)
    assert pong["restored_leases"] >= 1
    d = head.get_lease("restart-1", KEY)
    assert (d["state"], d["fencing_token"], d["allocation"]) == ("active", le["fencing_token"], le["allocation"])
    # The client found its connection broken and followed the head to its new incarnation's channel and token.
    assert channel.broken is not None and head._direct is not None and head._direct.broken is None
    assert head._direct.endpoint != channel.endpoint
    assert head.status()["head"]["fencing_counter"] == counter
    # The restored ledger still holds the demo's only 1g.20gb slot: a second request waits, with the reason.
    from orchestrator.core.errors import LeaseTimeoutError

    head.request_lease({"lease_id": "restart-2", "request": "mig:1g.20gb", "requester_digest": key_digest(KEY)})
    with pytest.raises(LeaseTimeoutError) as e:
        head.wait_lease("restart-2", 2, KEY)
    assert "no free valid placement" in str(e.value)
    head.release("restart-1", le["fencing_token"], key=KEY)
    nxt = head.wait_lease("restart-2", 30, KEY)
    assert nxt["fencing_token"] > counter
    assert nxt["handout"]["env_vars"]["CUDA_VISIBLE_DEVICES"] == le["handout"]["env_vars"]["CUDA_VISIBLE_DEVICES"]
    head.release("restart-2", nxt["fencing_token"], key=KEY)
