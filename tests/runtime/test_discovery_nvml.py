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
