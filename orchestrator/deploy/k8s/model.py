""":class:`K8sConfig`, the whole KubeRay config (``configs/k8s.yaml``): its top-level fields, its sections
(:mod:`.pools`, :mod:`.specs`) and the checks that need the whole tree at once -- the invariants listed in
:mod:`.config` (unique names, declared priority classes, the minimum cluster within the quota, distinct
ports, the checkpoint directory on the checkpoint volume). Loading a file is :mod:`.config`'s.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from orchestrator.core.catalogue import CATALOGUE
from orchestrator.core.quantity import parse_quantity
from orchestrator.deploy.k8s.fields import _OUR_IMAGE, _RAY_IMAGE, _bad, _dns_label, _Frozen, _image
from orchestrator.deploy.k8s.pools import NodePool
from orchestrator.deploy.k8s.specs import (
    AuthSpec, CheckpointSpec, GcsFaultToleranceSpec, HeadSpec, InferenceSpec, MonitoringSpec, NetworkSpec,
    PriorityClassSpec, QuotaSpec, SchedulerSpec, TrainingJobSpec, _default_priority_classes,
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
