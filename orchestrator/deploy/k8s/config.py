"""One declared config for a KubeRay deployment of the orchestrator.

Why one module over 500 lines: it is one pydantic model tree (pools, MIG
layouts, head, auth, Redis, checkpoints, quotas, overlays) whose cross-field
validators need the whole tree at once; split, each part would import the
others' types back for its checks. Each class is short and stands alone.

``orchestrator k8s render`` turns a :class:`K8sConfig` into every manifest
(``render.py``); nobody hand-edits the YAML. The config is frozen pydantic:
each field says what it means, each validator names the offending value and
what would have been accepted, and :func:`load_config` turns pydantic's
errors into :class:`~orchestrator.core.errors.ConfigError` (exit code 2 in the CLI).

Nomenclature:

* a **node pool** is a set of Kubernetes GPU nodes that look alike; each pool
  becomes one KubeRay worker group whose pods take a whole node's GPUs
  (``whole``), all its MIG devices under the device plugin's *mixed* strategy
  (``mig``), or shares of GPUs the GPU operator set up for MPS or
  time-slicing (``mps``, ``time-slicing``). A ``cpu`` pool has no GPUs (a kind
  cluster for a smoke test);
* a **MIG layout** is the list of instances on *each* GPU of a MIG node, as
  the GPU operator's MIG manager makes them (``nvidia.com/mig.config``);
* an **overlay** is a named partial config deep-merged over the base; the
  renderer writes it as a kustomize overlay of the base.

Invariants (checked here, so the renderer never sees a bad config):

* names are DNS-1123 labels and unique within their kind;
* every MIG layout fits one card of its model (valid NVML placements, at most
  7 compute slices) and uses only that model's profiles;
* every priority class a pool or the head names is declared;
* the minimum cluster (head plus ``min_replicas`` of every pool) fits the
  namespace quota, so the RayCluster can become ready at all;
* the ports the head listens on are distinct;
* the image is named with an explicit tag or digest (never an implied
  ``latest``), so every pod of a cluster runs the same build;
* the training job's checkpoint directory lies on the checkpoint volume,
  which every Ray pod of the training cluster mounts at the same path: every
  attempt of a job, on whichever node, finds the previous attempt's checkpoint.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from orchestrator.core.errors import ConfigError, InvalidRequestError
from orchestrator.core.catalogue import CATALOGUE, fit_mig, gpu_model
from orchestrator.core.priorities import SchedulerConfig
from orchestrator.core.quantity import is_quantity, parse_quantity
from orchestrator.core.validation import typed_error

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_RAY_IMAGE = re.compile(r"^(docker\.io/)?rayproject/ray(-ml)?:(?P<version>\d+\.\d+\.\d+)")
# name[:tag][@digest] with a tag or a digest: a registry host (with a port), path components, then the reference.
_IMAGE_REF = re.compile(
    r"^(?P<name>[a-z0-9]+([._-][a-z0-9]+)*(\.[a-z0-9]+([._-][a-z0-9]+)*)*(:[0-9]+)?(/[a-z0-9]+([._/-][a-z0-9]+)*)*)"
    r"(:(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(@(?P<digest>sha256:[a-f0-9]{64}))?$"
)
# The Dockerfile's tag scheme: <project version>-ray<Ray version>-py311-<variant>.
_OUR_IMAGE = re.compile(r":[^:/@]*-ray(?P<version>\d+\.\d+\.\d+)-")
_HOST_PORT = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?:[0-9]{1,5}$")

Sharing = Literal["whole", "mig", "mps", "time-slicing", "cpu"]

# What each sharing mode asks the GPU operator's feature discovery for.
SHARING_STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"


def _dns_label(field: str, v: str, max_len: int = 63) -> str:
    if len(v) > max_len or not _DNS_LABEL.match(v):
        raise ConfigError(
            field, v, f"a DNS-1123 label: lower-case letters, digits and '-', starting and ending with a letter "
            f"or digit, at most {max_len} characters",
        )
    return v


def _quantity(field: str, v: str) -> str:
    if not is_quantity(v):
        raise ConfigError(field, v, "a Kubernetes quantity, e.g. '4', '500m', '16Gi'")
    return v


def _image(field: str, v: str) -> str:
    m = _IMAGE_REF.match(v)
    if not m or not (m.group("tag") or m.group("digest")):
        raise ConfigError(
            field, v, "an image reference with an explicit tag or digest, e.g. "
            "'registry.example.com/ray-gpu-orchestrator:0.1.0-ray2.60.0-py311-gpu'",
            detail="an untagged image means 'latest', which differs from node to node over time",
        )
    if m.group("tag") == "latest":
        raise ConfigError(field, v, "a fixed tag or a digest", detail="'latest' differs from node to node over time")
    return v


def _bad(field: str, value: Any, allowed: str | list[str], detail: str = "") -> ConfigError:
    """A cross-field check failed; ``field`` is relative to the model that checks it."""
    return ConfigError(field, value, allowed, detail=detail)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Resources(_Frozen):
    """CPU and memory of one pod (requests equal limits: Guaranteed QoS, never evicted first)."""

    cpu: str = Field(default="8", description="CPU cores, a Kubernetes quantity ('8', '500m')")
    memory: str = Field(default="32Gi", description="Memory, a Kubernetes quantity ('32Gi')")

    @field_validator("cpu", "memory")
    @classmethod
    def _q(cls, v: str, info: Any) -> str:
        return _quantity(info.field_name, v)


class PriorityClassSpec(_Frozen):
    """A Kubernetes PriorityClass the deployment creates."""

    name: str = Field(description="PriorityClass name (cluster-scoped, so give it a prefix)")
    value: Annotated[int, Field(ge=-2_147_483_648, le=1_000_000_000)] = Field(
        description="Priority; above 1e9 is reserved for system classes"
    )
    description: str = Field(default="", description="Shown by kubectl describe")
    preempting: bool = Field(
        default=True,
        description="Whether pods of this class may preempt lower ones (preemptionPolicy PreemptLowerPriority, else Never)",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _dns_label("name", v, 253)


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


#: Where the head pod mounts the ConfigMap with the head's cluster file (its settings and its policy file).
HEAD_CONFIG_DIR = "/etc/orchestrator"
HEAD_CONFIG_FILE = f"{HEAD_CONFIG_DIR}/cluster.yaml"


class HeadSpec(_Frozen):
    """The Ray head pod, which also runs the orchestrator head (a native sidecar supervises it)."""

    resources: Resources = Field(default_factory=lambda: Resources(cpu="4", memory="16Gi"))
    supervisor_resources: Resources = Field(
        default_factory=lambda: Resources(cpu="500m", memory="1Gi"),
        description="The orchestrator-head sidecar: the supervisor, the dashboard and the inventory check "
        "(the head actor itself runs in Ray's worker processes, in the ray-head container)",
    )
    priority_class: str | None = Field(default=None, description="Name of a declared priority class")
    command: tuple[str, ...] = Field(
        default=("python", "-m", "orchestrator.deploy.kuberay", "head", "--supervise", "5",
                 "--config", HEAD_CONFIG_FILE, "--k8s-inventory-every", "60"),
        description="The head's supervisor, run by the orchestrator-head sidecar once Ray is up; it must stay "
        "running (--supervise S) and exits when the head actor is lost, so the kubelet restarts it. "
        f"{HEAD_CONFIG_FILE} is the ConfigMap rendered from `scheduler`",
    )
    scheduler: SchedulerConfig = Field(
        default_factory=SchedulerConfig,
        description="The head's policy file (priority classes, queues, quotas, windows), rendered into the "
        f"ConfigMap <name>-head-config the head reads at {HEAD_CONFIG_FILE}. In configs/k8s.yaml "
        "`scheduler_file: <path>` (relative to the config) reads it from a file, e.g. priorities.yaml",
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels the head pod requires")

    @field_validator("command")
    @classmethod
    def _command(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise _bad("command", [], "a command that starts the orchestrator head")
        if "--supervise" not in v:
            raise _bad("command", list(v), "a command with --supervise S",
                       "the sidecar restarts whatever ends; only the supervisor stays running while the head lives")
        return v


class AuthSpec(_Frozen):
    """Ray token authentication (Ray >= 2.52)."""

    mode: Literal["kuberay", "secret", "disabled"] = Field(
        default="kuberay",
        description="kuberay: spec.authOptions.mode=token, the operator (KubeRay >= 1.5.1) makes and injects the "
        "token; secret: RAY_AUTH_MODE=token and RAY_AUTH_TOKEN from a Secret you create (older KubeRay); "
        "disabled: no authentication (dev only)",
    )
    secret_name: str | None = Field(
        default=None,
        description="Secret with key auth_token. kuberay: optional, the operator makes one when unset; "
        "secret: required",
    )

    @model_validator(mode="after")
    def _secret(self) -> "AuthSpec":
        if self.mode == "secret" and not self.secret_name:
            raise _bad("secret_name", None, "the name of a Secret with key auth_token", "mode 'secret' needs it")
        if self.secret_name:
            _dns_label("secret_name", self.secret_name, 253)
        return self


class NetworkSpec(_Frozen):
    """Who may reach the Ray pods (a NetworkPolicy)."""

    operator_namespace: str | None = Field(
        default="kuberay-system",
        description="Namespace of the KubeRay operator, admitted to the dashboard/job API port: RayJob and "
        "RayService need it. None admits no one outside the namespace.",
    )
    monitoring_namespace: str | None = Field(
        default="monitoring", description="Namespace of Prometheus, admitted to the metrics ports only"
    )


class MonitoringSpec(_Frozen):
    """Prometheus PodMonitor and the Grafana dashboard ConfigMap."""

    pod_monitor: bool = Field(default=True, description="Render a PodMonitor (needs the Prometheus operator's CRD)")
    pod_monitor_labels: dict[str, str] = Field(
        default_factory=lambda: {"release": "prometheus"},
        description="Labels your Prometheus' podMonitorSelector matches",
    )
    scrape_interval: str = Field(default="30s", pattern=r"^[0-9]+(ms|s|m|h)$")
    dashboard: bool = Field(default=True, description="Render the Grafana dashboard ConfigMap")
    dashboard_labels: dict[str, str] = Field(
        default_factory=lambda: {"grafana_dashboard": "1"},
        description="Labels the Grafana dashboard sidecar watches for",
    )


class QuotaSpec(_Frozen):
    """A ResourceQuota for the namespace; unset fields are not limited."""

    cpu: str | None = Field(default=None, description="requests.cpu and limits.cpu")
    memory: str | None = Field(default=None, description="requests.memory and limits.memory")
    gpus: Annotated[int, Field(ge=0)] | None = Field(default=None, description="requests.nvidia.com/gpu")
    mig: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict, description="MIG profile -> requests.nvidia.com/mig-<profile>"
    )

    @field_validator("cpu", "memory")
    @classmethod
    def _q(cls, v: str | None, info: Any) -> str | None:
        return None if v is None else _quantity(info.field_name, v)

    @property
    def enabled(self) -> bool:
        return any(v is not None for v in (self.cpu, self.memory, self.gpus)) or bool(self.mig)


class SchedulerSpec(_Frozen):
    """A cluster scheduler admitting whole Ray clusters (Kueue or KAI), or none."""

    kind: Literal["none", "kueue", "kai"] = Field(
        default="none",
        description="kueue: label kueue.x-k8s.io/queue-name; kai: label kai.scheduler/queue (operator run with "
        "batchScheduler.name=kai-scheduler)",
    )
    queue: str | None = Field(default=None, description="Kueue LocalQueue or KAI queue name")

    @model_validator(mode="after")
    def _queue(self) -> "SchedulerSpec":
        if self.kind != "none" and not self.queue:
            raise _bad("queue", None, "a Kueue LocalQueue or KAI queue name", f"kind {self.kind!r} needs a queue")
        if self.kind == "none" and self.queue:
            raise _bad("kind", "none", ["kueue", "kai"], f"queue {self.queue!r} given without a scheduler")
        return self

    def labels(self) -> dict[str, str]:
        if self.kind == "kueue":
            return {"kueue.x-k8s.io/queue-name": self.queue or ""}
        if self.kind == "kai":
            return {"kai.scheduler/queue": self.queue or ""}
        return {}


class _ClaimSpec(_Frozen):
    """A PersistentVolumeClaim the render makes: its class and size."""

    storage_class: str | None = Field(default=None, description="storageClassName of the rendered claim")
    size: str = Field(default="8Gi", description="Requested storage of the rendered claim")

    @field_validator("size")
    @classmethod
    def _q(cls, v: str) -> str:
        return _quantity("size", v)

    @field_validator("storage_class")
    @classmethod
    def _class(cls, v: str | None) -> str | None:
        return None if v is None else _dns_label("storage_class", v, 253)


class CheckpointSpec(_ClaimSpec):
    """Where training jobs checkpoint: one PersistentVolumeClaim, mounted at ``mount_path`` in every Ray pod
    of the training cluster (head and every worker group), so a job's every attempt, on any node, reads
    and writes the same directory. Preemption is only lossless if the checkpoint outlives the pod.

    ``storage_class`` must serve ReadWriteMany (NFS, CephFS, EFS, Filestore, Azure Files); it is required
    unless ``claim_name`` names an existing claim."""

    claim_name: str | None = Field(
        default=None,
        description="An existing PersistentVolumeClaim to mount; unset: render one named <name>-checkpoints",
    )
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce"] = Field(
        default="ReadWriteMany",
        description="ReadWriteMany: pods on every node share it (production). ReadWriteOnce only works when "
        "every Ray pod runs on one node (a one-node kind cluster)",
    )
    size: str = Field(default="100Gi", description="Requested storage of the rendered claim")
    mount_path: str = Field(
        default="/mnt/checkpoints", pattern=r"^/[A-Za-z0-9._/-]*[A-Za-z0-9._-]$",
        description="Where the claim is mounted in every Ray pod; a job's checkpoint_dir lies below it",
    )

    @field_validator("claim_name")
    @classmethod
    def _claim_name(cls, v: str | None) -> str | None:
        return None if v is None else _dns_label("claim_name", v, 253)

    @model_validator(mode="after")
    def _claim(self) -> "CheckpointSpec":
        if self.claim_name is None and self.storage_class is None:
            raise _bad("storage_class", None, "the name of a StorageClass that serves ReadWriteMany",
                       "a rendered checkpoint claim needs it (or set claim_name to an existing claim)")
        if self.mount_path in ("/tmp", "/dev/shm", "/home/ray/.cache") or self.mount_path.startswith(
                ("/tmp/", "/dev/shm/")):
            raise _bad("mount_path", self.mount_path, "a path outside /tmp and /dev/shm (e.g. /mnt/checkpoints)",
                       "those are emptyDirs that die with the pod")
        return self


class RedisSpec(_ClaimSpec):
    """The Redis that backs the GCS (KubeRay's GCS fault tolerance). ``storage_class`` and ``size`` are those
    of its append-only file's ReadWriteOnce claim (deploy true; unset class: the cluster's default)."""

    deploy: bool = Field(
        default=True,
        description="true: render a one-replica Redis (Deployment, Service, Secret, a ReadWriteOnce claim for "
        "its append-only file, a NetworkPolicy admitting only the Ray head pods). false: use the Redis at "
        "address (a managed one)",
    )
    address: str | None = Field(default=None, description="deploy false: host:port of your Redis")
    password_secret: str | None = Field(
        default=None,
        description="Secret whose key 'password' is Redis' password. deploy true: default <name>-redis, rendered "
        "without data (`orchestrator k8s apply` fills it once with a random password, or you create it; "
        "server-side apply never touches data it does not set). deploy false: your Secret, or unset for no "
        "password",
    )
    image: str = Field(default="redis:7.2.5-alpine", description="Redis image (deploy true)")
    resources: Resources = Field(default_factory=lambda: Resources(cpu="500m", memory="1Gi"))

    @field_validator("image")
    @classmethod
    def _img(cls, v: str) -> str:
        return _image("image", v)

    @field_validator("password_secret")
    @classmethod
    def _secret_name(cls, v: str | None) -> str | None:
        return None if v is None else _dns_label("password_secret", v, 253)

    @model_validator(mode="after")
    def _where(self) -> "RedisSpec":
        if self.deploy and self.address:
            raise _bad("address", self.address, "nothing (unset)", "deploy true renders its own Redis")
        if not self.deploy:
            if not self.address:
                raise _bad("address", None, "host:port of a Redis, e.g. redis.example.internal:6379",
                           "deploy false needs the Redis to use")
            if not _HOST_PORT.match(self.address):
                raise _bad("address", self.address, "host:port, e.g. redis.example.internal:6379")
        return self


class GcsFaultToleranceSpec(_Frozen):
    """KubeRay's GCS fault tolerance: the GCS keeps its tables in Redis, so the head pod can die and come
    back with every actor, job and KV entry -- the orchestrator's lease ledger, queue and fencing counter
    live in the GCS KV store."""

    enabled: bool = Field(default=True, description="Render spec.gcsFaultToleranceOptions on every Ray cluster")
    redis: RedisSpec = Field(default_factory=RedisSpec)


class TrainingJobSpec(_Frozen):
    """A RayJob that submits a training job through the orchestrator to the RayCluster.

    The RayJob's entrypoint is built, not written: ``orchestrator submit --job-id <name> ... --checkpoint-dir
    <checkpoints.mount_path>/<name> -- <command>``. A fixed job id makes a retried submitter return the
    same job; a fixed checkpoint directory on the shared volume makes every attempt resume where the
    last one stopped.
    """

    enabled: bool = True
    name: str = Field(default="train", description="RayJob name suffix (<cluster>-<name>), job id and checkpoint subdirectory")
    command: str = Field(
        default="python /opt/orchestrator/jobs/train.py --steps 1000",
        description="The training command; paths are inside the image (see the Dockerfile)",
    )
    gpu: str = Field(default="1", description="GPU request, as `orchestrator submit --gpu`")
    priority: str = Field(default="training", description="Priority class, as `orchestrator submit --priority`")
    active_deadline_seconds: Annotated[int, Field(gt=0)] | None = Field(default=None)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _dns_label("name", v)

    @field_validator("command")
    @classmethod
    def _command(cls, v: str) -> str:
        if not v.strip():
            raise _bad("command", v, "the command the job runs, e.g. python /opt/orchestrator/jobs/train.py")
        return v

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, v: str) -> str:
        from orchestrator.core.request import GpuRequest

        GpuRequest.parse(v)  # raises InvalidRequestError naming the request
        return v

    def checkpoint_dir(self, checkpoints: CheckpointSpec) -> str:
        return f"{checkpoints.mount_path}/{self.name}"

    def entrypoint(self, checkpoints: CheckpointSpec) -> str:
        import shlex

        submit = ["orchestrator", "submit", "--address", "auto", "--wait", "--job-id", self.name,
                  "--name", self.name, "--gpu", self.gpu, "--priority", self.priority,
                  "--checkpoint-dir", self.checkpoint_dir(checkpoints)]
        return f"{shlex.join(submit)} -- {self.command}"


class InferenceSpec(_Frozen):
    """A RayService for the inference service, on its own Ray cluster."""

    enabled: bool = True
    name: str = Field(default="inference", description="RayService name suffix (<cluster>-<name>)")
    import_path: str = Field(
        default="orchestrator.serve.app:app", description="Ray Serve application import path"
    )
    route_prefix: str = Field(default="/", pattern=r"^/")
    pools: tuple[NodePool, ...] = Field(
        default=(), description="Worker groups of the serving cluster; default: the first GPU pool of the cluster"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _dns_label("name", v)


def _default_priority_classes() -> tuple[PriorityClassSpec, ...]:
    return (
        PriorityClassSpec(name="gpu-orchestrator-head", value=100_000,
                          description="Ray head running the orchestrator head: preempted last"),
        PriorityClassSpec(name="gpu-orchestrator-inference", value=50_000,
                          description="Serving workers of the inference RayService"),
        PriorityClassSpec(name="gpu-orchestrator-workers", value=10_000, preempting=False,
                          description="GPU workers of the training cluster; wait rather than preempt"),
    )


class K8sConfig(_Frozen):
    """Everything ``orchestrator k8s render`` needs; one file, ``configs/k8s.yaml``."""

    name: str = Field(default="gpu-orchestrator", description="RayCluster name; prefixes every other object")
    namespace: str = Field(default="gpu-orchestrator", description="Namespace of every namespaced object")
    image: str = Field(
        default="ray-gpu-orchestrator:0.1.0-ray2.60.0-py311-gpu",
        description="Image of every Ray pod, name:tag or name@digest: the project's Dockerfile built FROM "
        "rayproject/ray with the orchestrator, jobs/ and torch (build arg VARIANT=cpu|gpu)",
    )
    ray_version: str = Field(default="2.60.0", pattern=r"^\d+\.\d+\.\d+$", description="Ray version in the image")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    pod_security: Literal["restricted", "baseline", "privileged"] = Field(
        default="baseline",
        description="Pod Security Admission level the namespace enforces. Our containers meet 'restricted' "
        "(warned and audited always); 'baseline' leaves room for containers KubeRay injects",
    )
    read_only_root_filesystem: bool = Field(
        default=True, description="Containers' root filesystem read-only; Ray writes to emptyDir /tmp and /dev/shm"
    )
    head: HeadSpec = Field(default_factory=lambda: HeadSpec(priority_class="gpu-orchestrator-head"))
    pools: tuple[NodePool, ...] = Field(description="GPU node pools, one worker group each")
    autoscaling: bool = Field(default=False, description="Ray's in-tree autoscaler sidecar scales pools between min and max")
    auth: AuthSpec = Field(default_factory=AuthSpec)
    network: NetworkSpec = Field(default_factory=NetworkSpec)
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec)
    quota: QuotaSpec = Field(default_factory=QuotaSpec)
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    priority_classes: tuple[PriorityClassSpec, ...] = Field(default_factory=_default_priority_classes)
    training_job: TrainingJobSpec = Field(default_factory=TrainingJobSpec)
    inference: InferenceSpec = Field(default_factory=InferenceSpec)
    checkpoints: CheckpointSpec = Field(
        default_factory=lambda: CheckpointSpec(claim_name=None, storage_class="nfs-csi"),
        description="The shared volume training jobs checkpoint to",
    )
    gcs_fault_tolerance: GcsFaultToleranceSpec = Field(default_factory=GcsFaultToleranceSpec)
    metrics_port: Annotated[int, Field(ge=1024, le=65535)] = Field(
        default=8080, description="Port of the orchestrator head's Prometheus /metrics"
    )
    dashboard_port: Annotated[int, Field(ge=1024, le=65535)] = Field(
        default=8090, description="Port of the orchestrator's own dashboard (served by the head; "
        "ORCHESTRATOR_DASHBOARD_PORT in the head pod)"
    )
    ray_metrics_port: Annotated[int, Field(ge=1024, le=65535)] = Field(
        default=8081,
        description="Ray's metrics-export-port; KubeRay's default is 8080, which would collide with metrics_port",
    )

    @field_validator("name", "namespace")
    @classmethod
    def _names(cls, v: str, info: Any) -> str:
        # The RayCluster name prefixes pod and service names; KubeRay keeps it short.
        return _dns_label(info.field_name, v, 40 if info.field_name == "name" else 63)

    @model_validator(mode="after")
    def _consistent(self) -> "K8sConfig":
        _image("image", self.image)
        m = _RAY_IMAGE.match(self.image)
        if m is None:
            m = _OUR_IMAGE.search(self.image)
        if m and m.group("version") != self.ray_version:
            raise _bad("ray_version", self.ray_version, m.group("version"),
                       f"image {self.image!r} carries another Ray; KubeRay needs them equal")
        names = [p.name for p in self.pools]
        if not names:
            raise _bad("pools", [], "at least one node pool")
        for pools, field in ((self.pools, "pools"), (self.inference.pools, "inference.pools")):
            seen_names = [p.name for p in pools]
            dup = sorted({n for n in seen_names if seen_names.count(n) > 1})
            if dup:
                raise _bad(field, dup, "unique pool names", "repeated")
        declared = sorted(c.name for c in self.priority_classes)
        if len(set(declared)) != len(declared):
            raise _bad("priority_classes", declared, "unique names", "repeated")
        refs = [("head.priority_class", self.head.priority_class)]
        refs += [(f"pools.{i}.priority_class", p.priority_class) for i, p in enumerate(self.pools)]
        refs += [(f"inference.pools.{i}.priority_class", p.priority_class) for i, p in enumerate(self.inference.pools)]
        for field, ref in refs:
            if ref is not None and ref not in declared:
                raise _bad(field, ref, declared, "not declared in priority_classes")
        ports = {"metrics_port": self.metrics_port, "dashboard_port": self.dashboard_port,
                 "ray_metrics_port": self.ray_metrics_port}
        reserved = {6379: "Ray GCS", 8265: "Ray dashboard", 10001: "Ray client", 8000: "Ray Serve",
                    52365: "Ray dashboard agent"}
        for field, port in ports.items():
            others = {p: f for f, p in ports.items() if f != field}
            if port in reserved or port in others:
                taken = reserved.get(port) or others[port]
                raise _bad(field, port, f"a port other than {sorted({*reserved, *others})}", f"taken by {taken}")
        self._check_quota()
        return self

    @property
    def inference_pools(self) -> tuple[NodePool, ...]:
        if self.inference.pools:
            return self.inference.pools
        gpu = [p for p in self.pools if p.sharing != "cpu"]
        return tuple(gpu[:1]) or tuple(self.pools[:1])

    @property
    def checkpoint_claim(self) -> str:
        """The PersistentVolumeClaim every Ray pod of the training cluster mounts for checkpoints."""
        return self.checkpoints.claim_name or f"{self.name}-checkpoints"

    @property
    def redis_deployed(self) -> bool:
        return self.gcs_fault_tolerance.enabled and self.gcs_fault_tolerance.redis.deploy

    @property
    def redis_service(self) -> str:
        return f"{self.name}-redis"

    @property
    def redis_address(self) -> str | None:
        """host:port the GCS stores its tables at, or None without GCS fault tolerance."""
        ft = self.gcs_fault_tolerance
        if not ft.enabled:
            return None
        return f"{self.redis_service}:6379" if ft.redis.deploy else ft.redis.address

    @property
    def redis_password_secret(self) -> str | None:
        """The Secret with Redis' password (key ``password``), or None for a Redis without one."""
        ft = self.gcs_fault_tolerance
        if not ft.enabled:
            return None
        return ft.redis.password_secret or (f"{self.name}-redis" if ft.redis.deploy else None)

    @property
    def head_secret_name(self) -> str:
        """The Secret with the orchestrator head's credentials (``admin-key``, ``head-secret``), which the
        operator creates (``render --check`` lists the command): never rendered, so never in git."""
        return f"{self.name}-orchestrator"

    def external_refs(self) -> set[tuple[str, str]]:
        """(kind, name) of the objects the render refers to but the operator creates: the render check
        (tests/k8s/test_references.py) accepts exactly these as missing from the render."""
        out: set[tuple[str, str]] = {("Secret", self.head_secret_name)}
        if self.auth.secret_name:
            out.add(("Secret", self.auth.secret_name))
        ft = self.gcs_fault_tolerance
        if ft.enabled and not ft.redis.deploy and ft.redis.password_secret:
            out.add(("Secret", ft.redis.password_secret))
        if self.checkpoints.claim_name:
            out.add(("PersistentVolumeClaim", self.checkpoints.claim_name))
        return out

    def minimum_requests(self) -> dict[str, float]:
        """What the head, every pool's ``min_replicas`` and the Redis request: the least the cluster needs to be ready."""
        total: dict[str, float] = {
            "cpu": parse_quantity(self.head.resources.cpu) + parse_quantity(self.head.supervisor_resources.cpu),
            "memory": (parse_quantity(self.head.resources.memory)
                       + parse_quantity(self.head.supervisor_resources.memory)),
        }
        if self.redis_deployed:
            total["cpu"] += parse_quantity(self.gcs_fault_tolerance.redis.resources.cpu)
            total["memory"] += parse_quantity(self.gcs_fault_tolerance.redis.resources.memory)
        for p in self.pools:
            n = p.min_replicas
            total["cpu"] += n * parse_quantity(p.resources.cpu)
            total["memory"] += n * parse_quantity(p.resources.memory)
            for k, v in p.gpu_requests().items():
                total[k] = total.get(k, 0) + n * v
        return total

    def _check_quota(self) -> None:
        q = self.quota
        if not q.enabled:
            return
        need = self.minimum_requests()
        limits: dict[str, tuple[str, float]] = {}
        if q.cpu is not None:
            limits["cpu"] = ("quota.cpu", parse_quantity(q.cpu))
        if q.memory is not None:
            limits["memory"] = ("quota.memory", parse_quantity(q.memory))
        if q.gpus is not None:
            limits["nvidia.com/gpu"] = ("quota.gpus", q.gpus)
        for profile, n in q.mig.items():
            limits[f"nvidia.com/mig-{profile}"] = (f"quota.mig[{profile}]", n)
        for res, (field, limit) in limits.items():
            if need.get(res, 0) > limit:
                raise _bad(field, limit, f"at least {need[res]:g} {res}",
                           "below what the head and the pools' min_replicas request; the RayCluster could never "
                           "become ready")
        known = sorted({p.name for m in CATALOGUE.values() for p in m.mig_profiles})
        for profile in q.mig:
            if profile not in known:
                raise _bad("quota.mig", profile, known, "no such MIG profile")


def deep_merge(base: Any, over: Any) -> Any:
    """``over`` merged into ``base``: mappings merge key by key, ``null`` resets a key to its
    default (drops it), anything else (lists too) replaces."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = deep_merge(base[k], v) if k in base else v
        return out
    return over


def _config_error(e: ValidationError, prefix: str = "") -> ConfigError:
    """Pydantic's first error as a :class:`ConfigError` naming the field (``prefix`` + its location).

    Pydantic's own errors are worded by :func:`~orchestrator.core.validation.typed_error`, as every model's
    are. Our own checks' errors are placed by this module's convention: a :class:`ConfigError` names its
    field relative to the model that checks it (so it is put after the location), and any other typed
    error (an unknown GPU model, from the catalogue) is named by the location alone."""
    err = e.errors(include_url=False)[0]
    inner = (err.get("ctx") or {}).get("error")
    if not isinstance(inner, InvalidRequestError):
        return cast(ConfigError, typed_error(e, prefix.rstrip("."), K8sConfig, ConfigError))
    loc = ".".join(str(p) for p in err["loc"])
    parts = [x for x in (prefix.rstrip("."), loc) if x]
    if isinstance(inner, ConfigError):
        if inner.field != loc.rsplit(".", 1)[-1]:
            parts.append(inner.field)
        return ConfigError(".".join(parts), inner.value, inner.allowed, detail=inner.detail)
    return ConfigError(".".join(parts) or "(config)", inner.value, inner.allowed,
                       detail=inner.detail or f"unknown {inner.field}")


def parse_config(data: dict[str, Any]) -> tuple[K8sConfig, dict[str, K8sConfig]]:
    """The base config and each overlay's full config from one mapping.

    Overlays may not change ``name`` or ``namespace``: kustomize patches
    target objects by those, and a renamed object would be a second cluster.
    """
    if not isinstance(data, dict):
        raise ConfigError("(config)", type(data).__name__, "a mapping of fields", detail="the config must be a mapping")
    data = dict(data)
    overlays_raw = data.pop("overlays", {}) or {}
    if not isinstance(overlays_raw, dict):
        raise ConfigError("overlays", overlays_raw, "a mapping of overlay name -> partial config")
    try:
        base = K8sConfig.model_validate(data)
    except ValidationError as e:
        raise _config_error(e) from None
    overlays: dict[str, K8sConfig] = {}
    for name, partial in overlays_raw.items():
        try:
            _dns_label("overlay name", str(name))
        except ValueError as e:
            raise ConfigError("overlays", name, "DNS-1123 labels", detail=str(e)) from None
        if not isinstance(partial, dict):
            raise ConfigError(f"overlays.{name}", partial, "a partial config mapping")
        for fixed in ("name", "namespace"):
            if fixed in partial and partial[fixed] != data.get(fixed, K8sConfig.model_fields[fixed].default):
                raise ConfigError(
                    f"overlays.{name}.{fixed}", partial[fixed], f"the base's {fixed}",
                    detail="kustomize patches target objects by name and namespace",
                )
        try:
            overlays[name] = K8sConfig.model_validate(deep_merge(data, partial))
        except ValidationError as e:
            raise _config_error(e, prefix=f"overlays.{name}.") from None
    return base, overlays


def load_config(path: str | Path) -> tuple[K8sConfig, dict[str, K8sConfig]]:
    """Read ``configs/k8s.yaml``: the base config and its overlays, validated."""
    from orchestrator.core.yamlfile import read_yaml

    data = read_yaml(path, "--config") or {}
    if isinstance(data, dict):
        base_dir = Path(path).parent
        data = _read_scheduler_file(data, base_dir, "head")
        if isinstance(data.get("overlays"), dict):
            data["overlays"] = {k: _read_scheduler_file(v, base_dir, f"overlays.{k}.head") if isinstance(v, dict)
                                else v for k, v in data["overlays"].items()}
    return parse_config(data)


def _read_scheduler_file(data: dict[str, Any], base_dir: Path, field: str) -> dict[str, Any]:
    """``head.scheduler_file: <path>`` (relative to the config) read into ``head.scheduler``."""
    head = data.get("head")
    if not isinstance(head, dict) or "scheduler_file" not in head:
        return data
    head = dict(head)
    ref = base_dir / str(head.pop("scheduler_file"))
    if not ref.is_file():
        raise ConfigError(f"{field}.scheduler_file", str(ref), "a policy file (see configs/priorities.yaml)",
                          detail="no such file")
    head["scheduler"] = SchedulerConfig.load(ref).model_dump(mode="json")
    return {**data, "head": head}
