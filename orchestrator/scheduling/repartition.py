"""Live MIG repartitioning, planned: which GPUs get a new MIG layout, and which leases must drain first.

A *target* (:class:`MigTarget`) says what mix of MIG slices the cluster should
offer: a layout for some or all MIG-enabled GPUs of a model (by day seven
``1g.10gb`` slices for inference, by night one ``7g.80gb`` slice for
training), or "at least K free slices of profile P". :func:`plan_repartition`
turns it into a :class:`RepartitionPlan` over an immutable
:class:`~orchestrator.scheduling.snapshot.ClusterSnapshot` and the leases
that hold devices, and does nothing else: the controller
(:mod:`orchestrator.control.repartition`) cordons, drains and applies it.

Nomenclature: a *layout* is a card's set of MIG instances, each a
:class:`MigSlot` (profile and first memory slice, NVML's placement start);
an instance the old and the new layout share (same profile, same start) is
*kept*; the others are *removed* or *added*; *draining* preempts, through the
checkpoint path, the leases that hold a removed instance
(:func:`must_move`). A lease on a kept instance goes on running while its
card is relaid around it: MIG creates and destroys one GPU instance at a time
without touching the others, so only the work on slices that change moves.

Rules, in the order they are applied to each MIG-enabled GPU the target covers:

1. a GPU whose fixed layout is already the target's is left alone
   (``repartition.has_layout``) and counts towards the target;
2. a GPU already being repartitioned (``busy``) is left alone (``repartition.busy``);
3. an unhealthy GPU is left alone (``repartition.unhealthy``);
4. a GPU where a lease of a non-preemptible class (inference) holds an instance
   the new layout removes is never chosen (``repartition.protected``) unless the
   target says ``allow_non_preemptible``; inference on a kept instance does not
   protect its card;
5. the others are *eligible*; the plan takes the fewest of them that meet the
   target, cheapest to drain first: the order is (leases to drain, highest
   priority among them, MIG compute slices they hold, node, GPU index) -- no
   lease is best, and the last two make it deterministic. For a free-slice
   target each step takes the cheapest GPU whose gain alone covers what is
   still missing, else the one with the largest gain (the fewest GPUs in
   practice: one step per GPU);
6. eligible GPUs the target does not need are left alone (``repartition.not_needed``).

Invariants: only leases on a chosen GPU that hold a removed instance are
listed to drain (a lease on another GPU, or on a kept instance, never is); every new layout is a valid placement set of the card
(:func:`validate_layout`); every chosen and every skipped GPU carries a
:class:`~orchestrator.core.reasons.Reason`; the planner never changes its
inputs.

The drain ignores the classes' minimum runtimes: a layout change is planned
(a time window turning), not a contest for capacity, and the drained leases
checkpoint and are requeued like any victim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field, field_validator, model_validator

from orchestrator.core import codec
from orchestrator.core.catalogue import MODEL_NAMES, GpuModel, MigProfile, fill_mig, fit_mig, gpu_model
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.lease import Lease
from orchestrator.core.priorities import PriorityClass
from orchestrator.core.reasons import Cause, Reason, ReasonFields
from orchestrator.core.request import ShareKind
from orchestrator.core.validation import typed_error
from orchestrator.scheduling.snapshot import ClusterSnapshot

__all__ = ["GpuChange", "GpuSkipped", "MigSlot", "MigTarget", "PRESETS", "RepartitionPlan", "fill_layout",
           "held_slot", "layout_text", "must_move", "plan_repartition", "target_from", "validate_layout"]


@codec.by_hand
@dataclass(frozen=True, slots=True, order=True)
class MigSlot:
    """One MIG instance of a layout: its first memory slice and its profile (ordered by start)."""

    start: int
    profile: str

    def __str__(self) -> str:
        return f"{self.profile}@{self.start}"

    def to_json(self) -> dict[str, Any]:
        # By hand: the fields' order is the sort order (start first), the JSON the agents read lists profile first.
        return {"profile": self.profile, "start": self.start}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "MigSlot":
        return codec.load(cls, d, "slot")


def layout_text(layout: Sequence[MigSlot]) -> str:
    """``3g.40gb@0 + 2g.20gb@4``, or ``(none)`` for an empty layout."""
    return " + ".join(str(s) for s in layout) or "(none)"


def _parse_slot(item: Any, where: str) -> tuple[str, int | None]:
    if isinstance(item, MigSlot):
        return item.profile, item.start
    if isinstance(item, Mapping):
        start = item.get("start")
        return str(item.get("profile", "")), None if start is None else int(start)
    if isinstance(item, str):
        profile, sep, start = item.partition("@")
        if sep and not start.isdigit():
            raise InvalidRequestError(where, item, "PROFILE or PROFILE@START, e.g. 1g.10gb or 3g.40gb@4")
        return profile, int(start) if sep else None
    raise InvalidRequestError(where, item, "PROFILE or PROFILE@START, e.g. 1g.10gb or 3g.40gb@4")


def validate_layout(model: str, layout: Sequence[Any]) -> tuple[MigSlot, ...]:
    """The layout as valid placements on a card of ``model``, ordered by start.

    Each item is ``PROFILE``, ``PROFILE@START``, a ``{"profile", "start"}`` mapping or a :class:`MigSlot`.
    Items with a start keep it; the others are placed around them by :func:`~orchestrator.core.catalogue.fit_mig`
    (largest first, each at its lowest free start where that works). Raises :class:`InvalidRequestError` naming the profile
    (``layout.<profile>``) and its allowed starts when a start is not one of the profile's placements,
    overlaps another instance or no start is left; and when the compute slices exceed the card's."""
    spec = gpu_model(model)
    if not spec.mig_capable:
        raise InvalidRequestError("layout.model", spec.name, [m for m in MODEL_NAMES if gpu_model(m).mig_capable],
                                  detail=f"{spec.name} has no MIG")
    items = [(*_parse_slot(x, f"layout[{i}]"), i) for i, x in enumerate(layout)]
    profiles = {p: spec.profile(p) for p, _, _ in items}  # an unknown profile: typed error naming the allowed ones
    fixed = [(p, s) for p, s, _ in items if s is not None]
    loose = sorted((p for p, s, _ in items if s is None), key=lambda p: (-profiles[p].memory_slices, p))
    used = 0
    out: list[MigSlot] = []
    for name, start in fixed:
        prof = profiles[name]
        if start not in prof.placements:
            raise InvalidRequestError(f"layout.{name}", start, [str(s) for s in prof.placements],
                                      detail=f"{spec.name} MIG {name} cannot start at memory slice {start}")
        if used & prof.mask(start):
            raise InvalidRequestError(f"layout.{name}", start, _free_starts(prof, used) or ["(none left)"],
                                      detail=f"{name}@{start} overlaps another instance of the layout")
        used |= prof.mask(start)
        out.append(MigSlot(start, name))
    placed = fit_mig(spec, loose, used)
    if placed is None:  # name the first profile that no longer fits beside the ones before it
        n = next(i for i in range(1, len(loose) + 1) if fit_mig(spec, loose[:i], used) is None)
        name, before = loose[n - 1], fit_mig(spec, loose[:n - 1], used) or ()
        raise InvalidRequestError(f"layout.{name}", layout_text(sorted(out + [MigSlot(s, p) for p, s in before])),
                                  [str(s) for s in profiles[name].placements],
                                  detail=f"no free start left for {spec.name} MIG {name} in this layout")
    out += [MigSlot(s, p) for p, s in placed]
    slices = sum(profiles[s.profile].compute_slices for s in out)
    card = spec.mig_profiles[0].card_compute_slices
    if slices > card:
        raise InvalidRequestError("layout", layout_text(sorted(out)), f"at most {card} compute slices on {spec.name}",
                                  detail=f"the layout needs {slices}")
    return tuple(sorted(out))


def _free_starts(prof: MigProfile, used: int) -> list[int]:
    return [s for s in prof.placements if not used & prof.mask(s)]


def fill_layout(model: str, profile: str) -> tuple[MigSlot, ...]:
    """As many instances of ``profile`` as one card of ``model`` holds (memory slices and compute slices)."""
    return tuple(sorted(MigSlot(s, p) for p, s in fill_mig(model, profile)))


class MigTarget(BaseModel):
    """The MIG mix the cluster should offer. Exactly one of ``layout``, ``fill`` or ``free_profile``.

    * ``layout`` (needs ``model``): that layout on ``gpus`` GPUs of the model (all MIG-enabled ones: None);
    * ``fill``: every card of each MIG-capable model filled with its smallest profile (``smallest``:
      small slices for inference) or one instance of its largest (``largest``: a whole card for training);
    * ``free_profile`` with ``free_at_least``: at least that many free (unheld) instances of the profile,
      made by filling cards with it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(default="custom", min_length=1, description="What the target is called (reasons, metrics)")
    model: str | None = Field(default=None, description="Catalogue GPU model; None: every MIG-capable model present")
    layout: tuple[str, ...] | None = Field(default=None, description="PROFILE or PROFILE@START per instance")
    fill: Literal["smallest", "largest"] | None = Field(default=None, description="Fill each card with its "
                                                        "smallest profile, or one instance of its largest")
    gpus: int | None = Field(default=None, ge=1, description="How many GPUs should have the layout (None: all)")
    free_profile: str | None = Field(default=None, description="A profile to offer free instances of")
    free_at_least: int | None = Field(default=None, ge=1, description="How many free instances of free_profile")
    allow_non_preemptible: bool = Field(default=False, description="May drain non-preemptible (inference) leases")
    nodes: tuple[str, ...] = Field(default=(), description="Only GPUs of these nodes (empty: every node)")

    @field_validator("model")
    @classmethod
    def _catalogue_name(cls, v: str | None) -> str | None:
        return None if v is None else gpu_model(v).name  # an alias (NVML's name) becomes the catalogue's

    @model_validator(mode="after")
    def _one_kind(self) -> "MigTarget":
        kinds = [k for k in ("layout", "fill", "free_profile") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise InvalidRequestError("target", kinds or None, "exactly one of layout, fill, free_profile")
        if self.layout is not None:
            if self.model is None:
                raise InvalidRequestError("target.model", None, "a MIG-capable catalogue model",
                                          detail="a layout's profiles belong to one model")
            validate_layout(self.model, self.layout)
        if (self.free_profile is None) != (self.free_at_least is None):
            raise InvalidRequestError("target.free_at_least", self.free_at_least, "given together with free_profile")
        if self.free_profile is not None and self.gpus is not None:
            raise InvalidRequestError("target.gpus", self.gpus, "None for a free-slice target")
        if self.free_profile is not None and self.model is not None:
            fill_layout(self.model, self.free_profile)  # the model offers the profile
        return self

    def layout_for(self, model: GpuModel) -> tuple[MigSlot, ...] | None:
        """The layout the target wants on a card of ``model`` (None: the target does not cover that model)."""
        if self.model is not None and model.name != self.model:
            return None
        if self.layout is not None:
            return validate_layout(model.name, self.layout)
        if self.fill == "smallest":
            return fill_layout(model.name, model.mig_profiles[0].name)
        if self.fill == "largest":
            return validate_layout(model.name, [model.mig_profiles[-1].name])
        assert self.free_profile is not None
        if self.free_profile not in {p.name for p in model.mig_profiles}:
            return None
        return fill_layout(model.name, self.free_profile)


#: Named targets the head's ``repartition_mig`` takes by name.
PRESETS: dict[str, MigTarget] = {
    "inference": MigTarget(name="inference", fill="smallest"),  # day: small slices for many replicas
    "training": MigTarget(name="training", fill="largest"),  # night: one full-card slice per GPU
}


def target_from(spec: str | Mapping[str, Any] | MigTarget) -> MigTarget:
    """A target from a preset name (:data:`PRESETS`), a mapping of :class:`MigTarget` fields, or a target."""
    if isinstance(spec, MigTarget):
        return spec
    if isinstance(spec, str):
        try:
            return PRESETS[spec]
        except KeyError:
            raise InvalidRequestError("target", spec, sorted(PRESETS) + ["a mapping of MigTarget fields"]) from None
    try:
        return MigTarget.model_validate(dict(spec))
    except ValidationError as e:
        raise typed_error(e, "target", MigTarget) from None


def held_slot(lease: Lease) -> MigSlot | None:
    """The MIG instance a lease holds (None: it holds no MIG instance, or one whose start is unknown)."""
    a = lease.allocation
    if a is None or a.kind is not ShareKind.MIG or not a.mig_profile or a.mig_start is None:
        return None
    return MigSlot(int(a.mig_start), a.mig_profile)


def must_move(lease: Lease, new_layout: Collection[MigSlot]) -> bool:
    """Whether a lease on a GPU being relaid must drain first: it holds anything but an instance the new
    layout keeps (a whole card, a share, or a MIG instance that goes)."""
    slot = held_slot(lease)
    return slot is None or slot not in new_layout


@dataclass(frozen=True, slots=True)
class GpuChange(ReasonFields):
    """One GPU to reconfigure: its old and new layout, the leases to drain first (those on instances that
    go, :func:`must_move`), and why it was chosen. Instances in both layouts are kept, with their leases."""

    node: str
    gpu_index: int
    model: str
    old_layout: tuple[MigSlot, ...]
    new_layout: tuple[MigSlot, ...]
    drain: tuple[str, ...]
    reason: Reason

    @property
    def kept(self) -> tuple[MigSlot, ...]:
        """Instances the old and the new layout share: left in place, their leases undisturbed."""
        new = set(self.new_layout)
        return tuple(x for x in self.old_layout if x in new)

    @property
    def removed(self) -> tuple[MigSlot, ...]:
        new = set(self.new_layout)
        return tuple(x for x in self.old_layout if x not in new)

    @property
    def added(self) -> tuple[MigSlot, ...]:
        old = set(self.old_layout)
        return tuple(x for x in self.new_layout if x not in old)

    def to_json(self) -> dict[str, Any]:
        return codec.dump(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "GpuChange":
        return codec.load(cls, d, "change")


@dataclass(frozen=True, slots=True)
class GpuSkipped(ReasonFields):
    """A GPU the target covers that the plan leaves as it is, and why."""

    node: str
    gpu_index: int
    reason: Reason

    def to_json(self) -> dict[str, Any]:
        return codec.dump(self)


@dataclass(frozen=True, slots=True)
class RepartitionPlan(ReasonFields):
    """What to reconfigure for a target; ``reason`` says whether it meets the target in full."""

    target: str
    changes: tuple[GpuChange, ...]
    skipped: tuple[GpuSkipped, ...]
    reason: Reason

    @computed_field  # type: ignore[prop-decorator]
    @property
    def meets_target(self) -> bool:
        return self.reason.cause is not Cause.REPARTITION_SHORT

    def to_json(self) -> dict[str, Any]:
        return codec.dump(self)


@dataclass(frozen=True, slots=True)
class _Gpu:
    node: str
    index: int
    model: GpuModel
    layout: tuple[MigSlot, ...]  # the fixed layout; () on a card that makes instances on demand
    fixed: bool
    healthy: bool
    mig_mask: int
    mig_compute: int


def _mig_gpus(snap: ClusterSnapshot) -> list[_Gpu]:
    """Every present MIG-enabled GPU of the snapshot with its fixed layout, read from the static part."""
    st = snap.static
    layouts: dict[tuple[int, int], list[MigSlot]] = {}
    for prof, bits in st.layout_bits.items():
        for i, j in zip(*bits.nonzero()):
            b = int(bits[i, j])
            layouts.setdefault((int(i), int(j)), []).extend(MigSlot(s, prof) for s in range(8) if b >> s & 1)
    out = []
    healthy, mask, compute = snap.healthy, snap.mig_mask, snap.mig_compute
    for i, j in zip(*(st.mig_enabled & st.present).nonzero()):
        i, j = int(i), int(j)
        out.append(_Gpu(st.names[i], int(st.gpu_index[i, j]), gpu_model(MODEL_NAMES[st.model[i]]),
                        tuple(sorted(layouts.get((i, j), ()))), bool(st.mig_fixed[i, j]), bool(healthy[i, j]),
                        int(mask[i, j]), int(compute[i, j])))
    return out


def _free_count(g: _Gpu, profile: str) -> int:
    """Free instances of ``profile`` on ``g`` now: unheld layout instances, or what fits on demand (greedy)."""
    if not g.model.mig_capable or profile not in {p.name for p in g.model.mig_profiles}:
        return 0
    prof = g.model.profile(profile)
    if g.fixed:
        return sum(1 for s in g.layout if s.profile == profile and not g.mig_mask & prof.mask(s.start))
    used, slices, n = g.mig_mask, g.mig_compute, 0
    for s in prof.placements:
        if not used & prof.mask(s) and slices + prof.compute_slices <= prof.card_compute_slices:
            used |= prof.mask(s)
            slices += prof.compute_slices
            n += 1
    return n


def plan_repartition(snap: ClusterSnapshot, holding: Sequence[Lease], target: MigTarget,
                     classes: Mapping[str, PriorityClass], *, default_class: str = "",
                     busy: Collection[tuple[str, int]] = ()) -> RepartitionPlan:
    """The plan for ``target`` over ``snap`` and the ``holding`` leases; see the module docstring.

    ``classes`` are the priority classes by name (a lease of an unknown class counts as not
    preemptible); ``busy`` the (node, GPU index) pairs already being repartitioned."""
    on_gpu: dict[tuple[str, int], list[Lease]] = {}
    for lease in holding:
        a = lease.allocation
        if a is not None:
            for idx in a.gpu_indices:
                on_gpu.setdefault((a.node_name, idx), []).append(lease)
    nodes = set(target.nodes)
    wants: dict[str, tuple[MigSlot, ...] | None] = {}  # per model: one layout for all its cards
    eligible: list[tuple[tuple[Any, ...], _Gpu, tuple[MigSlot, ...], list[Lease], int]] = []  # ..., leases that stay
    skipped: list[GpuSkipped] = []
    have = 0  # GPUs at the target layout, or free instances of the target's profile
    need_all = 0
    for g in _mig_gpus(snap):
        if g.model.name not in wants:
            wants[g.model.name] = target.layout_for(g.model)
        want = wants[g.model.name]
        if want is None or (nodes and g.node not in nodes):
            continue
        on = sorted(on_gpu.get((g.node, g.index), []), key=lambda x: x.lease_id)
        keep = set(want) if g.fixed else set()  # an on-demand card's instances are not a layout to keep
        leases = [x for x in on if not keep or must_move(x, keep)]  # what must drain; the rest stays
        if target.free_profile is not None:
            have += _free_count(g, target.free_profile) if g.healthy and (g.node, g.index) not in busy else 0
        if g.fixed and g.layout == want:
            have += target.free_profile is None
            skipped.append(GpuSkipped(g.node, g.index, Reason(Cause.REPARTITION_HAS_LAYOUT,
                                                              f"already {layout_text(want)}")))
            continue
        need_all += 1
        if (g.node, g.index) in busy:
            skipped.append(GpuSkipped(g.node, g.index, Reason(Cause.REPARTITION_BUSY, "a repartition of it is under way")))
            continue
        if not g.healthy:
            skipped.append(GpuSkipped(g.node, g.index, Reason(Cause.REPARTITION_UNHEALTHY, "unhealthy (or cordoned)")))
            continue
        protected = [x for x in leases if not _preemptible(x, classes, default_class)]
        if protected and not target.allow_non_preemptible:
            skipped.append(GpuSkipped(g.node, g.index, Reason(
                Cause.REPARTITION_PROTECTED, f"holds non-preemptible {', '.join(_who(x) for x in protected)}; "
                "the target does not allow draining it")))
            continue
        cost = (len(leases), max((x.priority for x in leases), default=-1),
                sum(_slices(x) for x in leases), g.node, g.index)
        eligible.append((cost, g, want, leases, len(on) - len(leases)))
    eligible.sort(key=lambda e: e[0])
    if target.free_profile is not None:
        gains = {id(e): _gain(e, target.free_profile) for e in eligible}
        chosen = _by_gain(eligible, gains, max(0, (target.free_at_least or 0) - have))
        short = have + sum(gains[id(e)] for e in chosen) < (target.free_at_least or 0)
        goal = f"at least {target.free_at_least} free {target.free_profile} (now {have})"
    else:
        need = need_all if target.gpus is None else max(0, target.gpus - have)
        chosen = eligible[:need]
        short = len(chosen) < need
        goal = (f"{target.gpus} GPU(s)" if target.gpus else "every GPU") + f" at the target layout (now {have})"
    picked = {id(e) for e in chosen}
    changes = []
    for rank, e in enumerate(chosen, 1):
        cost, g, want, leases, stays = e
        drain = ", ".join(_who(x) for x in leases) or "no lease"
        kept = f", keeps {stays} lease(s) on unchanged slices" if stays else ""
        changes.append(GpuChange(g.node, g.index, g.model.name, g.layout, want, tuple(x.lease_id for x in leases),
                                 Reason(Cause.REPARTITION_CHOSEN, f"{target.name}: {layout_text(g.layout)} -> "
                                        f"{layout_text(want)}; drains {drain}{kept} (cheapest to drain: #{rank} of "
                                        f"{len(eligible)} eligible)")))
    for e in eligible:
        if id(e) not in picked:
            skipped.append(GpuSkipped(e[1].node, e[1].index, Reason(Cause.REPARTITION_NOT_NEEDED,
                                                                    f"{target.name}: met without it")))
    if short:
        reason = Reason(Cause.REPARTITION_SHORT, f"{target.name}: {goal}; only {len(changes)} eligible GPU(s) to "
                        f"change, {len(skipped)} left as they are")
    elif not changes:
        reason = Reason(Cause.REPARTITION_NOTHING, f"{target.name}: {goal}: met already")
    else:
        reason = Reason(Cause.REPARTITION_CHOSEN, f"{target.name}: {goal}: reconfigure {len(changes)} GPU(s)")
    return RepartitionPlan(target.name, tuple(changes), tuple(sorted(skipped, key=lambda s: (s.node, s.gpu_index))),
                           reason)


def _gain(e: tuple[Any, _Gpu, tuple[MigSlot, ...], list[Lease], int], profile: str) -> int:
    _, g, want, _, _ = e
    return sum(1 for s in want if s.profile == profile) - _free_count(g, profile)


def _by_gain(eligible: list[Any], gains: Mapping[int, int], missing: int) -> list[Any]:
    """Cheapest GPU whose gain alone covers what is missing, else the largest gain (then cheapest); repeat.
    ``eligible`` is in drain-cost order; ``gains`` by ``id`` of its items."""
    left = [e for e in eligible if gains[id(e)] > 0]
    out = []
    while missing > 0 and left:
        pick = next((e for e in left if gains[id(e)] >= missing), None)  # the cheapest that covers it
        if pick is None:  # the largest gain; among equals the cheapest
            best = max(gains[id(e)] for e in left)
            pick = next(e for e in left if gains[id(e)] == best)
        out.append(pick)
        left.remove(pick)
        missing -= gains[id(pick)]
    return out


def _preemptible(lease: Lease, classes: Mapping[str, PriorityClass], default_class: str) -> bool:
    pclass = classes.get(lease.priority_class or default_class)
    return pclass is not None and pclass.preemptible


def _slices(lease: Lease) -> int:
    a = lease.allocation
    return int(a.mig_profile[0]) if a is not None and a.kind is ShareKind.MIG and a.mig_profile else 0


def _who(lease: Lease) -> str:
    return f"{lease.lease_id} ({lease.priority_class or 'default'} {lease.priority})"
