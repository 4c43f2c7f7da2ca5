"""GpuRequest: parsing the CLI forms, refusals that name the field, resolution of unified requests."""

from __future__ import annotations

import pytest

from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.request import GpuRequest, Isolation, ShareKind, parse_memory_mib
from orchestrator.scheduling.alternatives import resolve


@pytest.mark.parametrize("text,kind,check", [
    ("1", ShareKind.WHOLE, lambda r: r.count == 1),
    ("2", ShareKind.WHOLE, lambda r: r.count == 2),
    ("mig:1g.10gb", ShareKind.MIG, lambda r: r.profile == "1g.10gb"),
    ("mps:30%,20GiB", ShareKind.MPS, lambda r: r.sm_percent == 30 and r.memory_mib == 20480),
    ("mps:50%", ShareKind.MPS, lambda r: r.sm_percent == 50 and r.memory_mib is None),
    ("timeslice:0.25", ShareKind.TIMESLICE, lambda r: r.fraction == 0.25),
    ("mem=20GiB,compute=0.3,isolation=hard", None, lambda r: r.isolation is Isolation.HARD and r.memory_mib == 20480),
])
def test_parse_forms(text, kind, check) -> None:
    r = GpuRequest.parse(text)
    assert r.kind is kind
    assert check(r)
    # describe() round-trips for the explicit forms (memory comes back in MiB: "20GiB" -> "20480MiB")
    if kind is not None and kind is not ShareKind.WHOLE:
        assert GpuRequest.parse(r.describe()) == r


@pytest.mark.parametrize("text,field", [
    ("", "gpu"),
    ("0", "gpu"),
    ("mig:9g.99gb", "profile"),
    ("mps:130%", "gpu.sm_percent"),
    ("mps:abc", "gpu.sm_percent"),
    ("mps:30%,-5GiB", "gpu.memory"),
    ("mps:30%,lots", "gpu.memory"),
    ("timeslice:1.5", "gpu.fraction"),
    ("timeslice:x", "gpu.fraction"),
    ("mem=20GiB,compute=2,isolation=hard", "gpu.compute"),
    ("mem=20GiB,isolation=maybe", "gpu.isolation"),
    ("colour=blue", "gpu"),
    ("quantum:1", "gpu"),
])
def test_refusals_name_the_field(text, field) -> None:
    with pytest.raises(InvalidRequestError) as e:
        GpuRequest.parse(text)
    assert e.value.field == field
    assert e.value.allowed  # says what is allowed
    assert field.split(".")[-1].split("_")[0] in str(e.value)


def test_kind_fields_are_exclusive() -> None:
    with pytest.raises(InvalidRequestError) as e:
        GpuRequest(kind=ShareKind.WHOLE, profile="1g.10gb")
    assert e.value.field == "profile"
    with pytest.raises(InvalidRequestError) as e:
        GpuRequest(memory_mib=1024)
    assert e.value.field == "isolation"
    with pytest.raises(InvalidRequestError) as e:
        GpuRequest.mps(20, count=2)
    assert e.value.field == "count"
    with pytest.raises(InvalidRequestError) as e:
        GpuRequest.whole(2, models=("Voodoo2",))
    assert e.value.field == "gpu.model"


def test_gpu_spec_style_models() -> None:
    r = GpuRequest.whole(1, models="V100M16|V100M32")
    assert r.models == ("V100M16", "V100M32")


def test_memory_units() -> None:
    assert parse_memory_mib("20GiB") == parse_memory_mib("20GB") == parse_memory_mib("20g") == 20480
    assert parse_memory_mib("512MiB") == 512
    assert parse_memory_mib(100) == 100
    with pytest.raises(InvalidRequestError):
        parse_memory_mib("-1GiB")


def test_hard_isolation_resolves_to_smallest_mig_then_whole() -> None:
    res = resolve(GpuRequest(memory_mib=12 * 1024, compute=0.1, isolation="hard"))
    kinds = [a.kind for a in res.alternatives]
    assert kinds == [ShareKind.MIG, ShareKind.WHOLE]
    profiles = dict(res.alternatives[0].profiles)
    # 1g.10gb (10 GiB) is too small for 12 GiB: the next smallest is the 1g.20gb slice.
    assert profiles["A100-80GB"] == "1g.20gb"
    assert profiles["H200-141GB"] == "1g.18gb"
    assert "smallest MIG profile" in res.alternatives[0].reason


def test_hard_isolation_compute_picks_enough_slices() -> None:
    res = resolve(GpuRequest(memory_mib=1024, compute=0.5, isolation="hard"))
    assert dict(res.alternatives[0].profiles)["A100-80GB"] == "4g.40gb"  # 4/7 >= 0.5, 3/7 < 0.5


def test_soft_and_none_isolation() -> None:
    soft = resolve(GpuRequest(memory_mib=8192, compute=0.3, isolation="soft"))
    assert [a.kind for a in soft.alternatives] == [ShareKind.MPS, ShareKind.WHOLE]
    assert soft.alternatives[0].sm_percent == 30 and soft.alternatives[0].memory_mib == 8192
    none = resolve(GpuRequest(compute=0.25, isolation="none"))
    assert [a.kind for a in none.alternatives] == [ShareKind.TIMESLICE, ShareKind.MPS, ShareKind.WHOLE]
    assert none.alternatives[0].milli == 250
