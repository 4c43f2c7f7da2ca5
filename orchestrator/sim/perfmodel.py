"""Workload models on simulated GPUs: how fast a lease's holder runs on its share.

A machine without GPUs still has to show that a 1g MIG slice serves more
slowly than a whole card and that a time-sliced card wastes time switching.
Holders on simulated GPUs therefore *sleep* for the time the modelled work
would take on their share, and every figure built from it (inference
latency, training steps, GPU utilisation) comes from this one module. On a
real GPU nothing here is used: the holder runs its model on the device and
the time is measured.

The model, per kind of share (``ShareSpeed.of_env`` reads it from the lease's
hand-out environment, so a holder needs nothing else):

* **whole** cards: speed = number of cards; efficiency 1.
* **MIG** ``<g>g.<mem>``: speed = g / 7 (A100 and H100 have 7 compute slices;
  a 1g slice runs about 1/7 of the card's SMs). Hard isolation: no
  interference from the card's other tenants, efficiency 1.
* **MPS** at ``p`` % of the SMs: speed = p / 100 (the MPS active-thread
  percentage caps the SMs a client's kernels may use; with every client
  busy each gets about its cap). Efficiency 1: kernels of different clients
  run concurrently, nothing is switched.
* **time-slice** of ``f`` (milli / 1000): the card's time is shared and each
  switch between contexts costs time: speed = f × (1 − ``TIMESLICE_SWITCH_COST``).
  The model assumes the card's other tenants are busy (the co-location case,
  where training fills every idle cycle); an idle card would give a
  time-sliced holder the whole card.

Work is stated on one whole card of the reference model.

* A **training step** takes ``step_s`` there and saturates whatever share it
  runs on: on a share of speed ``v`` it takes ``step_s / v``.
* An **inference batch** of ``b`` requests takes ``base_ms + per_item_ms × b``
  on a whole card but keeps only ``demand(b) = min(1, b × sm_per_item)`` of
  the card's SMs busy: a small batch of a small model cannot fill an A100
  (the reason a 12 GB model on an 80 GB card wastes it). On a *spatial* share
  (whole, MIG, MPS) of ``s`` of the card's SMs the batch runs at full speed
  while ``demand(b) <= s`` and is stretched by ``demand(b) / s`` beyond; on a
  *time-slice* the card is its only ``f`` of the time, so every batch takes
  ``1 / speed`` times longer, however small.

**GPU utilisation** = useful GPU-time ÷ available GPU-time. Useful GPU-time
is work measured on the reference card, whatever share did it: ``step_s`` per
training step, ``full_time(b) × demand(b)`` per inference batch (SM-seconds,
what DCGM's SM-activity metric reports -- not nvidia-smi's "a kernel was
running", which counts a card running one small kernel as 100 % busy). The
cluster has ``cards × wall`` GPU-seconds available. A share that is held but
idle, a slice nobody asked for, a time-slice's switching, a batch too small
for its card: each shows up as the gap between the two.

Pure: no I/O, no clock; callers sleep or measure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from orchestrator.core import env as E

#: Compute slices of a MIG-capable card (A100, H100): a ``<g>g`` profile runs g of them.
MIG_COMPUTE_SLICES = 7
#: Fraction of a time-sliced card's time lost to context switches when its tenants are all busy.
#: NVIDIA documents no figure; switch costs of 3-10 % are what published time-slicing measurements show.
TIMESLICE_SWITCH_COST = 0.08

_PROFILE = re.compile(r"^(\d+)g\.")


@dataclass(frozen=True, slots=True)
class ShareSpeed:
    """How fast a holder runs and how much of a card it accounts for.

    Invariants: ``speed > 0``; ``0 < efficiency <= 1``; ``speed == card_share * efficiency``.
    """

    kind: str
    card_share: float
    efficiency: float = 1.0

    @property
    def speed(self) -> float:
        """Throughput relative to one whole card of the reference model."""
        return self.card_share * self.efficiency

    @classmethod
    def whole(cls, cards: int = 1) -> "ShareSpeed":
        return cls("whole", float(cards))

    @classmethod
    def mig(cls, profile: str) -> "ShareSpeed":
        m = _PROFILE.match(profile)
        if not m or not 1 <= int(m.group(1)) <= MIG_COMPUTE_SLICES:
            raise ValueError(f"MIG profile {profile!r}: expected '<g>g.<memory>' with 1 <= g <= {MIG_COMPUTE_SLICES}")
        return cls("mig", int(m.group(1)) / MIG_COMPUTE_SLICES)

    @classmethod
    def mps(cls, sm_percent: int) -> "ShareSpeed":
        if not 1 <= sm_percent <= 100:
            raise ValueError(f"MPS share {sm_percent}%: expected 1..100")
        return cls("mps", sm_percent / 100)

    @classmethod
    def timeslice(cls, milli: int) -> "ShareSpeed":
        if not 1 <= milli <= 1000:
            raise ValueError(f"time-slice {milli} milli: expected 1..1000")
        return cls("timeslice", milli / 1000, 1.0 - TIMESLICE_SWITCH_COST)

    @classmethod
    def of_env(cls, environ: Mapping[str, str]) -> "ShareSpeed":
        """The share a lease's hand-out environment describes (a process without a lease: one whole card)."""
        kind = environ.get(E.SHARE_KIND, "whole")
        if kind == "mig":
            return cls.mig(environ.get(E.MIG_PROFILE, ""))
        if kind == "mps":
            return cls.mps(int(environ.get(E.MPS_ACTIVE_THREAD_PERCENTAGE, "100")))
        if kind == "timeslice":
            return cls.timeslice(int(environ.get(E.TIMESLICE_MILLI, "1000")))
        devices = [d for d in environ.get(E.CUDA_VISIBLE_DEVICES, "").split(",") if d.strip()]
        return cls.whole(max(1, len(devices)))


@dataclass(frozen=True, slots=True)
class InferenceModel:
    """Cost of one batch on one whole reference card, and how much of it the batch keeps busy.

    ``base_ms + per_item_ms × b`` seconds on the whole card, using ``min(1, b × sm_per_item)`` of its SMs.
    """

    base_ms: float = 30.0
    per_item_ms: float = 10.0
    sm_per_item: float = 0.04

    def full_s(self, batch: int) -> float:
        """Seconds a batch takes on a whole reference card."""
        return (self.base_ms + self.per_item_ms * max(1, batch)) / 1000.0

    def demand(self, batch: int) -> float:
        """Fraction of a card's SMs a batch of ``batch`` keeps busy."""
        return min(1.0, max(1, batch) * self.sm_per_item)

    def batch_s(self, batch: int, share: ShareSpeed) -> float:
        """Seconds a batch of ``batch`` requests takes on ``share`` (see the module docstring)."""
        full = self.full_s(batch)
        if share.kind == "timeslice":
            return full / share.speed
        sms = min(1.0, share.card_share)  # one replica runs on one card
        return full * max(1.0, self.demand(batch) / sms)

    def useful_gpu_s(self, batch: int) -> float:
        """Useful GPU-seconds one batch is worth, on any share: its SM-seconds on the reference card."""
        return self.full_s(batch) * self.demand(batch)


@dataclass(frozen=True, slots=True)
class TrainingModel:
    """Cost of one training step on one whole reference card; a step saturates its share."""

    step_s: float = 0.02

    def step_time_s(self, share: ShareSpeed) -> float:
        return self.step_s / share.speed

    def useful_gpu_s(self, steps: int) -> float:
        """Useful GPU-seconds ``steps`` steps are worth, on any share."""
        return steps * self.step_s
