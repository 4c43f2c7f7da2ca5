"""What one placement takes: an :class:`Allocation`, and its one JSON codec (derived from its fields, :mod:`.codec`).

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
from typing import Annotated, Any, Mapping

from pydantic import Field

from orchestrator.core import codec
from orchestrator.core.request import ShareKind, share_demand


@dataclass(frozen=True, slots=True)
class Allocation:
    """What one placement takes; a snapshot's ``apply`` adds it and ``release`` subtracts it exactly.

    ``gpus`` are column positions in the snapshot; ``gpu_indices``/``gpu_uuids``
    are the devices' own indices and UUIDs (what the agent and CUDA see).

    The JSON (:meth:`to_json`) names the node ``node`` and leaves the locations out; its keys come in field
    order, which is why ``model`` sits before the devices.
    """

    node: Annotated[int, codec.left_out(-1)]
    node_name: Annotated[str, Field(alias="node")]
    kind: ShareKind
    model: Annotated[str | None, Field(default=None)]
    gpus: Annotated[tuple[int, ...], codec.left_out(())]
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
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
        return codec.dump(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Allocation":
        """An unlocated allocation from :meth:`to_json`'s output; ``InvalidRequestError`` naming the key
        (``allocation.milli``) when ``d`` is not one."""
        return codec.load(cls, d, "allocation")
