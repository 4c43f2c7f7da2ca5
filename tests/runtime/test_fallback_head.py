"""Replicas' leases on the in-process head (no Ray), issue #36 item 1: N lease requests asked at once are granted
in one cycle, and when the slices run out they fall back, in the order asked, to MPS shares and whole cards,
preempting training through the checkpoint path -- by day, within the window's guarantee; by night, beyond
inference's floor, they only borrow and preempt nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from headless import LocalProcessRunner, SimulatedCluster

from orchestrator.control.service import HeadService
from orchestrator.control.store import MemoryStore
from orchestrator.core.clock import ManualClock, parse_hhmm
from orchestrator.core.config import ClusterConfig, RuntimeSettings, SimNode
from orchestrator.core.lease import key_digest
from orchestrator.core.priorities import SchedulerConfig

KEY = "fallback-test-key"
CHAIN = "mig:1g.10gb|mps:50|1"
SCHED = SchedulerConfig.parse({
    "classes": {"inference": {"priority": 1000, "preemptible": False, "checkpoint": False},
                "training": {"priority": 100, "min_runtime_s": 0, "grace_period_s": 60, "checkpoint": True}},
    "default_class": "training",
    "queues": {"default": {}, "inference": {}, "training": {}},
    "windows": [  # 4 cards: by day inference is guaranteed 3 of them, by night 0.2 of one
        {"name": "day", "start": "08:00", "end": "22:00",
         "queues": {"inference": {"quota_pct": 75}, "training": {"quota_pct": 25, "borrowing": True}}},
        {"name": "night", "start": "22:00", "end": "08:00",
         "queues": {"inference": {"quota_pct": 5, "borrowing": True}, "training": {"borrowing": True}}},
    ],
})
NODES = (SimNode.model_validate({"name": "m", "model": "A100-80GB", "gpus": 1, "mig": {0: [
             {"profile": "4g.40gb", "start": 0}, {"profile": "1g.10gb", "start": 4}, {"profile": "1g.10gb", "start": 5},
             {"profile": "1g.10gb", "start": 6}]}}),
         SimNode(name="h", model="H100-80GB", gpus=3))


class Head:
    """A HeadService over nodes ``m`` (one MIG card: 4g + three 1g) and ``h`` (three H100s), stepped by hand."""

    def __init__(self, tmp: Path, clock: ManualClock) -> None:
        self.clock = clock
        settings = RuntimeSettings(heartbeat_interval_s=0.1, agent_ttl_s=5.0)
        cluster = ClusterConfig(nodes=NODES, scheduler=SCHED)
        self.cluster = SimulatedCluster(cluster, settings)
        self.service = HeadService(settings, cluster, MemoryStore(), LocalProcessRunner(tmp), self.cluster,
                                   clock=clock.monotonic, status_poll_s=0.0, day_clock=clock)
        for _ in range(3):
            self.cycle()
        assert sorted(self.service.ctl.registered_nodes()) == ["h", "m"]

    def cycle(self, dt: float = 0.1) -> list[str]:
        """One round of heartbeats and one cycle; the leases it granted."""
        self.cluster.beat(self.service)
        report = self.service.cycle()
        self.clock.advance(dt)
        return sorted(report.granted)

    def ask(self, lease_id: str, queue: str, request: str) -> None:
        self.service.request_lease({"lease_id": lease_id, "request": request, "queue": queue, "priority_class": queue,
                                    "requester_digest": key_digest(KEY), "requeue_on_preempt": queue == "training",
                                    "checkpoint_dir": f"/ckpt/{lease_id}" if queue == "training" else None})

    def lease(self, lease_id: str) -> dict:
        return self.service.get_lease(self.service.ctl.current_attempt(lease_id), KEY)

    def start(self, lease_id: str) -> None:
        d = self.lease(lease_id)
        self.service.activate(d["lease_id"], d["fencing_token"], holder=f"holder-{lease_id}")

    def share(self, lease_id: str) -> str:
        a = self.lease(lease_id)["allocation"]
        return f"{a['node']}:{a['mig_profile'] or a['kind']}"


@pytest.fixture
def head(tmp_path: Path) -> Iterator[Head]:
    yield Head(tmp_path, ManualClock(t=1000.0, time_of_day_s=parse_hhmm("09:00")))


def test_n_requests_asked_at_once_are_granted_in_one_cycle_down_the_chain(head: Head) -> None:
    for k in range(7):
        head.ask(f"r{k}", "inference", CHAIN)
    granted = head.cycle()
    assert granted == [f"r{k}" for k in range(7)]  # all seven in the one cycle after they were asked
    shares = sorted(head.share(f"r{k}") for k in range(7))
    assert shares == ["h:mps"] * 4 + ["m:1g.10gb"] * 3  # the three 1g slices, then MPS halves of two H100s


def test_by_day_a_replica_preempts_training_for_a_later_choice_through_the_checkpoint_path(head: Head) -> None:
    for k in range(3):
        head.ask(f"t{k}", "training", "1")
    head.ask("t-4g", "training", "mig:4g.40gb")
    for k in range(3):
        head.ask(f"i{k}", "inference", "mig:1g.10gb")
    assert len(head.cycle()) == 7
    for lid in ("t0", "t1", "t2", "t-4g"):
        head.start(lid)
    head.cycle()
    head.ask("r", "inference", CHAIN)  # every 1g slice held; the H100s held by training
    head.cycle()
    victims = [lid for lid in ("t0", "t1", "t2") if head.lease(lid)["state"] == "checkpointing"]
    assert len(victims) == 1 and head.lease("t-4g")["state"] == "active"
    why = head.service.explain_lease("r")["pending"]
    assert why["cause"] == "wait.preempting" and "(fallback 2 of 3)" in why["reason"], why
    head.service.ctl.ack_preemption(head.lease(victims[0])["lease_id"], f"/ckpt/{victims[0]}/step-1")
    for _ in range(5):
        head.cycle()
    assert head.lease("r")["state"] == "granted" and head.share("r") == "h:mps"


def test_by_night_beyond_inferences_floor_a_later_choice_preempts_nothing(head: Head) -> None:
    head.clock.set_time_of_day(parse_hhmm("23:00"))
    for k in range(3):
        head.ask(f"t{k}", "training", "1")
    for k in range(3):
        head.ask(f"i{k}", "inference", "mig:1g.10gb")
    assert len(head.cycle()) == 6
    for k in range(3):
        head.start(f"t{k}")
    head.ask("r", "inference", CHAIN)
    for _ in range(5):
        head.cycle()
    assert all(head.lease(f"t{k}")["state"] == "active" for k in range(3))
    assert head.lease("r")["state"] == "pending"
    why = head.service.explain_lease("r")["pending"]
    assert why["cause"] == "wait.window", why
