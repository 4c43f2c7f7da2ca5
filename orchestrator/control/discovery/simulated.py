"""The ``simulated`` backend: a node's inventory from a cluster file (``configs/*.yaml``).

Health events are injected with :meth:`SimulatedBackend.inject` (tests, demos);
MIG instances made on demand get deterministic UUIDs; they are not added to the
reported inventory, whose ``mig_devices`` mean a *fixed* layout.
:meth:`SimulatedBackend.reconfigure_mig` replaces a card's layout in the
in-memory inventory: an instance in both layouts keeps its UUID, new ones get
new UUIDs (they name the inventory generation), a higher generation, the
on-demand instances of that card forgotten.
"""

from __future__ import annotations

import threading
import uuid
from typing import Sequence

from orchestrator.control.discovery.base import HealthEvent
from orchestrator.core.config import SimNode
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.inventory import GpuDevice, MigDevice, NodeInventory
from orchestrator.scheduling.repartition import validate_layout

_MIG_NS = uuid.UUID("0b8a4a4e-52f0-4f55-8f4e-3c1b5d7a9e21")


class SimulatedBackend:
    name = "simulated"

    def __init__(self, node: SimNode | None, *, node_name: str | None = None) -> None:
        self._inv = node.inventory() if node is not None else NodeInventory(name=node_name or "unnamed")
        self._events: list[HealthEvent] = []
        self.created: dict[tuple[int, str, int], str] = {}
        self.reconfigured: list[tuple[int, tuple[str, ...]]] = []  # (GPU index, new layout), in order
        self._cond = threading.Condition()

    def inventory(self) -> NodeInventory:
        return self._inv

    def inject(self, event: HealthEvent) -> None:
        with self._cond:
            self._events.append(event)
            self._cond.notify_all()

    def poll_events(self, timeout_s: float = 0.0) -> list[HealthEvent]:
        with self._cond:
            if not self._events and timeout_s > 0:
                self._cond.wait(timeout_s)
            out, self._events = self._events, []
        return out

    def create_mig(self, gpu_index: int, profile: str, start: int) -> str:
        g = self._mig_gpu(gpu_index)
        for d in g.mig_devices:
            if d.profile == profile and d.start == start:
                return d.uuid
        key = (gpu_index, profile, start)
        if key not in self.created:
            self.created[key] = f"MIG-{uuid.uuid5(_MIG_NS, f'{self._inv.name}/{gpu_index}/{profile}@{start}')}"
        return self.created[key]

    def reconfigure_mig(self, gpu_index: int, layout: Sequence[tuple[str, int]]) -> tuple[MigDevice, ...]:
        with self._cond:
            g = self._mig_gpu(gpu_index)
            slots = validate_layout(g.model, [f"{p}@{s}" for p, s in layout])
            gen = self._inv.generation + 1
            kept = {(d.profile, d.start): d for d in g.mig_devices}  # an instance in both layouts stays as it is
            devices = tuple(kept.get((s.profile, s.start)) or MigDevice(
                uuid=f"MIG-{uuid.uuid5(_MIG_NS, f'{self._inv.name}/{gpu_index}/{s}/gen{gen}')}",
                profile=s.profile, start=s.start) for s in slots)
            gpus = tuple(x.model_copy(update={"mig_devices": devices}) if x.index == gpu_index else x
                         for x in self._inv.gpus)
            self._inv = self._inv.model_copy(update={"gpus": gpus, "generation": gen})
            self.created = {k: v for k, v in self.created.items() if k[0] != gpu_index}
            self.reconfigured.append((gpu_index, tuple(str(s) for s in slots)))
            return devices

    def _mig_gpu(self, gpu_index: int) -> GpuDevice:
        g = next((g for g in self._inv.gpus if g.index == gpu_index), None)
        if g is None or not g.mig_enabled:
            raise InvalidRequestError("gpu_index", gpu_index, [x.index for x in self._inv.gpus if x.mig_enabled],
                                      detail=f"node {self._inv.name}: no MIG-enabled GPU with that index")
        return g

    def close(self) -> None:
        pass
