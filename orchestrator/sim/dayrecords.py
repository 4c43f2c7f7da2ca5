"""The simulated day's vocabulary: its parameters, what it keeps per replica, per training run and for the
figures, and the share an allocation gives its holder. Used by :mod:`orchestrator.sim.dayrun` and its two
sides (:mod:`orchestrator.sim.dayinference`, :mod:`orchestrator.sim.daytraining`).

Invariants:

* :class:`SimParams` is frozen; each default says where it comes from (measured, or an assumption to replace);
* a :class:`Replica` moves ``pending -> starting -> serving`` only (its lease asked, granted, ready); its
  ``kind`` is set when it is granted and never changes;
* a :class:`Run`'s work accrues lazily: ``work`` is what it had at ``since``, and it trains at ``speed`` from
  then only while ``phase == "training"``; ``work`` is only ever set back to ``saved`` (a lost lease), and
  every phase change bumps ``version``, which makes every timer set before it stale;
* :class:`Tally`'s time and request figures count from 00:00 (the warm-up's steps are not counted); the head's
  events (cycles, preemptions, checkpoints, work lost) count from the head's start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from orchestrator.core.allocation import Allocation
from orchestrator.core.request import ShareKind
from orchestrator.sim.perfmodel import InferenceModel, ShareSpeed, TrainingModel
from orchestrator.sim.queueing import ReplicaKind

#: The requester key of every lease the day asks for (its digest is each request's ``requester_digest``).
KEY = "sim-colocation-requester"


class SchemeLike(Protocol):
    """What the day needs of a scheme (``orchestrator.scenarios.colocation.Scheme`` is one)."""

    name: str
    inference_request: str
    load_driven: bool
    mig: str
    windows: bool


@dataclass(frozen=True)
class SimParams:
    """The workload model's parameters; each default says where it comes from."""

    #: Simulated seconds per step while nothing moves.
    tick_s: float = 10.0
    #: Measured: lease asked -> replica serving, 4.1 s (first replica) and 5.5 s (second, under a 40 req/s
    #: spike, after a training preemption) in tests/integration/test_colocation.py (docs/colocation.md). The
    #: grant itself is the head's (simulated); this is the start after it.
    replica_start_s: float = 5.5
    #: Assumption: a warm spare (a replica process started ahead, its model in host memory, no lease) attaching
    #: to a lease when granted: the model's 10 GB copied to the GPU (~0.4 s at 25 GB/s) and a CUDA context
    #: (~0.5 s). Not measured (#36 item 3a's real-time runs should).
    warm_start_s: float = 1.0
    #: Assumption, to be replaced by the real-time runs' measurement (#36 item 3a): writing a checkpoint of a
    #: multi-GB model. The toy MLP of the real runs writes one in 4-20 ms (docs/preemption.md).
    checkpoint_s: float = 30.0
    #: Assumption: a periodic checkpoint every half hour of training.
    checkpoint_every_s: float = 1800.0
    #: Assumption: a (re)started run's start-up (process, data loader, checkpoint read) before its first step.
    resume_s: float = 60.0
    #: The load generator's client timeout: a request waiting longer fails (jobs/loadgen.py).
    timeout_s: float = 30.0
    #: As the scenario's DayConfig: a step of 0.1 s on a card; a batch of b: 100 + 25 b ms on a card.
    trainer: TrainingModel = TrainingModel(step_s=0.1)
    inference: InferenceModel = InferenceModel(base_ms=100.0, per_item_ms=25.0, sm_per_item=0.04)
    #: Stratified latency samples kept for the day's p99 (each step in proportion to its requests).
    representatives: int = 50_000
    #: The head, the backlog and the first replicas start this long before 00:00 (not measured).
    warmup_s: float = 300.0
    #: A spike is absorbed once every service's p99 is back under the SLO and stays there this long.
    settle_s: float = 30.0
    #: Every agent heartbeats this often (and at once when it has work: a revocation, a relayout).
    heartbeat_every_s: float = 1200.0
    #: The head cycles after every step that changed something (a request, a release, a checkpoint, a
    #: relayout, a training lease past its minimum runtime or its grace period) and at least this often
    #: otherwise (what time alone changes besides those is the queue's aging, which orders but frees nothing).
    idle_cycle_s: float = 3600.0


@dataclass
class Replica:
    """One inference replica: one lease of service ``service``, asked ``seq``-th of the day."""

    lease_id: str
    service: int
    seq: int
    state: str = "pending"  # pending -> starting -> serving
    kind: ReplicaKind | None = None


@dataclass
class Run:
    """One training run across its lease attempts (the ``owner`` of every attempt). Work (GPU-seconds) accrues
    lazily: ``work`` is what it had at ``since``, and it trains at ``speed`` from then while ``training``."""

    owner: str
    request: str
    lease_id: str | None = None
    phase: str = "waiting"  # waiting | resuming | training | saving | checkpointing | refused
    speed: float = 0.0
    since: float = 0.0
    work: float = 0.0  # GPU-seconds trained and kept, at ``since``
    saved: float = 0.0  # GPU-seconds at the last checkpoint
    saving: float = 0.0  # what the checkpoint being written holds
    version: int = 0  # bumped on every phase change: older timers are stale
    offset: float = 0.0  # in [0, 1): where in the checkpoint interval this run's first save falls


@dataclass
class Tally:
    """What the day counted, for its figures (GPU-seconds, requests, events)."""

    arrived: float = 0.0
    within: float = 0.0
    dropped: float = 0.0
    train_busy: float = 0.0
    inf_busy: float = 0.0
    inf_sm: float = 0.0
    max_sample: float = 0.0
    preemptions: int = 0
    checkpoints: int = 0
    lost_work: float = 0.0
    reps: list[float] = field(default_factory=list)
    p99s: list[tuple[float, float | None]] = field(default_factory=list)  # (step end, worst service p99 s)
    peak_replicas: int = 0
    peak_replica_cards: float = 0.0
    steps: int = 0
    cycles: int = 0
    warm_starts: int = 0  # replicas that attached to a warm spare process instead of starting cold
    ready_saved_s: float = 0.0  # replica-ready seconds the warm spares saved, summed


def share_of(a: Allocation) -> ShareSpeed:
    """The share an allocation gives its holder (what ``ShareSpeed.of_env`` reads from its hand-out)."""
    if a.kind is ShareKind.MIG:
        return ShareSpeed.mig(a.mig_profile or "")
    if a.kind is ShareKind.MPS:
        return ShareSpeed.mps(int(a.sm_percent or 100))
    if a.kind is ShareKind.TIMESLICE:
        return ShareSpeed.timeslice(max(1, min(1000, int(a.milli))))
    return ShareSpeed.whole(max(1, len(a.gpu_indices)))
