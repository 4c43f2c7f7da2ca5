"""Time windows in the head, in process (no Ray): a ManualClock drives both the lease clock and the day.

One node of 4 whole cards. By day (08:00-22:00) inference is guaranteed 50% and training capped at 50%;
by night training borrows everything above a 25% inference floor. The story: by day training beyond its
cap waits with the window's reason; past 22:00 it is granted; at night inference beyond its floor only
borrows; at 08:00 inference gets its guaranteed share back by preempting borrowed training through the
checkpoint path, and the victim waits for the night again, requeued to resume from its checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
from headless import LocalProcessRunner, SimulatedCluster

from orchestrator.control.service import HeadService, day_clock_of
from orchestrator.control.store import MemoryStore
from orchestrator.core.clock import CompressedClock, ManualClock, SystemClock, parse_hhmm
from orchestrator.core.config import ClusterConfig, RuntimeSettings, SimNode
from orchestrator.core.lease import LeaseState, key_digest
from orchestrator.core.priorities import SchedulerConfig

KEY = "windows-test-key"
SCHED = SchedulerConfig.parse({
    "classes": {"inference": {"priority": 1000, "preemptible": False, "checkpoint": False},
                "training": {"priority": 100, "min_runtime_s": 30, "grace_period_s": 60, "checkpoint": True}},
    "default_class": "training",
    "queues": {"default": {}, "inference": {}, "training": {}},
    "windows": [
        {"name": "day", "start": "08:00", "end": "22:00",
         "queues": {"inference": {"quota_pct": 50}, "training": {"quota_pct": 50, "borrowing": False}}},
        {"name": "night", "start": "22:00", "end": "08:00",
         "queues": {"inference": {"quota_pct": 25}, "training": {"borrowing": True}}},
    ],
})


class Head:
    """A HeadService stepped by hand: each ``step`` is one round of heartbeats and one cycle."""

    def __init__(self, tmp: Path, clock: ManualClock) -> None:
        self.clock = clock
        self.settings = RuntimeSettings(heartbeat_interval_s=0.1, agent_ttl_s=5.0)
        cluster = ClusterConfig(nodes=(SimNode(name="n0", model="A100-80GB", gpus=4),), scheduler=SCHED)
        self.cluster = SimulatedCluster(cluster, self.settings)
        self.service = HeadService(self.settings, cluster, MemoryStore(), LocalProcessRunner(tmp), self.cluster,
                                   clock=clock.monotonic, status_poll_s=0.0, day_clock=clock)
        for _ in range(3):
            self.step(0.1)
        assert self.service.ctl.registered_nodes() == ["n0"]

    def step(self, dt: float = 0.5) -> None:
        self.cluster.beat(self.service)
        self.service.cycle()
        self.clock.advance(dt)

    def run(self, seconds: float, dt: float = 0.5) -> None:
        for _ in range(round(seconds / dt)):
            self.step(dt)

    def ask(self, lease_id: str, queue: str) -> None:
        self.service.request_lease({"lease_id": lease_id, "request": "1", "queue": queue, "priority_class": queue,
                                    "requester_digest": key_digest(KEY), "requeue_on_preempt": queue == "training",
                                    "checkpoint_dir": f"/ckpt/{lease_id}" if queue == "training" else None})

    def lease(self, lease_id: str) -> dict[str, Any]:
        return self.service.get_lease(self.service.ctl.current_attempt(lease_id), KEY)

    def state(self, lease_id: str) -> str:
        return self.lease(lease_id)["state"]

    def start(self, lease_id: str) -> None:
        """The holder starts on its devices (an active lease is what gets a checkpoint request)."""
        d = self.lease(lease_id)
        self.service.activate(d["lease_id"], d["fencing_token"], holder=f"holder-{lease_id}")

    def holding(self, queue: str) -> list[str]:
        return sorted(e.lease_id for e in self.service.ctl.ledger.holding() if e.spec.queue == queue)


@pytest.fixture
def head(tmp_path: Path) -> Iterator[Head]:
    yield Head(tmp_path, ManualClock(t=1000.0, time_of_day_s=parse_hhmm("09:00")))


def test_by_day_training_waits_at_its_cap_and_is_granted_past_22h(head: Head) -> None:
    for k in range(4):
        head.ask(f"t{k}", "training")
    head.run(2.0)
    assert [head.state(f"t{k}") for k in range(4)] == ["granted", "granted", "pending", "pending"]
    why = head.service.explain_lease("t2")["pending"]
    assert why["cause"] == "wait.window", why
    assert why["reason"] == ("queue training holds 2 GPUs and asks 1 more: over its cap of 2 GPUs, no borrowing, "
                             "set by time window day 08:00-22:00 until 22:00")
    win = head.service.status()["head"]["window"]
    assert win["window"] == "day" and win["next_change"]["at"] == "22:00" and win["next_change"]["window"] == "night"
    assert win["quotas"]["training"] == {"quota_gpus": 2.0, "borrowing": False}
    for k in range(2):
        head.start(f"t{k}")
    head.clock.set_time_of_day(parse_hhmm("21:59"))
    head.run(50.0)  # 21:59:00 -> 21:59:50: still day
    assert head.state("t2") == head.state("t3") == "pending"
    head.run(15.0)  # past 22:00: the night lets training borrow every idle card
    assert head.state("t2") == head.state("t3") == "granted"
    assert head.service.status()["head"]["window"]["window"] == "night"


def test_at_08h_inference_takes_its_guaranteed_share_back_through_the_checkpoint_path(head: Head) -> None:
    head.clock.set_time_of_day(parse_hhmm("23:00"))
    for k in range(4):
        head.ask(f"t{k}", "training")
    head.run(1.0)
    assert head.holding("training") == ["t0", "t1", "t2", "t3"]  # night: training takes all 4 cards
    for k in range(4):
        head.start(f"t{k}")
    head.run(40.0)  # past the training class's 30 s minimum runtime

    # at night inference has a floor of 1 card (25%): the first request preempts, the second only borrows
    head.ask("i0", "inference")
    head.ask("i1", "inference")
    head.run(1.0)
    victims = head.service.ctl.ledger.in_state(LeaseState.CHECKPOINTING)
    assert len(victims) == 1 and victims[0].lease.priority_class == "training"
    night_victim = victims[0].lease_id
    head.service.ctl.ack_preemption(night_victim, f"/ckpt/{night_victim}/step-10")
    head.run(1.0)
    assert head.state("i0") == "granted" and head.state("i1") == "pending"
    i1 = head.service.explain_lease("i1")["pending"]
    assert i1["cause"] == "wait.window" and "over its quota of 1 GPUs, set by time window night" in i1["reason"]
    assert "only borrows idle capacity and preempts nothing" in i1["reason"]
    assert len(head.holding("training")) == 3

    # 08:00: the day guarantees inference 2 cards: i1 is within it now and takes one back from training
    head.clock.set_time_of_day(parse_hhmm("07:59"))
    head.run(59.0)
    assert head.state("i1") == "pending" and not head.service.ctl.ledger.in_state(LeaseState.CHECKPOINTING)
    head.run(2.0)  # 08:00
    victims = head.service.ctl.ledger.in_state(LeaseState.CHECKPOINTING)
    assert len(victims) == 1, "exactly one training lease is asked to checkpoint for i1"
    v = victims[0]
    assert v.lease.priority_class == "training" and "preempted for" in v.lease.history[-1].reason
    assert head.state("i1") == "pending"  # nothing is handed out before the victim has checkpointed
    head.service.ctl.ack_preemption(v.lease_id, f"/ckpt/{v.lease_id}/step-99")
    head.run(1.0)
    assert head.state("i1") == "granted"
    assert head.holding("inference") and len(head.holding("inference")) == 2 and len(head.holding("training")) == 2
    # the victim was requeued to resume from its checkpoint and waits for the night: training is at its day cap
    retry = head.service.ctl.ledger.get(head.service.ctl.current_attempt(v.lease_id))
    assert retry.lease.state.value == "pending" and retry.spec.resume_from == f"/ckpt/{v.lease_id}/step-99"
    assert head.service.explain_lease(retry.lease_id)["pending"]["cause"] == "wait.window"


def test_the_head_reads_its_day_from_settings_or_local_time() -> None:
    assert isinstance(day_clock_of(RuntimeSettings()), SystemClock)
    c = day_clock_of(RuntimeSettings.model_validate({"day_clock": {"speedup": 720, "start": "06:00"}}))
    assert isinstance(c, CompressedClock) and c.speedup == 720 and abs(c.time_of_day_s() - 6 * 3600) < 720


def test_set_day_clock_starts_the_day_anew_and_the_window_follows(tmp_path: Path) -> None:
    """A scenario starts its compressed day when its load starts: the window in force follows at once."""
    from orchestrator.core.errors import InvalidRequestError

    head = Head(tmp_path, ManualClock(t=0.0, time_of_day_s=parse_hhmm("03:00")))
    assert head.service.status()["head"]["window"]["window"] == "night"
    out = head.service.set_day_clock({"speedup": 720, "start": "09:30"})
    assert out["window"] == "day" and out["time_of_day"] == "09:30"
    assert isinstance(head.service.ctl.day_clock, CompressedClock)
    head.step()
    assert head.service.status()["head"]["window"]["window"] == "day"
    for bad, field in (({"speedup": 0}, "day_clock.speedup"), ({"start": "25:00"}, "day_clock.start"), ("noon", "day_clock")):
        with pytest.raises(InvalidRequestError) as e:
            head.service.set_day_clock(bad)  # type: ignore[arg-type]
        assert e.value.field.startswith(field)
    assert head.service.status()["head"]["window"]["window"] == "day"  # a refused call changes nothing


def test_a_night_surge_lets_inference_preempt_beyond_its_floor_and_the_status_says_why(tmp_path: Path) -> None:
    """#36: with ``surge_pct: 75`` the night's 1-card floor follows inference's demand (the head passes what the
    queue holds and asks): two inference requests each preempt training through the checkpoint path, where the
    clock's floor alone lets the second only borrow (the test above); the window's status says ``window.surge``."""
    windows = [w.model_dump() for w in SCHED.windows]
    windows[1]["queues"]["inference"]["surge_pct"] = 75
    sched = SchedulerConfig.parse({**SCHED.model_dump(), "windows": windows})
    head = Head.__new__(Head)
    head.clock = ManualClock(t=1000.0, time_of_day_s=parse_hhmm("23:00"))
    head.settings = RuntimeSettings(heartbeat_interval_s=0.1, agent_ttl_s=5.0)
    cluster = ClusterConfig(nodes=(SimNode(name="n0", model="A100-80GB", gpus=4),), scheduler=sched)
    head.cluster = SimulatedCluster(cluster, head.settings)
    head.service = HeadService(head.settings, cluster, MemoryStore(), LocalProcessRunner(tmp_path), head.cluster,
                               clock=head.clock.monotonic, status_poll_s=0.0, day_clock=head.clock)
    head.run(0.3, dt=0.1)
    for k in range(4):
        head.ask(f"t{k}", "training")
    head.run(1.0)
    for k in range(4):
        head.start(f"t{k}")
    head.run(40.0)  # past the training class's minimum runtime
    head.ask("i0", "inference")
    head.ask("i1", "inference")
    head.run(1.0)
    victims = head.service.ctl.ledger.in_state(LeaseState.CHECKPOINTING)
    assert len(victims) == 2 and all(v.lease.priority_class == "training" for v in victims)
    win = head.service.status()["head"]["window"]
    assert win["cause"] == "window.surge" and win["quotas"]["inference"]["quota_gpus"] == 2.0, win
    for v in victims:
        head.service.ctl.ack_preemption(v.lease_id, f"/ckpt/{v.lease_id}/step-10")
    head.run(1.0)
    assert head.state("i0") == head.state("i1") == "granted" and len(head.holding("training")) == 2
    head.service.release(head.service.ctl.current_attempt("i1"), head.lease("i1")["fencing_token"], "done", key=KEY)
    head.run(1.0)  # the demand falls: the quota goes back towards the clock's floor
    assert head.service.status()["head"]["window"]["quotas"]["inference"]["quota_gpus"] == 1.0
