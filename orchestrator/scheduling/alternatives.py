"""Which concrete shares satisfy a request, cheapest first: the ranking of a request's alternatives.

A :class:`~orchestrator.core.request.GpuRequest` that names its kind has one
alternative, the share it asked for. One that states only what it needs
(``memory_mib``, ``compute``, ``isolation``) gets the cheapest kinds that give
the isolation asked for, each with the reason it was chosen:

* ``isolation=hard`` -> the smallest MIG profile with enough memory and
  compute on each MIG-capable model, then a whole card;
* ``isolation=soft`` -> an MPS share, then a whole card;
* ``isolation=none`` -> a time-slice, then an MPS share, then a whole card.

A request with a **fallback** (``mig:1g.10gb|mig:2g.20gb|mps:30|1``) gets
its own alternatives, then each fallback's, in the order given, each reason
saying which choice it is ("fallback 2 of 4: MIG 2g.20gb as asked"); an
alternative equal to one before it is dropped, and so is a unified choice's
last resort, a whole card, when choices follow it (they say what comes
after it: ``mem=10GiB,compute=0.14,isolation=hard|mps:25|1`` is a 1g slice,
then MPS, then a whole card). Each alternative knows what it counts against a
queue's quota (:func:`alternative_demand`): the cycle lets a queue preempt
only for alternatives within its quota (:mod:`.cycle`).

The engine tries them in that order (:mod:`.engine`), admission refuses a
request none of them could ever fit (:mod:`.admission`). Pure: the data types
(:class:`~orchestrator.core.request.Alternative`,
:class:`~orchestrator.core.request.ResolvedRequest`) live in the vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import replace

from orchestrator.core.catalogue import CATALOGUE, MIG_COMPUTE_SLICES, GpuModel, MigProfile
from orchestrator.core.request import Alternative, GpuRequest, Isolation, ResolvedRequest, ShareKind, share_demand


def _smallest_profile(model: GpuModel, memory_mib: int, compute: float) -> MigProfile | None:
    need_slices = math.ceil(compute * MIG_COMPUTE_SLICES - 1e-9) if compute else 1
    fits = [p for p in model.mig_profiles if p.memory_mib >= memory_mib and p.compute_slices >= need_slices]
    # Cheapest = fewest memory slices taken, then fewest compute slices.
    return min(fits, key=lambda p: (p.memory_slices, p.compute_slices), default=None)


def alternative_demand(alt: Alternative) -> float:
    """GPUs ``alt`` holds once granted, as a queue's usage counts them (the allocation's
    :attr:`~orchestrator.core.allocation.Allocation.gpu_demand`); a MIG alternative with a profile per
    model counts its largest."""
    if alt.kind is ShareKind.MIG:
        return max((share_demand(alt.kind, profile=p) for _, p in alt.profiles), default=0.0)
    return share_demand(alt.kind, cards=alt.count, milli=alt.milli)


def resolve(request: GpuRequest) -> ResolvedRequest:
    """Turn a request into concrete alternatives: its own, cheapest first, then its fallback's in the order
    given (duplicates dropped). Pure."""
    if not request.fallback:
        return _resolve_one(request)
    choices = request.choices
    n = len(choices)
    alts: list[Alternative] = []
    seen: set[tuple] = set()
    for i, choice in enumerate(choices):
        label = "choice 1" if i == 0 else f"fallback {i + 1}"
        own = _resolve_one(choice).alternatives
        if choice.kind is None and i + 1 < n:
            own = own[:-1]  # a unified choice's last resort, a whole card: the chain says what comes after it
        for alt in own:
            key = (alt.kind, alt.count, alt.milli, alt.memory_mib, alt.profiles, alt.nvlink, alt.sm_percent,
                   alt.client_priority, alt.fraction)
            if key not in seen:
                seen.add(key)
                alts.append(replace(alt, choice=i, reason=f"{label} of {n}: {alt.reason}"))
    return ResolvedRequest(request, tuple(alts), f"{n} choices in the order given: "
                           + ", then ".join(c.describe() for c in choices))


def _resolve_one(request: GpuRequest) -> ResolvedRequest:
    k = request.kind
    if k is ShareKind.WHOLE:
        alt = Alternative(ShareKind.WHOLE, request.count, 1000, request.memory_mib, nvlink=request.nvlink,
                          reason=f"{request.count} whole card(s) as asked" + (" in one NVLink island" if request.nvlink else ""))
        return ResolvedRequest(request, (alt,), alt.reason)
    if k is ShareKind.MIG:
        profs = tuple((m.name, request.profile) for m in CATALOGUE.values()
                      if any(p.name == request.profile for p in m.mig_profiles))
        alt = Alternative(ShareKind.MIG, 1, 0, None, profiles=profs, reason=f"MIG {request.profile} as asked")
        return ResolvedRequest(request, (alt,), alt.reason)
    if k is ShareKind.MPS:
        alt = Alternative(ShareKind.MPS, 1, request.sm_percent * 10, request.memory_mib,  # type: ignore[operator]
                          sm_percent=request.sm_percent, client_priority=request.client_priority,
                          reason=f"MPS {request.sm_percent}% as asked")
        return ResolvedRequest(request, (alt,), alt.reason)
    if k is ShareKind.TIMESLICE:
        alt = Alternative(ShareKind.TIMESLICE, 1, round(request.fraction * 1000), request.memory_mib,  # type: ignore[operator]
                          fraction=request.fraction, reason=f"time-slice {request.fraction:g} as asked")
        return ResolvedRequest(request, (alt,), alt.reason)

    # Unified: the cheapest kind that gives the isolation asked for.
    compute = request.compute or 0.0
    mem = request.memory_mib or 0
    milli = max(1, math.ceil(compute * 1000)) if compute else 0
    whole = Alternative(ShareKind.WHOLE, 1, 1000, mem or None, reason="whole card: always satisfies the isolation asked for")
    alts: list[Alternative] = []
    iso = request.isolation
    want = f"memory>={mem}MiB, compute>={compute:g}"
    if iso is Isolation.HARD:
        profs = []
        for m in CATALOGUE.values():
            if request.models and m.name not in request.models:
                continue
            p = _smallest_profile(m, mem, compute)
            if p is not None:
                profs.append((m.name, p.name))
        if profs:
            shown = ", ".join(f"{p} on {m}" for m, p in profs)
            alts.append(Alternative(ShareKind.MIG, 1, 0, None, profiles=tuple(profs),
                                    reason=f"isolation=hard: smallest MIG profile with {want} ({shown})"))
        alts.append(whole)
        reason = "isolation=hard needs hardware isolation: a MIG slice, else a whole card"
    else:
        sm = max(1, math.ceil(compute * 100)) if compute else None
        mps_alt = None
        if sm is not None or mem:
            sm = sm or 10
            mps_alt = Alternative(ShareKind.MPS, 1, sm * 10, mem or None, sm_percent=sm,
                                  reason=f"isolation={iso.value}: MPS share of {sm}% SMs with a {mem}MiB memory limit")  # type: ignore[union-attr]
        if iso is Isolation.NONE:
            frac_milli = milli or 100
            alts.append(Alternative(ShareKind.TIMESLICE, 1, frac_milli, mem or None, fraction=frac_milli / 1000,
                                    reason=f"isolation=none: a time-slice of {frac_milli / 1000:g} is cheapest"))
            reason = "isolation=none: a time-slice, else an MPS share, else a whole card"
        else:
            reason = "isolation=soft: an MPS share (SM and memory limits), else a whole card"
        if mps_alt is not None:
            alts.append(mps_alt)
        alts.append(whole)
    return ResolvedRequest(request, tuple(alts), reason)
