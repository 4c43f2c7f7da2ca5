"""Reasons: every decision carries a cause code (an enum) and the text built from it.

As Ray's autoscaler does with its ``Cause``: code reads the code, people read
the text, and ``orchestrator explain --json`` shows both. The codes are
stable strings (they end up in the GCS store, in ``--json`` output and in
metric labels); the texts may be reworded freely.

Groups:

* **fit** -- why a node (or a GPU state) cannot host a request now; the engine's
  :class:`~orchestrator.scheduling.engine.Unschedulable` groups nodes by them;
* **wait** -- why a queued request is still waiting after a scheduling cycle;
* **victim** -- why a running lease is chosen for preemption (a lower
  priority, or capacity it borrowed beyond its queue's quota);
* **ineligible** / **no_preemption** -- why a lease may not be preempted, or
  why no preemption can help;
* **lease** -- why a lease changed state (granted, lost, expired...);
* **scale** -- why the inference service's autoscaler wants the replica count it
  returns (:func:`orchestrator.scheduling.autoscale.decide`);
* **window** -- which time window's quotas are in force
  (:mod:`orchestrator.scheduling.windows`); a wait a window causes is ``wait.window``;
* **repartition** -- why a GPU is (or is not) given a new MIG layout, and how that ended.

Invariant: a :class:`Reason` always has a cause; its text is never parsed.

A decision's JSON carries its reason as two keys, ``reason`` (the text) and ``cause`` (the code), after the
decision's own (:class:`ReasonFields`, for the records whose JSON is derived by :mod:`.codec`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping

from pydantic import SerializerFunctionWrapHandler, model_serializer, model_validator

from orchestrator.core import codec


class Cause(str, Enum):
    # ---- fit: why a node cannot host a request now --------------------------------------------
    FIT_NODE_PIN = "fit.node_pin"                    # the request names another node
    FIT_MODEL = "fit.model"                          # GPU model not among the allowed ones
    FIT_CPU = "fit.cpu"                              # not enough free host CPU
    FIT_HOST_MEMORY = "fit.host_memory"              # not enough free host memory
    FIT_NO_GPU = "fit.no_gpu"                        # the node has no GPUs
    FIT_UNHEALTHY = "fit.unhealthy"                  # every GPU is unhealthy
    FIT_WHOLE = "fit.whole"                          # fewer free whole GPUs than requested
    FIT_NVLINK = "fit.nvlink"                        # no NVLink island with enough free GPUs
    FIT_COMPUTE = "fit.compute"                      # no GPU with enough free compute
    FIT_MEMORY = "fit.memory"                        # no GPU with enough free memory
    FIT_NO_MPS = "fit.no_mps"                        # the model does not support MPS
    FIT_NO_MIG = "fit.no_mig"                        # no MIG-enabled GPU
    FIT_MIG_FULL = "fit.mig_full"                    # no free valid placement for the MIG profile
    FIT_MIG_PROFILE = "fit.mig_profile"              # the model does not offer the profile
    FIT_MODE = "fit.mode"                            # the cards are in another sharing mode
    FIT_GANG = "fit.gang"                            # a gang's worker finds no room once the workers before it are placed
    FIT_GANG_SAME_NODE = "fit.gang_same_node"        # no one node holds every worker of a same-node gang
    # ---- placed --------------------------------------------------------------------------------
    PLACED = "placed"                                # granted where the policy scored best
    PLACED_BORROWING = "placed.borrowing"            # granted on idle capacity beyond the queue's quota
    PLACED_GANG = "placed.gang"                      # every worker of a gang granted at once
    PLACED_GANG_ELASTIC = "placed.gang_elastic"      # an elastic gang granted at the largest size that fits
    ELASTIC_TRIMMED = "elastic.trimmed"              # a worker beyond the size its elastic gang runs at: withdrawn
    # ---- wait: why a queued request still waits ------------------------------------------------
    WAIT_NO_FIT = "wait.no_fit"                      # nothing fits now and no preemption helps
    WAIT_NEVER_FITS = "wait.never_fits"              # no card of the cluster could hold it, even idle: a node must join
    WAIT_QUOTA = "wait.quota"                        # its queue is at its quota and does not borrow
    WAIT_BORROW_ONLY = "wait.borrow_only"            # over its quota: it only borrows idle capacity, preempts nothing
    WAIT_VICTIMS = "wait.victims"                    # victims chosen for it are checkpointing
    WAIT_PREEMPTING = "wait.preempting"              # this cycle chose victims for it
    WAIT_WINDOW = "wait.window"                      # over the quota the time window in force sets its queue (capped, or borrow-only)
    WAIT_GANG_MEMBERS = "wait.gang_members"          # some workers of its gang are not queued (yet, or again)
    WAIT_LIMIT = "wait.limit"                        # it would take its queue (or one above) beyond its limit
    WAIT_RESERVED = "wait.reserved"                  # it waited past the starvation bound: nodes are reserved for it
    WAIT_RESERVATION = "wait.reservation"            # it fits only on nodes reserved for a request that starves
    # ---- victim: why a lease is preempted ------------------------------------------------------
    VICTIM_PRIORITY = "victim.priority"              # a lower priority than the requester
    VICTIM_RECLAIM = "victim.reclaim"                # capacity borrowed beyond its queue's quota is reclaimed
    VICTIM_FAIRSHARE = "victim.fairshare"            # its queue is above its fair share, the requester's below
    VICTIM_CONSOLIDATE = "victim.consolidate"        # moved (checkpoint, requeue, elsewhere) to make room; nothing lost
    VICTIM_RESERVATION = "victim.reservation"        # on nodes reserved for a request past the starvation bound
    VICTIM_SHRINK = "victim.shrink"                  # an elastic gang that resumes at once, smaller, from its checkpoint
    VICTIM_GROW = "victim.grow"                      # an elastic gang checkpoints to resume larger on idle cards
    # ---- ineligible: why a lease may not be preempted ------------------------------------------
    INELIGIBLE_IN_FLIGHT = "ineligible.in_flight"    # already being preempted
    INELIGIBLE_NOT_HOLDING = "ineligible.not_holding"
    INELIGIBLE_CLASS = "ineligible.class"            # its class is not preemptible
    INELIGIBLE_PRIORITY = "ineligible.priority"      # not lower priority, and not borrowing
    INELIGIBLE_MIN_RUNTIME = "ineligible.min_runtime"
    INELIGIBLE_FAIR_SHARE = "ineligible.fair_share"  # fair share does not allow taking it (see scheduling.fairshare)
    # ---- no preemption -------------------------------------------------------------------------
    NO_PREEMPTION_NONE_ELIGIBLE = "no_preemption.none_eligible"
    NO_PREEMPTION_NOT_ENOUGH = "no_preemption.not_enough"  # even all eligible victims would not make room
    # ---- fair: where a queue stands against its fair share (scheduling.fairshare) ----------------------
    FAIR_ABOVE = "fair.above"                        # holds more than its fair share: the excess may be reclaimed
    FAIR_BELOW = "fair.below"                        # holds less than its fair share: goes first, may reclaim
    FAIR_AT = "fair.at"                              # holds its fair share
    FAIR_IDLE = "fair.idle"                          # asks for nothing: its share goes to its siblings
    # ---- lease lifecycle -----------------------------------------------------------------------
    LEASE_REQUESTED = "lease.requested"
    LEASE_REQUEUED = "lease.requeued"
    LEASE_ACTIVATED = "lease.activated"
    LEASE_RELEASED = "lease.released"
    LEASE_WITHDRAWN = "lease.withdrawn"
    LEASE_EXPIRED = "lease.expired"
    LEASE_NODE_LOST = "lease.node_lost"
    LEASE_HOLDER_DIED = "lease.holder_died"
    LEASE_DEVICES_GONE = "lease.devices_gone"
    LEASE_AGENT_REFUSED = "lease.agent_refused"
    LEASE_CHECKPOINT_ASKED = "lease.checkpoint_asked"
    LEASE_CHECKPOINTED = "lease.checkpointed"
    LEASE_GRACE_OVER = "lease.grace_over"
    LEASE_STOPPED = "lease.stopped"                  # preempted without a checkpoint (not started, or its class does not checkpoint)
    LEASE_DRAINED = "lease.drained"                  # preempted to drain a GPU whose MIG layout is being changed
    # ---- repartition: live MIG layout changes (scheduling.repartition, control.repartition) --------
    REPARTITION_CHOSEN = "repartition.chosen"        # this GPU is reconfigured (cheapest to drain among those needed)
    REPARTITION_HAS_LAYOUT = "repartition.has_layout"  # the GPU already has the target layout
    REPARTITION_NOT_NEEDED = "repartition.not_needed"  # the target is met without this GPU
    REPARTITION_PROTECTED = "repartition.protected"  # it holds a non-preemptible lease (inference) and the target does not allow draining it
    REPARTITION_UNHEALTHY = "repartition.unhealthy"  # the GPU is unhealthy: left as it is
    REPARTITION_BUSY = "repartition.busy"            # a repartition of this GPU is already under way
    REPARTITION_NOTHING = "repartition.nothing"      # the target is met already: no GPU changes
    REPARTITION_SHORT = "repartition.short"          # not enough eligible GPUs to meet the target in full
    REPARTITION_DONE = "repartition.done"            # the agent's inventory shows the new layout
    REPARTITION_FAILED = "repartition.failed"        # the agent could not apply it, or it took too long: old layout kept
    # ---- scale: the inference autoscaler's decision ---------------------------------------------
    SCALE_UP = "scale.up"                            # load per replica over the target for upscale_delay_s
    SCALE_DOWN = "scale.down"                        # load per replica under the target for downscale_delay_s
    SCALE_SLO = "scale.slo"                          # p99 latency over the SLO for upscale_delay_s
    SCALE_COLD_START = "scale.cold_start"            # requests arrive with no replica: one at once
    SCALE_FLOOR = "scale.floor"                      # raised to the floor (min_replicas or a window's guarantee) at once
    SCALE_CEILING = "scale.ceiling"                  # lowered to the ceiling (max_replicas or what may be had) at once
    SCALE_HOLD_STEADY = "scale.hold_steady"          # the load asks for the replicas there are
    SCALE_HOLD_BAND = "scale.hold_band"              # load per replica within the tolerance band of the target
    SCALE_HOLD_DELAY = "scale.hold_delay"            # a change is wanted but has not held for its delay yet
    SCALE_HOLD_STARTING = "scale.hold_starting"      # latency over the SLO while replicas already decided still start
    SCALE_UP_FACTOR = "scale.up_factor"              # a move up sized by upscale_factor (beyond max_step_up)
    SCALE_HOLD_PEAK = "scale.hold_peak"              # a scale-down stopped at peak_hold_fraction of the recent peak
    SCALE_WARM_SPARES = "scale.warm_spares"          # processes kept started (no lease) up to the recent peak
    # ---- window: the time window in force ----------------------------------------------------------
    WINDOW_ACTIVE = "window.active"                  # a window's quotas replace the configured ones
    WINDOW_NONE = "window.none"                      # no window covers this time of day: the configured quotas hold
    WINDOW_SURGE = "window.surge"                    # a queue's demand raised its quota above the clock's, up to surge_pct

    @property
    def group(self) -> str:
        return self.value.split(".", 1)[0]


@dataclass(frozen=True, slots=True)
class Reason:
    """A decision's cause and its human-readable text."""

    cause: Cause
    text: str

    def __str__(self) -> str:
        return self.text

    def to_json(self) -> dict[str, Any]:
        return codec.dump(self)

    def fields(self) -> dict[str, str]:
        """``{"reason": text, "cause": code}``: how a decision's JSON carries its reason."""
        return {"reason": self.text, "cause": self.cause.value}


class ReasonFields:
    """Base of a record with a field ``reason: Reason`` whose JSON shows it as :meth:`Reason.fields` does:
    ``reason`` (text) and ``cause`` (code), after every other key; it is read back from those two keys."""

    __slots__ = ()

    @model_serializer(mode="wrap")
    def _reason_last(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        d = handler(self)
        r = d.pop("reason")
        return {**d, "reason": r["text"], "cause": r["cause"]}

    @model_validator(mode="before")
    @classmethod
    def _reason_from_fields(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and isinstance(data.get("reason"), str):
            rest = {k: v for k, v in data.items() if k not in ("reason", "cause")}
            return {**rest, "reason": {"cause": data.get("cause"), "text": data["reason"]}}
        return data
