"""Live MIG repartitioning, carried out: each chosen GPU goes through an explicit state machine.

The planner (:mod:`orchestrator.scheduling.repartition`) chooses the GPUs and
their new layouts; this module runs the plan, one :class:`GpuRepartition` per
GPU, driven once per reconcile cycle by :meth:`Repartitions.step` (the
controller's step 4b):

```
planned → cordoned → draining → applying → done
              │          │          └────→ failed
              └──────────┴───────────────→ failed
```

* **cordoned** -- no new grant lands on the GPU: the controller marks it
  unavailable in its snapshot (:meth:`Repartitions.cordoned`; the snapshot's
  health row, so placement and preemption planning both skip it);
* **draining** -- the leases on instances the new layout removes are
  preempted through the ordinary checkpoint path (``HeadController.drain``:
  asked to checkpoint within their class's grace, requeued to resume when they
  asked to be, fenced until the agent confirms their holder stopped). Leases
  on kept instances (same profile and start in both layouts) go on running,
  and leases on other GPUs are never touched;
* **applying** -- nothing occupies a removed instance any more (revoking
  leases included): the node's heartbeat reply carries the layout
  (:meth:`Repartitions.node_work`), the agent destroys the removed instances
  and creates the added ones, leaving kept ones as they are
  (``DiscoveryBackend.reconfigure_mig``), then pushes its new inventory;
* **done** -- the node's inventory shows exactly the new layout: the GPU is
  uncordoned and its new slices are advertised (the snapshot is rebuilt from it);
* **failed** -- the agent reported an error, the node was lost, or draining or
  applying outlived its timeout: the GPU is uncordoned with the layout its
  inventory reports (the old one unless the agent changed it).

Invariants: at most one live repartition per GPU; a record is written to the
store before it is acted on (hard state first), so a restarted head resumes
it; the layout is sent to an agent only once the ledger has nothing occupying
an instance it removes; a kept instance keeps its UUID and its lease; every
edge carries its reason in the record's history.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Any, Mapping

from orchestrator.control.nodes import NodeState
from orchestrator.control.store import StateStore
from orchestrator.core import codec
from orchestrator.core.inventory import NodeInventory
from orchestrator.core.reasons import Cause, Reason
from orchestrator.core.statemachine import Transition, TransitionTable
from orchestrator.scheduling.repartition import GpuChange, MigSlot, RepartitionPlan, layout_text

if TYPE_CHECKING:  # the controller drives this module and passes itself in
    from orchestrator.control.controller import HeadController, ReconcileReport


class RepartitionState(str, Enum):
    PLANNED = "planned"
    CORDONED = "cordoned"
    DRAINING = "draining"
    APPLYING = "applying"
    DONE = "done"
    FAILED = "failed"


R = RepartitionState
REPARTITION_TRANSITIONS: TransitionTable[RepartitionState] = TransitionTable(
    "repartition",
    {
        R.PLANNED: {
            R.CORDONED: "the head accepted the plan: no new grant lands on the GPU from now on",
            R.FAILED: "the GPU or its node is gone before anything started",
        },
        R.CORDONED: {
            R.DRAINING: "the leases on the GPU were asked to checkpoint (or stopped): none left to ask",
            R.FAILED: "the node was lost before the drain started",
        },
        R.DRAINING: {
            R.APPLYING: "nothing occupies the GPU any more: the agent is told the new layout",
            R.FAILED: "the drain outlived its timeout, or the node was lost",
        },
        R.APPLYING: {
            R.DONE: "the agent's inventory shows the new layout: the GPU is uncordoned, its slices advertised",
            R.FAILED: "the agent could not apply the layout, the node was lost, or it outlived its timeout",
        },
        R.DONE: {},
        R.FAILED: {},
    },
    terminal=frozenset({R.DONE, R.FAILED}),
)

#: States in which the GPU is cordoned (no new grant lands on it).
CORDONED_STATES = frozenset({R.CORDONED, R.DRAINING, R.APPLYING})
#: Ended repartitions kept for ``status`` (the store keeps them too, until pushed out).
KEEP_ENDED = 64


@dataclass(frozen=True, slots=True)
class GpuRepartition:
    """One GPU's repartition: the planned change, where it stands, and how it got there."""

    repartition_id: str
    target: str
    change: GpuChange
    state: RepartitionState
    history: tuple[Transition[RepartitionState], ...]
    deadline: float | None = None  # when draining or applying is given up
    failure: str = ""

    @property
    def key(self) -> tuple[str, int]:
        return self.change.node, self.change.gpu_index

    @property
    def terminal(self) -> bool:
        return self.state in REPARTITION_TRANSITIONS.terminal

    def moved(self, to: RepartitionState, now: float, reason: str, **changes: Any) -> "GpuRepartition":
        """The record in ``to`` (an edge of :data:`REPARTITION_TRANSITIONS`, else ``IllegalTransitionError``)."""
        REPARTITION_TRANSITIONS.check(self.state, to)
        return replace(self, state=to, history=self.history + (Transition(now, to, reason),), **changes)

    def to_json(self) -> dict[str, Any]:
        """The stored form (``<namespace>/repartition/<id>``), derived from the fields (:mod:`~orchestrator.core.codec`)."""
        return codec.dump(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "GpuRepartition":
        return codec.load(cls, d, "repartition")


def gpu_layout(inv: NodeInventory, gpu_index: int) -> tuple[MigSlot, ...] | None:
    """The fixed MIG layout ``inv`` reports for a GPU (None: no such GPU)."""
    g = next((g for g in inv.gpus if g.index == gpu_index), None)
    return None if g is None else tuple(sorted(MigSlot(d.start, d.profile) for d in g.mig_devices))


@dataclass
class Repartitions:
    """Every GPU repartition the head runs or ran lately; see the module docstring."""

    store: StateStore
    namespace: str
    drain_timeout_s: float = 900.0
    apply_timeout_s: float = 120.0
    records: dict[str, GpuRepartition] = field(default_factory=dict)
    failed_by_agent: dict[tuple[str, int], str] = field(default_factory=dict)  # soft: what the agents reported
    _ids: Any = field(default_factory=itertools.count)

    @property
    def prefix(self) -> str:
        return f"{self.namespace}/repartition/"

    def restore(self) -> None:
        for key in self.store.keys(self.prefix):
            d = self.store.get(key)
            if d is not None:
                rec = GpuRepartition.from_json(d)
                self.records[rec.repartition_id] = rec
        self.records = dict(sorted(self.records.items(), key=lambda kv: int(kv[0].rsplit("-", 1)[-1])))
        seqs = [int(r.repartition_id.rsplit("-", 1)[-1]) for r in self.records.values()]
        self._ids = itertools.count(max(seqs, default=-1) + 1)

    def _commit(self, rec: GpuRepartition) -> None:
        self.store.put(self.prefix + rec.repartition_id, rec.to_json())  # hard state first
        self.records[rec.repartition_id] = rec

    # ---- reads -----------------------------------------------------------------------------------
    def live(self) -> list[GpuRepartition]:
        return [r for r in self.records.values() if not r.terminal]

    def busy(self) -> set[tuple[str, int]]:
        """GPUs with a live repartition (the planner leaves them alone)."""
        return {r.key for r in self.live()}

    def cordoned(self) -> dict[str, set[int]]:
        """Per node, the GPUs no new grant may land on."""
        out: dict[str, set[int]] = {}
        for r in self.live():
            if r.state in CORDONED_STATES:
                out.setdefault(r.change.node, set()).add(r.change.gpu_index)
        return out

    def node_work(self, node: str) -> dict[str, list[dict[str, Any]]]:
        """What the node's agent must apply now: GPU index (a string) -> the new layout."""
        return {str(r.change.gpu_index): [s.to_json() for s in r.change.new_layout]
                for r in self.live() if r.state is R.APPLYING and r.change.node == node}

    def agent_work(self) -> dict[str, set[tuple[str, str]]]:
        """Per node, ``(repartition id, "reconfigure")`` for each layout its agent must apply (whom to wake)."""
        out: dict[str, set[tuple[str, str]]] = {}
        for r in self.live():
            if r.state is R.APPLYING:
                out.setdefault(r.change.node, set()).add((r.repartition_id, "reconfigure"))
        return out

    def to_json(self) -> list[dict[str, Any]]:
        """Live repartitions and the latest ended ones, oldest first (``status``)."""
        # Not a record's codec: which records ``status`` shows; each is written by its derived codec.
        ended = [r for r in self.records.values() if r.terminal][-KEEP_ENDED:]
        return [r.to_json() for r in self.records.values() if not r.terminal or r in ended]

    # ---- changes ---------------------------------------------------------------------------------
    def start(self, plan: RepartitionPlan, now: float) -> list[GpuRepartition]:
        """One record per change of ``plan``, cordoned at once (a GPU already under way is skipped)."""
        busy = self.busy()
        out = []
        for ch in plan.changes:
            if (ch.node, ch.gpu_index) in busy:
                continue
            rec = GpuRepartition(f"{plan.target}-{ch.node}-{ch.gpu_index}-{next(self._ids)}", plan.target, ch, R.PLANNED,
                                 (Transition(now, R.PLANNED, str(ch.reason)),))
            rec = rec.moved(R.CORDONED, now, f"cordoned: {layout_text(ch.old_layout)} -> {layout_text(ch.new_layout)}")
            self._commit(rec)
            out.append(rec)
        self._prune()
        return out

    def agent_failed(self, node: str, failures: Mapping[str, str] | None) -> None:
        """An agent reports layouts it could not apply (GPU index -> why); the next step fails them."""
        for idx, why in (failures or {}).items():
            self.failed_by_agent[(node, int(idx))] = str(why)

    def step(self, ctl: "HeadController", now: float, report: "ReconcileReport") -> bool:
        """Move every live repartition as far as it can go now; True when a GPU was uncordoned."""
        uncordon = False
        for rec in sorted(self.live(), key=lambda r: r.repartition_id):
            new = self._advance(ctl, rec, now, report)
            if new is rec:
                continue
            self._commit(new)
            if new.state is R.DONE:
                report.reconfigured.append(new.repartition_id)
            elif new.state is R.FAILED:
                report.reconfigure_failed.append(new.repartition_id)
            uncordon |= new.terminal
        if uncordon:
            self._prune()
        return uncordon

    def _advance(self, ctl: "HeadController", rec: GpuRepartition, now: float,
                 report: "ReconcileReport") -> GpuRepartition:
        node, idx = rec.key
        node_rec = ctl.nodes.get(node)
        if node_rec is None or node_rec.state is not NodeState.REGISTERED:
            return rec.moved(R.FAILED, now, f"node {node} lost", failure="node lost")
        if rec.state is R.CORDONED:
            drained = ctl.drain(node, idx, for_item=f"repartition:{rec.repartition_id}",
                                why=f"drained for the MIG repartition of {node} GPU {idx} ({rec.target}: "
                                    f"{layout_text(rec.change.new_layout)})", report=report,
                                keep=rec.change.kept)
            return rec.moved(R.DRAINING, now, f"draining {len(drained)} lease(s): {', '.join(drained) or 'none'}",
                             deadline=now + self.drain_timeout_s)
        if rec.state is R.DRAINING:
            left = [e.lease_id for e in ctl.occupying_gpu(node, idx, rec.change.kept)]
            if not left:
                self.failed_by_agent.pop(rec.key, None)
                kept = f" ({layout_text(rec.change.kept)} kept)" if rec.change.kept else ""
                return rec.moved(R.APPLYING, now, f"removed instances free: agent of {node} told to apply "
                                 f"{layout_text(rec.change.new_layout)}{kept}", deadline=now + self.apply_timeout_s)
            if rec.deadline is not None and now > rec.deadline:
                return rec.moved(R.FAILED, now, f"drain timed out; still occupied by {', '.join(left)}",
                                 failure="drain timeout")
            return rec
        if rec.state is R.APPLYING:
            if gpu_layout(node_rec.inventory, idx) == rec.change.new_layout:
                return rec.moved(R.DONE, now, f"{node} GPU {idx} now {layout_text(rec.change.new_layout)}; uncordoned")
            why = self.failed_by_agent.pop(rec.key, None)
            if why is not None:
                return rec.moved(R.FAILED, now, f"the agent of {node} could not apply it: {why}; layout kept "
                                 f"{layout_text(gpu_layout(node_rec.inventory, idx) or ())}", failure=why)
            if rec.deadline is not None and now > rec.deadline:
                return rec.moved(R.FAILED, now, "the agent did not report the new layout in time", failure="apply timeout")
        return rec

    def _prune(self) -> None:
        ended = [r for r in self.records.values() if r.terminal]
        for r in ended[:-KEEP_ENDED]:
            self.store.delete(self.prefix + r.repartition_id)
            del self.records[r.repartition_id]


def reason_of(rec: GpuRepartition) -> Reason:
    """The record's latest reason, with its cause (``repartition.done``, ``.failed``, or the plan's)."""
    cause = {R.DONE: Cause.REPARTITION_DONE, R.FAILED: Cause.REPARTITION_FAILED}.get(rec.state, rec.change.reason.cause)
    return Reason(cause, rec.history[-1].reason)
