"""Co-location config: the inference service, its autoscaler and its SLO (``configs/colocation.yaml``).

Nomenclature:

* the **service** is one Ray Serve deployment whose replicas each hold one
  lease of ours, asked for with :attr:`ServiceConfig.request` (the CLI's
  ``--gpu`` forms: ``mem=10GiB,compute=0.14,isolation=hard`` resolves to a MIG
  1g slice where one fits, else a whole card);
* its **autoscaler** (:class:`AutoscaleConfig`, read by the pure
  :func:`orchestrator.scheduling.autoscale.decide`) turns load samples into a
  replica count: ``ceil(ongoing / target_ongoing_per_replica)``, held inside a
  dead band (``tolerance``), moved only after the wish has held for
  ``upscale_delay_s`` / ``downscale_delay_s``, at most ``max_step_up`` /
  ``max_step_down`` replicas per move, and pushed up while p99 latency is
  over ``slo_p99_ms`` when that is set;
* the **SLO** (:attr:`ServiceConfig.slo_p99_ms`) is what a request's latency
  is judged against (SLO attainment); the autoscaler reacts to it only when
  ``autoscale.slo_p99_ms`` is set too (a separate field: one may measure
  against an SLO without scaling on a noisy p99).

The config is frozen pydantic; every failure is a
:class:`~orchestrator.core.errors.ConfigError` naming the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from orchestrator.core import datafiles, validation
from orchestrator.core.errors import ConfigError, InvalidRequestError
from orchestrator.core.request import GpuRequest
from orchestrator.core.yamlfile import read_yaml


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AutoscaleConfig(_Frozen):
    """How load moves the replica count; see :mod:`orchestrator.scheduling.autoscale` for the rules."""

    min_replicas: Annotated[int, Field(ge=0, le=1024, description="Never fewer replicas than this")] = 1
    max_replicas: Annotated[int, Field(ge=1, le=1024, description="Never more replicas than this")] = 8
    target_ongoing_per_replica: Annotated[float, Field(gt=0, le=100_000, description="Ongoing requests one "
                                                       "replica should carry (Ray Serve's target_ongoing_requests)")] = 2.0
    upscale_delay_s: Annotated[float, Field(ge=0, le=3600, description="A wish to scale up must hold this "
                                            "long before it is acted on")] = 3.0
    downscale_delay_s: Annotated[float, Field(ge=0, le=86400, description="A wish to scale down must hold "
                                              "this long before it is acted on")] = 30.0
    tolerance: Annotated[float, Field(ge=0, lt=1, description="Dead band: no change while load per replica "
                                      "is within this fraction of the target (Kubernetes HPA's 0.1)")] = 0.1
    max_step_up: Annotated[int, Field(ge=1, le=1024, description="At most this many replicas added per move")] = 2
    max_step_down: Annotated[int, Field(ge=1, le=1024, description="At most this many replicas removed per move")] = 1
    upscale_factor: Annotated[float, Field(ge=1, le=100, description="A move up may also grow the target to this "
                                           "many times its size (Ray Serve's upscaling_factor), when that is more "
                                           "than max_step_up; 1: additive steps only")] = 1.0
    warm_window_s: Annotated[float, Field(ge=0, le=86400, description="Keep processes started (model loaded, no "
                                          "lease) up to the highest target of the last this many seconds, so a "
                                          "replica granted again attaches in seconds; 0: no warm spares")] = 0.0
    max_warm_spares: Annotated[int, Field(ge=0, le=1024, description="At most this many warm spare processes "
                                          "(host memory and CPU only: they hold no GPU)")] = 0
    peak_hold_fraction: Annotated[float, Field(ge=0, le=1, description="A scale-down stops at this fraction of "
                                               "the highest target of the last warm_window_s (replicas held through "
                                               "the lull between bursts); 0: no hold")] = 0.0
    slo_p99_ms: Annotated[float, Field(gt=0, le=3_600_000, description="Scale up while p99 latency is above "
                                       "this (ms); null: load alone decides")] | None = None

    @model_validator(mode="after")
    def _bounds(self) -> "AutoscaleConfig":
        if self.min_replicas > self.max_replicas:
            raise ConfigError("max_replicas", self.max_replicas, f"at least min_replicas={self.min_replicas}")
        return self


class ServiceConfig(_Frozen):
    """The inference service: what each replica leases, how it batches, its SLO and its autoscaler."""

    name: str = Field(default="inference", min_length=1, max_length=63, pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$",
                      description="Service (Serve deployment) name: lowercase letters, digits and '-'")
    request: str = Field(default="mem=10GiB,compute=0.14,isolation=hard",
                         description="What each replica leases, in the --gpu forms (N, mig:P, mps:PCT%, "
                                     "timeslice:F, mem=..,compute=..,isolation=..)")
    priority_class: str = Field(default="inference", min_length=1, description="Priority class of its leases")
    queue: str = Field(default="inference", min_length=1, description="Queue its leases are charged to "
                       "(time windows guarantee or cap queues)")
    autoscale: AutoscaleConfig = Field(default_factory=AutoscaleConfig)
    slo_p99_ms: Annotated[float, Field(gt=0, le=3_600_000, description="Latency SLO, ms: a request slower "
                                       "than this misses it")] = 200.0
    max_batch_size: Annotated[int, Field(ge=1, le=4096, description="Requests batched into one model call")] = 8
    batch_wait_timeout_s: Annotated[float, Field(ge=0, le=10, description="How long a batch waits to fill")] = 0.01

    @field_validator("request")
    @classmethod
    def _request_parses(cls, v: str) -> str:
        try:
            GpuRequest.parse(v)
        except InvalidRequestError as e:  # named where it stands: request.gpu.compute, ...
            raise ConfigError(f"request.{e.field}", e.value, e.allowed, e.detail) from None
        return v

    def gpu_request(self) -> GpuRequest:
        """The request each replica's lease asks for."""
        return GpuRequest.parse(self.request)


class ColocationConfig(_Frozen):
    """A whole ``colocation.yaml``."""

    service: ServiceConfig = Field(default_factory=ServiceConfig)
    control_interval_s: Annotated[float, Field(gt=0, le=60, description="How often the scaling loop samples "
                                               "load and asks the autoscaler")] = 0.5

    @classmethod
    def parse(cls, data: Any, source: str = "colocation") -> "ColocationConfig":
        """Validate a mapping; every failure is a :class:`ConfigError` named ``source:field``."""
        try:
            return cls.model_validate({} if data is None else data)
        except ValidationError as e:
            raise validation.config_error(e, cls, source) from None


def load_colocation(path: str | Path) -> ColocationConfig:
    """Read and validate a co-location file (``configs/colocation.yaml``)."""
    return ColocationConfig.parse(read_yaml(path, "colocation"), source=str(path))


#: The co-location config the package ships (``configs/colocation.yaml``).
DEFAULT_COLOCATION = datafiles.config_file("colocation.yaml")
