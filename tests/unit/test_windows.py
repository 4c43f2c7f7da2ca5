"""Time windows: lookup (wrap-around included), the next change, percent -> GPUs, overrides, the cycle's reasons."""

from __future__ import annotations

import pytest

from orchestrator.core.clock import parse_hhmm
from orchestrator.core.errors import ConfigError
from orchestrator.core.priorities import QueueConfig, SchedulerConfig
from orchestrator.core.reasons import Cause
from orchestrator.core.request import GpuRequest
from orchestrator.scheduling.cycle import PendingItem, schedule
from orchestrator.scheduling.policies import get_policy
from orchestrator.scheduling.snapshot import ClusterSnapshot, NodeSpec
from orchestrator.scheduling.windows import effective_config, next_change, window_at, window_status

H = 3600.0
QUEUES = {"default": {}, "inference": {}, "training": {"quota_gpus": 6, "borrowing": True}}
DAY_NIGHT = {
    "queues": QUEUES,
    "windows": [
        {"name": "day", "start": "08:00", "end": "22:00",
         "queues": {"inference": {"quota_pct": 60}, "training": {"quota_pct": 40, "borrowing": False}}},
        {"name": "night", "start": "22:00", "end": "08:00",
         "queues": {"inference": {"quota_pct": 10}, "training": {"borrowing": True}}},
    ],
}
CFG = SchedulerConfig.parse(DAY_NIGHT)


@pytest.mark.parametrize("hhmm, name", [("00:00", "night"), ("07:59", "night"), ("08:00", "day"), ("12:00", "day"),
                                        ("21:59", "day"), ("22:00", "night"), ("23:59", "night")])
def test_the_window_in_force_wraps_midnight_and_covers_start_not_end(hhmm: str, name: str) -> None:
    w = window_at(CFG.windows, parse_hhmm(hhmm))
    assert w is not None and w.name == name


def test_outside_every_window_none_is_in_force() -> None:
    cfg = SchedulerConfig.parse({"queues": QUEUES, "windows": [
        {"name": "late", "start": "23:00", "end": "01:30", "queues": {"training": {"quota_gpus": 1}}}]})
    assert window_at(cfg.windows, 22.99 * H) is None and window_at(cfg.windows, 1.5 * H) is None
    assert window_at(cfg.windows, 0.5 * H).name == "late" and window_at(cfg.windows, 23 * H).name == "late"
    assert effective_config(cfg, 12 * H, 8) == (cfg, None)
    gap, after = next_change(cfg.windows, 12 * H)
    assert gap == 11 * H and after.name == "late"
    gap, after = next_change(cfg.windows, 0.5 * H)
    assert gap == 1 * H and after is None
    whole = SchedulerConfig.parse({"windows": [{"name": "all", "start": "00:00", "end": "24:00"}]})
    assert window_at(whole.windows, 0) is not None and window_at(whole.windows, 86399) is not None
    assert next_change(whole.windows, 5) is None and next_change((), 5) is None


def test_next_change_names_the_window_that_follows() -> None:
    assert next_change(CFG.windows, 21 * H) == (1 * H, CFG.windows[1])
    assert next_change(CFG.windows, 23 * H) == (9 * H, CFG.windows[0])
    assert next_change(CFG.windows, 8 * H) == (14 * H, CFG.windows[1])


def test_percent_quotas_become_gpus_of_the_capacity_and_overrides_apply() -> None:
    day, w = effective_config(CFG, 9 * H, capacity_gpus=8)
    assert w is not None and w.name == "day"
    assert day.queues["inference"] == QueueConfig(quota_gpus=4.8, borrowing=True)
    assert day.queues["training"] == QueueConfig(quota_gpus=3.2, borrowing=False)
    assert day.queues["default"] == CFG.queues["default"] and day.classes == CFG.classes
    night, w = effective_config(CFG, 23 * H, capacity_gpus=20)
    assert w.name == "night"
    assert night.queues["inference"].quota_gpus == 2.0
    assert night.queues["training"] == QueueConfig(quota_gpus=6, borrowing=True)  # the configured quota is kept
    gpus = SchedulerConfig.parse({"queues": QUEUES, "windows": [
        {"name": "w", "start": "01:00", "end": "02:00", "queues": {"training": {"quota_gpus": 1.5}}}]})
    assert effective_config(gpus, 1 * H, 100)[0].queues["training"].quota_gpus == 1.5
    assert CFG.queues["training"].quota_gpus == 6  # the configured config is never changed


def test_without_windows_the_config_comes_back_the_same() -> None:
    plain = SchedulerConfig()
    assert plain.windows == () and effective_config(plain, 9 * H, 8) == (plain, None)
    assert effective_config(plain, 9 * H, 8)[0] is plain


def test_window_status_says_what_is_in_force_and_what_comes_next() -> None:
    st = window_status(CFG, 21.5 * H, 8).to_json()
    assert st["window"] == "day" and st["next_change"] == {"at": "22:00", "in_s": 1800.0, "window": "night"}
    assert st["cause"] == "window.active" and st["quotas"]["training"] == {"quota_gpus": 3.2, "borrowing": False}
    assert st["reason"] == ("21:30: window day 08:00-22:00 in force (inference quota 4.8 GPUs, borrows idle "
                            "capacity, training quota 3.2 GPUs, capped); next change at 22:00 to window night")


@pytest.mark.parametrize("windows, field", [
    ([{"name": "a", "start": "08:00", "end": "22:00"}, {"name": "b", "start": "21:00", "end": "23:00"}], "windows.1.start"),
    ([{"name": "a", "start": "22:00", "end": "08:00"}, {"name": "b", "start": "07:00", "end": "09:00"}], "windows.1.start"),
    ([{"name": "a", "start": "08:00", "end": "08:00"}], "windows.0.end"),
    ([{"name": "a", "start": "8h", "end": "09:00"}], "windows.0.start"),
    ([{"name": "a", "start": "08:00", "end": "24:30"}], "windows.0.end"),
    ([{"name": "a", "start": "24:00", "end": "02:00"}], "windows.0.start"),
    ([{"name": "a", "start": "01:00", "end": "02:00"}, {"name": "a", "start": "03:00", "end": "04:00"}], "windows.1.name"),
    ([{"name": "a", "start": "01:00", "end": "02:00", "queues": {"nope": {}}}], "windows.0.queues"),
    ([{"name": "a", "start": "01:00", "end": "02:00", "queues": {"training": {"quota_pct": 10, "quota_gpus": 1}}}],
     "windows.0.queues.training.quota_pct"),
    ([{"name": "a", "start": "01:00", "end": "02:00", "queues": {"training": {"quota_pct": 150}}}],
     "windows.0.queues.training.quota_pct"),
    ([{"name": "a", "start": "01:00", "end": "02:00", "queues": {"training": {"cap": 1}}}],
     "windows.0.queues.training.cap"),
])
def test_bad_windows_are_config_errors_naming_the_field(windows: list, field: str) -> None:
    with pytest.raises(ConfigError) as e:
        SchedulerConfig.parse({"queues": QUEUES, "windows": windows}, source="p.yaml")
    assert e.value.field == f"p.yaml:{field}", e.value


# ---- the cycle under a window ---------------------------------------------------------------------------------

POLICY = get_policy("bestfit")


def _item(i: str, cls: str, queue: str, t: float = 0.0) -> PendingItem:
    return PendingItem(i, GpuRequest.whole(1), CFG.classes[cls].priority, cls, t, queue)


def test_a_wait_the_window_causes_says_so_and_until_when() -> None:
    snap = ClusterSnapshot.build([NodeSpec("n0", "A100-80GB", 8)])
    pending = [_item(f"t{k}", "training", "training", k) for k in range(5)]
    st = window_status(CFG, 9 * H, 8)
    day, _ = effective_config(CFG, 9 * H, 8)
    plan = schedule(snap, pending, [], day, now=10, policy=POLICY, window=st)
    assert [g.item_id for g in plan.grants] == ["t0", "t1", "t2"]  # 3 <= 3.2 GPUs; a fourth would be 4 > 3.2
    w = plan.waiting_for("t3")
    assert w.reason.cause is Cause.WAIT_WINDOW
    assert w.reason.text == ("queue training holds 3 GPUs and asks 1 more: over its cap of 3.2 GPUs, no borrowing, "
                             "set by time window day 08:00-22:00 until 22:00")
    plain = schedule(snap, pending, [], day, now=10, policy=POLICY)  # the same quota not from a window: wait.quota
    assert plain.waiting_for("t3").reason.cause is Cause.WAIT_QUOTA
    night, _ = effective_config(CFG, 23 * H, 8)
    assert len(schedule(snap, pending, [], night, now=10, policy=POLICY, window=window_status(CFG, 23 * H, 8)).grants) == 5


def test_at_night_inference_beyond_its_floor_only_borrows_and_the_wait_names_the_window() -> None:
    snap = ClusterSnapshot.build([NodeSpec("n0", "A100-80GB", 2)])
    pending = [_item("i0", "inference", "inference", 0), _item("i1", "inference", "inference", 1),
               _item("i2", "inference", "inference", 2)]
    night, _ = effective_config(CFG, 23 * H, 10)  # floor 1 GPU
    plan = schedule(snap, pending, [], night, now=10, policy=POLICY, window=window_status(CFG, 23 * H, 10))
    assert [g.item_id for g in plan.grants] == ["i0", "i1"]
    assert plan.grants[1].reason.cause is Cause.PLACED_BORROWING
    w = plan.waiting_for("i2")
    assert w.reason.cause is Cause.WAIT_WINDOW and not w.would_preempt
    assert "over its quota of 1 GPUs, set by time window night 22:00-08:00 until 08:00" in w.reason.text


def _training_on_four_cards(config: SchedulerConfig) -> tuple[ClusterSnapshot, list]:
    """A 4-card node with a training lease granted on each card: the snapshot and the holding leases."""
    from orchestrator.core.lease import Lease

    snap = ClusterSnapshot.build([NodeSpec("n0", "A100-80GB", 4)])
    held = []
    for k in range(4):
        r = schedule(snap, [_item(f"t{k}", "training", "training")], [], config, now=0, policy=POLICY)
        a = r.grants[0].placement.allocation
        snap = snap.apply(a)
        held.append(Lease.new(f"t{k}", GpuRequest.whole(1), now=0, queue="training", priority=100,
                              priority_class="training").grant(a, k + 1, now=0, reason="granted"))
    return snap, held


def test_two_requests_never_both_preempt_for_the_last_of_a_quota() -> None:
    """The night floor is 1 card: the first inference request preempts training for it, the second one
    counts that card as its queue's and only borrows -- in the cycle that plans, and while victims checkpoint."""
    snap, held = _training_on_four_cards(CFG)
    night, _ = effective_config(CFG, 23 * H, 10)  # a floor of 1 card
    st = window_status(CFG, 23 * H, 10)
    pending = [_item("i0", "inference", "inference", 1), _item("i1", "inference", "inference", 2)]
    plan = schedule(snap, pending, held, night, now=100, policy=POLICY, window=st)
    assert [p.for_item for p in plan.preemptions] == ["i0"], plan.to_json()["waiting"]
    assert plan.waiting_for("i1").reason.cause is Cause.WAIT_WINDOW and not plan.waiting_for("i1").would_preempt
    nominated = [PendingItem("i0", GpuRequest.whole(1), 1000, "inference", 1, "inference", nominated=True), pending[1]]
    again = schedule(snap, nominated, held, night, now=101, policy=POLICY, window=st,
                     in_flight=frozenset(p.victim.lease_id for p in plan.preemptions))
    assert not again.preemptions and again.waiting_for("i1").reason.cause is Cause.WAIT_WINDOW


# ---- #36: a guarantee that yields to load (surge_pct) ---------------------------------------------------------

SURGE = SchedulerConfig.parse({**DAY_NIGHT, "windows": [
    DAY_NIGHT["windows"][0],
    {"name": "night", "start": "22:00", "end": "08:00",
     "queues": {"inference": {"quota_pct": 10, "surge_pct": 50}, "training": {"borrowing": True}}}]})


def test_a_surging_quota_follows_demand_between_the_clocks_and_its_cap() -> None:
    from orchestrator.scheduling.windows import surge_caps

    def quota(demand: float) -> float | None:
        return effective_config(SURGE, 23 * H, 10, {"inference": demand})[0].queues["inference"].quota_gpus

    assert quota(0.5) == 1.0  # below the clock's 10 %: the clock's guarantee
    assert quota(2.3) == 3.0  # above it: the demand, rounded up to a card
    assert quota(9.0) == 5.0  # never above surge_pct (50 % of 10)
    assert effective_config(SURGE, 23 * H, 10)[0].queues["inference"].quota_gpus == 1.0  # no demand given: the clock's
    assert effective_config(CFG, 23 * H, 10, {"inference": 9.0})[0].queues["inference"].quota_gpus == 1.0  # no surge_pct
    assert surge_caps(SURGE, 23 * H, 10) == {"inference": 5.0} and surge_caps(SURGE, 9 * H, 10) == {}
    st = window_status(SURGE, 23 * H, 10, {"inference": 2.3})
    assert st.reason.cause is Cause.WINDOW_SURGE
    assert "inference's demand 2.3 GPUs raised its quota from the clock's 1 to 3 (surge_pct 50)" in st.reason.text
    assert window_status(SURGE, 23 * H, 10, {"inference": 0.5}).reason.cause is Cause.WINDOW_ACTIVE


def test_surge_pct_below_the_clocks_quota_is_a_config_error() -> None:
    bad = {**DAY_NIGHT, "windows": [{"name": "n", "start": "22:00", "end": "08:00",
                                     "queues": {"inference": {"quota_pct": 30, "surge_pct": 20}}}]}
    with pytest.raises(ConfigError) as e:
        SchedulerConfig.parse(bad)
    assert "surge_pct" in str(e.value)


def test_queue_demand_counts_holdings_and_each_pending_request_at_its_largest_choice() -> None:
    from orchestrator.core.lease import Lease
    from orchestrator.scheduling.windows import queue_demand

    snap = ClusterSnapshot.build([NodeSpec("n0", "A100-80GB", 4)])
    a = schedule(snap, [_item("t0", "training", "training")], [], CFG, now=0, policy=POLICY).grants[0].placement.allocation
    held = Lease.new("t0", GpuRequest.whole(2), now=0, queue="training", priority=100,
                     priority_class="training").grant(a, 1, now=0, reason="granted")
    pend = Lease.new("i0", GpuRequest.parse("mig:1g.10gb|mps:25|1"), now=0, queue="inference", priority=1000,
                     priority_class="inference")
    assert queue_demand([held], [pend]) == {"training": 1.0, "inference": 1.0}


def test_by_night_inference_demand_beyond_the_floor_preempts_training_within_the_surge() -> None:
    """The night floor is 10 % (0.4 of these 4 cards: not one card): with surge_pct 50 and three inference requests,
    the quota follows the demand to 2 cards (50 % of 4): two preempt training through the checkpoint path, the third
    only borrows. With the clock's floor alone none may preempt."""
    from orchestrator.core.lease import Lease
    from orchestrator.scheduling.windows import queue_demand

    snap, held = _training_on_four_cards(SURGE)
    pending = [_item(f"i{k}", "inference", "inference", k) for k in range(3)]
    asks = [Lease.new(p.item_id, p.request, now=0, queue="inference", priority=1000, priority_class="inference")
            for p in pending]
    demand = queue_demand(held, asks)
    night, _ = effective_config(SURGE, 23 * H, 4, demand)
    assert night.queues["inference"].quota_gpus == 2.0
    plan = schedule(snap, pending, held, night, now=100, policy=POLICY, window=window_status(SURGE, 23 * H, 4, demand))
    assert sorted(p.for_item for p in plan.preemptions) == ["i0", "i1"], plan.to_json()["waiting"]
    assert not plan.waiting_for("i2").would_preempt
    clock_only, _ = effective_config(SURGE, 23 * H, 4)  # the clock's floor alone
    assert not schedule(snap, pending, held, clock_only, now=100, policy=POLICY).preemptions
