"""Ray's own GPU API on leases, on a real 3-node Ray cluster with simulated GPUs (docs/ray-native.md).

Nodes advertise Ray's ``GPU``; each agent holds every unit no lease covers (``control/holds.py``). What only a
real cluster shows: an unleased ``num_gpus`` task waits; a leased actor's ``ray.get_gpu_ids()`` names its card
and Ray's own instance is the ledger's card; a job's plain ``@ray.remote(num_gpus=1)`` code runs inside its
lease and one asking for more fails at once; and a sampler of who holds which card never sees one used twice.
CUDA is absent: the assertions are on ``ray.get_gpu_ids()``, ``CUDA_VISIBLE_DEVICES`` and Ray's books.
"""

from __future__ import annotations

import os
import time
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from heads import remove_head

from orchestrator.core.config import RuntimeSettings
from orchestrator.core.lease import key_digest
from tests.integration.heads import until

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
SETTINGS = RuntimeSettings(namespace="rgo-native", heartbeat_interval_s=0.5, agent_ttl_s=5.0, reconcile_interval_s=0.1)



@pytest.fixture(scope="module")
def head(job_env: None, ray_cluster: Any) -> Iterator[Any]:
    import ray

    from orchestrator.rayport import ray_api, serve_api
    from orchestrator.rayport.actors import start_head
    from orchestrator.rayport.client import HeadClient

    handle = start_head(SETTINGS, ray_cluster.config, node_id=ray_api.head_node_id())
    until("agents registered", lambda: ray_api.unwrap(ray.get(handle.ping.remote()))["registered_nodes"]
          == ["a100-0", "a100-1", "h100-0"], 120, every_s=0.25)
    # every unit of Ray's GPU is held by an agent once they have registered
    until("every card held", lambda: ray.available_resources().get("GPU", 0) == 0, 60, every_s=0.25)
    yield HeadClient(handle=handle)
    serve_api.shutdown()  # the Serve tests' controller is detached: it would outlive this module's driver
    remove_head(SETTINGS, ray_cluster.config)


def _lease(head: Any, lease_id: str, request: dict[str, Any]) -> dict[str, Any]:
    head.request_lease({"lease_id": lease_id, "request": request, "owner": "it", "requester_digest": key_digest("k")})
    return head.wait_lease(lease_id, 60, "k")


def test_nodes_advertise_ray_gpus_and_unleased_num_gpus_work_waits(head: Any, ray_cluster: Any) -> None:
    import ray

    total = ray.cluster_resources()
    assert total.get("GPU") == sum(n.gpus for n in ray_cluster.config.nodes) == 10
    assert total.get("accelerator_type:A100") == 2 and total.get("accelerator_type:H100") == 1

    @ray.remote(num_gpus=1)
    def outsider() -> str:
        return os.environ.get("CUDA_VISIBLE_DEVICES", "")

    ref = outsider.remote()
    ready, _ = ray.wait([ref], timeout=4)
    assert not ready, "a num_gpus task without a lease ran on a held card"
    ray.cancel(ref, force=True)


def _probe_actor() -> Any:
    import ray

    @ray.remote
    class Probe:
        def seen(self) -> dict[str, Any]:
            raw = ray._private.worker.global_worker.core_worker.resource_ids()
            instances = sorted({i for k, v in raw.items() if k.startswith("GPU_group_") and "_group_0_" not in k
                                for i, _ in v})
            return {"ids": [str(i) for i in ray.get_gpu_ids()], "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
                    "instances": instances}

    return Probe


def test_a_leased_actor_sees_its_card_through_ray_and_ray_books_the_same_card(head: Any) -> None:
    import ray

    from orchestrator.rayport import ray_api

    Probe = _probe_actor()
    grants = [_lease(head, "nat-w", {"kind": "whole", "count": 1, "node": "a100-0"}),
              _lease(head, "nat-mps", {"kind": "mps", "sm_percent": 40, "node": "a100-0"})]
    actors = [Probe.options(**ray_api.actor_options(g["handout"])).remote() for g in grants]
    try:
        seen = ray.get([a.seen.remote() for a in actors], timeout=60)
        for g, s in zip(grants, seen):
            a = g["allocation"]
            assert s["ids"] == list(a["gpu_uuids"]) == [s["cvd"]], (g["lease_id"], s)
            # Ray's own GPU instance is the card the ledger chose: the holds put the group there
            assert s["instances"] == list(a["gpu_indices"]), (g["lease_id"], s, a["gpu_indices"])
        assert ray.available_resources().get("GPU", 0) == 0  # the rest of every card is still held
    finally:
        for x in actors:
            ray.kill(x)
        for g in grants:
            head.release(g["lease_id"], g["fencing_token"], key="k")
    until("the released shares held again", lambda: ray.available_resources().get("GPU", 0) == 0, 30)


def test_a_jobs_plain_num_gpus_code_runs_inside_its_lease_and_asking_more_fails_fast(head: Any) -> None:
    import json

    from orchestrator import Client

    client = Client(namespace=SETTINGS.namespace)
    # the README's first SDK example, as shipped
    h = client.submit({"name": "probe", "entrypoint": f"{sys.executable} {REPO / 'jobs' / 'native_example.py'}",
                       "gpu": "1"})
    d = h.wait(180)
    logs = h.logs()
    assert d["state"] == "succeeded", (d["message"], logs)
    line = next(x for x in logs.splitlines() if x.startswith("NATIVE="))
    out = json.loads(line[len("NATIVE="):])
    lease = head.get_lease(d["lease_id"])
    uuid = lease["allocation"]["gpu_uuids"][0]
    assert out["driver_cuda_visible_devices"] == uuid
    for t in out["tasks"]:
        assert t["gpu_ids"] == [uuid] and t["cuda_visible_devices"] == uuid, t
        assert t["node"] == lease["handout"]["node_id"], t
    over = out["over_the_lease"]
    assert over.startswith("LeaseCapacityError") and d["lease_id"] in over and "holds 1" in over, over


def _submit_plain(what: str, env: dict[str, str] | None = None) -> str:
    """``jobs/native_probes.py <what>`` submitted with Ray's own job API (what ``ray job submit`` does): a driver
    that holds no lease. Returns its submission id."""
    from orchestrator.bench import native as nb
    from orchestrator.rayport import ray_api

    return ray_api.RayJobRunner().client.submit_job(entrypoint=nb.probe_entrypoint(sys.executable, REPO / "jobs", what),
                                                    runtime_env=nb.job_env(SETTINGS.namespace, env))


def _wait_plain(sid: str, timeout: float = 300) -> tuple[str, str]:
    """(Ray's final status, the driver's log) of job ``sid``, stopped after ``timeout``."""
    from orchestrator.rayport import ray_api

    client = ray_api.RayJobRunner().client
    deadline = time.monotonic() + timeout
    while (st := str(client.get_job_status(sid).value)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        if time.monotonic() > deadline:
            client.stop_job(sid)
            break
        time.sleep(0.5)
    return st, client.get_job_logs(sid)


def _plain_ray_job(what: str, timeout: float = 300, env: dict[str, str] | None = None) -> tuple[str, str]:
    return _wait_plain(_submit_plain(what, env), timeout)


@pytest.mark.parametrize("what", ["plain", "train", "tune", "serve"])
def test_a_plain_ray_jobs_gpu_work_gets_leases_of_its_own(head: Any, what: str) -> None:
    """A driver started by Ray's own job API, holding no lease: its num_gpus tasks, its TorchTrainer(use_gpu=True),
    its Tune trials with {"gpu": 1} and its Serve replicas with num_gpus each get a lease of their own, see one
    card through Ray's API, and no card is held twice or without a lease meanwhile."""
    from orchestrator.bench import native as nb

    checker = nb.CardChecker(head, SETTINGS.namespace, ["a100-0", "a100-1", "h100-0"], interval_s=0.3).start()
    try:
        status, logs = _plain_ray_job(what)
    finally:
        checker.stop()
    out = nb.read_probe(logs, what)
    assert status == "SUCCEEDED" and out is not None, logs[-3000:]
    assert nb.judge(what, out) == "ok", out
    assert checker.samples > 0 and checker.holders_seen > 0 and not checker.events, checker.events[:3]
    if what == "plain":  # each task ran on a lease of its own (the checker saw none outside one), released after
        lid = out["half"]["lease"]  # a share's lease is in its environment (a whole card's needs none)
        until("its lease released", lambda: head.get_lease(lid)["state"] == "released", 30)
        half = head.get_lease(lid)["allocation"]
        assert half["kind"] == "mps" and half["sm_percent"] == 50  # num_gpus=0.5: the config's share (MPS)
    until("no lease of the job left", lambda: not [le for le in head.status()["leases"]
                                                   if le["owner"].startswith("ray-job:")], 60)


def test_train_inside_a_job_takes_its_lease(head: Any) -> None:
    """``orchestrator submit --gpu 2 -- python jobs/native_probes.py train``: the job's TorchTrainer(use_gpu=True)
    worker group takes the job's lease (the agent lends it and adopts Train's group); each worker sees one of the
    lease's two cards, and a second group on the same lease would be refused."""
    from orchestrator import Client
    from orchestrator.bench import native as nb

    client = Client(namespace=SETTINGS.namespace)
    h = client.submit({"name": "train-in-lease", "gpu": "2",
                       "entrypoint": nb.probe_entrypoint(sys.executable, REPO / "jobs", "train")})
    d = h.wait(240)
    logs = h.logs()
    assert d["state"] == "succeeded", (d["message"], logs[-3000:])
    out = nb.read_probe(logs, "train")
    assert nb.judge("train", out) == "ok", out
    lease = head.get_lease(d["lease_id"])
    assert {w["gpu_ids"][0] for w in out["workers"]} == set(lease["allocation"]["gpu_uuids"])
    assert {w["lease"] for w in out["workers"]} == {d["lease_id"]}


def test_a_serve_replica_on_a_lease_is_preempted_and_serve_starts_it_again_on_another_card(head: Any,
                                                                                           tmp_path: Path) -> None:
    """A Serve replica with num_gpus=1 from a plain Ray job holds a lease of its own (the default class, batch);
    an inference lease that needs its card preempts it: the agent stops the replica, Serve starts it again, and
    the new replica asks for (and gets) a lease on another card. No card is held twice meanwhile."""
    import threading

    from orchestrator.bench import native as nb
    from orchestrator.core.request import GpuRequest

    from orchestrator.rayport import ray_api

    checker = nb.CardChecker(head, SETTINGS.namespace, ["a100-0", "a100-1", "h100-0"], interval_s=0.3).start()
    result: dict[str, Any] = {}
    try:
        # The app answers until the test has seen the new replica's lease and two answers came from another card
        # than the first (at most 90 s): the assertions below need no more.
        stop = tmp_path / "seen-the-new-replica"
        sid = _submit_plain("serve-hold", env={"NATIVE_SERVE_S": "90", "NATIVE_SERVE_MOVED": "2",
                                               "NATIVE_SERVE_STOP": str(stop)})
        job = threading.Thread(target=lambda: result.update(zip(("status", "logs"), _wait_plain(sid))))
        job.start()
        until("the app serving", lambda: "NATIVE_SERVING" in ray_api.RayJobRunner().client.get_job_logs(sid), 180,
              every_s=0.5)
        time.sleep(2)  # a few answers from the first replica
        replica = until("the replica's lease", lambda: next(
            (le for le in head.status()["leases"] if le["owner"].startswith("ray-job:") and le["state"] == "active"),
            None), 120)
        node = replica["allocation"]["node"]
        # the rest of that node taken at inference priority, then one more card of it: the replica's
        blockers = []
        for i in range(8):
            lid = f"serve-block-{i}"
            head.request_lease({"lease_id": lid, "request": GpuRequest.whole(1, node=node).model_dump(mode="json"),
                                "owner": "it", "priority_class": "inference", "requester_digest": key_digest("k")})
            blockers.append(lid)
            if head.get_lease(replica["lease_id"])["state"] not in ("active", "granted"):
                break
            time.sleep(0.5)
        until("the replica's lease preempted", lambda: head.get_lease(replica["lease_id"])["state"] == "preempted", 30)
        again = until("Serve's new replica on a lease of its own", lambda: next(
            (le for le in head.status()["leases"] if le["owner"].startswith("ray-job:") and le["state"] == "active"
             and le["lease_id"] != replica["lease_id"]), None), 120)
        assert again["allocation"]["gpu_uuids"] != replica["allocation"]["gpu_uuids"]
        stop.touch()
        job.join(120)
    finally:
        checker.stop()
        for lid in locals().get("blockers", []):
            le = head.get_lease(lid, "k")
            head.release(lid, le.get("fencing_token"), key="k")
    out = nb.read_probe(result.get("logs", ""), "serve-hold")
    assert result.get("status") == "SUCCEEDED" and out, result.get("logs", "")[-3000:]
    cards = [a["gpu_ids"][0] for a in out["answers"]]
    assert cards[0] == replica["allocation"]["gpu_uuids"][0], cards  # first the preempted lease's card,
    assert cards[-1] == again["allocation"]["gpu_uuids"][0], cards  # then its new lease's
    assert not checker.events, checker.events[:3]


def test_serves_controller_keeps_answering_while_its_replicas_leases_wait(head: Any) -> None:
    """Every card held at inference priority; a plain Ray job's Serve applications ask for replicas with num_gpus=1.
    Serve's controller must not wait for those leases inside its loop (rayport/serve_leases.py): the replicas'
    leases are all in the queue at once, ``serve.status()`` keeps answering meanwhile, an application deleted
    while its replicas wait withdraws their leases, and two cards freed start the other's two replicas on them."""
    import threading

    from orchestrator.bench import native as nb
    from orchestrator.core.request import GpuRequest

    def pending(prefix: str) -> list[dict[str, Any]]:
        return [le for le in head.status()["leases"] if le["lease_id"].startswith(prefix) and le["state"] == "pending"]

    checker = nb.CardChecker(head, SETTINGS.namespace, ["a100-0", "a100-1", "h100-0"], interval_s=0.3).start()
    blockers: list[str] = []
    result: dict[str, Any] = {}
    try:
        for i in range(10):  # every card a whole lease can take, taken at inference priority
            lid = f"sw-block-{i}"
            got = head.acquire_lease_now({"lease_id": lid, "request": GpuRequest.whole(1).model_dump(mode="json"),
                                          "owner": "it", "priority_class": "inference",
                                          "requester_digest": key_digest("k")}, "k")
            if got["state"] == "pending":
                head.release(lid, None, "the cluster is full", "k")
                break
            blockers.append(lid)
        assert len(blockers) >= 2, blockers
        sid = _submit_plain("serve-wait")
        job = threading.Thread(target=lambda: result.update(zip(("status", "logs"), _wait_plain(sid, 400))))
        job.start()
        gone = until("both of gone's replicas asking at once", lambda: len(pending("serve-gone-")) == 2 or None,
                     180, every_s=0.25)
        gone_ids = [le["lease_id"] for le in pending("serve-gone-")]
        until("gone's leases withdrawn with their application",
              lambda: all(head.get_lease(lid)["state"] == "released" for lid in gone_ids), 120, every_s=0.5)
        until("both of waits' replicas asking at once", lambda: len(pending("serve-waits-")) == 2 or None, 120,
              every_s=0.25)
        waits_ids = [le["lease_id"] for le in pending("serve-waits-")]
        freed = []
        for lid in blockers[:2]:
            le = head.get_lease(lid, "k")
            freed += le["allocation"]["gpu_uuids"]
            head.release(lid, le["fencing_token"], key="k")
        job.join(400)
    finally:
        checker.stop()
        for lid in blockers:
            le = head.get_lease(lid, "k")
            if le["state"] in ("granted", "active"):
                head.release(lid, le.get("fencing_token"), key="k")
    assert gone
    out = nb.read_probe(result.get("logs", ""), "serve-wait")
    assert result.get("status") == "SUCCEEDED" and out, result.get("logs", "")[-3000:]
    # the controller answered within seconds the whole time its replicas waited (blocked, it would not at all)
    assert out["status_ms"] and max(out["status_ms"]) < 5000, out["status_ms"]
    # each replica ran on its own lease's card, one of the two freed
    cards = {head.get_lease(lid)["allocation"]["gpu_uuids"][0] for lid in waits_ids}
    assert cards == set(freed), (cards, freed)
    assert {a["gpu_ids"][0] for a in out["answers"]} <= cards, (out["answers"], cards)
    assert all(a["gpu_ids"] == [a["cvd"]] for a in out["answers"]), out["answers"]
    assert not checker.events, checker.events[:3]
