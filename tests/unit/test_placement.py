"""Scenario tests of the placement engine: declared cluster + requests -> expected placement."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.core.allocation import Allocation
from orchestrator.core.priorities import POLICY_NAMES
from orchestrator.core.reasons import Cause
from orchestrator.core.request import GpuRequest, ShareKind
from orchestrator.scheduling.engine import Placement, Unschedulable, place, warm
from orchestrator.scheduling.policies import get_policy
from orchestrator.scheduling.snapshot import ClusterSnapshot, NodeSpec


def demo() -> ClusterSnapshot:
    return ClusterSnapshot.build([
        NodeSpec("a0", "A100-80GB", 4, mig_enabled=(2, 3),
                 mig_layout=((2, "3g.40gb", 4, "MIG-a0-2-4"), (2, "2g.20gb", 0, "MIG-a0-2-0"),
                             (2, "1g.10gb", 2, "MIG-a0-2-2"), (2, "1g.10gb", 3, "MIG-a0-2-3"))),
        NodeSpec("a1", "A100-80GB", 4),
        NodeSpec("h0", "H100-80GB", 2, nvlink_islands=((0, 1),)),
    ])


def ok(res) -> Placement:
    assert isinstance(res, Placement), getattr(res, "message", res)
    return res


def test_fixed_mig_layout_hands_out_existing_instances() -> None:
    s = demo()
    p = ok(place(s, GpuRequest.mig("1g.10gb"), get_policy("bestfit")))
    a = p.allocation
    assert a.kind is ShareKind.MIG and a.node_name == "a0"
    # GPU 2 has a fixed layout: the slice must be one of its two 1g.10gb instances.
    if a.gpus == (2,):
        assert a.mig_uuid in ("MIG-a0-2-2", "MIG-a0-2-3")
    s = s.apply(a)
    # 3g.40gb exists only at slot 4 of GPU 2, and GPU 3 can make one on demand.
    p2 = ok(place(s, GpuRequest.mig("3g.40gb"), get_policy("bestfit")))
    assert (p2.allocation.gpus, p2.allocation.mig_start) in (((2,), 4), ((3,), 0), ((3,), 4))


def test_fixed_layout_refuses_profiles_it_lacks() -> None:
    s = ClusterSnapshot.build([NodeSpec("a0", "A100-80GB", 1, mig_enabled=(0,),
                                        mig_layout=((0, "7g.80gb", 0, "MIG-x"),))])
    res = place(s, GpuRequest.mig("1g.10gb"), get_policy("bestfit"))
    assert isinstance(res, Unschedulable)
    assert "MIG: no free valid placement" in res.message


def test_multi_gpu_prefers_one_nvlink_island() -> None:
    s = ClusterSnapshot.build([NodeSpec("n", "A100-80GB", 4, nvlink_islands=((0, 1), (2, 3)))])
    s = s.apply(ok(place(s, GpuRequest.whole(1), get_policy("bestfit"))).allocation)
    p = ok(place(s, GpuRequest.whole(2), get_policy("bestfit")))
    taken = set(p.allocation.gpus)
    assert taken in ({0, 1}, {2, 3}), "two GPUs must come from one island when one has room"


def on_card(s: ClusterSnapshot, col: int, kind: ShareKind, milli: int) -> Allocation:
    """What a lease holding ``kind`` on card ``col`` of the first node holds."""
    return Allocation(node=0, node_name=s.node_names[0], kind=kind, gpus=(col,), gpu_indices=(col,),
                      gpu_uuids=(s.static.uuids[0][col],), model="A100-80GB", milli=milli,
                      memory_mib=int(s.static.gpu_memory[0]) if kind is ShareKind.WHOLE else 0)


@pytest.mark.parametrize("policy", sorted(POLICY_NAMES))
def test_nvlink_is_required_when_asked(policy: str) -> None:
    """Two free cards in different islands: an ``nvlink=True`` request is refused for NVLink (a plain
    one takes them); once an island has two free cards, the request lands inside it."""
    s = ClusterSnapshot.build([NodeSpec("n", "A100-80GB", 4, nvlink_islands=((0, 1), (2, 3)))])
    share = on_card(s, 2, ShareKind.TIMESLICE, 500)
    s = s.apply(on_card(s, 1, ShareKind.WHOLE, 1000)).apply(share)  # free whole cards: 0 and 3
    res = place(s, GpuRequest.whole(2, nvlink=True), get_policy(policy))
    assert isinstance(res, Unschedulable), res
    assert [(r.cause, c) for _, r, c in res.reasons] == [(Cause.FIT_NVLINK, 1)]
    assert "1 node: no NVLink island with enough free GPUs" in res.message
    assert ok(place(s, GpuRequest.whole(2), get_policy(policy))).allocation.gpus == (0, 3)
    s = s.release(share)  # island (2, 3) is free again
    assert ok(place(s, GpuRequest.whole(2, nvlink=True), get_policy(policy))).allocation.gpus == (2, 3)


def test_cards_no_island_lists_are_not_linked() -> None:
    """A node that lists only (0, 1) as an island: cards 2 and 3 have no NVLink (as an inventory says of a
    card without peers), so with card 0 down an ``nvlink=True`` pair has nowhere to go."""
    s = ClusterSnapshot.build([NodeSpec("n", "A100-80GB", 4, nvlink_islands=((0, 1),))]).with_health("n", 0, False)
    res = place(s, GpuRequest.whole(2, nvlink=True), get_policy("bestfit"))
    assert isinstance(res, Unschedulable), f"placed on {res.allocation.gpus}"
    assert [r.cause for _, r, _ in res.reasons] == [Cause.FIT_NVLINK]


def test_unschedulable_groups_reasons_with_counts() -> None:
    nodes = [NodeSpec(f"t{i}", "T4", 2) for i in range(5)] + [NodeSpec(f"v{i}", "V100M32", 4, cpu_milli=1000) for i in range(3)]
    s = ClusterSnapshot.build(nodes)
    res = place(s, GpuRequest.whole(1, models="V100M16|V100M32", cpu_milli=4000), get_policy("bestfit"))
    assert isinstance(res, Unschedulable)
    reasons = {(r.cause, r.text): c for _, r, c in res.reasons}
    assert reasons == {(Cause.FIT_MODEL, "GPU model not in V100M16|V100M32"): 5, (Cause.FIT_CPU, "not enough free CPU"): 3}
    assert [row["cause"] for row in res.to_json()["reasons"]] == ["fit.model", "fit.cpu"]
    assert "5 nodes: GPU model not in V100M16|V100M32" in res.message
    assert "3 nodes: not enough free CPU" in res.message


def test_unified_request_falls_back_and_says_so() -> None:
    s = ClusterSnapshot.build([NodeSpec("t", "T4", 1)])  # no MIG anywhere
    p = ok(place(s, GpuRequest(memory_mib=4096, compute=0.2, isolation="hard"), get_policy("bestfit")))
    assert p.allocation.kind is ShareKind.WHOLE
    assert "mig did not fit" in p.reason.text and p.reason.cause is Cause.PLACED


def test_modes_do_not_mix_on_a_card() -> None:
    s = ClusterSnapshot.build([NodeSpec("a", "A100-80GB", 1)])
    s = s.apply(ok(place(s, GpuRequest.mps(30, 10240), get_policy("bestfit"))).allocation)
    assert isinstance(place(s, GpuRequest.timeslice(0.1), get_policy("bestfit")), Unschedulable)
    assert isinstance(place(s, GpuRequest.whole(1), get_policy("bestfit")), Unschedulable)
    p = ok(place(s, GpuRequest.mps(70, 10240), get_policy("bestfit")))
    s = s.apply(p.allocation)
    res = place(s, GpuRequest.mps(1, 0), get_policy("bestfit"))
    assert isinstance(res, Unschedulable) and "no GPU with enough free compute" in res.message


def test_mps_memory_limit_is_enforced() -> None:
    s = ClusterSnapshot.build([NodeSpec("a", "T4", 1)])  # 15 GiB
    s = s.apply(ok(place(s, GpuRequest.mps(20, 12 * 1024), get_policy("bestfit"))).allocation)
    res = place(s, GpuRequest.mps(20, 4 * 1024), get_policy("bestfit"))
    assert isinstance(res, Unschedulable) and "not enough free GPU memory" in res.message


def test_random_policy_is_seeded_and_deterministic_policies_are_stable() -> None:
    nodes = [NodeSpec(f"n{i}", "A100-80GB", 8) for i in range(20)]
    s = ClusterSnapshot.build(nodes)
    picks = lambda seed: [place(s, GpuRequest.whole(1), get_policy("random"), rng=np.random.default_rng(seed)).allocation.node_name  # noqa: E731
                          for _ in range(1)]
    assert picks(1) == picks(1)
    assert len({place(s, GpuRequest.whole(1), get_policy("random"), rng=np.random.default_rng(k)).allocation.node_name
                for k in range(20)}) > 3
    a = place(s, GpuRequest.whole(1), get_policy("bestfit")).allocation
    b = place(s, GpuRequest.whole(1), get_policy("bestfit")).allocation
    assert a == b and a.node_name == "n0"  # ties without an rng go to the lowest index


def test_bestfit_packs_and_spread_spreads() -> None:
    s = ClusterSnapshot.build([NodeSpec(f"n{i}", "A100-80GB", 4) for i in range(3)])
    first = ok(place(s, GpuRequest.timeslice(0.5), get_policy("bestfit"))).allocation
    s = s.apply(first)
    again = ok(place(s, GpuRequest.timeslice(0.5), get_policy("bestfit"))).allocation
    assert (again.node_name, again.gpus) == (first.node_name, first.gpus)
    spread = ok(place(s, GpuRequest.timeslice(0.5), get_policy("spread"))).allocation
    assert spread.node_name != first.node_name


def test_unknown_policy_is_refused() -> None:
    from orchestrator.core.errors import InvalidRequestError
    with pytest.raises(InvalidRequestError) as e:
        get_policy("magic")
    assert e.value.field == "policy" and "bestfit" in e.value.allowed
    assert "fgd" in POLICY_NAMES and "default" in POLICY_NAMES


def test_health_change_steers_new_work_away() -> None:
    s = ClusterSnapshot.build([NodeSpec("a", "A100-80GB", 1), NodeSpec("b", "A100-80GB", 1)])
    s = s.with_health("a", 0, False)
    p = ok(place(s, GpuRequest.whole(1), get_policy("bestfit")))
    assert p.allocation.node_name == "b"
    s = s.apply(p.allocation)
    res = place(s, GpuRequest.whole(1), get_policy("bestfit"))
    assert isinstance(res, Unschedulable) and "all GPUs unhealthy" in res.message


def test_warm_readies_what_was_placed_since_and_nothing_else(monkeypatch) -> None:
    """engine.warm (the head's step 8) does for the requests placed since its last call the work the next
    placement of each would do on this snapshot, so that placement does none; it leaves the others alone."""
    policy = get_policy("default")
    scored: list[int] = []
    node_score = type(policy).node_score

    def spy(self, snap, nodes, *args):  # how many nodes' node-wide term each call computes
        scored.append(len(nodes))
        return node_score(self, snap, nodes, *args)

    monkeypatch.setattr(type(policy), "node_score", spy)
    s = ClusterSnapshot.build([NodeSpec(f"n{i}", "A100-80GB", 4) for i in range(3)])
    small, whole = GpuRequest.timeslice(0.25), GpuRequest.whole(1)
    s = s.apply(ok(place(s, small, policy)).allocation)
    ok(place(s, whole, policy))
    s = s.apply(ok(place(s, small, policy)).allocation)  # the whole request's totals are now one node behind
    assert warm(s, policy) == 2
    scored.clear()
    assert warm(s, policy) == 0, "nothing was placed since the last warm"
    first = ok(place(s, small, policy))
    ok(place(s, whole, policy))
    assert scored == [], "the warmed totals were recomputed by the placement"
    s2 = s.apply(first.allocation)
    assert warm(s2, policy, most=1) == 1, "at most ``most``, the most recent first (the whole card)"
    scored.clear()
    ok(place(s2, whole, policy))
    assert scored == []
    ok(place(s2, small, policy))
    assert scored == [1], "the request warm left alone is brought up to date by its placement: one node changed"
