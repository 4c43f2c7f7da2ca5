"""What a Ray resource request (``num_gpus``, ``accelerator_type``, ``memory``) asks of the orchestrator. Pure.

A task or actor that asks Ray for GPUs outside any lease becomes a lease request of its own
(:mod:`orchestrator.rayport.native`). This module is the one mapping, so ``orchestrator explain`` and the
docs (``docs/ray-native.md``) can state it:

* a whole number ``k`` of GPUs: ``k`` whole cards;
* a fraction ``f`` (0 < f < 1): the share the cluster's config names (``settings.fractional_gpu``):
  ``mps`` -> an MPS share of ``round(100 f)`` % of the SMs, ``timeslice`` -> a time-slice of ``f``, ``mig`` ->
  the smallest MIG slice with at least ``f`` of a card's compute (a unified request, ``isolation=hard``);
* a fraction above 1 (``1.5``) is refused: Ray itself only places those on whole instances, and no share
  kind spans cards;
* ``accelerator_type="A100"`` -> the catalogue's models of that Ray type (``A100-80GB``, ``A100-40GB``...);
* ``memory`` (bytes of host memory, Ray's own option) -> the request's ``host_memory_mib``.
"""

from __future__ import annotations

from typing import Literal

from orchestrator.core.catalogue import MODEL_NAMES
from orchestrator.core.config import ray_accelerator_type
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.request import GpuRequest, Isolation

FractionalKind = Literal["mps", "timeslice", "mig"]
FRACTIONAL_KINDS: tuple[str, ...] = ("mps", "timeslice", "mig")


def models_of(accelerator_type: str) -> tuple[str, ...]:
    """The catalogue's models whose Ray accelerator type is ``accelerator_type``; refused when none is."""
    found = tuple(m for m in MODEL_NAMES if ray_accelerator_type(m) == accelerator_type.upper())
    if not found:
        raise InvalidRequestError("accelerator_type", accelerator_type,
                                  sorted({ray_accelerator_type(m) for m in MODEL_NAMES}))
    return found


def request_for(num_gpus: float, *, accelerator_type: str | None = None, memory_bytes: int | None = None,
                fractional: str = "mps") -> GpuRequest:
    """The lease request a Ray task or actor asking for ``num_gpus`` stands for (see the module docstring)."""
    if not num_gpus > 0:
        raise InvalidRequestError("num_gpus", num_gpus, "a number above 0")
    if fractional not in FRACTIONAL_KINDS:
        raise InvalidRequestError("settings.fractional_gpu", fractional, FRACTIONAL_KINDS)
    kw: dict[str, object] = {}
    if accelerator_type:
        kw["models"] = models_of(accelerator_type)
    if memory_bytes:
        kw["host_memory_mib"] = -(-int(memory_bytes) // (1024 * 1024))
    if float(num_gpus).is_integer():
        return GpuRequest.whole(int(num_gpus), **kw)
    if num_gpus > 1:
        raise InvalidRequestError("num_gpus", num_gpus, "a whole number of cards, or a fraction below 1",
                                  detail="no share spans cards")
    if fractional == "mps":
        return GpuRequest.mps(max(1, round(num_gpus * 100)), **kw)
    if fractional == "timeslice":
        return GpuRequest.timeslice(num_gpus, **kw)
    return GpuRequest(compute=num_gpus, isolation=Isolation.HARD, **kw)
