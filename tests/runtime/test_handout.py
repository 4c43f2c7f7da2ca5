"""Lease -> Ray actor options: per-card resources make Ray place exactly what the ledger granted
(num_gpus keeps its accounting truthful where a node declares none); env binds the devices."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.request import GpuRequest, ShareKind
from orchestrator.scheduling.engine import Placement, place
from orchestrator.scheduling.policies import get_policy
from orchestrator.core.allocation import Allocation
from orchestrator.scheduling.snapshot import ClusterSnapshot
from orchestrator.core.config import ClusterConfig
from orchestrator.control.handout import NOSET_CUDA_VISIBLE_DEVICES, card_shares, device_env, make_handout, ray_num_gpus


def _alloc(kind: ShareKind, **kw: object) -> Allocation:
    base = dict(node=0, node_name="n", kind=kind, gpus=(0,), gpu_indices=(3,), gpu_uuids=("GPU-x",), model="A100-80GB",
                milli=0, memory_mib=0)
    base.update(kw)
    return Allocation(**base)  # type: ignore[arg-type]


def test_num_gpus_per_kind() -> None:
    assert ray_num_gpus(_alloc(ShareKind.WHOLE, gpus=(0, 1), gpu_indices=(0, 1), gpu_uuids=("a", "b"))) == 2.0
    assert ray_num_gpus(_alloc(ShareKind.MIG, mig_profile="3g.40gb", mig_start=0)) == 0.4285
    assert ray_num_gpus(_alloc(ShareKind.MPS, sm_percent=30, milli=300)) == 0.3
    assert ray_num_gpus(_alloc(ShareKind.TIMESLICE, milli=250)) == 0.25
    assert ray_num_gpus(_alloc(ShareKind.TIMESLICE, milli=250), timeslice_capacity_milli=2000) == 0.125


def test_shares_of_one_card_never_sum_above_one_in_rays_books(demo: ClusterConfig) -> None:
    # The demo's fuller MIG card: 4g + 1g + 1g + 1g(20gb) = 7 of 7 compute slices.
    layout = demo.node("a100-1").mig[3]  # type: ignore[union-attr]
    total = sum(ray_num_gpus(_alloc(ShareKind.MIG, mig_profile=m.profile, mig_start=m.start)) for m in layout)
    assert 0.99 < total <= 1.0
    assert sum(ray_num_gpus(_alloc(ShareKind.MPS, sm_percent=p, milli=p * 10)) for p in (33, 33, 34)) <= 1.0


def test_env_per_kind() -> None:
    common = dict(lease_id="L", fencing_token=7, mps_pipe_root="/run/mps/")
    whole = device_env(_alloc(ShareKind.WHOLE, gpu_uuids=("GPU-a", "GPU-b"), gpus=(0, 1), gpu_indices=(0, 1)), **common)
    assert whole["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b" and whole[NOSET_CUDA_VISIBLE_DEVICES] == "1"
    assert whole["ORCHESTRATOR_LEASE_ID"] == "L" and whole["ORCHESTRATOR_FENCING_TOKEN"] == "7"
    mig = device_env(_alloc(ShareKind.MIG, mig_profile="1g.10gb", mig_start=6, mig_uuid="MIG-z"), **common)
    assert mig["CUDA_VISIBLE_DEVICES"] == "MIG-z"
    mps = device_env(_alloc(ShareKind.MPS, sm_percent=30, milli=300, memory_mib=20480, client_priority=1), **common)
    assert mps["CUDA_VISIBLE_DEVICES"] == "GPU-x"
    assert mps["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert mps["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert mps["CUDA_MPS_PIPE_DIRECTORY"] == "/run/mps/gpu-3"
    assert mps["CUDA_MPS_CLIENT_PRIORITY"] == "1"
    ts = device_env(_alloc(ShareKind.TIMESLICE, milli=250), **common)
    assert ts["CUDA_VISIBLE_DEVICES"] == "GPU-x" and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in ts


def test_a_mig_allocation_without_a_uuid_is_refused_until_the_instance_exists() -> None:
    a = _alloc(ShareKind.MIG, mig_profile="1g.10gb", mig_start=0)
    with pytest.raises(InvalidRequestError) as e:
        device_env(a, lease_id="L", fencing_token=1, mps_pipe_root="/m")
    assert e.value.field == "allocation.mig_uuid"
    assert device_env(a, lease_id="L", fencing_token=1, mps_pipe_root="/m", mig_uuid="MIG-new")["CUDA_VISIBLE_DEVICES"] == "MIG-new"


def test_handout_from_a_real_placement_on_the_demo(demo: ClusterConfig) -> None:
    snap = ClusterSnapshot.build([n.inventory() for n in demo.nodes])
    p = place(snap, GpuRequest.mig("2g.20gb"), get_policy("bestfit"))
    assert isinstance(p, Placement)
    h = make_handout(p.allocation, ray_node_id="abc", lease_id="L", fencing_token=1, mps_pipe_root="/m")
    assert h.node_id == "abc" and h.node_name == "a100-1" and h.num_gpus == 0.2857
    assert h.resources == {f"rgo-gpu-{p.allocation.gpu_indices[0]}": 0.2857}
    assert h.env_vars["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
    assert type(h).from_dict(h.to_dict()) == h


_REQUESTS = [GpuRequest.whole(1), GpuRequest.whole(2), GpuRequest.mig("1g.10gb"), GpuRequest.mig("3g.40gb"),
             GpuRequest.mig("2g.20gb"), GpuRequest.mig("4g.40gb"), GpuRequest.mig("1g.20gb"), GpuRequest.mps(30), GpuRequest.mps(40), GpuRequest.mps(60), GpuRequest.mps(33),
             GpuRequest.timeslice(0.25), GpuRequest.timeslice(0.6), GpuRequest.timeslice(1.0)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.lists(st.sampled_from(range(len(_REQUESTS))), min_size=1, max_size=40),
       policy=st.sampled_from(["bestfit", "default", "spread"]), capacity=st.sampled_from([1000, 2000]))
def test_what_the_ledger_grants_ray_can_place_card_by_card(demo: ClusterConfig, order: list[int], policy: str,
                                                           capacity: int) -> None:
    """The per-card resources of every placement the engine makes, in any arrival order, fit each card's one
    unit: Ray can place every granted holder (the 0.4, 0.4, 0.6, 0.6 + whole order of docs/runtime.md included)."""
    snap = ClusterSnapshot.build([n.inventory() for n in demo.nodes], timeslice_capacity_milli=capacity)
    held: dict[tuple[str, str], float] = {}
    for i in order:
        p = place(snap, _REQUESTS[i], get_policy(policy))
        if not isinstance(p, Placement):
            continue
        snap = snap.apply(p.allocation)
        for res, share in card_shares(p.allocation, timeslice_capacity_milli=capacity).items():
            assert res.startswith("rgo-gpu-") and 0 < share <= 1
            held[(p.allocation.node_name, res)] = held.get((p.allocation.node_name, res), 0.0) + share
    assert all(total <= 1.0 + 1e-9 for total in held.values()), held


def test_card_shares_per_kind() -> None:
    assert card_shares(_alloc(ShareKind.WHOLE, gpus=(0, 1), gpu_indices=(0, 2), gpu_uuids=("a", "b"))) == {
        "rgo-gpu-0": 1.0, "rgo-gpu-2": 1.0}
    assert card_shares(_alloc(ShareKind.MIG, mig_profile="3g.40gb", mig_start=0)) == {"rgo-gpu-3": 0.4285}
    assert card_shares(_alloc(ShareKind.MPS, sm_percent=40, milli=400)) == {"rgo-gpu-3": 0.4}
    assert card_shares(_alloc(ShareKind.TIMESLICE, milli=600), timeslice_capacity_milli=2000) == {"rgo-gpu-3": 0.3}
