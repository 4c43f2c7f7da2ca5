"""GPU discovery backends behind one interface (:mod:`.base`): ``nvml`` on real nodes, ``simulated`` elsewhere."""

from __future__ import annotations

from orchestrator.control.discovery.base import DiscoveryBackend, HealthEvent, apply_events
from orchestrator.control.discovery.nvml import NvmlBackend, nvml_available
from orchestrator.control.discovery.simulated import SimulatedBackend
from orchestrator.core.config import SimNode
from orchestrator.core.errors import ConfigError

__all__ = ["DiscoveryBackend", "HealthEvent", "apply_events", "select_backend"]


def select_backend(kind: str, node_name: str, simulated_node: SimNode | None = None) -> DiscoveryBackend:
    """The backend for ``kind`` (auto | nvml | simulated): ``auto`` is NVML where it loads and sees a GPU."""
    if kind == "nvml" or (kind == "auto" and nvml_available()):
        return NvmlBackend(node_name)
    if kind in ("auto", "simulated"):
        return SimulatedBackend(simulated_node, node_name=node_name)
    raise ConfigError("settings.discovery", kind, ["auto", "nvml", "simulated"])
