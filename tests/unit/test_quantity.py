"""The one quantity parser: Kubernetes quantities and the memory sizes people write."""

from __future__ import annotations

import pytest

from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.quantity import MAX_MIB, is_quantity, parse_memory_mib, parse_quantity


@pytest.mark.parametrize(("q", "v"), [
    ("4", 4), ("500m", 0.5), ("1.5", 1.5), ("1k", 1000), ("2M", 2e6), ("3G", 3e9),
    ("16Gi", 16 * 2**30), ("32780976Ki", 32780976 * 1024), ("3Ti", 3 * 2**40), (" 8 ", 8),
])
def test_kubernetes_quantities_read_as_the_api_server_reads_them(q: str, v: float) -> None:
    assert parse_quantity(q) == v


@pytest.mark.parametrize("q", ["", "Gi", "1..2", ".5", "1.", "-1", "16GiB", "16gi", "1e3", "4 cores"])
def test_what_is_not_a_quantity_is_refused_by_both(q: str) -> None:
    assert not is_quantity(q)
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(q)


@pytest.mark.parametrize(("text", "mib"), [
    ("20GiB", 20480), ("20GB", 20480), ("20g", 20480), ("20 Gi", 20480), ("512MiB", 512), ("512", 512),
    ("1.5Ti", 1536 * 1024), ("2048KiB", 2), ("1k", 0), (100, 100), (1.9, 1),
])
def test_memory_sizes_are_binary_whatever_the_spelling(text: str | int | float, mib: int) -> None:
    assert parse_memory_mib(text) == mib


@pytest.mark.parametrize("bad", ["-1GiB", "20 PB", "twenty", True, None, -1, float("nan"), f"{MAX_MIB + 1}", "2000Ti"])
def test_bad_memory_sizes_name_the_field(bad: object) -> None:
    with pytest.raises(InvalidRequestError) as ei:
        parse_memory_mib(bad, "gpu.memory")  # type: ignore[arg-type]
    assert ei.value.field == "gpu.memory"
