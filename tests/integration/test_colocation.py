"""Co-location on a real local Ray cluster: a load spike grows the leased inference service, the training
actor on the card it needs checkpoints and yields, and after the spike the service shrinks and training
resumes from its checkpoint, ending with the weights of an undisturbed run.

One cluster for the module (``ray_cluster``), a head whose training class may be preempted at once. Both
the service's replicas (one Serve application; Serve's controller asks for a lease per replica) and the
training actor lease whole cards pinned to ``h100-0`` (2 cards): the
service starts with one replica beside training, so a second replica needs the training card. Nothing
here names a victim or schedules an arrival: the load generator's requests drive the autoscaler, whose
inference lease preempts training through the head's ordinary path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from orchestrator.core.colocation import AutoscaleConfig, ServiceConfig
from orchestrator.core.config import RuntimeSettings
from orchestrator.core.request import GpuRequest
from orchestrator.deploy.local import free_port
from orchestrator.sim.perfmodel import InferenceModel

from tests.integration.heads import running_head, until, with_class
from tests.unit.test_loadgen import lg

pytestmark = pytest.mark.ray

# agents get 30 s of silence: replicas and training actors import torch on a 2-core machine shared with others
SETTINGS = RuntimeSettings(namespace="rgo-colo", heartbeat_interval_s=0.5, agent_ttl_s=30.0, reconcile_interval_s=0.1)
ONE_H100 = GpuRequest(kind="whole", count=1, node="h100-0")
SEED = 7
TRAIN_LEASE = f"train-{SEED}"  # the actor scenario's name for the run's first lease
#: Slow enough that a 40 rps spike keeps several requests in flight (a 1-request batch: 45 ms on a whole card).
PERF = InferenceModel(base_ms=40.0, per_item_ms=5.0)
SERVICE = ServiceConfig(name="colo", request="1", queue="default", slo_p99_ms=500, max_batch_size=4,
                        autoscale=AutoscaleConfig(min_replicas=1, max_replicas=2, target_ongoing_per_replica=1.0,
                                                  tolerance=0.1, upscale_delay_s=1.0, downscale_delay_s=3.0,
                                                  max_step_up=1, max_step_down=1))


@pytest.fixture(scope="module")
def head(ray_cluster: Any) -> Iterator[Any]:
    from orchestrator.rayport import serve_api
    from orchestrator.rayport.client import HeadClient

    cfg = with_class(ray_cluster.config, "training", min_runtime_s=0.0, grace_period_s=30.0)
    with running_head(SETTINGS, cfg) as handle:
        yield HeadClient(handle=handle)
        serve_api.shutdown()  # the service's Serve controller is detached: it would outlive this module's driver


def test_a_spike_grows_the_service_training_yields_and_resumes_after(head: Any, ray_cluster: Any,
                                                                       tmp_path: Path) -> None:
    from orchestrator.scenarios.actors import ActorScenario, ActorScenarioConfig, _Run
    from orchestrator.serve.manager import LeasedService

    lines: list[str] = []
    # the actor scenario's training driver: an actor per attempt, resumed from the checkpoint after each preemption
    sc = ActorScenario(head, SETTINGS.namespace, tmp_path, ActorScenarioConfig(step_delay_s=0.02), say=lines.append)
    train = _Run(SEED, 1, request=ONE_H100)
    thread, ready = sc.start_run(train)
    assert ready.wait(180) and train.error is None, train.error
    until("training to step", lambda: train.error or train.attempts[0]["last_step"] > 5, 60)

    svc = LeasedService(SERVICE, head=head, namespace=SETTINGS.namespace, head_name=SETTINGS.head_name,
                        port=free_port(), request=ONE_H100, perf=PERF, say=lines.append)
    try:
        url = svc.start()
        assert len(svc.replicas) == 1 and svc.replicas[0].node == "h100-0", lines
        first = svc.replicas[0]
        # one Serve application: its GPU deployment's replica runs on a lease Serve's controller asked for
        assert first.lease_id.startswith(f"serve-{SERVICE.name}-LeasedReplica-"), first
        assert head.get_lease(first.lease_id)["state"] == "active"
        assert head.get_lease(TRAIN_LEASE)["state"] == "active"  # beside training, on the other card

        # ---- the spike: the service grows because of load, and training yields its card -----------------
        spike = lg.start(url, lg.steady(40, 120), seed=1)
        try:
            until("the service to grow", lambda: len(svc.replicas) == 2, 120, step=svc.step)
        finally:
            spike.stop()
        spike_recs = spike.join(60)
        lines.append(f"spike at 40 rps: {lg.summarize(spike_recs, SERVICE.slo_p99_ms)}")
        grow = next(h for h in svc.history if h["event"] == "decide" and h["replicas"] == 2)
        assert grow["before"] == 1 and grow["cause"] in ("scale.up", "scale.slo"), grow
        assert grow["ongoing"] > SERVICE.autoscale.target_ongoing_per_replica, grow
        second = next(r for r in svc.replicas if r.name != first.name)
        victim = head.get_lease(TRAIN_LEASE)
        assert victim["state"] == "preempted" and victim["preempt_for"] == second.lease_id, victim
        ck = Path(victim["checkpoint_path"])
        assert ck.exists() and tmp_path / f"actor-train-{SEED}" in ck.parents
        ck_step = json.loads(Path(str(ck) + ".meta.json").read_text())["step"]
        assert ck_step >= train.attempts[0]["last_step"] - 1 > 5
        assert {r.status for r in spike_recs} == {200}, {r.status for r in spike_recs}
        assert {r.node for r in svc.replicas} == {"h100-0"}

        # ---- after the spike: the service shrinks and training resumes from its checkpoint -------------
        calm = lg.start(url, lg.steady(2, 120), seed=2)
        try:
            until("the service to shrink", lambda: len(svc.replicas) == 1, 60, step=svc.step)
        finally:
            calm.stop()
        lines.append(f"calm at 2 rps: {lg.summarize(calm.join(60), SERVICE.slo_p99_ms)}")
        shrink = next(h for h in svc.history if h["event"] == "decide" and h["replicas"] == 1)
        assert shrink["before"] == 2 and shrink["cause"] == "scale.down", shrink
        kept, gone = svc.replicas[0], svc.retired[-1]
        assert {kept.lease_id, gone.lease_id} == {first.lease_id, second.lease_id}
        until("the stopped replica's lease released", lambda: head.get_lease(gone.lease_id)["state"] == "released", 60)
        assert head.get_lease(gone.lease_id)["history"][-1]["reason"] == "its Serve replica stopped"
        assert head.get_lease(kept.lease_id)["state"] == "active"
        until("training to resume", lambda: train.error or len(train.attempts) == 2, 120)
        assert train.error is None, train.error
        assert train.attempts[1]["resumed_at"] == ck_step and train.attempts[1]["lease_id"] != TRAIN_LEASE

        stats = svc.stats()
        by = {r["replica"]: r for r in stats["replicas"]}
        assert by[second.name]["requests"] > 0 and by[second.name]["busy_s"] > 0
        assert 0 < stats["useful_gpu_s"] < stats["busy_s"]  # a small batch keeps only part of a whole card busy
        assert stats["requests"] == len(spike_recs) + len(calm.records)
    except BaseException:
        sc.targets[SEED] = 0  # the training thread finishes at its next look
        raise
    finally:
        svc.stop()
        print("\n".join(lines))

    # ---- training ends where an undisturbed run of the same steps ends ------------------------------
    sc.targets[SEED] = max(a["last_step"] for a in train.attempts) + 50
    thread.join(180)
    assert train.final is not None and train.error is None, train.error
    ref = sc.train.run(sc.targets[SEED], seed=SEED, log=lambda s: None)["digest"]
    assert train.final["digest"] == ref
    assert head.get_lease(first.lease_id)["state"] == "released"
