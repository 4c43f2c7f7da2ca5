"""The sections of the KubeRay config other than the node pools: priority classes, the head (and where its
cluster file is mounted), auth, network, monitoring, the namespace quota, the scheduler, the checkpoint and
Redis claims, GCS fault tolerance, the training job and the inference service. Each section checks what
it can alone; the checks across sections are :class:`~orchestrator.deploy.k8s.model.K8sConfig`'s.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from orchestrator.core.config import RuntimeSettings
from orchestrator.core.priorities import SchedulerConfig
from orchestrator.deploy.k8s.fields import _HOST_PORT, Resources, _bad, _dns_label, _Frozen, _image, _quantity
from orchestrator.deploy.k8s.pools import NodePool


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


#: Where the head pod mounts the ConfigMap with the head's cluster file (its settings and its policy file).
HEAD_CONFIG_DIR = "/etc/orchestrator"
HEAD_CONFIG_FILE = f"{HEAD_CONFIG_DIR}/cluster.yaml"
#: The head's settings the deployment itself gives (rendered into its cluster file): not the config's to set.
DEPLOYMENT_SETTINGS = {"discovery": "auto (agents read NVML, or the pool's simulated inventory)",
                       "metrics_host": "0.0.0.0 (Prometheus scrapes the pod)",
                       "metrics_port": "the top-level metrics_port (the pod's port, the NetworkPolicy and the PodMonitor "
                                       "take it too)"}


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
    settings: RuntimeSettings = Field(
        default_factory=RuntimeSettings,
        description="The head's runtime settings: the same model as a cluster file's `settings` "
        "(orchestrator.core.config.RuntimeSettings, `tuning` included), rendered with `scheduler` into the "
        f"ConfigMap the head reads at {HEAD_CONFIG_FILE}; every pod's ORCHESTRATOR_NAMESPACE and "
        "ORCHESTRATOR_HEAD_NAME are its namespace and head_name. " + "; ".join(
            f"{k}: {v}" for k, v in DEPLOYMENT_SETTINGS.items()) + ": set by the deployment, not here",
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels the head pod requires")

    @field_validator("settings")
    @classmethod
    def _settings(cls, v: RuntimeSettings) -> RuntimeSettings:
        for name, given in DEPLOYMENT_SETTINGS.items():
            if name in v.model_fields_set:
                raise _bad(name, getattr(v, name), "left unset", f"the deployment sets it: {given}")
        return v

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
