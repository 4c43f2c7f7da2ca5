"""A request's ordered fallback (issue #36 item 1): the ``a|b|c`` grammar and its errors, resolve's order and
reasons, the engine taking a later choice when the earlier ones are full, and the cycle preempting for a later
choice only within its queue's quota (what a time window guarantees), counting what each grant holds."""

from __future__ import annotations

from typing import Sequence

import pytest

from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.inventory import GpuDevice, MigDevice
from orchestrator.core.lease import Lease, LeaseState
from orchestrator.core.priorities import PriorityClass, QueueConfig, SchedulerConfig
from orchestrator.core.reasons import Cause
from orchestrator.core.request import MAX_FALLBACK, GpuRequest, ShareKind
from orchestrator.core.gang_request import GangRequest
from orchestrator.scheduling.alternatives import alternative_demand, resolve
from orchestrator.scheduling.autoscale import reachable_replicas
from orchestrator.scheduling.cycle import PendingItem, schedule
from orchestrator.scheduling.engine import Placement, Unschedulable, place
from orchestrator.scheduling.policies import get_policy
from orchestrator.scheduling.snapshot import ClusterSnapshot, NodeSpec
from orchestrator.sim.perfmodel import InferenceModel, ShareSpeed
from orchestrator.sim.queueing import ReplicaKind, step as queue_step, step_mixed

POLICY = get_policy("bestfit")
CHAIN = "mig:1g.10gb|mig:2g.20gb|mps:30|1"
NOW = 1000.0


# ---- the grammar -------------------------------------------------------------------------------------------------
def test_a_chain_parses_in_order_in_every_form_and_round_trips() -> None:
    r = GpuRequest.parse(CHAIN)
    assert [c.describe() for c in r.choices] == ["mig:1g.10gb", "mig:2g.20gb", "mps:30%", "1x whole"]
    assert r.kind is ShareKind.MIG and r.gpu_demand == pytest.approx(1 / 7)  # the first choice's
    assert GpuRequest.parse(CHAIN.split("|")) == r  # a YAML list
    assert GpuRequest(kind="mig", profile="1g.10gb", fallback=["mig:2g.20gb", "mps:30", {"kind": "whole"}]) == r
    assert GpuRequest.model_validate_json(r.model_dump_json()) == r
    assert "fallback" not in GpuRequest.parse("mig:1g.10gb").model_dump_json()  # records keep their bytes
    assert r.describe() == "mig:1g.10gb, else mig:2g.20gb, else mps:30%, else 1x whole"


@pytest.mark.parametrize("text,field", [
    ("mig:1g.10gb||1", "gpu.fallback[1]"),
    ("mig:1g.10gb|mps:300", "gpu.fallback[1].sm_percent"),
    ("mig:1g.10gb|1|mig:9g.99gb", "gpu.fallback[2].profile"),
    ("|1", "gpu"),
    ("|".join(["1"] * (MAX_FALLBACK + 2)), "gpu.fallback"),
    (["mig:1g.10gb", 3], "gpu"),
])
def test_a_bad_chain_is_refused_naming_the_choice(text: object, field: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        GpuRequest.parse(text)  # type: ignore[arg-type]
    assert e.value.field == field, e.value


def test_a_fallback_is_flat_short_and_shares_its_requests_node_wide_constraints() -> None:
    with pytest.raises(InvalidRequestError) as e:
        GpuRequest(kind="whole", fallback=[{"kind": "whole", "count": 2, "fallback": ["1"]}])
    assert e.value.field == "fallback[1].fallback"
    with pytest.raises(InvalidRequestError) as e:
        GpuRequest(kind="whole", fallback=[{"kind": "whole", "node": "n1"}])
    assert e.value.field == "fallback[1].node"
    with pytest.raises(InvalidRequestError) as e:
        GpuRequest(kind="whole", count=2, fallback=["1"] * (MAX_FALLBACK + 1))
    assert e.value.field == "fallback"
    with pytest.raises(InvalidRequestError) as e:
        GangRequest.parse("2xmig:1g.10gb|1")
    assert e.value.field == "gang.worker.fallback"
    pinned = GpuRequest(kind="mig", profile="1g.10gb", node="n1", models=("A100-80GB",), fallback=["1"])
    assert [(c.node, c.models) for c in pinned.choices] == [("n1", ("A100-80GB",))] * 2


# ---- resolve -----------------------------------------------------------------------------------------------------
def test_resolve_gives_each_choice_in_order_with_its_reason_and_drops_repeats() -> None:
    alts = resolve(GpuRequest.parse(CHAIN + "|mig:1g.10gb")).alternatives
    assert [(a.kind, a.choice) for a in alts] == [(ShareKind.MIG, 0), (ShareKind.MIG, 1), (ShareKind.MPS, 2),
                                                   (ShareKind.WHOLE, 3)]
    assert [a.reason for a in alts] == ["choice 1 of 5: MIG 1g.10gb as asked", "fallback 2 of 5: MIG 2g.20gb as asked",
                                        "fallback 3 of 5: MPS 30% as asked", "fallback 4 of 5: 1 whole card(s) as asked"]
    assert [alternative_demand(a) for a in alts] == pytest.approx([1 / 7, 2 / 7, 0.3, 1.0])
    unified = resolve(GpuRequest.parse("mem=10GiB,compute=0.14,isolation=hard|mps:25|1")).alternatives
    assert [a.kind for a in unified] == [ShareKind.MIG, ShareKind.MPS, ShareKind.WHOLE]  # its whole card goes last
    assert unified[-1].reason == "fallback 3 of 3: 1 whole card(s) as asked"
    plain = resolve(GpuRequest.parse("mig:1g.10gb")).alternatives
    assert [(a.reason, a.choice) for a in plain] == [("MIG 1g.10gb as asked", 0)]  # no chain: as before


# ---- the engine --------------------------------------------------------------------------------------------------
def cluster() -> ClusterSnapshot:
    """``m``: one A100 in the night layout (4g + 2g + 1g, fixed); ``h``: two H100s without MIG."""
    layout = ((0, "4g.40gb", 0, "MIG-m-0-0"), (0, "2g.20gb", 4, "MIG-m-0-4"), (0, "1g.10gb", 6, "MIG-m-0-6"))
    return ClusterSnapshot.build([NodeSpec("m", "A100-80GB", 1, mig_enabled=(0,), mig_layout=layout),
                                  NodeSpec("h", "H100-80GB", 2)])


def test_the_engine_takes_the_next_choice_when_the_earlier_ones_are_full() -> None:
    req = GpuRequest.parse(CHAIN)
    snap = cluster()
    got = []
    for _ in range(3 + 6):
        res = place(snap, req, POLICY)
        if not isinstance(res, Placement):
            break
        got.append((res.allocation.node_name, res.allocation.mig_profile or res.allocation.kind.value))
        snap = snap.apply(res.allocation)
    # the 1g slice, then the 2g slice, then MPS shares of 30% on the H100s (three a card); the 4g slice is no choice
    assert got == [("m", "1g.10gb"), ("m", "2g.20gb")] + [("h", "mps")] * 6
    assert isinstance(res, Unschedulable)
    assert {a for a, _, _ in res.reasons} == {"mig:1g.10gb", "mig:2g.20gb", "mps:0.3", "whole x1"}


def test_the_whole_card_is_the_last_choice_and_the_reason_says_which_choice_it_is() -> None:
    snap = cluster()
    req = GpuRequest.parse("mig:1g.10gb|mig:2g.20gb|1")
    for _ in range(2):
        snap = snap.apply(place(snap, req, POLICY).allocation)  # type: ignore[union-attr]
    res = place(snap, req, POLICY)
    assert isinstance(res, Placement) and res.allocation.node_name == "h" and res.allocation.kind is ShareKind.WHOLE
    assert res.reason.text.startswith("fallback 3 of 3: 1 whole card(s) as asked; bestfit chose h GPU")
    assert "(mig:1g.10gb did not fit; mig:2g.20gb did not fit)" in res.reason.text


# ---- the cycle: quota counts what is granted; preemption for a later choice within the quota ------------------
def config(quota: float | None, borrowing: bool = True) -> SchedulerConfig:
    return SchedulerConfig(
        classes={"inference": PriorityClass(priority=1000, preemptible=False),
                 "training": PriorityClass(priority=100, min_runtime_s=0, grace_period_s=30)},
        queues={"default": QueueConfig(), "inference": QueueConfig(quota_gpus=quota, borrowing=borrowing),
                "training": QueueConfig()}, default_class="training")


def held(snap: ClusterSnapshot, cfg: SchedulerConfig, specs: Sequence[tuple[str, str, str]]) -> tuple[ClusterSnapshot, list[Lease]]:
    """Each (id, --gpu request, class) placed in turn and held since t=0, checkpointed at t=900."""
    leases = []
    for lid, text, cls in specs:
        req = GpuRequest.parse(text)
        res = place(snap, req, POLICY)
        assert isinstance(res, Placement), res
        snap = snap.apply(res.allocation)
        lease = Lease.new(lid, req, now=0, owner=lid, priority=cfg.classes[cls].priority, priority_class=cls, queue=cls)
        lease = lease.grant(res.allocation, len(leases) + 1, now=0, reason="test")
        leases.append(lease.transition(LeaseState.ACTIVE, now=1, reason="test", last_checkpoint_at=900))
    return snap, leases


def full(cfg: SchedulerConfig) -> tuple[ClusterSnapshot, list[Lease]]:
    """Inference holds the 1g slice; training the 4g and 2g slices and both H100s."""
    return held(cluster(), cfg, [("inf-0", "mig:1g.10gb", "inference"), ("t-4g", "mig:4g.40gb", "training"),
                                 ("t-2g", "mig:2g.20gb", "training"), ("t-h0", "1", "training"),
                                 ("t-h1", "1", "training")])


def ask(i: str, text: str) -> PendingItem:
    return PendingItem(i, GpuRequest.parse(text), 1000, "inference", 0.0, "inference")


def test_a_request_whose_every_choice_is_full_preempts_for_a_later_choice_within_its_quota() -> None:
    cfg = config(quota=4.0)
    snap, leases = full(cfg)
    plan = schedule(snap, [ask("inf-1", "mig:1g.10gb|1")], leases, cfg, NOW, POLICY)
    assert not plan.grants
    (p,) = plan.preemptions
    assert p.victim.lease_id in ("t-h0", "t-h1") and p.for_item == "inf-1"
    (w,) = plan.waiting
    assert w.reason.cause is Cause.WAIT_PREEMPTING
    assert "admits 1x whole (fallback 2 of 2) on h" in w.reason.text, w.reason.text
    assert w.reason.text.endswith("on h; no preemption within the quota makes room for an earlier choice")
    # in the order given: a 2g slice held by training comes before a whole card
    plan = schedule(snap, [ask("inf-1", "mig:1g.10gb|mig:2g.20gb|1")], leases, cfg, NOW, POLICY)
    assert [p.victim.lease_id for p in plan.preemptions] == ["t-2g"]


def test_no_preemption_for_a_choice_beyond_the_quota_and_the_reason_says_so() -> None:
    cfg = config(quota=0.5)  # the 1g slice held (1/7) and another (2/7) fit under it; a whole card does not
    snap, leases = full(cfg)
    plan = schedule(snap, [ask("inf-1", "mig:1g.10gb|1")], leases, cfg, NOW, POLICY)
    assert not plan.preemptions and not plan.grants
    (w,) = plan.waiting
    assert w.preemption_blocked is not None
    assert w.preemption_blocked.text.endswith("beyond its queue's quota, so not preempted for: fallback 2 of 2 (1 GPUs)")


def test_beyond_the_quota_a_later_choice_only_borrows_idle_capacity() -> None:
    cfg = config(quota=0.5)
    snap, leases = held(cluster(), cfg, [("inf-0", "mig:1g.10gb", "inference"), ("t-2g", "mig:2g.20gb", "training"),
                                         ("t-h0", "1", "training")])
    plan = schedule(snap, [ask("inf-1", "mig:1g.10gb|mig:2g.20gb|1")], leases, cfg, NOW, POLICY)
    (g,) = plan.grants
    assert g.placement.allocation.node_name == "h" and g.placement.allocation.kind is ShareKind.WHOLE
    assert g.reason.cause is Cause.PLACED_BORROWING and not plan.preemptions


def test_a_grant_counts_what_it_holds_against_the_quota_not_its_first_choice() -> None:
    cfg = config(quota=2.0, borrowing=False)
    snap, leases = held(cluster(), cfg, [("inf-0", "mig:1g.10gb", "inference")])
    # a's 1g slice is taken (no 1g left), so a gets a whole card; b's whole card would then pass 2 GPUs
    plan = schedule(snap, [ask("a", "mig:1g.10gb|1"), ask("b", "1")], leases, cfg, NOW, POLICY)
    assert [(g.item_id, g.placement.allocation.kind) for g in plan.grants] == [("a", ShareKind.WHOLE)]
    (w,) = plan.waiting
    assert w.item_id == "b" and w.reason.cause is Cause.WAIT_QUOTA  # 1/7 + 1 + 1 > 2: a counted as a whole card


# ---- the scaling loop's ceiling ----------------------------------------------------------------------------------
def test_the_scaling_loops_ceiling_counts_what_the_whole_chain_reaches() -> None:
    night = (MigDevice(uuid="MIG-a", profile="4g.40gb", start=0), MigDevice(uuid="MIG-b", profile="2g.20gb", start=4),
             MigDevice(uuid="MIG-c", profile="1g.10gb", start=6))
    cards = [GpuDevice(index=0, uuid="GPU-m", model="A100-80GB", mig_enabled=True, mig_devices=night),
             *(GpuDevice(index=i, uuid=f"GPU-h{i}", model="H100-80GB") for i in (1, 2))]
    assert reachable_replicas(GpuRequest.parse("mig:1g.10gb"), cards) == 1  # the 1g slices alone
    assert reachable_replicas(GpuRequest.parse("mig:1g.10gb|mig:2g.20gb"), cards) == 2
    assert reachable_replicas(GpuRequest.parse("mig:1g.10gb|mig:2g.20gb|mps:25|1"), cards) == 2 + 2 * 4
    assert reachable_replicas(GpuRequest.parse("mig:1g.10gb|1"), cards) == 1 + 2
    assert reachable_replicas(GpuRequest.parse("mig:1g.10gb|2"), cards) == 1 + 1  # two cards a replica
    # within a quota: the choices in order while the queue is within it (the last may pass it, borrowing)
    chain = GpuRequest.parse("mig:1g.10gb|mig:2g.20gb|mps:25|1")
    assert [reachable_replicas(chain, cards, quota_gpus=q) for q in (0.1, 0.2, 0.5, 3.0, None)] == [1, 2, 10, 10, 10]
    assert reachable_replicas(chain, cards, quota_gpus=0.0) == 0
    on_demand = GpuDevice(index=0, uuid="GPU-d", model="A100-80GB", mig_enabled=True)
    assert reachable_replicas(GpuRequest.parse("mig:2g.20gb|mig:1g.10gb"), [on_demand]) == 7
    assert reachable_replicas(GpuRequest.parse("mem=10GiB,compute=0.1,isolation=hard"), cards) is None


# ---- the simulated day's queue when replicas fell back to several kinds ----------------------------------------
def test_a_service_of_several_kinds_counts_each_kinds_busy_time_at_its_own_share() -> None:
    model = InferenceModel(100, 25, 0.04)
    one_g, mps = ReplicaKind(ShareSpeed.mig("1g.10gb"), model, 8), ReplicaKind(ShareSpeed.mps(25), model, 8)
    kinds = {one_g: 24, mps: 25}
    for lam in (10.0, 1e5):  # keeping up, and far beyond (every replica busy all the step)
        out, card_s = step_mixed(kinds, lam, 0.5, 0.0, 30.0)
        assert card_s <= (24 / 7 + 25 * 0.25) * 0.5 + 1e-9
        assert out.arrived == pytest.approx(lam * 0.5) and out.answered + out.dropped == pytest.approx(out.arrived)
    # far beyond, each kind is busy all the step at its own share: not all 49 replicas at the commonest kind's
    assert card_s == pytest.approx((24 / 7 + 25 * 0.25) * 0.5)
    single, card = step_mixed({one_g: 24}, 50.0, 0.5, 3.0, 30.0)
    assert single == queue_step(one_g, 24, 50.0, 0.5, 3.0, 30.0) and card == pytest.approx(single.busy_replica_s / 7)
    nobody, card = step_mixed({}, 5.0, 0.5, 0.0, 30.0)
    assert nobody.dropped == nobody.arrived == 2.5 and card == 0
