"""What a Ray resource request outside any lease asks of the orchestrator (core/ray_request.py)."""

from __future__ import annotations

import pytest

from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.ray_request import request_for
from orchestrator.core.request import Isolation, ShareKind


def test_whole_numbers_are_whole_cards() -> None:
    assert request_for(1).kind is ShareKind.WHOLE and request_for(1).count == 1
    assert request_for(3.0).count == 3


@pytest.mark.parametrize("kind, check", [
    ("mps", lambda r: r.kind is ShareKind.MPS and r.sm_percent == 50),
    ("timeslice", lambda r: r.kind is ShareKind.TIMESLICE and r.fraction == 0.5),
    ("mig", lambda r: r.kind is None and r.isolation is Isolation.HARD and r.compute == 0.5),
])
def test_a_fraction_is_the_configured_share(kind: str, check) -> None:
    assert check(request_for(0.5, fractional=kind))


def test_accelerator_type_and_memory_are_honoured() -> None:
    r = request_for(1, accelerator_type="A100", memory_bytes=3 * 1024 * 1024 + 1)
    assert set(r.models) >= {"A100-80GB"} and all(m.startswith("A100") for m in r.models)
    assert r.host_memory_mib == 4  # rounded up: Ray's bytes never shrink


@pytest.mark.parametrize("gpus, kw, field", [
    (0, {}, "num_gpus"), (-1, {}, "num_gpus"), (1.5, {}, "num_gpus"),
    (1, {"accelerator_type": "Z9000"}, "accelerator_type"), (0.5, {"fractional": "half"}, "settings.fractional_gpu"),
])
def test_what_cannot_be_a_lease_is_refused_naming_the_field(gpus: float, kw: dict, field: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        request_for(gpus, **kw)
    assert e.value.field == field
