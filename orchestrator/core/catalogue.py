"""The GPU catalogue: what each GPU model offers.

Nomenclature (NVIDIA's MIG user guide):

* a MIG-capable card has **8 memory slices** and **7 compute slices**;
* a *profile* such as ``3g.40gb`` takes ``compute_slices`` compute slices and
  ``memory_slices`` memory slices;
* a *placement* is the first memory slice of an instance; an instance of a
  profile occupies ``[start, start + memory_slices)``. NVML reports the same
  table through ``nvmlDeviceGetGpuInstancePossiblePlacements`` (``start`` and
  ``size`` in memory slices), so a simulated card and a real one agree.

Invariants: the catalogue is immutable; every placement of every profile lies
inside the 8 memory slices; a profile name is unique within a model.
The openb models ``G1``, ``G2``, ``G3`` are undisclosed internal codes in
Alibaba's trace: we give them plausible sizes and no MIG, which is all the
trace needs (it counts GPUs in milli-units, not bytes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from orchestrator.core.errors import InvalidRequestError

MIG_MEMORY_SLICES = 8
MIG_COMPUTE_SLICES = 7
_PROFILE_SLICES = re.compile(r"^([1-7])g\.")


def mig_compute_slices(profile: str) -> int:
    """Compute slices of a MIG profile from its name (``3g.40gb`` -> 3): the same on every model that offers it."""
    m = _PROFILE_SLICES.match(profile)
    if m is None:
        raise InvalidRequestError("gpu.profile", profile, "a MIG profile name such as 1g.10gb or 3g.40gb")
    return int(m.group(1))


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile and where it may start."""

    name: str
    compute_slices: int
    memory_slices: int
    memory_mib: int
    placements: tuple[int, ...]

    def mask(self, start: int) -> int:
        """Bit mask of the memory slices an instance at ``start`` occupies."""
        return ((1 << self.memory_slices) - 1) << start

    @property
    def compute_fraction(self) -> float:
        return self.compute_slices / MIG_COMPUTE_SLICES


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A GPU model and what sharing it supports.

    ``mig_profiles`` is empty for cards without MIG; it is ordered from the
    smallest profile to the largest, which is the order unified requests
    try them in.
    """

    name: str
    memory_mib: int
    sm_count: int
    mps: bool = True
    nvlink: bool = False
    mig_profiles: tuple[MigProfile, ...] = ()
    aliases: tuple[str, ...] = field(default=())

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    def profile(self, name: str) -> MigProfile:
        for p in self.mig_profiles:
            if p.name == name:
                return p
        raise InvalidRequestError(
            "gpu.profile", name, [p.name for p in self.mig_profiles] or ["(none: no MIG on " + self.name + ")"],
            detail=f"{self.name} offers no such MIG profile",
        )


def _mig(card_mib: int, table: list[tuple[str, int, int, tuple[int, ...]]]) -> tuple[MigProfile, ...]:
    # Memory of a profile: its share of the card's memory slices. NVML reports
    # slightly less (firmware reserve); placement only needs the proportion.
    return tuple(
        MigProfile(name, c, m, card_mib * m // MIG_MEMORY_SLICES, placements) for name, c, m, placements in table
    )


def _standard_table(g1: str, g1x2: str, g2: str, g3: str, g4: str, g7: str) -> list[tuple[str, int, int, tuple[int, ...]]]:
    """The six-profile layout shared by A100/H100/H200 (MIG user guide, 'Supported profiles')."""
    return [
        (g1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        (g1x2, 1, 2, (0, 2, 4, 6)),
        (g2, 2, 2, (0, 2, 4)),
        (g3, 3, 4, (0, 4)),
        (g4, 4, 4, (0,)),
        (g7, 7, 8, (0,)),
    ]


_MODELS: tuple[GpuModel, ...] = (
    GpuModel("A100-40GB", 40960, 108, nvlink=True,
             mig_profiles=_mig(40960, _standard_table("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")),
             aliases=("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB", "A100")),
    GpuModel("A100-80GB", 81920, 108, nvlink=True,
             mig_profiles=_mig(81920, _standard_table("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")),
             aliases=("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe")),
    GpuModel("H100-80GB", 81920, 132, nvlink=True,
             mig_profiles=_mig(81920, _standard_table("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")),
             aliases=("NVIDIA H100 80GB HBM3", "NVIDIA H100-SXM5-80GB", "NVIDIA H100 PCIe", "H100")),
    GpuModel("H100-NVL", 95830, 132, nvlink=True,
             mig_profiles=_mig(95830, _standard_table("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb")),
             aliases=("NVIDIA H100 NVL",)),
    GpuModel("H200-141GB", 144384, 132, nvlink=True,
             mig_profiles=_mig(144384, _standard_table("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")),
             aliases=("NVIDIA H200", "NVIDIA H200 NVL", "H200")),
    # The openb trace's models: no MIG. G1-G3 are undisclosed; sizes are plausible guesses.
    GpuModel("G1", 32768, 80, aliases=()),
    GpuModel("G2", 32768, 80, nvlink=True),
    GpuModel("G3", 32768, 80, nvlink=True),
    GpuModel("T4", 15360, 40, aliases=("Tesla T4",)),
    GpuModel("P100", 16384, 56, mps=False, aliases=("Tesla P100-PCIE-16GB", "Tesla P100-SXM2-16GB")),
    GpuModel("V100M16", 16384, 80, nvlink=True, aliases=("Tesla V100-SXM2-16GB",)),
    GpuModel("V100M32", 32768, 80, nvlink=True, aliases=("Tesla V100-SXM2-32GB",)),
    GpuModel("A10", 23028, 72, aliases=("NVIDIA A10",)),
)

CATALOGUE: Mapping[str, GpuModel] = MappingProxyType({m.name: m for m in _MODELS})
_BY_ALIAS: Mapping[str, GpuModel] = MappingProxyType(
    {a.lower(): m for m in _MODELS for a in (m.name, *m.aliases)}
)


def gpu_model(name: str) -> GpuModel:
    """Look a model up by its catalogue name or by the name NVML reports."""
    try:
        return _BY_ALIAS[name.lower()]
    except KeyError:
        raise InvalidRequestError("gpu.model", name, sorted(CATALOGUE)) from None


def model_index(name: str) -> int:
    """A stable small integer for a model (its catalogue position), used by vectorised snapshots."""
    return list(CATALOGUE).index(gpu_model(name).name)


MODEL_NAMES: tuple[str, ...] = tuple(CATALOGUE)


def all_mig_profiles() -> dict[str, tuple[str, ...]]:
    """Profile name -> the models that offer it."""
    out: dict[str, list[str]] = {}
    for m in _MODELS:
        for p in m.mig_profiles:
            out.setdefault(p.name, []).append(m.name)
    return {k: tuple(v) for k, v in out.items()}
