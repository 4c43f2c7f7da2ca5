"""One request type for every kind of GPU share.

A :class:`GpuRequest` either names its kind:

* ``whole``     -- ``count`` >= 1 entire cards;
* ``mig``       -- one MIG slice of ``profile``;
* ``mps``       -- an MPS client with ``sm_percent`` of the SMs, a pinned
  memory limit ``memory_mib`` and an optional ``client_priority``;
* ``timeslice`` -- ``fraction`` of one card's time, no isolation;

or states only what it needs (``memory_mib``, ``compute``, ``isolation``) and
lets the engine choose.

A request may also carry an ordered **fallback**: further requests tried, in
the order given, when none of its own shares fits (``mig:1g.10gb|mig:2g.20gb|mps:30|1``
in the ``--gpu`` grammar, a list in YAML). A fallback shares its request's
node-wide constraints (``node``, ``models``, host CPU and memory) and has no
fallback of its own; a chain holds at most :data:`MAX_FALLBACK` of them.

Which concrete shares satisfy a request, and in what order
they are tried, is scheduling policy: :func:`orchestrator.scheduling.alternatives.resolve`
turns a request into :class:`Alternative` s, cheapest first, each with the
reason it was chosen (a :class:`ResolvedRequest`); this module holds the data.

Compute is accounted in *milli-GPUs* (1000 = one card): an MPS share of 30%
is 300, a time-slice of 0.25 is 250, a whole card 1000. This is the unit of
the openb trace too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Annotated, Any, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.core.catalogue import (
    MIG_COMPUTE_SLICES,
    MigProfile,
    all_mig_profiles,
    gpu_model,
    mig_compute_slices,
)
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.quantity import MAX_MIB, parse_memory_mib
from orchestrator.core.validation import typed_error


def fields_of(data: object, field: str, known: Sequence[str]) -> dict[str, Any]:
    """``data`` as keyword arguments of a model: a mapping with string keys, else a typed error naming
    ``field`` (what a client sends may be anything JSON or pickle can carry)."""
    if not isinstance(data, Mapping):
        raise InvalidRequestError(field, _type_name(data), f"a mapping of {', '.join(known)}", detail="not a mapping")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise InvalidRequestError(field, bad[0], ", ".join(known), detail="field names are strings")
    return dict(data)


def _type_name(v: object) -> str:
    return type(v).__name__


class ShareKind(str, Enum):
    WHOLE = "whole"
    MIG = "mig"
    MPS = "mps"
    TIMESLICE = "timeslice"


class Isolation(str, Enum):
    HARD = "hard"
    SOFT = "soft"
    NONE = "none"


#: The most whole cards one request asks for (all of them on one node).
MAX_CARDS = 64
#: The most fallbacks one request carries (a chain of at most MAX_FALLBACK + 1 choices).
MAX_FALLBACK = 7
#: Fields a fallback takes from its request: they constrain the node, not the share.
NODE_WIDE = ("node", "models", "cpu_milli", "host_memory_mib")
MAX_CPU_MILLI = 10**9


class GpuRequest(BaseModel):
    """What a workload asks for. Immutable; validated on construction.

    Invariants: exactly the fields of its kind are set (a ``whole`` request
    has no ``profile``...); a request without ``kind`` has ``isolation``;
    fractional kinds (mig, mps, timeslice) ask for one card; a ``fallback``
    has at most :data:`MAX_FALLBACK` requests, none with a fallback or a
    node-wide field of its own (:data:`NODE_WIDE`: the request's hold for
    every choice).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)

    kind: ShareKind | None = Field(default=None, description="Named kind; None lets the engine resolve one")
    count: Annotated[int, Field(ge=0, le=MAX_CARDS, description="Whole cards (kind=whole); 0 = no GPU (a CPU-only task)")] = 1
    profile: str | None = Field(default=None, description="MIG profile such as 1g.10gb (kind=mig)")
    sm_percent: Annotated[int, Field(ge=1, le=100, description="MPS active thread percentage (kind=mps)")] | None = None
    memory_mib: Annotated[int, Field(ge=0, le=MAX_MIB, description="GPU memory needed / MPS pinned memory limit, MiB")] | None = None
    client_priority: Annotated[int, Field(ge=0, le=1, description="CUDA_MPS_CLIENT_PRIORITY: 0 normal, 1 below")] | None = None
    fraction: Annotated[float, Field(gt=0, le=1, description="Share of one card's time (kind=timeslice)")] | None = None
    compute: Annotated[float, Field(gt=0, le=1, description="Fraction of one card's compute (unified)")] | None = None
    isolation: Isolation | None = Field(default=None, description="hard | soft | none (unified)")
    models: tuple[str, ...] = Field(default=(), description="Allowed GPU models; empty = any")
    node: str | None = Field(default=None, description="Only this node")
    nvlink: bool = Field(default=False, description="Multi-GPU: all GPUs in one NVLink island")
    cpu_milli: Annotated[int, Field(ge=0, le=MAX_CPU_MILLI, description="Host CPU, milli-cores")] = 0
    host_memory_mib: Annotated[int, Field(ge=0, le=MAX_MIB, description="Host memory, MiB")] = 0
    fallback: tuple["GpuRequest", ...] = Field(
        default=(), exclude_if=lambda v: not v,  # absent from the JSON when empty: records keep their bytes
        description="Requests tried in this order when none of this one's shares fits (no nesting)")

    def __init__(self, **data: object) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise typed_error(e, "gpu", GpuRequest) from None

    @model_validator(mode="before")
    @classmethod
    def _check_models(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("models"):
            ms = data["models"]
            if isinstance(ms, str):
                ms = [m for m in ms.split("|") if m]
            if not isinstance(ms, (list, tuple)) or not all(isinstance(m, str) for m in ms):
                raise InvalidRequestError("gpu.models", ms, "GPU model names, as a list or joined by '|'")
            data = {**data, "models": tuple(gpu_model(m).name for m in ms)}
        if isinstance(data, dict) and data.get("fallback"):
            data = {**data, "fallback": _fallback_items(data["fallback"])}
        return data

    @model_validator(mode="after")
    def _fallback_flat(self) -> "GpuRequest":
        fb = self.fallback
        if len(fb) > MAX_FALLBACK:
            raise InvalidRequestError("fallback", len(fb), f"at most {MAX_FALLBACK} fallbacks",
                                      detail=f"a chain of {len(fb) + 1} choices")
        for i, f in enumerate(fb, 1):
            if f.fallback:
                raise InvalidRequestError(f"fallback[{i}].fallback", f.describe(), "unset",
                                          detail="a fallback has no fallback of its own: list every choice in one chain")
            for name in NODE_WIDE:
                if getattr(f, name) != GpuRequest.model_fields[name].default:
                    raise InvalidRequestError(f"fallback[{i}].{name}", getattr(f, name), "unset",
                                              detail="a fallback takes the node-wide constraints of its request")
        return self

    @model_validator(mode="after")
    def _fields_match_kind(self) -> "GpuRequest":
        k = self.kind
        def forbid(name: str, why: str) -> None:
            if getattr(self, name) is not None:
                raise InvalidRequestError(name, getattr(self, name), "unset", detail=why)
        if k is None:
            if self.isolation is None:
                raise InvalidRequestError("isolation", None, [i.value for i in Isolation],
                                          detail="a request without kind must state isolation")
            if self.compute is None and self.memory_mib is None:
                raise InvalidRequestError("compute", None, "a fraction in (0, 1], and/or memory",
                                          detail="a request without kind must state compute or memory")
            for n in ("profile", "sm_percent", "fraction"):
                forbid(n, "set kind to use it")
            if self.count != 1:
                raise InvalidRequestError("count", self.count, "1", detail="unified requests ask for one card's share")
            return self
        if self.isolation is not None or self.compute is not None:
            raise InvalidRequestError("isolation" if self.isolation is not None else "compute",
                                      self.isolation or self.compute, "unset", detail=f"kind={k.value} is explicit")
        if k is ShareKind.WHOLE:
            for n in ("profile", "sm_percent", "fraction", "client_priority"):
                forbid(n, "kind=whole")
        elif k is ShareKind.MIG:
            if not self.profile:
                raise InvalidRequestError("profile", self.profile, sorted(all_mig_profiles()))
            if self.profile not in all_mig_profiles():
                raise InvalidRequestError("profile", self.profile, sorted(all_mig_profiles()),
                                          detail="no GPU model offers this MIG profile")
            for n in ("sm_percent", "fraction", "client_priority", "memory_mib"):
                forbid(n, "kind=mig: the profile fixes compute and memory")
        elif k is ShareKind.MPS:
            if self.sm_percent is None:
                raise InvalidRequestError("sm_percent", None, "an integer percentage 1..100")
            for n in ("profile", "fraction"):
                forbid(n, "kind=mps")
        elif k is ShareKind.TIMESLICE:
            if self.fraction is None:
                raise InvalidRequestError("fraction", None, "a fraction in (0, 1]")
            for n in ("profile", "sm_percent", "client_priority"):
                forbid(n, "kind=timeslice")
        if k is not ShareKind.WHOLE and self.count != 1:
            raise InvalidRequestError("count", self.count, "1", detail=f"kind={k.value} shares one card")
        if self.nvlink and self.count < 2:
            raise InvalidRequestError("nvlink", True, "false for single-GPU requests")
        return self

    # ---- constructors -------------------------------------------------------------------------
    @classmethod
    def whole(cls, count: int = 1, **kw: object) -> "GpuRequest":
        return cls(kind=ShareKind.WHOLE, count=count, **kw)

    @classmethod
    def mig(cls, profile: str, **kw: object) -> "GpuRequest":
        return cls(kind=ShareKind.MIG, profile=profile, **kw)

    @classmethod
    def mps(cls, sm_percent: int, memory_mib: int | None = None, **kw: object) -> "GpuRequest":
        return cls(kind=ShareKind.MPS, sm_percent=sm_percent, memory_mib=memory_mib, **kw)

    @classmethod
    def timeslice(cls, fraction: float, **kw: object) -> "GpuRequest":
        return cls(kind=ShareKind.TIMESLICE, fraction=fraction, **kw)

    @property
    def choices(self) -> tuple["GpuRequest", ...]:
        """This request without its fallback, then each fallback with the request's node-wide constraints
        (:data:`NODE_WIDE`), in the order they are tried."""
        if not self.fallback:
            return (self,)
        wide = {name: getattr(self, name) for name in NODE_WIDE}
        return (self.model_copy(update={"fallback": ()}), *(f.model_copy(update=wide) for f in self.fallback))

    @classmethod
    def parse(cls, text: "str | Sequence[str]") -> "GpuRequest":
        """The CLI's ``--gpu`` forms: ``1``, ``2``, ``mig:1g.10gb``, ``mps:30%,20GiB``,
        ``timeslice:0.25``, ``mem=20GiB,compute=0.3,isolation=hard``; several joined by ``|`` (or a list
        of them, as YAML writes one) are a request and its ordered fallback: ``mig:1g.10gb|mps:30|1``."""
        if isinstance(text, (list, tuple)):
            if not text or not all(isinstance(t, str) for t in text):
                raise InvalidRequestError("gpu", text, "a non-empty list of --gpu strings (a request, then its fallback)")
            text = "|".join(text)
        if isinstance(text, str) and "|" in text:
            parts = [p.strip() for p in text.split("|")]
            if len(parts) > MAX_FALLBACK + 1:
                raise InvalidRequestError("gpu.fallback", text, f"at most {MAX_FALLBACK + 1} choices joined by '|'",
                                          detail=f"{len(parts)} choices")
            chain = []
            for i, part in enumerate(parts):
                if not part:
                    raise InvalidRequestError("gpu" if i == 0 else f"gpu.fallback[{i}]", text,
                                              "CHOICE|CHOICE|..., each a --gpu form", detail="an empty choice")
                try:
                    chain.append(cls._parse_one(part))
                except InvalidRequestError as e:
                    if i == 0:
                        raise
                    rest = e.field.removeprefix("gpu").lstrip(".")
                    raise InvalidRequestError(f"gpu.fallback[{i}]" + (f".{rest}" if rest else ""), e.value, e.allowed,
                                              detail=e.detail) from None
            return chain[0].model_copy(update={"fallback": ()}).with_fallback(*chain[1:])
        return cls._parse_one(text)

    def with_fallback(self, *fallback: "GpuRequest") -> "GpuRequest":
        """This request with ``fallback`` (validated: flat, at most :data:`MAX_FALLBACK`)."""
        return GpuRequest(**{**self.model_dump(exclude={"fallback"}), "fallback": fallback})

    @classmethod
    def _parse_one(cls, text: str) -> "GpuRequest":
        forms = "N (whole cards), mig:PROFILE, mps:PCT%[,MEM], timeslice:FRACTION, mem=MEM,compute=F,isolation=hard|soft|none"
        if not isinstance(text, str):
            raise InvalidRequestError("gpu", text, forms, detail="not a string")
        s = text.strip()
        if not s:
            raise InvalidRequestError("gpu", text, forms)
        if s.isascii() and s.isdigit():
            n = int(s)
            if n < 1:
                raise InvalidRequestError("gpu", text, forms, detail="at least one card")
            if n > MAX_CARDS:
                raise InvalidRequestError("gpu.count", n, f"1 to {MAX_CARDS} whole cards",
                                          detail=f"more cards than one request may ask for (at most {MAX_CARDS})")
            return cls.whole(n)
        head, sep, rest = s.partition(":")
        head = head.lower()
        if sep and head == "mig":
            return cls.mig(rest.strip())
        if sep and head == "mps":
            parts = [p.strip() for p in rest.split(",") if p.strip()]
            if not parts:
                raise InvalidRequestError("gpu.sm_percent", rest, "PCT% such as 30%")
            pct_s = parts[0].rstrip("%")
            try:
                pct = float(pct_s)
            except ValueError:
                raise InvalidRequestError("gpu.sm_percent", parts[0], "an integer percentage 1..100") from None
            if not (1 <= pct <= 100) or pct != int(pct):
                raise InvalidRequestError("gpu.sm_percent", parts[0], "an integer percentage 1..100")
            mem = parse_memory_mib(parts[1], "gpu.memory") if len(parts) > 1 else None
            return cls.mps(int(pct), mem)
        if sep and head in ("timeslice", "ts"):
            try:
                frac = float(rest)
            except ValueError:
                raise InvalidRequestError("gpu.fraction", rest, "a fraction in (0, 1]") from None
            if not (0 < frac <= 1):
                raise InvalidRequestError("gpu.fraction", rest, "a fraction in (0, 1]")
            return cls.timeslice(frac)
        if "=" in s:
            kv: dict[str, object] = {}
            for part in s.split(","):
                k, eq, v = part.partition("=")
                k, v = k.strip().lower(), v.strip()
                if not eq:
                    raise InvalidRequestError("gpu", part, forms)
                if k in ("mem", "memory"):
                    kv["memory_mib"] = parse_memory_mib(v, "gpu.memory")
                elif k == "compute":
                    try:
                        c = float(v)
                    except ValueError:
                        raise InvalidRequestError("gpu.compute", v, "a fraction in (0, 1]") from None
                    if not (0 < c <= 1):
                        raise InvalidRequestError("gpu.compute", v, "a fraction in (0, 1]")
                    kv["compute"] = c
                elif k == "isolation":
                    if v.lower() not in {i.value for i in Isolation}:
                        raise InvalidRequestError("gpu.isolation", v, [i.value for i in Isolation])
                    kv["isolation"] = Isolation(v.lower())
                else:
                    raise InvalidRequestError("gpu", k, ["mem", "compute", "isolation"])
            return cls(**kv)
        raise InvalidRequestError("gpu", text, forms)

    @property
    def gpu_demand(self) -> float:
        """GPUs asked for, fractions counted (:func:`share_demand`); a unified request counts its
        ``compute`` (0.1 when it names only memory)."""
        k = self.kind
        if k is ShareKind.WHOLE:
            return share_demand(k, cards=self.count)
        if k is ShareKind.MIG:
            return share_demand(k, profile=self.profile)
        if k is ShareKind.MPS:
            return share_demand(k, milli=(self.sm_percent or 0) * 10)
        if k is ShareKind.TIMESLICE:
            return share_demand(k, milli=round((self.fraction or 0.0) * 1000))
        return self.compute or 0.1

    def describe(self) -> str:
        """A short human form, the inverse of :meth:`parse` where one exists."""
        k = self.kind
        if k is ShareKind.WHOLE:
            s = f"{self.count}x whole"
        elif k is ShareKind.MIG:
            s = f"mig:{self.profile}"
        elif k is ShareKind.MPS:
            s = f"mps:{self.sm_percent}%" + (f",{self.memory_mib}MiB" if self.memory_mib is not None else "")
        elif k is ShareKind.TIMESLICE:
            s = f"timeslice:{self.fraction:g}"
        else:
            parts = []
            if self.memory_mib is not None:
                parts.append(f"mem={self.memory_mib}MiB")
            if self.compute is not None:
                parts.append(f"compute={self.compute:g}")
            parts.append(f"isolation={self.isolation.value}")  # type: ignore[union-attr]
            s = ",".join(parts)
        if self.models:
            s += f" on {'|'.join(self.models)}"
        if self.fallback:
            s += ", else " + ", else ".join(f.describe() for f in self.fallback)
        return s


def _fallback_items(items: object) -> object:
    """A fallback as YAML or JSON gives it: ``--gpu`` strings (or requests) in a list; strings parsed."""
    if isinstance(items, str):
        items = [p.strip() for p in items.split("|")]
    if not isinstance(items, (list, tuple)):
        raise InvalidRequestError("fallback", items, "a list of requests (--gpu strings or mappings)")
    return tuple(GpuRequest._parse_one(f) if isinstance(f, str) else f for f in items)


def share_demand(kind: ShareKind, *, cards: int = 1, profile: str | None = None, milli: int = 0) -> float:
    """GPUs one share stands for: the one definition quotas and preemption count, before a grant
    (:attr:`GpuRequest.gpu_demand`) and after it (:attr:`~orchestrator.core.allocation.Allocation.gpu_demand`).

    Whole cards count 1 each; a MIG slice its compute slices / 7 (``3g.40gb`` is 3/7 on every
    model); MPS and time-slice shares their milli-GPUs / 1000 on each card.
    """
    if kind is ShareKind.WHOLE:
        return float(cards)
    if kind is ShareKind.MIG:
        return mig_compute_slices(profile or "") / MIG_COMPUTE_SLICES
    return cards * milli / 1000


@dataclass(frozen=True, slots=True)
class Alternative:
    """One concrete way to satisfy a request.

    ``milli`` is compute per GPU in milli-GPUs; ``memory_mib`` is GPU memory per
    GPU (None: proportional to ``milli`` on the chosen card, for MPS, or not
    accounted, for time-slices); ``profiles`` maps model name -> MIG profile
    for ``kind=mig``.
    """

    kind: ShareKind
    count: int
    milli: int
    memory_mib: int | None
    profiles: tuple[tuple[str, str], ...] = ()
    reason: str = ""
    sm_percent: int | None = None
    client_priority: int | None = None
    fraction: float | None = None
    nvlink: bool = False
    choice: int = 0  # which of the request's choices it comes from: 0 the request, i its i-th fallback

    def profile_for(self, model: str) -> MigProfile | None:
        for m, p in self.profiles:
            if m == model:
                return gpu_model(m).profile(p)
        return None


@dataclass(frozen=True, slots=True)
class ResolvedRequest:
    """A request with its alternatives, cheapest first, and the reason for the order."""

    request: GpuRequest
    alternatives: tuple[Alternative, ...]
    reason: str = field(default="")
