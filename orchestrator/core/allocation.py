"""What one placement takes: an :class:`Allocation`, and its one JSON codec.

An allocation names concrete devices by what the node and CUDA see (node
name, GPU indices and UUIDs, MIG profile/start/UUID, MPS share) and carries
two *locations* that only mean something against one
:class:`~orchestrator.scheduling.snapshot.ClusterSnapshot`: ``node`` (its row)
and ``gpus`` (its columns). :meth:`Allocation.from_json` gives an unlocated
allocation (``node=-1``, ``gpus=()``); the snapshot's ``locate`` fills the
locations in. Nothing else encodes or decodes an allocation: the ledger, the
agent's assignments, the read views and the placement reason all use
:meth:`to_json`.

Invariants: ``milli`` and ``memory_mib`` are per GPU; a MIG allocation has
exactly one GPU and a profile and start; ``to_json`` followed by
``from_json`` gives back the same allocation less its locations.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from orchestrator.core.request import ShareKind, share_demand


@dataclass(frozen=True, slots=True)
class Allocation:
    """What one placement takes; a snapshot's ``apply`` adds it and ``release`` subtracts it exactly.

    ``gpus`` are column positions in the snapshot; ``gpu_indices``/``gpu_uuids``
    are the devices' own indices and UUIDs (what the agent and CUDA see).
    """

    node: int
    node_name: str
    kind: ShareKind
    gpus: tuple[int, ...]
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    model: str | None
    milli: int
    memory_mib: int
    mig_profile: str | None = None
    mig_start: int | None = None
    mig_uuid: str | None = None
    sm_percent: int | None = None
    client_priority: int | None = None
    cpu_milli: int = 0
    host_memory_mib: int = 0

    @property
    def located(self) -> bool:
        """True when ``node``/``gpus`` refer to a snapshot (see the module docstring)."""
        return self.node >= 0

    @property
    def gpu_demand(self) -> float:
        """GPUs this allocation stands for, fractions counted (:func:`~orchestrator.core.request.share_demand`)."""
        return share_demand(self.kind, cards=len(self.gpu_indices), profile=self.mig_profile, milli=self.milli)

    def at(self, node: int, gpus: tuple[int, ...]) -> "Allocation":
        """The same devices at another snapshot location."""
        return replace(self, node=node, gpus=gpus)

    def with_mig_uuid(self, uuid: str) -> "Allocation":
        """The allocation once its MIG instance exists (made on demand by the agent)."""
        return replace(self, mig_uuid=uuid)

    def to_json(self) -> dict[str, Any]:
        """Every field but the snapshot locations, JSON-safe."""
        return {
            "node": self.node_name, "kind": self.kind.value, "model": self.model,
            "gpu_indices": list(self.gpu_indices), "gpu_uuids": list(self.gpu_uuids),
            "milli": self.milli, "memory_mib": self.memory_mib,
            "mig_profile": self.mig_profile, "mig_start": self.mig_start, "mig_uuid": self.mig_uuid,
            "sm_percent": self.sm_percent, "client_priority": self.client_priority,
            "cpu_milli": self.cpu_milli, "host_memory_mib": self.host_memory_mib,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Allocation":
        """An unlocated allocation from :meth:`to_json`'s output."""
        return cls(node=-1, node_name=d["node"], kind=ShareKind(d["kind"]), gpus=(),
                   gpu_indices=tuple(d["gpu_indices"]), gpu_uuids=tuple(d["gpu_uuids"]), model=d.get("model"),
                   milli=d["milli"], memory_mib=d["memory_mib"], mig_profile=d.get("mig_profile"),
                   mig_start=d.get("mig_start"), mig_uuid=d.get("mig_uuid"), sm_percent=d.get("sm_percent"),
                   client_priority=d.get("client_priority"), cpu_milli=d.get("cpu_milli", 0),
                   host_memory_mib=d.get("host_memory_mib", 0))
