"""What a node has: its GPUs, MIG instances, NVLink islands, health.

An inventory is what a discovery backend reports (NVML on a real node, a YAML
file for a simulated one) and what the head builds its cluster snapshot from.
It is immutable: a change (a GPU going unhealthy, an XID event) is a new
inventory with a higher ``generation``.

Invariants (checked by validators):

* GPU indices on a node are unique, and so are UUIDs;
* a node's GPUs are all of one model (what every GPU node pool in practice
  is, and what lets the placement engine treat a node as one row);
* MIG devices exist only on MIG-enabled GPUs of MIG-capable models, use a
  valid placement of their profile, and never overlap.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator.core.catalogue import GENERIC_PREFIX, GpuModel, generic_model, gpu_model

#: The inventory label naming the Kubernetes node an agent runs on (``$ORCHESTRATOR_NODE_NAME``, set from the
#: pod's ``spec.nodeName``): what the Kubernetes cross-check matches Node objects by.
K8S_NODE_LABEL = "orchestrator.io/k8s-node"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MigDevice(_Frozen):
    """An existing MIG (GPU instance + compute instance) device."""

    uuid: str = Field(description="MIG UUID, as CUDA_VISIBLE_DEVICES takes it (MIG-...)")
    profile: str = Field(description="Profile name, e.g. 1g.10gb")
    start: Annotated[int, Field(ge=0, le=7, description="First memory slice (NVML placement start)")]


class GpuDevice(_Frozen):
    """One physical GPU."""

    index: Annotated[int, Field(ge=0, description="Device index on the node (nvmlDeviceGetIndex)")]
    uuid: str = Field(description="GPU UUID (GPU-...)")
    model: str = Field(description="Catalogue model name, or the name NVML reports")
    memory_mib: Annotated[int, Field(gt=0)] | None = Field(
        default=None, description="Total memory; defaults to the catalogue's figure for the model"
    )
    mig_enabled: bool = Field(default=False, description="MIG mode is on for this card")
    mig_devices: tuple[MigDevice, ...] = Field(
        default=(),
        description="A fixed MIG layout made by the administrator. Empty on a MIG-enabled card means "
        "instances are made on demand at any valid placement.",
    )
    nvlink_peers: tuple[int, ...] = Field(default=(), description="Indices of GPUs this one has NVLink to")
    healthy: bool = True
    health_reason: str = ""

    @model_validator(mode="before")
    @classmethod
    def _register_generic(cls, data: object) -> object:
        # A generic model travels as its name plus the card's memory; whoever reads it registers it.
        if isinstance(data, dict) and str(data.get("model", "")).startswith(GENERIC_PREFIX):
            mem = data.get("memory_mib")
            if not isinstance(mem, int) or isinstance(mem, bool) or mem <= 0:
                raise ValueError(f"gpu {data.get('index')}: generic model {data['model']!r} needs memory_mib > 0, got {mem!r}")
            generic_model(data["model"], mem)
        return data

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str) -> str:
        return gpu_model(v).name  # raises InvalidRequestError naming the allowed models

    @property
    def spec(self) -> GpuModel:
        return gpu_model(self.model)

    @property
    def total_memory_mib(self) -> int:
        return self.memory_mib or self.spec.memory_mib

    @model_validator(mode="after")
    def _mig_layout_valid(self) -> "GpuDevice":
        if self.mig_devices and not self.mig_enabled:
            raise ValueError(f"gpu {self.index}: mig_devices given but mig_enabled is false")
        if self.mig_enabled and not self.spec.mig_capable:
            raise ValueError(f"gpu {self.index}: {self.model} does not support MIG")
        used = 0
        for d in self.mig_devices:
            p = self.spec.profile(d.profile)
            if d.start not in p.placements:
                raise ValueError(
                    f"gpu {self.index}: MIG {d.profile} cannot start at slice {d.start} (valid: {list(p.placements)})"
                )
            if used & p.mask(d.start):
                raise ValueError(f"gpu {self.index}: MIG device {d.uuid} overlaps another instance")
            used |= p.mask(d.start)
        return self


class NodeInventory(_Frozen):
    """A node's GPUs and host resources, as its agent reports them."""

    name: str = Field(min_length=1)
    gpus: tuple[GpuDevice, ...] = ()
    cpu_milli: Annotated[int, Field(ge=0)] = 64_000
    memory_mib: Annotated[int, Field(ge=0)] = 262_144
    labels: dict[str, str] = Field(default_factory=dict)
    generation: int = 0

    @model_validator(mode="after")
    def _consistent(self) -> "NodeInventory":
        idx = [g.index for g in self.gpus]
        if len(set(idx)) != len(idx):
            raise ValueError(f"node {self.name}: duplicate GPU index in {idx}")
        uuids = [g.uuid for g in self.gpus]
        if len(set(uuids)) != len(uuids):
            raise ValueError(f"node {self.name}: duplicate GPU UUID")
        models = {g.model for g in self.gpus}
        if len(models) > 1:
            raise ValueError(f"node {self.name}: GPUs of several models {sorted(models)}; one model per node")
        return self

    @property
    def model(self) -> str | None:
        return self.gpus[0].model if self.gpus else None

    def nvlink_islands(self) -> list[frozenset[int]]:
        """Connected components of the NVLink graph (a GPU without links is its own island)."""
        parent = {g.index: g.index for g in self.gpus}

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for g in self.gpus:
            for p in g.nvlink_peers:
                if p in parent:
                    parent[find(g.index)] = find(p)
        groups: dict[int, set[int]] = {}
        for i in parent:
            groups.setdefault(find(i), set()).add(i)
        return [frozenset(s) for s in sorted(groups.values(), key=min)]
