"""Live MIG repartitioning through the real head and agent cores on simulated GPUs (no Ray, an injected clock).

The demo's a100-1 has MIG on GPU 2 (3g.40gb + 2g.20gb + 1g.10gb) and GPU 3 (4g.40gb + 1g.10gb x2 + 1g.20gb).
Training holds one lease on GPU 2 and two on GPU 3; asking for one GPU with a single 7g.80gb slice must
reconfigure GPU 2 only: its lease checkpoints, yields and resumes elsewhere, GPU 3's leases never hear of it,
and the new slice is advertised and granted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from headless import InProcessHead

from orchestrator.control.controller import HeadController, ReconcileReport
from orchestrator.control.metrics import HeadMetrics
from orchestrator.control.mps import MpsDaemons, RecordingPort
from orchestrator.control.repartition import RepartitionState, gpu_layout
from orchestrator.control.store import MemoryStore
from orchestrator.core.config import ClusterConfig, RuntimeSettings
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.lease import key_digest
from orchestrator.scheduling.repartition import MigSlot, target_from

from .conftest import FakeClock, SimAgent
from . import test_revocation
from .test_revocation import FakeWorkloads

KEY = "k"
NIGHT = {"name": "night", "model": "A100-80GB", "layout": ["7g.80gb"], "gpus": 1}
#: The demo head with training preemptible at once (a 10 s grace), as the revocation tests use it.
head = test_revocation.head
OLD_GPU3 = (MigSlot(0, "4g.40gb"), MigSlot(4, "1g.10gb"), MigSlot(5, "1g.10gb"), MigSlot(6, "1g.20gb"))


class RepartitionAgent(SimAgent):
    """A :class:`SimAgent` that also applies the reply's MIG layouts and pushes its new inventory, as the
    agent actor's loop does (``rayport.agent``)."""

    def beat(self, **overrides: Any) -> dict[str, Any]:
        self.last_reply = self.ctl.heartbeat(**{**self.core.heartbeat_payload(), **overrides})
        if self.last_reply.get("ok"):
            self.core.apply_assignments(self.last_reply.get("assignments", {}), self.last_reply.get("revocations"),
                                        self.last_reply.get("reconfigure"))
            changed = self.core.poll_health(0.0)
            if changed is not None:
                self.ctl.update_inventory(self.name, self.incarnation, changed.model_dump(mode="json"))
        return self.last_reply


@pytest.fixture
def cluster(head: HeadController, demo: ClusterConfig) -> dict[str, RepartitionAgent]:
    out = {}
    for n in demo.nodes:
        agent = RepartitionAgent(head, demo, n.name)
        agent.core.workloads = FakeWorkloads()
        agent.core.mps = MpsDaemons(head.settings.mps_pipe_root, RecordingPort())
        agent.register()
        out[n.name] = agent
    return out


def _cycle(head: HeadController, agents: dict[str, RepartitionAgent], metrics: HeadMetrics | None = None,
           n: int = 1) -> list[ReconcileReport]:
    reports = []
    for _ in range(n):
        for a in agents.values():
            a.beat()
        reports.append(head.reconcile())
        if metrics is not None:
            metrics.update(head, reports[-1])
    return reports


def _train(head: HeadController, agents: dict[str, RepartitionAgent], lease_id: str, request: Any) -> dict[str, Any]:
    head.request_lease({"lease_id": lease_id, "request": request, "priority_class": "training",
                        "requester_digest": key_digest(KEY), "requeue_on_preempt": True, "checkpoint_dir": "/ck"})
    _cycle(head, agents)
    d = head.get_lease(lease_id, KEY)
    assert d["state"] == "granted", d
    return head.activate(lease_id, d["fencing_token"], None, f"actor:rgo/{lease_id}")


def _on(d: dict[str, Any]) -> tuple[str, list[int]]:
    return d["allocation"]["node"], d["allocation"]["gpu_indices"]


def test_repartition_drains_only_the_gpu_it_changes_and_the_new_slice_is_granted(
        head: HeadController, cluster: dict[str, RepartitionAgent]) -> None:
    metrics = HeadMetrics()
    t2 = _train(head, cluster, "t2", "mem=30GiB,compute=0.4,isolation=hard")  # smallest MIG fit: 3g.40gb
    t3 = _train(head, cluster, "t3", "mig:4g.40gb")
    t3b = _train(head, cluster, "t3b", "mig:1g.20gb")
    assert [_on(d) for d in (t2, t3, t3b)] == [("a100-1", [2]), ("a100-1", [3]), ("a100-1", [3])]
    a100_1 = cluster["a100-1"]
    fake: FakeWorkloads = a100_1.core.workloads  # type: ignore[assignment]
    old_uuids_gpu3 = [d.uuid for d in a100_1.core.inventory.gpus[3].mig_devices]

    answer = head.request_repartition(target_from(NIGHT))
    plan = answer["plan"]
    assert [(c["node"], c["gpu_index"], c["drain"]) for c in plan["changes"]] == [("a100-1", 2, ["t2"])]
    assert {s["gpu_index"]: s["cause"] for s in plan["skipped"]} == {3: "repartition.not_needed"}
    (rid,) = answer["started"]
    assert not head.snapshot().healthy[head.snapshot().node_index("a100-1"), 2]  # cordoned at once

    reports = _cycle(head, cluster, metrics, 6)
    # Only GPU 2's lease was asked to checkpoint and stopped; it was requeued and resumed elsewhere.
    assert fake.asked == [("actor:rgo/t2", "/ck/t2")] and fake.stopped == ["actor:rgo/t2"]
    t2_end = head.get_lease("t2")
    assert t2_end["state"] == "preempted" and t2_end["checkpoint_path"] == "/ck/t2/ck.pt"
    assert "MIG repartition of a100-1 GPU 2" in t2_end["history"][-1]["reason"]
    retry = head.get_lease(t2_end["requeued_as"])
    assert retry["state"] == "granted" and retry["allocation"]["kind"] == "whole"  # no 3g.40gb left: a whole card
    assert head.ledger.get(retry["lease_id"]).spec.resume_from == "/ck/t2/ck.pt"
    for before in (t3, t3b):  # GPU 3's leases: untouched, same token, same slice
        now = head.get_lease(before["lease_id"], KEY)
        assert (now["state"], now["fencing_token"], now["allocation"]) == ("active", before["fencing_token"],
                                                                          before["allocation"])
    # The agent applied the layout; the head's inventory shows it and the GPU is uncordoned.
    rec = head.repartitions.records[rid]
    assert [t.state for t in rec.history] == [RepartitionState.PLANNED, RepartitionState.CORDONED,
                                              RepartitionState.DRAINING, RepartitionState.APPLYING,
                                              RepartitionState.DONE]
    assert a100_1.core.backend.reconfigured == [(2, ("7g.80gb@0",))]  # type: ignore[attr-defined]
    inv = head.nodes.get("a100-1").inventory  # type: ignore[union-attr]
    assert gpu_layout(inv, 2) == (MigSlot(0, "7g.80gb"),) and gpu_layout(inv, 3) == OLD_GPU3
    assert [d.uuid for d in inv.gpus[3].mig_devices] == old_uuids_gpu3 and inv.generation == 1
    assert head.snapshot().healthy[head.snapshot().node_index("a100-1"), 2]
    assert sum(len(r.reconfigured) for r in reports) == 1 and not any(r.reconfigure_failed for r in reports)
    assert metrics.registry.get_sample_value("orchestrator_mig_reconfigurations_total", {"result": "done"}) == 1
    assert metrics.registry.get_sample_value("orchestrator_preemptions_total",
                                             {"reason": "checkpoint", "cause": "lease.drained",
                                              "priority_class": "training", "queue": "default"}) == 1
    # The new slice is advertised and grantable: a training lease asking for the whole-card slice gets it.
    big = _train(head, cluster, "big", "mig:7g.80gb")
    assert _on(big) == ("a100-1", [2])
    assert big["allocation"]["mig_uuid"] == inv.gpus[2].mig_devices[0].uuid
    assert head.get_lease("big", KEY)["handout"]["env_vars"]["CUDA_VISIBLE_DEVICES"] == inv.gpus[2].mig_devices[0].uuid
    again = head.request_repartition(target_from(NIGHT))  # met now: nothing changes
    assert again["started"] == [] and again["plan"]["cause"] == "repartition.nothing"


def test_a_cordoned_gpu_takes_no_new_grant_until_its_layout_is_applied(
        head: HeadController, cluster: dict[str, RepartitionAgent]) -> None:
    _train(head, cluster, "t3", "mig:4g.40gb")  # GPU 3 busy: GPU 2 is the one to change
    assert [c["gpu_index"] for c in head.request_repartition(target_from(NIGHT))["plan"]["changes"]] == [2]
    head.request_lease({"lease_id": "small", "request": {"kind": "mig", "profile": "2g.20gb"}, "priority_class": "batch"})
    head.reconcile()  # GPU 2 (the only 2g.20gb) is cordoned: the request waits, it does not land there
    assert head.get_lease("small")["state"] == "pending"
    _cycle(head, cluster, n=6)
    assert head.get_lease("small")["state"] == "pending"  # and after: GPU 2 is one 7g.80gb slice now
    assert [r.state for r in head.repartitions.records.values()] == [RepartitionState.DONE]


def test_an_agent_that_cannot_apply_the_layout_fails_it_and_the_gpu_comes_back_with_its_old_layout(
        head: HeadController, cluster: dict[str, RepartitionAgent]) -> None:
    metrics = HeadMetrics()
    backend = cluster["a100-1"].core.backend

    def broken(gpu_index: int, layout: Any) -> Any:
        raise InvalidRequestError("gpu_index", gpu_index, "a card NVML lets us change", detail="driver says no")

    backend.reconfigure_mig = broken  # type: ignore[method-assign]
    (rid,) = head.request_repartition(target_from(NIGHT))["started"]
    reports = _cycle(head, cluster, metrics, 4)
    rec = head.repartitions.records[rid]
    assert rec.state is RepartitionState.FAILED and "driver says no" in rec.history[-1].reason
    assert [r for rep in reports for r in rep.reconfigure_failed] == [rid]
    assert metrics.registry.get_sample_value("orchestrator_mig_reconfigurations_total", {"result": "failed"}) == 1
    assert gpu_layout(head.nodes.get("a100-1").inventory, 2) == (  # type: ignore[union-attr]
        MigSlot(0, "3g.40gb"), MigSlot(4, "2g.20gb"), MigSlot(6, "1g.10gb"))
    # uncordoned with the old layout: its 3g.40gb is grantable again
    head.request_lease({"lease_id": "after", "request": "mig:3g.40gb"})
    _cycle(head, cluster)
    assert head.get_lease("after")["state"] == "granted"
    assert cluster["a100-1"].core.reconfigure_failed == {}  # the head stopped asking: the report is dropped


def test_the_agent_refuses_a_layout_on_a_gpu_it_still_holds_a_lease_on(
        head: HeadController, cluster: dict[str, RepartitionAgent]) -> None:
    _train(head, cluster, "t2", "mig:3g.40gb")
    core = cluster["a100-1"].core
    reply = head.heartbeat(**core.heartbeat_payload())
    core.apply_assignments(reply["assignments"], reply["revocations"], {"2": [{"profile": "7g.80gb", "start": 0}]})
    assert "still holds t2" in core.reconfigure_failed["2"] and core.backend.reconfigured == []  # type: ignore[attr-defined]
    assert core.heartbeat_payload()["reconfigure_failed"] == core.reconfigure_failed
    assert core.poll_health() is None  # nothing changed: nothing to push


def test_inference_protects_its_gpu_and_a_restarted_head_resumes_a_repartition_under_way(
        head: HeadController, cluster: dict[str, RepartitionAgent], settings: RuntimeSettings, store: MemoryStore,
        clock: FakeClock, demo: ClusterConfig) -> None:
    _train(head, cluster, "t2", "mig:3g.40gb")
    head.request_lease({"lease_id": "inf", "request": "mig:4g.40gb", "priority_class": "inference"})
    _cycle(head, cluster)
    both = head.request_repartition(target_from({**NIGHT, "gpus": 2}), dry_run=True)
    assert both["started"] == [] and both["plan"]["meets_target"] is False
    assert {s["gpu_index"]: s["cause"] for s in both["plan"]["skipped"]} == {3: "repartition.protected"}
    (rid,) = head.request_repartition(target_from(NIGHT))["started"]
    head.reconcile()  # draining: t2 asked to checkpoint
    assert head.repartitions.records[rid].state is RepartitionState.DRAINING
    restarted = HeadController(settings, store, clock=clock, sched_config=head.sched_config)
    restarted.restore()
    assert [r.state for r in restarted.repartitions.live()] == [RepartitionState.DRAINING]
    snap = restarted.snapshot()
    assert not snap.healthy[snap.node_index("a100-1"), 2]  # still cordoned after the restart
    for a in cluster.values():
        a.ctl = restarted
        a.register()
    _cycle(restarted, cluster, n=6)
    assert restarted.repartitions.records[rid].state is RepartitionState.DONE
    assert restarted.get_lease("inf")["state"] == "granted"  # never touched


def test_the_head_api_takes_a_preset_or_a_target_and_reports_it_in_status(tmp_path: Path) -> None:
    head = InProcessHead(workdir=tmp_path)
    try:
        with pytest.raises(InvalidRequestError) as e:
            head.repartition_mig("dusk")
        assert e.value.field == "target"
        with pytest.raises(InvalidRequestError) as e:
            head.repartition_mig({"model": "A100-80GB", "layout": ["3g.40gb@2"]})
        assert e.value.field.endswith("layout.3g.40gb") and e.value.allowed == "0, 4"
        answer = head.repartition_mig("inference")
        assert sorted(c["gpu_index"] for c in answer["plan"]["changes"]) == [2, 3] and len(answer["started"]) == 2
        head.wait_for(lambda: all(r["state"] == "done" for r in head.service.status()["repartitions"]), 10,
                      "both repartitions done")
        inv = next(n for n in head.agent_inventories() if n["name"] == "a100-1")
        assert [[m["profile"] for m in g["mig_devices"]] for g in inv["gpus"][2:]] == [["1g.10gb"] * 7] * 2
    finally:
        head.close()


def test_a_relayout_drains_only_the_instances_that_go_and_a_lease_on_a_kept_instance_runs_on(
        head: HeadController, cluster: dict[str, RepartitionAgent]) -> None:
    """GPU 3 (4g.40gb@0 + 1g.10gb@4 + 1g.10gb@5 + 1g.20gb@6) to 4g.40gb@0 + three 1g.10gb: the 4g run and the
    inference replica on 1g.10gb@4 keep their instance, its UUID and their token; only the 1g.20gb run drains."""
    big = _train(head, cluster, "big", "mig:4g.40gb")
    head.request_lease({"lease_id": "svc", "request": {"kind": "mig", "profile": "1g.10gb", "node": "a100-1"},
                        "priority_class": "inference", "requester_digest": key_digest(KEY)})
    _cycle(head, cluster)
    svc = head.get_lease("svc", KEY)
    svc = head.activate("svc", svc["fencing_token"], None, "actor:rgo/svc")
    odd = _train(head, cluster, "odd", "mig:1g.20gb")
    assert [_on(d) for d in (big, odd)] == [("a100-1", [3]), ("a100-1", [3])]
    a100_1 = cluster["a100-1"]
    fake: FakeWorkloads = a100_1.core.workloads  # type: ignore[assignment]
    day = {"name": "day", "model": "A100-80GB", "layout": ["4g.40gb", "1g.10gb", "1g.10gb", "1g.10gb"],
           "nodes": ["a100-1"], "gpus": 2}
    answer = head.request_repartition(target_from(day))
    changes = {c["gpu_index"]: c["drain"] for c in answer["plan"]["changes"]}
    assert changes[3] == ["odd"], answer["plan"]
    _cycle(head, cluster, n=8)
    assert [r.state for r in head.repartitions.records.values()] == [RepartitionState.DONE] * len(changes)
    assert ("actor:rgo/odd", "/ck/odd") in fake.asked and "actor:rgo/big" not in fake.stopped
    assert "actor:rgo/svc" not in fake.stopped
    for before in (big, svc):  # on kept instances: still active, same token, same instance
        now = head.get_lease(before["lease_id"], KEY)
        assert (now["state"], now["fencing_token"], now["allocation"]) == ("active", before["fencing_token"],
                                                                          before["allocation"])
    inv = head.nodes.get("a100-1").inventory  # type: ignore[union-attr]
    assert gpu_layout(inv, 3) == (MigSlot(0, "4g.40gb"), MigSlot(4, "1g.10gb"), MigSlot(5, "1g.10gb"),
                                  MigSlot(6, "1g.10gb"))
    uuids = {d.start: d.uuid for d in inv.gpus[3].mig_devices}
    assert uuids[0] == big["allocation"]["mig_uuid"] and svc["allocation"]["mig_uuid"] in uuids.values()
    assert head.get_lease("odd")["state"] == "preempted"
