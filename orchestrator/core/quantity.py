"""Sizes and amounts written as text: one parser for every quantity the project reads.

Two spellings reach us, and both go through :func:`parse_quantity`:

* a **Kubernetes quantity** (``"8"``, ``"500m"``, ``"16Gi"``, ``"1k"``): a pod's CPU and memory in the
  KubeRay config, a node's allocatable read back from the API server. Decimal suffixes are powers of
  1000 (``m`` is milli), binary ones powers of 1024, as the API server reads them;
* a **memory size a person writes** (``"20GiB"``, ``"20GB"``, ``"512MiB"``, ``"1.5Ti"``, ``"20 g"`` or a
  bare number of MiB) for a GPU or host memory amount: :func:`parse_memory_mib`. Its unit is read
  case-insensitively and always as binary -- GPU memory is sold in binary units and nobody means 10^9
  bytes when they ask for "20GB" of an 80 GB card -- then handed to :func:`parse_quantity` as the
  Kubernetes binary suffix it means.

The core needs no Kubernetes client for this (the ``k8s`` extra is optional).

Invariants: :func:`parse_quantity` reads exactly what :func:`is_quantity` accepts (digits, an optional
fraction, an optional suffix: the form the KubeRay config validates), surrounding blanks aside;
:func:`is_quantity` never raises.
"""

from __future__ import annotations

import math
import re

from orchestrator.core.errors import InvalidRequestError

#: Kubernetes ``resource.Quantity``: the decimal and binary suffixes the API server accepts.
QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SCALE: dict[str, float] = {
    "": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}

#: Upper bound of a memory amount a request may name (1 PiB): far beyond any machine, and small enough
#: that every amount stays an exact int64 in the engine's arrays.
MAX_MIB = 1 << 30

_MEMORY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B?|[KMGT])?\s*$", re.IGNORECASE | re.ASCII)
_MIB = 2**20


def is_quantity(text: str) -> bool:
    """Whether ``text`` is a Kubernetes quantity :func:`parse_quantity` reads (``4``, ``500m``, ``16Gi``)."""
    return isinstance(text, str) and QUANTITY.match(text) is not None


def parse_quantity(text: str) -> float:
    """A Kubernetes quantity as a plain number: cores for CPU (``500m`` -> 0.5), bytes for memory
    (``16Gi`` -> 17179869184). Raises ``ValueError`` naming the text when it is not one."""
    m = QUANTITY.match(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r} (e.g. '4', '500m', '16Gi')")
    return float(m.group(1)) * _SCALE[m.group(2) or ""]


def parse_memory_mib(value: str | int | float, field_name: str = "memory") -> int:
    """``"20GiB"``, ``"20GB"``, ``"512MiB"``, ``"1.5Ti"`` or a bare number of MiB -> MiB (rounded down).

    GB and GiB are both read as GiB (see the module docstring); a bare number is MiB. Raises
    :class:`InvalidRequestError` naming ``field_name`` for anything else, a negative amount or more
    than :data:`MAX_MIB`."""
    allowed = "a non-negative size such as 20GiB, 512MiB or a number of MiB"
    if isinstance(value, bool):
        raise InvalidRequestError(field_name, value, allowed)
    if isinstance(value, int):
        if value < 0:
            raise InvalidRequestError(field_name, value, allowed)
        return value
    if isinstance(value, float):
        if value < 0 or not math.isfinite(value):
            raise InvalidRequestError(field_name, value, allowed)
        return int(value)
    if not isinstance(value, str):
        raise InvalidRequestError(field_name, value, allowed)
    m = _MEMORY.match(value)
    if not m:
        raise InvalidRequestError(field_name, value, allowed)
    unit = (m.group(2) or "M")[:1].upper()  # no unit: MiB
    mib = parse_quantity(m.group(1) + unit + "i") / _MIB
    if not math.isfinite(mib) or mib > MAX_MIB:
        raise InvalidRequestError(field_name, value, f"at most {MAX_MIB // (1 << 20)} TiB",
                                  detail="larger than any memory there is")
    return int(mib)
