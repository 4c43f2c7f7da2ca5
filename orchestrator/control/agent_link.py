"""The head's end of its link with the node agents: registration, inventory pushes, heartbeats, and silence.

Each public function here is a method of
:class:`~orchestrator.control.controller.HeadController` (its class body binds
them by name), so ``ctl`` is the controller and the state it changes -- the
node registry, the ledger, the snapshot (through ``_topology_changed`` and
``_free``) and the ``_dirty`` mark -- is the controller's; nothing here keeps
state of its own.

Invariants:

* **One incarnation speaks for a node.** An inventory push or a heartbeat
  from an agent that is not the node's registered incarnation changes nothing
  and is answered ``{"ok": False, "reregister": True}``; registering the
  registered incarnation again is idempotent (its record is touched, the same
  reply is sent).
* **An agent acts on its own node's leases only.** A heartbeat's ``rejected``,
  ``checkpointed`` and ``mig_uuids`` name leases; one placed on another node,
  or an unknown id, is ignored and logged (:func:`_on_node`).
* **Desired state is pulled.** Every reply carries what the node should hold
  and what it must stop (:mod:`.revocation`), so a lost reply is repaired by
  the next heartbeat; nothing is pushed to an agent.
* **Silence past the TTL loses the node** (step 1 of the cycle,
  :func:`expire_agents`): its holding leases are lost -- fenced while its Ray
  node is still there, since their holders may run on, freed at once once the
  Ray node is gone.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from orchestrator.control import revocation
from orchestrator.control.handout import lease_handout
from orchestrator.control.ledger import LedgerEntry
from orchestrator.control.nodes import NodeRecord, NodeState, RayNodeInfo
from orchestrator.control.reconcile_report import ReconcileReport
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.inventory import NodeInventory
from orchestrator.core.lease import LeaseState

if TYPE_CHECKING:  # the controller binds these functions as its methods
    from orchestrator.control.controller import HeadController

log = logging.getLogger("orchestrator.control.controller")  # the controller's logger: its parts log as it did


def register_agent(ctl: HeadController, node_name: str, ray_node_id: str, incarnation: str,
                   inventory: NodeInventory | Mapping[str, Any]) -> dict[str, Any]:
    """An agent (re-)registers its node with its inventory; the reply carries the heartbeat settings and the
    node's desired state. A new incarnation replaces the node's record."""
    inv = inventory if isinstance(inventory, NodeInventory) else NodeInventory.model_validate(inventory)
    if inv.name != node_name:
        raise InvalidRequestError("inventory.name", inv.name, node_name, detail="inventory of another node")
    now = ctl.clock()
    old = ctl.nodes.get(node_name)
    if old is not None and old.incarnation == incarnation and old.state is NodeState.REGISTERED:
        ctl.nodes.touch(old, now)
        return _ack(ctl, node_name)
    rec = NodeRecord(node_name, ray_node_id, incarnation, inv, NodeState.REGISTERED, now, now,
                     reason="registered" if old is None else f"re-registered (was {old.state.value})")
    ctl.nodes.commit(rec)
    ctl.nodes.starts.pop(node_name, None)
    ctl._topology_changed(node_name)
    ctl._dirty = True
    return _ack(ctl, node_name)


def update_inventory(ctl: HeadController, node_name: str, incarnation: str,
                     inventory: NodeInventory | Mapping[str, Any]) -> dict[str, Any]:
    """ListAndWatch: the agent pushes a changed inventory (health, XID events)."""
    rec = ctl.nodes.current(node_name, incarnation)
    if rec is None:
        return {"ok": False, "reregister": True}
    inv = inventory if isinstance(inventory, NodeInventory) else NodeInventory.model_validate(inventory)
    ctl.nodes.commit(replace(rec, inventory=inv, last_seen=ctl.clock()))
    ctl._topology_changed(node_name)
    ctl._dirty = True
    return {"ok": True}


def heartbeat(ctl: HeadController, node_name: str, incarnation: str, allocated: Sequence[str] = (),
              rejected: Mapping[str, str] | None = None, mig_uuids: Mapping[str, str] | None = None,
              utilization: Mapping[str, float] | None = None, revoked: Sequence[str] = (),
              checkpointed: Mapping[str, str] | None = None,
              reconfigure_failed: Mapping[str, str] | None = None) -> dict[str, Any]:
    """An agent's heartbeat: what it holds, stopped and checkpointed, and MIG layouts it could not apply;
    the reply carries what it should hold, what it must stop (:mod:`.revocation`) and the MIG layouts
    to apply (``reconfigure``, :mod:`.repartition`)."""
    rec = ctl.nodes.current(node_name, incarnation)
    if rec is None:
        return {"ok": False, "reregister": True}
    ctl.nodes.touch(rec, ctl.clock(), tuple(allocated))
    ctl.nodes.measure(node_name, utilization)
    ctl.repartitions.agent_failed(node_name, reconfigure_failed)
    for e in revocation.confirm(ctl.ledger, node_name, revoked):  # the agent stopped them: free now
        ctl._free(e)
    for lease_id, path in (checkpointed or {}).items():
        e = _on_node(ctl, node_name, lease_id)
        if e is not None and e.lease.state is LeaseState.CHECKPOINTING:
            ctl.ack_preemption(lease_id, path, reason=f"checkpoint written through the agent of {node_name}")
    changed: list[LedgerEntry] = []
    for lease_id, uuid in (mig_uuids or {}).items():
        e = _on_node(ctl, node_name, lease_id)
        if e is not None and e.lease.holding and e.handout is None and e.lease.allocation is not None:
            changed.append(replace(e, handout=lease_handout(e.lease, rec.ray_node_id, ctl.settings, mig_uuid=uuid,
                                                            node_gpu_uuids=node_gpu_uuids(rec))))
    if changed:
        ctl.ledger.commit(changed)
    for lease_id, why in (rejected or {}).items():
        e = _on_node(ctl, node_name, lease_id)
        if e is not None and e.lease.holding:
            ctl._lose([e], f"agent on {node_name} refused the devices: {why}", ReconcileReport())
    return {"ok": True, "assignments": revocation.node_assignments(ctl.ledger, node_name),
            "revocations": revocation.node_revocations(ctl.ledger, node_name),
            "reconfigure": ctl.repartitions.node_work(node_name)}


def _on_node(ctl: HeadController, node_name: str, lease_id: str) -> LedgerEntry | None:
    """Lease ``lease_id``'s entry when it is placed on ``node_name``: an agent's heartbeat acts on the leases of
    its own node only (another node's lease, or an unknown id, is ignored and logged)."""
    e = ctl.ledger.find(lease_id)
    a = e.lease.allocation if e is not None else None
    if a is None or a.node_name != node_name:
        log.warning("the agent of %s reported lease %s, which is not on its node: ignored", node_name, lease_id)
        return None
    return e


def _ack(ctl: HeadController, node_name: str) -> dict[str, Any]:
    """The reply to a registration: the heartbeat settings and the node's desired state."""
    return {"ok": True, "heartbeat_interval_s": ctl.settings.heartbeat_interval_s,
            "agent_ttl_s": ctl.settings.agent_ttl_s, "assignments": revocation.node_assignments(ctl.ledger, node_name),
            "revocations": revocation.node_revocations(ctl.ledger, node_name)}


def observe_ray_nodes(ctl: HeadController, nodes: Iterable[RayNodeInfo]) -> None:
    """The live Ray nodes (the wrapper reads the GCS node table); used to decide where agents go."""
    ctl.nodes.observe(nodes)


def agent_start_requested(ctl: HeadController, node_name: str) -> None:
    """The wrapper asked Ray to start an agent on ``node_name``: none is asked for there again within a TTL."""
    ctl.nodes.starts[node_name] = ctl.clock()


# ---- step 1 of the cycle -----------------------------------------------------------------------------
def expire_agents(ctl: HeadController, now: float, report: ReconcileReport) -> None:
    """Lose the nodes whose agents were silent past ``agent_ttl_s``, and their holding leases."""
    for rec, why in ctl.nodes.silent(now, ctl.settings.agent_ttl_s):
        ctl.nodes.commit(replace(rec, state=NodeState.LOST, reason=why))
        report.lost_nodes.append(rec.name)
        # A silent agent on a Ray node that is still there: its holders may well run on. Their leases end,
        # but stay fenced (revoking) until the node's next agent stops them and confirms; only a node that
        # left Ray frees its devices at once.
        fence = ctl.nodes.ray_node_alive(rec)
        if not fence:
            for e in revocation.confirm(ctl.ledger, rec.name):  # a node gone frees what it was stopping
                ctl._free(e)
        ctl._lose([e for e in ctl.ledger.occupying_on(rec.name) if e.lease.holding], f"node {rec.name} lost: {why}",
                  report, fence=fence)
        ctl._topology_changed(rec.name)
    for rec in ctl.nodes.gone_while_lost():  # fenced leases of a node that has since left Ray: free now
        for e in revocation.confirm(ctl.ledger, rec.name):
            ctl._free(e)


def node_gpu_uuids(rec: Any) -> tuple[str, ...]:
    """A node record's GPU UUIDs by index (what a lease's hand-out names the node's cards with)."""
    return tuple(g.uuid for g in sorted(rec.inventory.gpus, key=lambda g: g.index))
