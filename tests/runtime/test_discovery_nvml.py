"""The nvml backend against FakeNvml (a fake at the pynvml boundary), and once against real NVML if present."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from orchestrator.core.catalogue import gpu_model
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.inventory import GpuDevice, NodeInventory
from orchestrator.core.request import GpuRequest
from orchestrator.scheduling.engine import Placement, place
from orchestrator.scheduling.policies import get_policy
from orchestrator.scheduling.snapshot import ClusterSnapshot, NodeSpec
from orchestrator.control.discovery.nvml import NvmlBackend, nvml_available

from .fake_nvml import two_a100s_one_mig


def test_inventory_from_nvml() -> None:
    fake = two_a100s_one_mig()
    inv = NvmlBackend("gpu-node", nvml=fake).inventory()
    g0, g1 = inv.gpus
    assert (g0.index, g0.uuid, g0.model, g0.memory_mib, g0.mig_enabled) == (0, "GPU-aaaa", "A100-80GB", 81920, False)
    assert g1.mig_enabled and [(d.uuid, d.profile, d.start) for d in g1.mig_devices] == [
        ("MIG-2222", "3g.40gb", 0), ("MIG-1111", "1g.10gb", 6)]
    # NVLink both ways; the link to an NVSwitch (bus 99) names no GPU
    assert g0.nvlink_peers == (1,) and g1.nvlink_peers == (0,)
    assert inv.nvlink_islands() == [frozenset({0, 1})]


def test_xid_events_mark_gpus_unhealthy_except_application_xids() -> None:
    fake = two_a100s_one_mig()
    b = NvmlBackend("gpu-node", nvml=fake)
    b.inventory()
    assert b.poll_events() == []
    assert fake.registered == [0, 1]
    fake.pending_xids += [(0, 13), (1, 79)]  # 13: an application's illegal access; 79: fallen off the bus
    events = b.poll_events()
    assert [(e.gpu_index, e.healthy, e.xid) for e in events] == [(1, False, 79)]
    assert events[0].reason == "XID 79"


def test_unknown_model_starts_as_a_generic_entry_with_a_warning(caplog) -> None:
    fake = two_a100s_one_mig()
    for g in fake.gpus:
        g.name, g.mig_mode, g.migs = "NVIDIA GH200 480GB", None, []
    with caplog.at_level(logging.WARNING):
        backend = NvmlBackend("gh-node", nvml=fake)
        inv = backend.inventory()
        backend.inventory()  # warns once per name, not once per inventory
    assert [g.model for g in inv.gpus] == ["generic:NVIDIA GH200 480GB"] * 2
    assert inv.gpus[0].memory_mib == 81920 and not inv.gpus[0].spec.mig_capable
    warnings = [r.getMessage() for r in caplog.records if "not in the catalogue" in r.getMessage()]
    assert len(warnings) == 1 and "GH200" in warnings[0]
    # The head reads the inventory as JSON in another process: the generic entry travels with it.
    again = NodeInventory.model_validate_json(inv.model_dump_json())
    assert again == inv
    head = subprocess.run(
        [sys.executable, "-c", "import sys; from orchestrator.core.inventory import NodeInventory as N; "
         "print(N.model_validate_json(sys.stdin.read()).gpus[1].spec.memory_mib)"],
        input=inv.model_dump_json(), capture_output=True, text=True, timeout=60)
    assert head.returncode == 0 and head.stdout.strip() == "81920", head.stderr
    # ... and the engine places a share on it: MPS is allowed, MIG is not offered.
    snap = ClusterSnapshot.build([NodeSpec.from_inventory(inv)])
    placed = place(snap, GpuRequest(kind="mps", sm_percent=30, memory_mib=1024), get_policy("bestfit"))
    assert isinstance(placed, Placement) and snap.static.names[placed.allocation.node] == "gh-node"
    assert isinstance(place(snap, GpuRequest(kind="whole", count=2), get_policy("fgd")), Placement)


def test_a_generic_model_needs_its_memory() -> None:
    with pytest.raises(ValueError, match="needs memory_mib"):
        GpuDevice(index=0, uuid="GPU-x", model="generic:NVIDIA Q9")
    with pytest.raises(InvalidRequestError) as e:
        gpu_model("generic:NVIDIA never registered")
    assert e.value.field == "gpu.model"


def test_a_mixed_node_and_mig_creation_are_refused_with_reasons() -> None:
    fake = two_a100s_one_mig()
    fake.gpus[0].name = "NVIDIA Z80"
    with pytest.raises(ValueError, match="one model per node"):
        NvmlBackend("n", nvml=fake).inventory()
    with pytest.raises(InvalidRequestError):
        NvmlBackend("n", nvml=two_a100s_one_mig()).create_mig(1, "1g.10gb", 1)


def test_nvml_available_is_false_when_the_library_does_not_load() -> None:
    class NoLibrary:
        def nvmlInit(self) -> None:
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    assert nvml_available(NoLibrary()) is False
    assert nvml_available(two_a100s_one_mig()) is True


@pytest.mark.gpu
def test_real_nvml_inventory() -> None:
    if not nvml_available():
        pytest.skip("NVML is absent: no NVIDIA driver or GPU on this machine")
    inv = NvmlBackend("this-node").inventory()
    assert inv.gpus and all(g.uuid.startswith("GPU-") for g in inv.gpus)
    for g in inv.gpus:
        assert all(d.uuid.startswith("MIG-") for d in g.mig_devices)


# ---- live MIG repartitioning (reconfigure_mig) ------------------------------------------------------
RECONFIGURE_CALLS = ("nvmlDeviceGetGpuInstanceProfileInfo", "nvmlDeviceGetGpuInstances",
                     "nvmlGpuInstanceGetComputeInstanceProfileInfo", "nvmlGpuInstanceGetComputeInstances",
                     "nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy", "nvmlDeviceCreateGpuInstanceWithPlacement",
                     "nvmlGpuInstanceCreateComputeInstance", "c_nvmlGpuInstance_t", "c_nvmlComputeInstance_t",
                     "c_nvmlGpuInstancePlacement_t", "NVML_GPU_INSTANCE_PROFILE_COUNT",
                     "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED",
                     *(f"NVML_COMPUTE_INSTANCE_PROFILE_{k}_SLICE" for k in (1, 2, 3, 4, 7)))


def test_the_real_pynvml_and_the_fake_both_have_every_call_reconfigure_makes() -> None:
    import pynvml

    fake = two_a100s_one_mig()
    assert [c for c in RECONFIGURE_CALLS if not hasattr(pynvml, c)] == []
    assert [c for c in RECONFIGURE_CALLS if not hasattr(fake, c)] == []


def test_reconfigure_is_refused_without_the_opt_in_and_on_a_card_without_mig_mode(monkeypatch) -> None:
    monkeypatch.delenv("ORCHESTRATOR_ALLOW_MIG_RECONFIGURE", raising=False)
    fake = two_a100s_one_mig()
    with pytest.raises(InvalidRequestError) as e:
        NvmlBackend("n", nvml=fake).reconfigure_mig(1, [("7g.80gb", 0)])
    assert e.value.field == "ORCHESTRATOR_ALLOW_MIG_RECONFIGURE" and e.value.allowed == "1"
    monkeypatch.setenv("ORCHESTRATOR_ALLOW_MIG_RECONFIGURE", "1")
    with pytest.raises(InvalidRequestError) as e:
        NvmlBackend("n", nvml=fake).reconfigure_mig(0, [("7g.80gb", 0)])  # GPU 0 has MIG off: never turned on
    assert e.value.field == "gpu_index" and "never changed" in str(e.value)
    with pytest.raises(InvalidRequestError) as e:
        NvmlBackend("n", nvml=fake).reconfigure_mig(1, [("3g.40gb", 2)])
    assert e.value.field == "layout.3g.40gb" and e.value.allowed == "0, 4"
    assert fake.calls == [] and [m.profile for m in fake.gpus[1].migs] == ["1g.10gb", "3g.40gb"]


@pytest.mark.parametrize("names", [True, False], ids=["profile-names", "old-driver-without-names"])
def test_reconfigure_destroys_only_the_instances_that_go_and_creates_only_the_new_ones(names: bool) -> None:
    fake = two_a100s_one_mig()  # GPU 1: 3g.40gb@0 + 1g.10gb@6
    fake.names = names
    kept_uuid = next(d.uuid for d in NvmlBackend("n", nvml=fake).inventory().gpus[1].mig_devices if d.start == 6)
    backend = NvmlBackend("n", nvml=fake, allow_reconfigure=True)
    devices = backend.reconfigure_mig(1, [("1g.10gb", s) for s in range(7)])
    assert [(d.profile, d.start) for d in devices] == [("1g.10gb", s) for s in range(7)]
    destroys, creates = fake.calls[:2], fake.calls[2:]
    assert destroys == ["destroy-ci 3g.40gb@0", "destroy-gi 3g.40gb@0"]  # 1g.10gb@6 is in both layouts: kept
    assert creates == [c for s in range(6) for c in (f"create-gi 1g.10gb@{s}", f"create-ci 1g.10gb@{s}")]  # never +me
    assert next(d.uuid for d in devices if d.start == 6) == kept_uuid  # its holder's CUDA_VISIBLE_DEVICES holds
    assert len({d.uuid for d in devices}) == 7
    inv = backend.inventory()
    assert inv.gpus[1].mig_devices == devices and inv.gpus[0].mig_devices == ()
    fake.calls.clear()
    assert [(d.profile, d.start) for d in backend.reconfigure_mig(1, [("7g.80gb", 0)])] == [("7g.80gb", 0)]
    assert sorted(c for c in fake.calls if c.startswith("destroy-gi")) == [f"destroy-gi 1g.10gb@{s}" for s in range(7)]


def test_a_layout_the_driver_refuses_puts_the_old_one_back_and_says_so() -> None:
    fake = two_a100s_one_mig()
    fake.gpus[1].fail_create = {"7g.80gb"}
    backend = NvmlBackend("n", nvml=fake, allow_reconfigure=True)
    with pytest.raises(InvalidRequestError) as e:
        backend.reconfigure_mig(1, [("7g.80gb", 0)])
    assert "InsufficientResources" in str(e.value) and "old layout 3g.40gb@0 + 1g.10gb@6 restored" in str(e.value)
    assert [(d.profile, d.start) for d in backend.inventory().gpus[1].mig_devices] == [("3g.40gb", 0), ("1g.10gb", 6)]


@pytest.mark.gpu
def test_real_mig_reconfigure_to_the_same_layout() -> None:
    """Asks one MIG-enabled card for the layout it has: every instance is kept (same UUIDs), nothing destroyed.
    Needs the opt-in and root; never turns MIG mode on or resets a GPU."""
    import os

    if not nvml_available():
        pytest.skip("NVML is absent: no NVIDIA driver or GPU on this machine")
    backend = NvmlBackend("this-node")
    try:
        gpu = next((g for g in backend.inventory().gpus if g.mig_enabled), None)
        if gpu is None:
            pytest.skip("no MIG-capable GPU with MIG mode on (this test never turns MIG mode on)")
        if os.environ.get("ORCHESTRATOR_ALLOW_MIG_RECONFIGURE") != "1":
            pytest.skip(f"GPU {gpu.index} has MIG on; set ORCHESTRATOR_ALLOW_MIG_RECONFIGURE=1 to let this test "
                        "destroy and recreate its instances (nothing may run on it)")
        layout = [(d.profile, d.start) for d in gpu.mig_devices] or [(gpu.spec.mig_profiles[-1].name, 0)]
        devices = backend.reconfigure_mig(gpu.index, layout)
        assert sorted((d.profile, d.start) for d in devices) == sorted(layout)
        assert all(d.uuid.startswith("MIG-") for d in devices)
        assert {d.uuid for d in devices} == {d.uuid for d in gpu.mig_devices} or not gpu.mig_devices
    finally:
        backend.close()
