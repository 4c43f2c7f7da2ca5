"""The discovery interface: what an agent asks of the node's GPUs.

A backend reports the node's :class:`~orchestrator.core.inventory.NodeInventory`
(index, UUID, model, memory, MIG mode and instances with their placements,
NVLink peers, health) and, between inventories, :class:`HealthEvent` s (an
XID error makes a GPU unhealthy). It can also make a MIG instance on a card
that takes them on demand, and give a MIG-enabled card a whole new layout
(:meth:`DiscoveryBackend.reconfigure_mig`: live repartitioning; it never
changes MIG mode). Backends:

* ``nvml`` (:mod:`.nvml`) -- the real GPUs through pynvml;
* ``simulated`` (:mod:`.simulated`) -- the node's entry of a cluster file.

:func:`orchestrator.control.discovery.select_backend` picks one: ``auto`` is ``nvml`` where the NVML library
loads and reports at least one GPU, ``simulated`` otherwise (the default on
machines without GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from orchestrator.core.inventory import MigDevice, NodeInventory


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """A GPU's health changed. ``xid`` is the NVIDIA XID error code when that is the cause."""

    gpu_index: int
    healthy: bool
    reason: str
    xid: int | None = None


class DiscoveryBackend(Protocol):
    name: str

    def inventory(self) -> NodeInventory:
        """The node's devices as they are now."""
        ...

    def poll_events(self, timeout_s: float = 0.0) -> list[HealthEvent]:
        """Health events since the last call; waits at most ``timeout_s`` for the first."""
        ...

    def create_mig(self, gpu_index: int, profile: str, start: int) -> str:
        """Make a MIG instance of ``profile`` at ``start`` on a MIG-enabled card; returns its UUID."""
        ...

    def reconfigure_mig(self, gpu_index: int, layout: Sequence[tuple[str, int]]) -> tuple[MigDevice, ...]:
        """Destroy every GPU and compute instance on a MIG-enabled card and create ``layout`` (``(profile,
        start)`` pairs, valid placements); returns the card's new MIG devices, which :meth:`inventory` reports
        from now on. The caller has made sure nothing runs on the card."""
        ...

    def close(self) -> None: ...


def measured_utilization(backend: DiscoveryBackend) -> dict[int, float]:
    """The backend's measured GPU utilisation (index -> busy fraction); {} when it measures none (simulated)."""
    measure = getattr(backend, "utilization", None)
    return dict(measure()) if measure is not None else {}


def apply_events(inv: NodeInventory, events: list[HealthEvent]) -> NodeInventory:
    """``inv`` with the events' health applied and a higher generation (unchanged if no GPU changed). Pure."""
    by_index = {e.gpu_index: e for e in events}
    gpus = []
    changed = False
    for g in inv.gpus:
        e = by_index.get(g.index)
        if e is not None and (g.healthy != e.healthy or g.health_reason != e.reason):
            g = g.model_copy(update={"healthy": e.healthy, "health_reason": e.reason})
            changed = True
        gpus.append(g)
    if not changed:
        return inv
    return inv.model_copy(update={"gpus": tuple(gpus), "generation": inv.generation + 1})
