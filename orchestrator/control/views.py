"""Read views of the head: ``status`` and ``explain``. Pure functions of the ledger and the node registry.

Nothing here changes state; every view is JSON-safe, because it crosses the
Ray port unchanged. Cause codes (:class:`orchestrator.core.reasons.Cause`)
appear beside the texts where the scheduler gave one, so ``--json`` readers
branch on codes, never on wording.
"""

from __future__ import annotations

from typing import Any

from orchestrator.control.ledger import Ledger, LedgerEntry
from orchestrator.control.nodes import NodeRegistry
from orchestrator.core.config import RuntimeSettings
from orchestrator.core.lease import LeaseState
from orchestrator.core.request import ShareKind


def explain_lease(ledger: Ledger, lease_id: str) -> dict[str, Any]:
    """Why a lease is where it is: pending reasons and would-be victims, or its placement reason."""
    e = ledger.get(lease_id)
    out: dict[str, Any] = {"lease_id": e.lease_id, "state": e.lease.state.value, "reason": e.reason()}
    w = e.waiting
    if e.lease.state is LeaseState.PENDING and w is not None:
        out["pending"] = {
            "position": w.position, "reason": w.reason.text, "cause": w.reason.cause.value,
            "reasons": w.unschedulable.to_json()["reasons"] if w.unschedulable else [],
            "would_preempt": [{"lease_id": v, "owner": _owner(ledger, v)} for v in w.would_preempt],
            "being_preempted": [{"lease_id": x.lease_id, "owner": x.spec.owner} for x in ledger
                                if x.preempt_for == e.lease_id and x.lease.state is LeaseState.CHECKPOINTING],
            "preemption_blocked": w.preemption_blocked.text if w.preemption_blocked else "",
            "preemption_blocked_cause": w.preemption_blocked.cause.value if w.preemption_blocked else None,
        }
    if e.grant_reason() and e.lease.allocation is not None:
        a = e.lease.allocation
        out["placement"] = {"node": a.node_name, "gpu_indices": list(a.gpu_indices), "kind": a.kind.value,
                            "reason": e.grant_reason()}
    if e.preempt_for:
        out["preempted"] = {"for": e.preempt_for, "for_owner": _owner(ledger, e.preempt_for),
                            "reason": e.preempt_reason, "cause": e.preempt_cause or None,
                            "checkpoint_path": e.lease.checkpoint_path}
    return out


def _owner(ledger: Ledger, lease_id: str) -> str:
    e = ledger.find(lease_id)
    return e.spec.owner if e else ""


def status(ledger: Ledger, nodes: NodeRegistry, *, settings: RuntimeSettings, policy: str, now: float) -> dict[str, Any]:
    """Nodes with their GPUs and who holds them, live and recently ended leases, the queue, the head's settings."""
    holding_by_gpu: dict[tuple[str, int], list[str]] = {}
    holding_by_mig: dict[tuple[str, int, int], str] = {}
    for e in ledger.holding():
        a = e.lease.allocation
        if a is None:
            continue
        for idx in a.gpu_indices:
            holding_by_gpu.setdefault((a.node_name, idx), []).append(e.lease_id)
        if a.kind is ShareKind.MIG:
            holding_by_mig[(a.node_name, a.gpu_indices[0], a.mig_start or 0)] = e.lease_id
    out_nodes = []
    for rec in sorted(nodes.records.values(), key=lambda r: r.name):
        gpus = [{
            "index": g.index, "uuid": g.uuid, "model": g.model, "memory_mib": g.total_memory_mib,
            "healthy": g.healthy, "health_reason": g.health_reason, "mig_enabled": g.mig_enabled,
            "mig": [{"uuid": m.uuid, "profile": m.profile, "start": m.start,
                     "memory_mib": g.spec.profile(m.profile).memory_mib,
                     "lease": holding_by_mig.get((rec.name, g.index, m.start))} for m in g.mig_devices],
            "nvlink_peers": list(g.nvlink_peers),
            "leases": holding_by_gpu.get((rec.name, g.index), []),
        } for g in rec.inventory.gpus]
        out_nodes.append({"name": rec.name, "state": rec.state.value, "reason": rec.reason,
                          "ray_node_id": rec.ray_node_id, "incarnation": rec.incarnation,
                          "heartbeat_age_s": round(now - rec.last_seen, 3), "model": rec.inventory.model,
                          "handed_out": list(rec.allocated),  # leases the agent reports holding devices for
                          "gpus": gpus})
    entries = list(ledger)
    live = [e for e in entries if not e.lease.terminal]
    ended = sorted((e for e in entries if e.lease.terminal), key=lambda e: e.lease.history[-1].at, reverse=True)[:50]
    queue = sorted((e for e in live if e.lease.state is LeaseState.PENDING), key=lambda e: (-e.lease.priority, e.seq))
    return {
        "nodes": out_nodes,
        "leases": [e.to_dict() for e in sorted(live, key=lambda e: e.seq)],
        "ended_leases": [e.to_dict() for e in ended],
        "queue": [_queue_row(e) for e in queue],
        "head": {"namespace": settings.namespace, "policy": policy, "fencing_counter": ledger.fencing,
                 "agent_ttl_s": settings.agent_ttl_s, "heartbeat_interval_s": settings.heartbeat_interval_s},
    }


def _queue_row(e: LedgerEntry) -> dict[str, Any]:
    return {"lease_id": e.lease_id, "request": e.spec.request.describe(), "priority": e.lease.priority,
            "owner": e.spec.owner, "why_pending": e.why_pending or None,
            "cause": e.waiting.reason.cause.value if e.waiting else None}
