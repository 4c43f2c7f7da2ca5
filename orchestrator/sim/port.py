"""The head's cluster port in process: every node alive, every holder alive, a real agent core per node.

:class:`SimPort` is the :class:`~orchestrator.control.service.ClusterPort` a
:class:`~orchestrator.control.service.HeadService` runs over where nothing is Ray: the simulated co-location day
(:mod:`orchestrator.sim.dayrun`) and the head's scale bench (``bench/scale.py``, which names it ``BenchPort``).

Invariants:

* node ``i`` of the config has the Ray node id ``f"{i:056x}"`` (56 hex digits, as Ray's), so ids are stable
  across runs of the same config;
* every node and every holder is alive for the port's whole life: no failure is modelled here;
* ``start_agent`` makes the node's real :class:`~orchestrator.control.agent.AgentCore` on the ``simulated``
  discovery backend and keeps it in ``agents`` by node name; nothing runs on its own: the driver registers,
  heartbeats and applies each agent's replies itself.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from orchestrator.control.agent import AgentCore
from orchestrator.control.discovery.simulated import SimulatedBackend
from orchestrator.control.nodes import RayNodeInfo
from orchestrator.core.config import ClusterConfig, RuntimeSettings, SimNode


class SimPort:
    """The head's :class:`~orchestrator.control.service.ClusterPort`: every node alive, every holder alive,
    an :class:`AgentCore` per node on the simulated backend."""

    def __init__(self, config: ClusterConfig, settings: RuntimeSettings) -> None:
        self.settings = settings
        self.alive = [RayNodeInfo(f"{i:056x}", n.name) for i, n in enumerate(config.nodes)]
        self.agents: dict[str, AgentCore] = {}

    def alive_nodes(self) -> list[RayNodeInfo]:
        return self.alive

    def holders_alive(self, holders: Sequence[str]) -> Mapping[str, bool]:
        return dict.fromkeys(holders, True)

    def start_agent(self, node_name: str, ray_node_id: str, sim_node: SimNode | None, agent_key: str) -> None:
        self.agents[node_name] = AgentCore(node_name, ray_node_id, SimulatedBackend(sim_node, node_name=node_name),
                                           self.settings)
