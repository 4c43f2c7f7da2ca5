"""The catalogue's MIG tables match NVIDIA's MIG user guide."""

from __future__ import annotations

import pytest

from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.catalogue import CATALOGUE, MIG_MEMORY_SLICES, fill_mig, fit_mig, gpu_model
from orchestrator.core.inventory import GpuDevice, MigDevice, NodeInventory


@pytest.mark.parametrize("model,profiles", [
    ("A100-40GB", ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
    ("A100-80GB", ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    ("H100-80GB", ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    ("H100-NVL", ["1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"]),
    ("H200-141GB", ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]),
    ("B200-180GB", ["1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"]),
    ("A30-24GB", ["1g.6gb", "2g.12gb", "4g.24gb"]),
])
def test_profiles(model, profiles) -> None:
    assert [p.name for p in gpu_model(model).mig_profiles] == profiles


def test_placements_are_the_guides() -> None:
    p = {x.name: x for x in gpu_model("A100-80GB").mig_profiles}
    assert p["1g.10gb"].placements == (0, 1, 2, 3, 4, 5, 6)
    assert p["1g.20gb"].placements == (0, 2, 4, 6)
    assert p["2g.20gb"].placements == (0, 2, 4)
    assert p["3g.40gb"].placements == (0, 4)
    assert p["4g.40gb"].placements == (0,)
    assert p["7g.80gb"].placements == (0,)
    for m in CATALOGUE.values():
        for prof in m.mig_profiles:
            for s in prof.placements:
                assert s + prof.memory_slices <= MIG_MEMORY_SLICES


def test_a30_is_a_four_by_four_grid_with_nvidias_placements() -> None:
    p = {x.name: x for x in gpu_model("NVIDIA A30").mig_profiles}
    assert p["1g.6gb"].placements == (0, 1, 2, 3) and p["1g.6gb"].compute_fraction == 0.25
    assert p["2g.12gb"].placements == (0, 2) and p["2g.12gb"].memory_slices == 2
    assert p["4g.24gb"].placements == (0,) and p["4g.24gb"].compute_fraction == 1.0
    assert p["4g.24gb"].memory_mib == 24576
    # Four 1g.6gb fill the card: a 2g.12gb overlaps any of them.
    used = 0
    for start in p["1g.6gb"].placements:
        used |= p["1g.6gb"].mask(start)
    assert all(used & p["2g.12gb"].mask(s) for s in p["2g.12gb"].placements)


def test_b200_placements_are_the_standard_table() -> None:
    p = {x.name: x for x in gpu_model("NVIDIA B200").mig_profiles}
    assert p["1g.23gb"].placements == (0, 1, 2, 3, 4, 5, 6) and p["1g.45gb"].memory_slices == 2
    assert p["3g.90gb"].placements == (0, 4) and p["7g.180gb"].compute_fraction == 1.0


def test_openb_models_have_no_mig() -> None:
    for name in ("G1", "G2", "G3", "T4", "P100", "V100M16", "V100M32", "A10", "L4", "L40S"):
        assert not gpu_model(name).mig_capable


def test_nvml_names_resolve() -> None:
    assert gpu_model("NVIDIA A100-SXM4-80GB").name == "A100-80GB"
    assert [gpu_model(n).name for n in ("NVIDIA L4", "NVIDIA L40S", "NVIDIA A30", "NVIDIA B200")] == [
        "L4", "L40S", "A30-24GB", "B200-180GB"]
    with pytest.raises(InvalidRequestError) as e:
        gpu_model("Voodoo2")
    assert e.value.field == "gpu.model"


def test_inventory_rejects_invalid_mig_layout() -> None:
    ok = GpuDevice(index=0, uuid="GPU-0", model="A100-80GB", mig_enabled=True,
                   mig_devices=(MigDevice(uuid="MIG-a", profile="3g.40gb", start=4),
                                MigDevice(uuid="MIG-b", profile="2g.20gb", start=0)))
    assert len(ok.mig_devices) == 2
    with pytest.raises(ValueError, match="cannot start"):
        GpuDevice(index=0, uuid="GPU-0", model="A100-80GB", mig_enabled=True,
                  mig_devices=(MigDevice(uuid="MIG-a", profile="3g.40gb", start=2),))
    with pytest.raises(ValueError, match="overlaps"):
        GpuDevice(index=0, uuid="GPU-0", model="A100-80GB", mig_enabled=True,
                  mig_devices=(MigDevice(uuid="MIG-a", profile="4g.40gb", start=0),
                               MigDevice(uuid="MIG-b", profile="2g.20gb", start=2)))
    with pytest.raises(ValueError, match="does not support MIG"):
        GpuDevice(index=0, uuid="GPU-0", model="T4", mig_enabled=True)
    with pytest.raises(ValueError, match="one model per node"):
        NodeInventory(name="x", gpus=(GpuDevice(index=0, uuid="a", model="T4"), GpuDevice(index=1, uuid="b", model="A10")))


def test_nvlink_islands() -> None:
    inv = NodeInventory(name="x", gpus=tuple(
        GpuDevice(index=i, uuid=f"g{i}", model="A100-80GB", nvlink_peers=peers)
        for i, peers in enumerate([(1,), (0,), (3,), (2,)])))
    assert inv.nvlink_islands() == [frozenset({0, 1}), frozenset({2, 3})]


def test_fit_mig_places_each_profile_at_its_lowest_free_start_where_that_works() -> None:
    assert fit_mig("A100-80GB", ["1g.10gb", "3g.40gb", "2g.20gb"]) == (("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6))
    assert fit_mig("A100-80GB", []) == ()


def test_fit_mig_backtracks_where_the_lowest_starts_do_not_fit() -> None:
    # all-balanced: 3g at 0 leaves no room for the second 1g (1g starts at 0..6 only); 3g at 4 does.
    placed = fit_mig("A100-80GB", ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"])
    assert placed == (("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3))


def test_fit_mig_keeps_clear_of_slices_already_taken_and_of_the_cards_compute() -> None:
    taken = gpu_model("A100-80GB").profile("4g.40gb").mask(0)
    assert fit_mig("A100-80GB", ["3g.40gb"], taken) == (("3g.40gb", 4),)
    assert fit_mig("A100-80GB", ["4g.40gb"], taken) is None
    assert fit_mig("A100-80GB", ["1g.10gb"] * 8) is None
    assert fit_mig("A30-24GB", ["2g.12gb", "2g.12gb"]) == (("2g.12gb", 0), ("2g.12gb", 2))
    assert fit_mig("A30-24GB", ["2g.12gb", "2g.12gb", "1g.6gb"]) is None
    with pytest.raises(InvalidRequestError):
        fit_mig("A100-80GB", ["1g.6gb"])


@pytest.mark.parametrize(("profile", "starts"), [
    ("1g.10gb", (0, 1, 2, 3, 4, 5, 6)), ("1g.20gb", (0, 2, 4, 6)), ("2g.20gb", (0, 2, 4)), ("3g.40gb", (0, 4)),
    ("4g.40gb", (0,)), ("7g.80gb", (0,)),
])
def test_fill_mig_puts_as_many_instances_as_one_card_holds(profile: str, starts: tuple[int, ...]) -> None:
    assert fill_mig("A100-80GB", profile) == tuple((profile, s) for s in starts)


def test_fit_mig_counts_compute_slices_where_the_placements_alone_would_allow_more() -> None:
    from orchestrator.core.catalogue import GpuModel, MigProfile

    card = GpuModel("test-card", 8000, 10, mig_profiles=(MigProfile("2g.1gb", 2, 1, 1000, tuple(range(8))),))
    assert fit_mig(card, ["2g.1gb"] * 3) == tuple(("2g.1gb", s) for s in range(3))
    assert fit_mig(card, ["2g.1gb"] * 4) is None  # 8 compute slices on a card of 7
