"""The agent's logic without Ray: Allocate checks devices, assignments converge, health is pushed."""

from __future__ import annotations

import pytest

from orchestrator.core.allocation import Allocation
from orchestrator.core.errors import InvalidRequestError
from orchestrator.control.agent import AgentCore
from orchestrator.core.config import ClusterConfig, RuntimeSettings
from orchestrator.control.controller import HeadController
from orchestrator.control.discovery import HealthEvent, apply_events, select_backend
from orchestrator.control.discovery.simulated import SimulatedBackend
from orchestrator.control.store import MemoryStore

from .conftest import FakeClock


def _core(demo: ClusterConfig, name: str = "a100-1") -> AgentCore:
    return AgentCore(name, f"ray-{name}", SimulatedBackend(demo.node(name)), RuntimeSettings())


def test_agent_and_head_converge_through_heartbeats(demo: ClusterConfig) -> None:
    clock = FakeClock()
    ctl = HeadController(RuntimeSettings(), MemoryStore(), clock=clock)
    cores = {n.name: _core(demo, n.name) for n in demo.nodes}
    for c in cores.values():
        c.apply_assignments(ctl.register_agent(**c.registration())["assignments"])
    ctl.request_lease({"lease_id": "m", "request": "mig:1g.10gb"})
    ctl.request_lease({"lease_id": "p", "request": "mps:25%"})
    ctl.reconcile()
    for c in cores.values():
        c.apply_assignments(ctl.heartbeat(**c.heartbeat_payload())["assignments"])
    held = {name: sorted(c.allocated) for name, c in cores.items() if c.allocated}
    assert sorted(x for v in held.values() for x in v) == ["m", "p"]
    m_node = ctl.get_lease("m")["allocation"]["node"]
    assert cores[m_node].allocated["m"] == ctl.ledger.get("m").handout.env_vars
    ctl.release("m", ctl.ledger.get("m").lease.fencing_token)
    cores[m_node].apply_assignments(ctl.heartbeat(**cores[m_node].heartbeat_payload())["assignments"])
    assert "m" not in cores[m_node].allocated
    assert ctl.heartbeat(**cores[m_node].heartbeat_payload())["ok"]


def test_allocate_refuses_devices_of_another_node(demo: ClusterConfig) -> None:
    core = _core(demo, "a100-1")
    foreign = {"node": "a100-0", "kind": "whole", "gpu_indices": [0], "gpu_uuids": [demo.node("a100-0").gpu_uuid(0)],  # type: ignore[union-attr]
               "milli": 1000, "memory_mib": 81920}
    with pytest.raises(InvalidRequestError):
        core.allocate("x", Allocation.from_json(foreign))
    core.apply_assignments({"x": {"allocation": foreign, "fencing_token": 3}})
    assert "x" in core.rejected and core.heartbeat_payload()["rejected"]["x"]
    core.apply_assignments({})
    assert core.rejected == {}


def test_mig_on_demand_is_created_by_the_backend_and_reported() -> None:
    from orchestrator.core.config import parse_config

    cfg = parse_config({"nodes": [{"name": "d", "model": "A100-80GB", "gpus": 1, "mig": {0: [{"profile": "1g.10gb", "start": 0}]}}]})
    node = cfg.nodes[0]
    core = AgentCore("d", "ray-d", SimulatedBackend(node), RuntimeSettings())
    # an instance of the fixed layout keeps its UUID; one the layout lacks is made on demand
    alloc = {"node": "d", "kind": "mig", "gpu_indices": [0], "gpu_uuids": [node.gpu_uuid(0)], "milli": 0,
             "memory_mib": 10240, "mig_profile": "1g.10gb", "mig_start": 3, "mig_uuid": None}
    made = core.allocate("m", Allocation.from_json(alloc))
    assert made is not None and made.startswith("MIG-") and core.heartbeat_payload()["mig_uuids"]["m"] == made
    assert core.allocate("m2", Allocation.from_json(alloc)) == made  # idempotent per placement
    fixed = dict(alloc, mig_start=0, mig_uuid=node.inventory().gpus[0].mig_devices[0].uuid)
    assert core.allocate("f", Allocation.from_json(fixed)) is None  # an existing instance is not made again


def test_health_events_make_a_new_inventory_once(demo: ClusterConfig) -> None:
    core = _core(demo, "h100-0")
    assert core.poll_health() is None
    core.backend.inject(HealthEvent(1, False, "XID 79", xid=79))  # type: ignore[attr-defined]
    inv = core.poll_health()
    assert inv is not None and inv.generation == 1 and not inv.gpus[1].healthy
    core.backend.inject(HealthEvent(1, False, "XID 79", xid=79))  # type: ignore[attr-defined]
    assert core.poll_health() is None  # no change, no push
    assert apply_events(inv, []) is inv


def test_auto_discovery_falls_back_to_simulated_without_nvml(demo: ClusterConfig) -> None:
    b = select_backend("auto", "a100-0", demo.node("a100-0"))
    assert b.name == "simulated" and len(b.inventory().gpus) == 4
    assert select_backend("simulated", "elsewhere", None).inventory().gpus == ()
