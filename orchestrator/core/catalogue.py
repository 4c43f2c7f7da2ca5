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

The A30 is the one card with a smaller MIG grid: 4 memory slices and 4 compute
slices (NVIDIA's 1g.6gb at 0-3, 2g.12gb at 0 or 2, 4g.24gb at 0). Its profiles
keep NVML's placements; ``GpuModel.mig_compute_total`` says a slice is 1/4 of
the card there, not 1/7 (the snapshot still counts MIG compute in sevenths, so
an A30 MIG card reads as at most 4/7 busy in utilisation figures; placement is
exact, as it goes by the memory-slice mask).

**Generic models.** A card NVML names but the catalogue does not know (GH200,
a new SKU) must not stop its agent: :func:`generic_model` registers a
``generic:<NVML name>`` entry with the memory NVML reports, MPS allowed, no
NVLink and no MIG table, and the discovery backend warns. The registry grows
only through that call (``CATALOGUE``, ``MODEL_NAMES`` and ``MODEL_INDEX`` are
live read-only views of it, so a model index never changes once given); an
inventory naming a ``generic:`` model with its memory registers it on the
head too, so head and agent agree without sharing a process.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterator, Mapping, Sequence

from orchestrator.core.errors import InvalidRequestError

MIG_MEMORY_SLICES = 8
MIG_COMPUTE_SLICES = 7
GENERIC_PREFIX = "generic:"
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
    card_compute_slices: int = MIG_COMPUTE_SLICES

    def mask(self, start: int) -> int:
        """Bit mask of the memory slices an instance at ``start`` occupies."""
        return ((1 << self.memory_slices) - 1) << start

    @property
    def compute_fraction(self) -> float:
        """Share of the card's SMs (1/7 per slice on most cards, 1/4 on an A30)."""
        return self.compute_slices / self.card_compute_slices


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
    generic: bool = False

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


def _mig(card_mib: int, table: list[tuple[str, int, int, tuple[int, ...]]], *,
         memory_slices: int = MIG_MEMORY_SLICES, compute_slices: int = MIG_COMPUTE_SLICES) -> tuple[MigProfile, ...]:
    # Memory of a profile: its share of the card's memory slices. NVML reports
    # slightly less (firmware reserve); placement only needs the proportion.
    return tuple(
        MigProfile(name, c, m, card_mib * m // memory_slices, placements, compute_slices)
        for name, c, m, placements in table
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
    # Ada and Ampere inference cards (NVML names as nvidia-smi prints them). No MIG on L4/L40S.
    GpuModel("L4", 23034, 58, aliases=("NVIDIA L4",)),
    GpuModel("L40S", 46068, 142, aliases=("NVIDIA L40S",)),
    # A30: MIG on a 4 x 4 grid (MIG user guide, "A30 MIG Profiles"); 1g.6gb x4, 2g.12gb x2, 4g.24gb x1.
    GpuModel("A30-24GB", 24576, 56,
             mig_profiles=_mig(24576, [("1g.6gb", 1, 1, (0, 1, 2, 3)), ("2g.12gb", 2, 2, (0, 2)),
                                       ("4g.24gb", 4, 4, (0,))], memory_slices=4, compute_slices=4),
             aliases=("NVIDIA A30", "A30")),
    # B200 180GB: the standard 8 x 7 layout (MIG user guide, "B200 MIG Profiles").
    GpuModel("B200-180GB", 184320, 148, nvlink=True,
             mig_profiles=_mig(184320, _standard_table("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb")),
             aliases=("NVIDIA B200", "B200")),
)

_REGISTRY: dict[str, GpuModel] = {m.name: m for m in _MODELS}
_ALIASES: dict[str, GpuModel] = {a.lower(): m for m in _MODELS for a in (m.name, *m.aliases)}
_NAMES: list[str] = list(_REGISTRY)
_LOCK = threading.Lock()
#: Every model by catalogue name (a live read-only view: generic models appear as they register).
CATALOGUE: Mapping[str, GpuModel] = MappingProxyType(_REGISTRY)


class _LiveNames(Sequence[str]):
    """Model names in index order; grows (never reorders) as generic models register."""

    def __getitem__(self, i):  # type: ignore[override]
        return _NAMES[i]

    def __len__(self) -> int:
        return len(_NAMES)

    def __iter__(self) -> Iterator[str]:
        return iter(list(_NAMES))

    def index(self, value: object, start: int = 0, stop: int | None = None) -> int:  # type: ignore[override]
        return _NAMES.index(value, start, len(_NAMES) if stop is None else stop)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"MODEL_NAMES{tuple(_NAMES)!r}"


class _LiveIndex(Mapping[str, int]):
    """Model name -> its index in ``MODEL_NAMES``."""

    def __getitem__(self, name: str) -> int:
        if name not in _REGISTRY:
            raise KeyError(name)
        return _NAMES.index(name)

    def __len__(self) -> int:
        return len(_NAMES)

    def __iter__(self) -> Iterator[str]:
        return iter(list(_NAMES))


MODEL_NAMES: Sequence[str] = _LiveNames()
MODEL_INDEX: Mapping[str, int] = _LiveIndex()


def gpu_model(name: str) -> GpuModel:
    """Look a model up by its catalogue name or by the name NVML reports."""
    try:
        return _ALIASES[name.lower()]
    except KeyError:
        detail = ("a generic model registers with its memory (an inventory's memory_mib, or generic_model())"
                  if name.startswith(GENERIC_PREFIX) else "")
        raise InvalidRequestError("gpu.model", name, sorted(CATALOGUE), detail=detail) from None


def is_known(name: str) -> bool:
    """True when ``name`` is a catalogue name, an NVML alias, or a registered generic model."""
    return name.lower() in _ALIASES


def generic_model(nvml_name: str, memory_mib: int) -> GpuModel:
    """The ``generic:<nvml_name>`` entry, registered on first use: the NVML memory, MPS, no NVLink, no MIG.

    ``nvml_name`` may already carry the prefix. Idempotent: a second call returns the first entry.
    """
    if memory_mib <= 0:
        raise InvalidRequestError("gpu.memory_mib", memory_mib, "> 0 for a generic GPU model")
    bare = nvml_name[len(GENERIC_PREFIX):] if nvml_name.startswith(GENERIC_PREFIX) else nvml_name
    if not bare.strip():
        raise InvalidRequestError("gpu.model", nvml_name, "a non-empty NVML device name")
    name = GENERIC_PREFIX + bare
    with _LOCK:
        known = _ALIASES.get(name.lower())
        if known is not None:
            return known
        m = GpuModel(name, int(memory_mib), 0, generic=True)
        _REGISTRY[name] = m
        _ALIASES[name.lower()] = m
        _NAMES.append(name)
        return m


def model_index(name: str) -> int:
    """A stable small integer for a model (its catalogue position), used by vectorised snapshots."""
    return MODEL_INDEX[gpu_model(name).name]


def fit_mig(model: str | GpuModel, profiles: Sequence[str], used: int = 0) -> tuple[tuple[str, int], ...] | None:
    """Place instances of ``profiles`` on one card of ``model``: ``((profile, start), ...)``, or None when
    they cannot all fit. The one MIG fitter: the KubeRay config's layouts, the Kubernetes inventory's
    spread of a node's MIG devices and the repartition planner's layouts all ask it.

    ``used`` is a mask of memory slices already taken (instances placed at fixed starts). A backtracking
    search over NVML's placement table, largest profiles first (stable: ties keep their order, they
    have the fewest placements), each at its lowest free start first -- so where placing each at its
    lowest free start works (how ``nvidia-smi mig -cgi`` fills a card), that is the answer, and where
    it does not (the all-balanced 3g+2g+1g+1g) another start is tried. The profiles' compute slices may
    not exceed the card's. At most 7 instances per card: the search is tiny.
    Raises :class:`InvalidRequestError` for a profile the model does not offer."""
    spec = model if isinstance(model, GpuModel) else gpu_model(model)
    table = sorted((spec.profile(p) for p in profiles), key=lambda p: -p.memory_slices)
    if table and sum(p.compute_slices for p in table) > table[0].card_compute_slices:
        return None
    placed: list[tuple[str, int]] = []

    def go(i: int, taken: int) -> bool:
        if i == len(table):
            return True
        p = table[i]
        for start in p.placements:
            if not taken & p.mask(start):
                placed.append((p.name, start))
                if go(i + 1, taken | p.mask(start)):
                    return True
                placed.pop()
        return False

    return tuple(placed) if go(0, used) else None


def fill_mig(model: str | GpuModel, profile: str) -> tuple[tuple[str, int], ...]:
    """As many instances of ``profile`` as one card of ``model`` holds (memory and compute slices), at the
    starts :func:`fit_mig` gives them."""
    spec = model if isinstance(model, GpuModel) else gpu_model(model)
    prof = spec.profile(profile)
    for n in range(len(prof.placements), 0, -1):
        fit = fit_mig(spec, [profile] * n)
        if fit is not None:
            return fit
    return ()


def all_mig_profiles() -> dict[str, tuple[str, ...]]:
    """Profile name -> the models that offer it."""
    out: dict[str, list[str]] = {}
    for m in _MODELS:  # generic models have no MIG table
        for p in m.mig_profiles:
            out.setdefault(p.name, []).append(m.name)
    return {k: tuple(v) for k, v in out.items()}
