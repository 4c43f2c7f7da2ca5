"""The runtime on real Ray: a head and agents on one shared 3-node cluster (the CLI's up/status/down cycle, which
starts a cluster of its own, is tests/integration/test_up_down.py).

Few tests, each proving something only a real cluster can: agents pinned to their nodes registering
their simulated GPUs; a lease of each kind becoming an actor that sees its
devices in its own environment; a SIGKILLed agent noticed within the TTL; a
killed head resuming from the GCS store. The control logic behind them is
unit-tested in ``tests/runtime``.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Iterator

import pytest

from orchestrator.core.config import RuntimeSettings
from orchestrator.core.lease import key_digest

from tests.integration.heads import running_head

pytestmark = pytest.mark.ray

SETTINGS = RuntimeSettings(namespace="rgo-it", heartbeat_interval_s=0.5, agent_ttl_s=6.0, reconcile_interval_s=0.1)  # room for a loaded 2-core machine


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
