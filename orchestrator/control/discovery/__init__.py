"""GPU discovery backends behind one interface (:mod:`.base`): ``nvml`` on real nodes, ``simulated`` elsewhere."""

from orchestrator.control.discovery.base import DiscoveryBackend, HealthEvent, apply_events, select_backend

__all__ = ["DiscoveryBackend", "HealthEvent", "apply_events", "select_backend"]
