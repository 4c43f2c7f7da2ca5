"""Hierarchical weighted fair share (scheduling.fairshare): the water-filling, the tree, dominant resources,
the decay and the reclaim rule -- each test breaks when its rule is broken."""

from __future__ import annotations

import pytest

from orchestrator.core.errors import ConfigError
from orchestrator.core.priorities import SchedulerConfig
from orchestrator.core.reasons import Cause
from orchestrator.scheduling.fairshare import (
    DecayedUsage, QueueTree, Resources, compute, jain, reclaim_block,
)

CAP = Resources(gpus=16, cpu_milli=256_000, memory_mib=1_048_576)


def config(queues: dict) -> SchedulerConfig:
    return SchedulerConfig(queues={"default": {}, **queues})


def gpus(n: float) -> Resources:
    return Resources(gpus=n)


def test_weights_divide_what_is_contended() -> None:
    cfg = config({"a": {"weight": 3}, "b": {"weight": 1}})
    shares = compute(cfg, CAP, used={}, asked={"a": gpus(16), "b": gpus(16)})
    assert shares.fair_gpus("a") == pytest.approx(12)
    assert shares.fair_gpus("b") == pytest.approx(4)
    assert shares.fair_gpus("default") == 0


def test_a_queue_never_gets_more_than_it_asks_and_the_rest_flows_to_its_siblings() -> None:
    cfg = config({"a": {"weight": 3}, "b": {"weight": 1}})
    shares = compute(cfg, CAP, used={}, asked={"a": gpus(2), "b": gpus(16)})
    assert shares.fair_gpus("a") == pytest.approx(2)
    assert shares.fair_gpus("b") == pytest.approx(14)
    idle = shares.line("default")
    assert idle is not None and idle.reason.cause is Cause.FAIR_IDLE


def test_guarantees_come_first_then_weights() -> None:
    cfg = config({"a": {"quota_gpus": 10, "weight": 1}, "b": {"weight": 1}})
    shares = compute(cfg, CAP, used={}, asked={"a": gpus(16), "b": gpus(16)})
    assert shares.fair_gpus("a") == pytest.approx(13)  # 10 guaranteed + half of the 6 left
    assert shares.fair_gpus("b") == pytest.approx(3)


def test_guarantees_beyond_the_cluster_are_scaled_down() -> None:
    cfg = config({"a": {"quota_gpus": 16}, "b": {"quota_gpus": 16}})
    shares = compute(cfg, CAP, used={}, asked={"a": gpus(16), "b": gpus(8)})
    assert shares.fair_gpus("a") + shares.fair_gpus("b") == pytest.approx(16)
    assert shares.fair_gpus("a") == pytest.approx(16 * 16 / 24)


def test_a_limit_caps_the_share() -> None:
    cfg = config({"a": {"weight": 3, "limit_gpus": 5}, "b": {"weight": 1}})
    shares = compute(cfg, CAP, used={}, asked={"a": gpus(16), "b": gpus(16)})
    assert shares.fair_gpus("a") == pytest.approx(5)
    assert shares.fair_gpus("b") == pytest.approx(11)


def test_the_tree_divides_top_down() -> None:
    cfg = config({"org": {"weight": 1}, "ops": {"weight": 1},
                  "team1": {"parent": "org", "weight": 1}, "team2": {"parent": "org", "weight": 3}})
    shares = compute(cfg, CAP, used={}, asked={"team1": gpus(16), "team2": gpus(16), "ops": gpus(16)})
    assert shares.fair_gpus("org") == pytest.approx(8)
    assert shares.fair_gpus("ops") == pytest.approx(8)
    assert shares.fair_gpus("team1") == pytest.approx(2)
    assert shares.fair_gpus("team2") == pytest.approx(6)
    line = shares.line("team2")
    assert line is not None and line.depth == 1 and line.parent == "org"


def test_used_above_and_below_say_so() -> None:
    cfg = config({"a": {}, "b": {}})
    shares = compute(cfg, CAP, used={"a": gpus(12), "b": gpus(4)}, asked={"a": gpus(12), "b": gpus(16)})
    a, b = shares.line("a"), shares.line("b")
    assert a is not None and a.reason.cause is Cause.FAIR_ABOVE and "above its fair share of 8" in a.reason.text
    assert b is not None and b.reason.cause is Cause.FAIR_BELOW
    assert shares.order_key("b") < shares.order_key("a")


def test_dominant_resource_counts_cpu_heavy_work() -> None:
    # "a" asks 4 GPUs with three quarters of the cluster's CPU: its dominant resource is CPU
    cfg = config({"a": {}, "b": {}})
    heavy = Resources(gpus=4, cpu_milli=192_000)
    shares = compute(cfg, CAP, used={}, asked={"a": heavy, "b": gpus(16)})
    # half of the cluster each in dominant units: "a" gets 0.5/0.75 of its ask, "b" 8 GPUs
    assert shares.fair_gpus("a") == pytest.approx(4 * 0.5 / 0.75)
    assert shares.fair_gpus("b") == pytest.approx(8)


def test_decay_halves_each_half_life_and_keeps_what_runs() -> None:
    d = DecayedUsage().advance(0.0, {}, 60)
    d = d.advance(60.0, {"a": 0.5}, 60)
    assert d.usage["a"] == pytest.approx(30.0)
    d = d.advance(120.0, {}, 60)
    assert d.usage["a"] == pytest.approx(15.0)
    assert d.advance(100.0, {"a": 1.0}, 60).usage == d.usage  # a clock that went back changes nothing
    with pytest.raises(ConfigError, match="half_life_s"):
        d.advance(200.0, {}, 0)


def test_decayed_usage_orders_queues_that_stand_alike() -> None:
    cfg = config({"a": {}, "b": {}})
    shares = compute(cfg, CAP, used={}, asked={"a": gpus(8), "b": gpus(8)}, decayed={"a": 100.0, "b": 10.0})
    assert shares.order_key("b") < shares.order_key("a")


def test_reclaim_moves_toward_fair_share_and_never_back() -> None:
    cfg = config({"a": {}, "b": {}})
    shares = compute(cfg, CAP, used={"a": gpus(14), "b": gpus(2)}, asked={"a": gpus(16), "b": gpus(16)})
    assert reclaim_block(shares, victim_queue="a", victim=gpus(2), requester_queue="b", asks=gpus(2)) is None
    # the reverse is refused: b is not below its share... and with b below, taking from a that would end
    # below b's ratio is refused too
    near = compute(cfg, CAP, used={"a": gpus(9), "b": gpus(7)}, asked={"a": gpus(16), "b": gpus(16)})
    why = reclaim_block(near, victim_queue="a", victim=gpus(4), requester_queue="b", asks=gpus(4))
    assert why is not None and why.cause is Cause.INELIGIBLE_FAIR_SHARE and "only move the unfairness" in why.text
    above = reclaim_block(shares, victim_queue="b", victim=gpus(2), requester_queue="a", asks=gpus(2))
    assert above is not None and "not below its fair share" in above.text


def test_reclaim_compares_the_siblings_where_the_paths_part() -> None:
    cfg = config({"org": {}, "ops": {}, "t1": {"parent": "org"}, "t2": {"parent": "org"}})
    # org's two teams hold 12 between them (org's share 8); ops holds 4 and asks more
    shares = compute(cfg, CAP, used={"t1": gpus(6), "t2": gpus(6), "ops": gpus(4)},
                     asked={"t1": gpus(6), "t2": gpus(6), "ops": gpus(16)})
    assert reclaim_block(shares, victim_queue="t1", victim=gpus(2), requester_queue="ops", asks=gpus(2)) is None
    assert QueueTree.of(cfg).parting("t1", "ops") == ("org", "ops")
    assert QueueTree.of(cfg).parting("t1", "org") is None


def test_jain() -> None:
    assert jain([1, 1, 1]) == pytest.approx(1.0)
    assert jain([1, 0, 0, 0]) == pytest.approx(0.25)
    assert jain([]) == 1.0


def test_config_refuses_unknown_parents_and_circles() -> None:
    with pytest.raises(Exception, match="parent"):
        config({"a": {"parent": "nope"}})
    with pytest.raises(Exception, match="circle"):
        config({"a": {"parent": "b"}, "b": {"parent": "a"}})
    with pytest.raises(Exception, match="limit_gpus"):
        config({"a": {"quota_gpus": 4, "limit_gpus": 2}})


def test_a_limited_child_does_not_strand_its_parents_share() -> None:
    """product's only asking team is limited to 4: product can take 4, so the rest goes to research (it was
    given to product by weight and held by no one)."""
    cfg = config({"research": {}, "product": {}, "ads": {"parent": "product", "limit_gpus": 4}})
    shares = compute(cfg, CAP, used={}, asked={"ads": gpus(16), "research": gpus(16)})
    assert shares.fair_gpus("ads") == pytest.approx(4)
    assert shares.fair_gpus("product") == pytest.approx(4)
    assert shares.fair_gpus("research") == pytest.approx(12)
