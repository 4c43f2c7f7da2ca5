"""What one reconcile cycle (or one fast grant) did, and what the head's wrapper must do about it.

A :class:`ReconcileReport` is made empty by the call that starts the work
(:meth:`~orchestrator.control.controller.HeadController.reconcile`,
:meth:`~orchestrator.control.controller.HeadController.schedule_now`) and the
controller's parts append to it as they act: every list only grows, and by the
time the call that made it returns, every change it names is in the store (hard
state first), so the wrapper may act on it. The names are lease ids but for ``lost_nodes`` (node names),
``start_agents`` (the agents the wrapper must start) and the repartition ids of
``reconfigured`` and ``reconfigure_failed``.

It lives apart from the controller so that the parts (:mod:`.leasing`,
:mod:`.agent_link`, :mod:`.victims`) and the MIG runner (:mod:`.repartition`)
can make one without importing the controller.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.control.nodes import AgentStart


@dataclass(slots=True)
class ReconcileReport:
    """What one cycle did, and what the wrapper must do (start agents)."""

    lost_nodes: list[str] = field(default_factory=list)
    lost_leases: list[str] = field(default_factory=list)
    expired_leases: list[str] = field(default_factory=list)
    granted: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    start_agents: list[AgentStart] = field(default_factory=list)
    checkpoint_requested: list[str] = field(default_factory=list)  # victims asked to checkpoint
    preempted: list[str] = field(default_factory=list)  # victims whose holders must now be stopped
    pruned: list[str] = field(default_factory=list)  # ended leases dropped after settings.ended_retention_s
    pruned_before: float | None = None  # the cutoff of this cycle's prune pass, when one ran (jobs use it too)
    plan_seconds: float | None = None  # wall time of this cycle's scheduling pass, when one ran with work
    reconfigured: list[str] = field(default_factory=list)  # MIG repartitions done (the agent shows the new layout)
    reconfigure_failed: list[str] = field(default_factory=list)  # MIG repartitions failed (old layout kept)
