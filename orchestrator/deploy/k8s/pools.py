"""A node pool of the KubeRay config: a set of Kubernetes GPU nodes that look alike, which becomes one
KubeRay worker group (see :mod:`.config` for the nomenclature). A pool declares how its GPUs are shared
(whole cards, MIG devices under the device plugin's *mixed* strategy, MPS or time-slicing shares, or no
GPU at all), its MIG layout (checked to fit one card of its model), the node labels the GPU operator
writes, and what a pod of it asks Kubernetes and Ray for.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from orchestrator.core.catalogue import CATALOGUE, fit_mig, gpu_model
from orchestrator.deploy.k8s.fields import Resources, _bad, _dns_label, _Frozen


Sharing = Literal["whole", "mig", "mps", "time-slicing", "cpu"]

# What each sharing mode asks the GPU operator's feature discovery for.
SHARING_STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"


class SimulatedGpus(_Frozen):
    """GPUs a cpu pool's raylet declares without having them, to try the orchestrator where there are none
    (kind). The head's cluster file (``head.command``'s ``--config``) must list a node named like the pool
    with the same model and count: its agent then reports them through the simulated discovery backend."""

    model: str = Field(description="Catalogue GPU model the simulated node reports (e.g. A100-80GB)")
    gpus: Annotated[int, Field(ge=1, le=16)] = Field(default=1, description="Simulated GPUs of the node")

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        return gpu_model(v).name


class NodePool(_Frozen):
    """A set of alike GPU nodes, rendered as one KubeRay worker group."""

    name: str = Field(description="Worker group name (DNS-1123 label)")
    sharing: Sharing = Field(
        description="whole: pods take whole GPUs (nvidia.com/gpu); mig: MIG devices under the device plugin's "
        "mixed strategy (nvidia.com/mig-<profile>); mps / time-slicing: shares on nodes the GPU operator "
        "configured so (selected by nvidia.com/gpu.sharing-strategy); cpu: no GPUs"
    )
    gpu_model: str | None = Field(
        default=None, description="Catalogue GPU model (e.g. H100-80GB); required unless sharing is cpu"
    )
    gpus_per_node: Annotated[int, Field(ge=1, le=64)] = Field(
        default=8, description="Physical GPUs on each node of the pool; a whole or mig pod takes all of them"
    )
    mig_layout: tuple[str, ...] = Field(
        default=(),
        description="mig only: the MIG instances on each GPU (profile names), as the MIG manager makes them",
    )
    mig_config: str | None = Field(
        default=None,
        description="mig only: value of the nvidia.com/mig.config node label to select (e.g. all-balanced)",
    )
    replicas_per_gpu: Annotated[int, Field(ge=2, le=64)] | None = Field(
        default=None, description="mps / time-slicing only: replicas the device plugin makes of each GPU"
    )
    shares_per_pod: Annotated[int, Field(ge=1)] = Field(
        default=1, description="mps / time-slicing only: shared nvidia.com/gpu a pod requests"
    )
    products: tuple[str, ...] = Field(
        default=(),
        description="nvidia.com/gpu.product values to select; default: derived from the model's catalogue aliases",
    )
    min_replicas: Annotated[int, Field(ge=0)] = Field(default=0, description="Fewest worker pods")
    max_replicas: Annotated[int, Field(ge=0)] = Field(default=4, description="Most worker pods")
    replicas: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="Pods to start with; default min_replicas"
    )
    resources: Resources = Field(default_factory=Resources, description="CPU and memory of each pod")
    priority_class: str | None = Field(default=None, description="Name of a declared priority class")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Extra node labels to require")
    simulated: SimulatedGpus | None = Field(
        default=None,
        description="cpu only: the pod's raylet declares these simulated GPUs (Ray labels rgo.io/node=<pool name> "
        "and rgo.io/gpu-model, resource rgo-node-<pool name>), as `orchestrator up` does locally; at most one "
        "replica, since the node name is the pool's",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _dns_label("name", v)

    @field_validator("gpu_model")
    @classmethod
    def _model(cls, v: str | None) -> str | None:
        return None if v is None else gpu_model(v).name  # raises naming the catalogue's models

    @model_validator(mode="after")
    def _consistent(self) -> "NodePool":
        where = f"pool {self.name!r}"
        if self.simulated is not None:
            if self.sharing != "cpu":
                raise _bad("simulated", self.simulated.model, "nothing (unset)",
                           f"{where}: only a cpu pool simulates GPUs; sharing {self.sharing!r} has real ones")
            if self.max_replicas > 1:
                raise _bad("max_replicas", self.max_replicas, "0 or 1",
                           f"{where}: a simulated node is one raylet (its name is the pool's)")
        if self.sharing == "cpu":
            for f in ("gpu_model", "mig_layout", "replicas_per_gpu"):
                if getattr(self, f):
                    raise _bad(f, getattr(self, f), "nothing (unset)", f"{where}: a cpu pool has no GPUs")
        elif self.gpu_model is None:
            raise _bad("gpu_model", None, sorted(CATALOGUE), f"{where}: sharing {self.sharing!r} needs a GPU model")
        if self.sharing == "mig":
            spec = gpu_model(self.gpu_model or "")
            profiles = [p.name for p in spec.mig_profiles]
            if not spec.mig_capable:
                capable = sorted(m.name for m in CATALOGUE.values() if m.mig_capable)
                raise _bad("gpu_model", spec.name, capable, f"{where}: {spec.name} has no MIG")
            if not self.mig_layout:
                raise _bad("mig_layout", [], f"profiles of {spec.name}: {', '.join(profiles)}",
                           f"{where}: sharing 'mig' needs the instances on each GPU")
            for p in self.mig_layout:
                if p not in profiles:
                    raise _bad("mig_layout", p, profiles, f"{where}: {spec.name} offers no such MIG profile")
            if fit_mig(spec, self.mig_layout) is None:
                raise _bad(
                    "mig_layout", list(self.mig_layout),
                    f"instances of at most {spec.mig_profiles[0].card_compute_slices} compute slices in all, at non-overlapping NVML "
                    f"placements (e.g. {spec.name}'s all-balanced layout)",
                    f"{where}: does not fit one {spec.name}",
                )
        else:
            for f in ("mig_layout", "mig_config"):
                if getattr(self, f):
                    raise _bad(f, getattr(self, f), "nothing (unset)", f"{where}: applies only to sharing 'mig'")
        if self.sharing in ("mps", "time-slicing"):
            if self.replicas_per_gpu is None:
                raise _bad("replicas_per_gpu", None, "an integer >= 2 (the device plugin's replicas)",
                           f"{where}: sharing {self.sharing!r} needs it")
            if self.sharing == "mps" and self.shares_per_pod != 1:
                raise _bad("shares_per_pod", self.shares_per_pod, "1",
                           f"{where}: the NVIDIA device plugin rejects MPS requests for more than one shared GPU")
            if self.shares_per_pod > self.gpus_per_node * self.replicas_per_gpu:
                raise _bad("shares_per_pod", self.shares_per_pod,
                           f"at most {self.gpus_per_node * self.replicas_per_gpu} (gpus_per_node x replicas_per_gpu)",
                           f"{where}: more shares than a node has")
        else:
            if self.replicas_per_gpu is not None:
                raise _bad("replicas_per_gpu", self.replicas_per_gpu, "nothing (unset)",
                           f"{where}: applies only to mps and time-slicing")
            if self.shares_per_pod != 1:
                raise _bad("shares_per_pod", self.shares_per_pod, "1",
                           f"{where}: applies only to mps and time-slicing")
        if self.min_replicas > self.max_replicas:
            raise _bad("min_replicas", self.min_replicas, f"at most max_replicas={self.max_replicas}", where)
        r = self.start_replicas
        if not self.min_replicas <= r <= self.max_replicas:
            raise _bad("replicas", r, f"{self.min_replicas}..{self.max_replicas} (min_replicas..max_replicas)", where)
        return self

    @property
    def start_replicas(self) -> int:
        return self.min_replicas if self.replicas is None else self.replicas

    def gpu_requests(self) -> dict[str, int]:
        """Extended resources one pod of the pool requests (device plugin resource -> count)."""
        if self.sharing == "whole":
            return {"nvidia.com/gpu": self.gpus_per_node}
        if self.sharing == "mig":
            out: dict[str, int] = {}
            for p in self.mig_layout:
                key = f"nvidia.com/mig-{p}"
                out[key] = out.get(key, 0) + self.gpus_per_node
            return dict(sorted(out.items()))
        if self.sharing in ("mps", "time-slicing"):
            return {"nvidia.com/gpu": self.shares_per_pod}
        return {}

    def ray_gpus(self) -> int:
        """GPUs one pod holds from the device plugin: whole cards, MIG devices, or shares."""
        return sum(self.gpu_requests().values())

    def ray_cards(self) -> int:
        """Cards one pod sees, each declared to Ray as its own ``rgo-gpu-<i>`` resource: every card of the
        node (whole, MIG: the slices' parents), or one per device-plugin share at most (MPS, time-slicing)."""
        if self.sharing == "cpu":
            return 0
        if self.sharing in ("mps", "time-slicing"):
            return min(self.shares_per_pod, self.gpus_per_node)
        return self.gpus_per_node
