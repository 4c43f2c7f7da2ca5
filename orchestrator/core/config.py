"""Runtime configuration: the cluster file and the head's settings.

A cluster file (``configs/cluster.demo.yaml``) declares

* ``settings`` -- :class:`RuntimeSettings`: namespace, heartbeat interval,
  agent TTL, grant TTL, MPS pipe root (the placement policy is the
  scheduler config's ``policy``, set in one place), and under ``tuning``
  (:class:`Tuning`) the head's and agents' tuning constants;
* ``nodes`` -- :class:`SimNode` s: what the ``simulated`` discovery backend
  reports for each node and what ``orchestrator up`` gives each raylet
  (``--num-gpus N``, ``--resources`` with one ``rgo-gpu-<i>`` per card, ``--labels``).

Both are frozen pydantic models; every validation failure is raised as
:class:`~orchestrator.core.errors.ConfigError` naming the field (dotted, with list
positions) and showing the offending value.

Simulated UUIDs are deterministic (UUIDv5 of cluster/node/index), so a node
reports the same devices on every start and the head's stored ledger still
matches after a restart.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from orchestrator.core import datafiles, validation
from orchestrator.core.catalogue import gpu_model
from orchestrator.core.clock import DayClock
from orchestrator.core.errors import ConfigError, InvalidRequestError
from orchestrator.core.inventory import GpuDevice, MigDevice, NodeInventory
from orchestrator.core.priorities import SchedulerConfig
from orchestrator.core.quantity import parse_memory_mib
from orchestrator.core.yamlfile import read_yaml

#: Ray node label that names the simulated (or configured) node a raylet stands for.
NODE_LABEL = "rgo.io/node"
#: The label Ray itself gives every node (its node id): what pins a job's driver to its lease's node, on any
#: cluster -- a KubeRay worker pod has no per-replica custom resource, but it has this label.
RAY_NODE_ID_LABEL = "ray.io/node-id"
#: Ray node label with the GPU model, for label selectors.
MODEL_LABEL = "rgo.io/gpu-model"
#: Custom Ray resource every node of ours carries (1 per node), e.g. ``rgo-node-a100-0``.
NODE_RESOURCE_PREFIX = "rgo-node-"
#: Custom Ray resource per card of a node (1 each), e.g. ``rgo-gpu-0``: a lease holder asks for its card's
#: share of it, pinned to the node, so Ray places exactly what the ledger granted (docs/runtime.md).
CARD_RESOURCE_PREFIX = "rgo-gpu-"


#: Ray's own resource naming a node's accelerator type (``accelerator_type:A100``), one unit per node.
ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"


def ray_accelerator_type(model: str) -> str:
    """Ray's accelerator type for one of our GPU models: the name before the memory size, as Ray's NVIDIA
    accelerator manager reports it (``A100-80GB`` -> ``A100``, ``H100-80GB`` -> ``H100``, ``L4`` -> ``L4``)."""
    return model.split("-")[0].upper()


def card_resource(index: int) -> str:
    """The Ray resource that stands for card ``index`` of its node (node-local: holders are pinned to the node)."""
    return f"{CARD_RESOURCE_PREFIX}{index}"


def card_resources(cards: int) -> dict[str, float]:
    """What a raylet with ``cards`` GPUs declares, one unit per card."""
    return {card_resource(i): 1.0 for i in range(cards)}

_UUID_NS = uuid.UUID("6f1c1c3e-7d0b-4a53-9a53-7f0d5c0e2a11")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Tuning(_Frozen):
    """The head's and the agents' tuning constants: how often, how long, how soon again. Each trades what it
    says against its cost; the defaults are what the project measured (docs/load.md, docs/runtime.md). Times in
    seconds. Each knob's one other name is ``ORCHESTRATOR_TUNING_<FIELD>`` (:func:`with_environment`).

    Invariant: every knob is read where the component that uses it is built from the settings (the module
    constants of the same names are these defaults, kept for readers and tests); nothing reads a knob
    from a module global at run time."""

    # ---- the head's cycle ------------------------------------------------------------------------------
    holder_check_every_s: Annotated[float, Field(
        gt=0, le=60, description="How often the head asks Ray's actor table whether the holders of active leases "
        "are alive: a dead holder's cards freed sooner, against a GCS read and a walk of every active lease "
        "(~10 ms at 12,000) each time")] = 1.0
    tables_every_s: Annotated[float, Field(
        gt=0, le=60, description="How often the head re-reads Ray's node table: a raylet that joined or died seen "
        "sooner, against a GCS read")] = 1.0
    heap_freeze_every_s: Annotated[float, Field(
        gt=0, le=3600, description="How often the head collects what its heap gained since the last freeze and "
        "freezes the survivors: shorter, more frequent pauses against longer, rarer ones (~12 ms at 2.5 s under "
        "the scale bench's load, ~50 ms at 10 s)")] = 2.5
    heap_full_every_s: Annotated[float, Field(
        gt=0, le=7 * 86400, description="How often the head unfreezes and collects its whole heap: garbage "
        "cycles among frozen objects reclaimed sooner, against one long pause each time")] = 3600.0
    curves_every_s: Annotated[float, Field(
        gt=0, le=3600, description="One point of the live page's curves per this: finer curves against a "
        "shorter span (3,600 points are kept)")] = 1.0
    curves_rate_s: Annotated[float, Field(
        gt=0, le=3600, description="The curves' throughput is a rate over this: smoother against slower to show "
        "a change")] = 5.0
    curves_window_s: Annotated[float, Field(
        gt=0, le=3600, description="The curves' latency quantiles are over what happened in this: steadier "
        "against slower to show a change")] = 30.0
    # ---- the head's jobs and Ray's job API --------------------------------------------------------------
    job_status_poll_s: Annotated[float, Field(
        gt=0, le=3600, description="How often the head reads the Ray status of its started jobs (one batched "
        "read): a job's end seen sooner, against a GCS read each time")] = 0.5
    status_read_timeout_s: Annotated[float, Field(
        gt=0, le=600, description="The longest the head's loop waits for one read of its jobs' Ray status (the "
        "last answers stand meanwhile): a slow GCS answered, against the loop held that long")] = 5.0
    job_api_timeout_s: Annotated[float, Field(
        gt=0, le=3600, description="The longest one HTTP request to Ray's job API may take (a submission that "
        "timed out is sent again under the same id): a slow job head waited for, against a thread of the head "
        "held that long")] = 30.0
    submit_backoff_first_s: Annotated[float, Field(
        gt=0, le=3600, description="The first wait before a call Ray's job API could not take for a reason that "
        "may pass (a submission, a stop, a delete) is made again, doubled per failure up to "
        "submit_backoff_max_s: quicker recovery from a short outage, against more calls to a job API that is "
        "down")] = 1.0
    submit_backoff_max_s: Annotated[float, Field(
        gt=0, le=3600, description="The longest wait between two tries of such a call")] = 30.0
    id_reuse_quiet_s: Annotated[float, Field(
        gt=0, le=3600, description="How long after an earlier job under a submission id ended the head waits "
        "before Ray's job API is given the id again (Ray's job manager fails a job put under an id whose earlier "
        "supervisor it has not yet seen die): shorter, a job whose id was reused may fail")] = 10.0
    restop_slack_s: Annotated[float, Field(
        gt=0, le=86400, description="A restarted head stops again the Ray jobs the crashed one may not have "
        "stopped: those of jobs cancelled or requeued within the job API's retry time (300 s) plus this before "
        "the restart: a longer crash covered, against more stop calls at start-up")] = 60.0
    # ---- the head's durable store and channel ------------------------------------------------------------
    commit_retry_first_s: Annotated[float, Field(
        gt=0, le=60, description="The first wait before a failed write of the head's journal batch to the GCS is "
        "tried again, doubled per failure up to commit_retry_max_s (replies wait meanwhile): replies back sooner "
        "after a short GCS outage, against more writes to a GCS that is away")] = 0.05
    commit_retry_max_s: Annotated[float, Field(
        gt=0, le=600, description="The longest wait between two tries of that write")] = 2.0
    channel_window_s: Annotated[float, Field(
        gt=0, le=1, description="Under load a call on the head's channel waits until no other call joined it "
        "for this, so calls that arrive together are carried out as one batch: less head CPU per call, against "
        "a little latency")] = 0.001
    channel_max_wait_s: Annotated[float, Field(
        gt=0, le=1, description="The longest a call on the head's channel waits for others to join its batch")] = 0.005
    channel_call_grace_s: Annotated[float, Field(
        gt=0, le=3600, description="How long a stream its client closed stays open for the answers to the calls "
        "it had sent: slow calls still answered, against a stream held for a client that is gone")] = 60.0
    # ---- the agents ---------------------------------------------------------------------------------------
    urgent_beat_s: Annotated[float, Field(
        gt=0, le=60, description="An agent's heartbeat period while a revocation is in flight on its node: the "
        "preemptor starts sooner, against more heartbeats to the head")] = 0.1
    hold_place_timeout_s: Annotated[float, Field(
        gt=0, le=600, description="How long an agent waits for one new placement group (a hold or a lease's "
        "group) to be placed before it moves on and tries again next beat: fewer retries on a slow GCS, against "
        "the agent's loop held that long")] = 10.0
    hold_return_wait_s: Annotated[float, Field(
        gt=0, le=60, description="After removing a group, how long an agent waits for the GCS to see its capacity "
        "free before it makes the next one anyway: the next group placed at once rather than at the GCS's next "
        "try (0.3-1 s later), against the agent's loop held that long")] = 2.0
    lend_timeout_s: Annotated[float, Field(
        gt=0, le=3600, description="How long a lease's capacity stays lent (its own group removed so that a "
        "placement group its holder makes lands there) before the agent makes the lease's own group again: time "
        "for a holder (Ray Train, Tune, Serve) to make its group, against capacity held by nobody meanwhile")] = 30.0
    # ---- the cluster's autoscaler (settings.autoscaler_demand) -------------------------------------------
    autoscaler_demand_every_s: Annotated[float, Field(
        gt=0, le=3600, description="How often the head looks at the queue's demand for nodes and, if it changed "
        "since Ray last took it, sends it to Ray's autoscaler (request_resources; a failed send is tried again a "
        "period later): a grown queue seen by the autoscaler sooner, against a walk of the queue and the held "
        "leases and a GCS write each time")] = 5.0
    autoscaler_demand_max_bundles: Annotated[int, Field(
        gt=0, le=10_000, description="The most bundles the demand asks for pending leases, the front of the queue "
        "first (the held cards' bundles, one per busy node, come on top): a long queue asked for at once, "
        "against more nodes launched for work that may find room before they are up")] = 100

    @model_validator(mode="after")
    def _first_within_max(self) -> "Tuning":
        for first, most in (("submit_backoff_first_s", "submit_backoff_max_s"),
                            ("commit_retry_first_s", "commit_retry_max_s"),
                            ("channel_window_s", "channel_max_wait_s")):
            if getattr(self, first) > getattr(self, most):
                raise ConfigError(f"settings.tuning.{most}", getattr(self, most),
                                  f"at least {first}={getattr(self, first):g}",
                                  detail=f"{first} is the first wait; this is the longest")
        return self


class RuntimeSettings(_Frozen):
    """How the head and the agents run. Times in seconds. Each field's one other name is its environment variable,
    ``ORCHESTRATOR_<FIELD>``, which overrides the file where the file is loaded (:func:`with_environment`); the
    tuning constants are the section ``tuning`` (:class:`Tuning`), each ``ORCHESTRATOR_TUNING_<FIELD>``."""

    namespace: str = Field(default="rgo", min_length=1, pattern=r"^[A-Za-z0-9_.-]+$",
                           description="Ray namespace of the head and agent actors, and prefix of their GCS keys")
    head_name: str = Field(default="rgo-head", min_length=1, description="Name of the detached head actor")
    heartbeat_interval_s: Annotated[float, Field(gt=0, le=60, description="Agent heartbeat period")] = 1.0
    agent_ttl_s: Annotated[float, Field(gt=0, le=3600, description="An agent silent this long is lost; its node's leases too")] = 5.0
    reconcile_interval_s: Annotated[float, Field(gt=0, le=60, description="Head reconcile loop period")] = 0.25
    head_switch_interval_s: Annotated[float, Field(
        ge=0.0001, le=0.1, description="Python's thread switch interval in the head actor's process "
        "(sys.setswitchinterval): how long Ray's own threads, which hand calls in and replies out, may wait "
        "for the interpreter while the head's loop is busy (Python's default is 0.005)")] = 0.0005
    direct_calls: bool = Field(
        default=True, description="The head serves its quick calls (the grant path) over gRPC beside Ray's actor "
        "calls, at its node's address (TLS off loopback) with a per-incarnation token given out through Ray "
        "(docs/load.md); clients that cannot reach it call the actor. false: actor calls only")
    autoscaler_demand: bool = Field(
        default=True, description="The head asks Ray's autoscaler (ray.autoscaler.sdk.request_resources, which "
        "KubeRay's autoscaler reads too) for the nodes its pending leases need, so a cluster that can grow does "
        "(docs/runtime.md, 'Growing the cluster'); where no autoscaler runs the request is only recorded. It "
        "replaces any other caller's request: false where something else owns request_resources")
    metrics_gauges_every_s: Annotated[float, Field(
        ge=0, le=60, description="The head's GPU gauges (allocated, per GPU, per lease) are refreshed at most this "
        "often; counters and lease counts every cycle (0: every cycle)")] = 0.25
    grant_ttl_s: Annotated[float, Field(gt=0, description="A granted lease not activated within this is expired")] = 600.0
    timeslice_capacity_milli: Annotated[int, Field(ge=1000, description="Time-slice oversubscription per card (1000 = 1.0)")] = 1000
    mps_pipe_root: str = Field(default="/tmp/nvidia-mps",
                               description="MPS pipe directories live under this root, one per GPU: <root>/gpu-<index>")
    discovery: str = Field(default="auto", description="auto | nvml | simulated")
    metrics_port: Annotated[int, Field(ge=0, le=65535, description="Prometheus /metrics of the head; 0 = "
                                       "a free port on a loopback metrics_host under a local `orchestrator up`, else "
                                       "off. Like every knob here, ORCHESTRATOR_METRICS_PORT overrides the file")] = 0
    metrics_host: str = Field(default="127.0.0.1", description="Address /metrics listens on (0.0.0.0 in a pod)")
    inference_services: tuple[Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9._-]*$")],
                              ...] = Field(
        default=(), max_length=100, description="Inference services whose reports (HeadApi.record_inference) keep "
        "their name as the metrics' service label; reports under any other name count as service=\"other\", so "
        "callers cannot add series")
    ended_retention_s: Annotated[float, Field(ge=0, description="Ended leases and jobs leave the head and the GCS "
                                              "this long after they end (also how long a retried lease or job id is "
                                              "recognised); 0 keeps them forever")] = 86400.0
    job_runner: Literal["ray", "none"] = Field(
        default="ray", description="ray: an admitted job runs as a Ray job. none: nothing runs it; it is recorded "
        "as started and succeeds at the next status read (what bench/load.py measures job admission with)")
    fractional_gpu: Literal["mps", "timeslice", "mig"] = Field(
        default="mps", description="What a Ray task asking for a fraction of a GPU (num_gpus=0.5) outside any "
        "lease is granted: an MPS share of that many SMs, a time-slice of that fraction, or the smallest MIG slice "
        "with that much compute (docs/ray-native.md)")
    admin_key_sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the administrator key (core.credentials): "
        "who shows it may repartition, set the day clock, announce the dashboard, cancel any job. `orchestrator up` "
        "sets it from the state folder's admin.key; null when the head is started: the digest of the starter's "
        "own administrator key (ORCHESTRATOR_ADMIN_KEY or admin.key), else no administrator")
    day_clock: DayClock | None = Field(default=None, description="A compressed day for the head's time windows "
                                       "({speedup: 720, start: '06:00'}: a day in 120 s from 06:00); "
                                       "null: the machine's local time of day")
    tuning: Tuning = Field(default_factory=Tuning, description="The head's and the agents' tuning constants; each "
                           "knob's environment variable is ORCHESTRATOR_TUNING_<FIELD>")

    @model_validator(mode="after")
    def _ttl_above_heartbeat(self) -> "RuntimeSettings":
        if 0 < self.ended_retention_s < 60:
            raise ConfigError("settings.ended_retention_s", self.ended_retention_s, "0 (keep forever) or >= 60",
                              detail="the job layer must see a lease end before it goes")
        if self.agent_ttl_s <= self.heartbeat_interval_s:
            raise ConfigError("settings.agent_ttl_s", self.agent_ttl_s,
                              f"more than heartbeat_interval_s={self.heartbeat_interval_s:g}",
                              detail="an agent must get at least one heartbeat in before it is declared lost")
        if self.discovery not in ("auto", "nvml", "simulated"):
            raise ConfigError("settings.discovery", self.discovery, ["auto", "nvml", "simulated"])
        if "other" in self.inference_services:
            raise ConfigError("settings.inference_services", list(self.inference_services), "names other than 'other'",
                              detail="'other' is the label of the reports from services not named here")
        return self


def raylet_native_env(settings: RuntimeSettings) -> dict[str, str]:
    """What every raylet of ours is started with so that Ray's own GPU API reaches the orchestrator: Ray calls
    the hook from ``ray.init`` in each driver it starts (a Ray job's), which then asks for a lease of its own
    for each GPU task or actor a driver without a lease starts (``docs/ray-native.md``)."""
    from orchestrator.core import env as E

    return {E.RAY_RUNTIME_ENV_HOOK: E.NATIVE_HOOK, E.RAY_AUTO_LEASE: "1", E.NAMESPACE: settings.namespace,
            E.HEAD_NAME: settings.head_name, E.FRACTIONAL_GPU: settings.fractional_gpu}


class SimMig(_Frozen):
    """One fixed MIG instance on a simulated card."""

    profile: str
    start: Annotated[int, Field(ge=0, le=7)]


class SimNode(_Frozen):
    """A simulated GPU node: what its agent reports and what its raylet is started with."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$",
                      description="Node name: also a Ray label value, so DNS-label characters only")
    model: str = Field(description="GPU model (catalogue name or NVML name)")
    gpus: Annotated[int, Field(ge=0, le=64)] = 0
    cpus: Annotated[int, Field(ge=0, le=1024, description="Logical CPUs given to the raylet")] = 4
    memory: str | int = Field(default="64GiB", description="Host memory the inventory reports")
    mig: dict[int, tuple[SimMig, ...]] = Field(default_factory=dict,
                                                description="GPU index -> fixed MIG layout; listed cards have MIG on")
    nvlink: tuple[tuple[int, ...], ...] = Field(default=(), description="Groups of GPU indices joined by NVLink")
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str) -> str:
        return gpu_model(v).name

    @model_validator(mode="after")
    def _indices_exist(self) -> "SimNode":
        for idx in self.mig:
            if not 0 <= idx < self.gpus:
                raise ConfigError(f"nodes[{self.name}].mig", idx, f"a GPU index in 0..{self.gpus - 1}")
        for group in self.nvlink:
            for idx in group:
                if not 0 <= idx < self.gpus:
                    raise ConfigError(f"nodes[{self.name}].nvlink", idx, f"a GPU index in 0..{self.gpus - 1}")
        try:
            self.inventory()  # the inventory's own validators check MIG profiles, placements and overlaps
        except ValidationError as e:  # in our words; named by the node's layout, wherever inside it pydantic found it
            t = validation.typed_error(e, "", None)
            if isinstance((e.errors()[0].get("ctx") or {}).get("error"), InvalidRequestError):
                raise ConfigError(f"nodes[{self.name}].mig", t.value, t.allowed, t.detail) from None
            raise ConfigError(f"nodes[{self.name}].mig", {k: [m.model_dump() for m in v] for k, v in self.mig.items()},
                              "a valid, non-overlapping MIG layout", detail=t.detail) from None
        except InvalidRequestError as e:
            raise ConfigError(f"nodes[{self.name}].mig", e.value, e.allowed, e.detail) from None
        return self

    def gpu_uuid(self, index: int) -> str:
        return f"GPU-{uuid.uuid5(_UUID_NS, f'{self.name}/{index}')}"

    def inventory(self) -> NodeInventory:
        """The node as the ``simulated`` discovery backend reports it."""
        peers: dict[int, set[int]] = {i: set() for i in range(self.gpus)}
        for group in self.nvlink:
            for i in group:
                peers[i].update(j for j in group if j != i)
        gpus = []
        for i in range(self.gpus):
            migs = tuple(
                MigDevice(uuid=f"MIG-{uuid.uuid5(_UUID_NS, f'{self.name}/{i}/{m.profile}@{m.start}')}",
                          profile=m.profile, start=m.start)
                for m in self.mig.get(i, ())
            )
            gpus.append(GpuDevice(index=i, uuid=self.gpu_uuid(i), model=self.model, mig_enabled=i in self.mig,
                                  mig_devices=migs, nvlink_peers=tuple(sorted(peers[i]))))
        return NodeInventory(name=self.name, gpus=tuple(gpus), cpu_milli=self.cpus * 1000,
                             memory_mib=parse_memory_mib(self.memory, f"nodes[{self.name}].memory"),
                             labels=dict(self.labels))

    def ray_labels(self) -> dict[str, str]:
        return {NODE_LABEL: self.name, MODEL_LABEL: self.model, **self.labels}

    def ray_resources(self) -> dict[str, float]:
        """The raylet's custom resources: its node marker, one unit per card, and Ray's own
        ``accelerator_type:<type>`` (what ``@ray.remote(accelerator_type=...)`` asks for). Its ``GPU`` count is
        the number of cards, as Ray would detect it (:attr:`ray_num_gpus`; ``docs/ray-native.md``)."""
        out = {NODE_RESOURCE_PREFIX + self.name: 1.0, **card_resources(self.gpus)}
        if self.gpus:
            out[ACCELERATOR_RESOURCE_PREFIX + ray_accelerator_type(self.model)] = 1.0
        return out

    def ray_env(self) -> dict[str, str]:
        """The raylet's own environment for its cards: ``CUDA_VISIBLE_DEVICES`` lists the node's GPU UUIDs by index
        (Ray maps its instance ``i`` through it, so a task sees its card's UUID, as on a node where the variable
        names the cards), and Ray sets it to nothing for work that asks for no GPU."""
        if not self.gpus:
            return {}
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.gpu_uuid(i) for i in range(self.gpus)),
                "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "1"}

    @property
    def ray_num_gpus(self) -> int:
        """Ray's ``GPU`` on the node: one per card; the node's agent holds what no lease covers."""
        return self.gpus


class ClusterConfig(_Frozen):
    """A whole cluster file."""

    settings: RuntimeSettings = Field(default_factory=RuntimeSettings)
    nodes: tuple[SimNode, ...] = ()
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig,
                                       description="Priority classes, queues and quotas (see configs/priorities.yaml)")

    @model_validator(mode="after")
    def _unique_names(self) -> "ClusterConfig":
        names = [n.name for n in self.nodes]
        for n in names:
            if names.count(n) > 1:
                raise ConfigError("nodes.name", n, "unique node names")
        return self

    def node(self, name: str) -> SimNode | None:
        return next((n for n in self.nodes if n.name == name), None)

    @property
    def gpu_count(self) -> int:
        return sum(n.gpus for n in self.nodes)


def parse_config(data: Any, source: str = "config") -> ClusterConfig:
    """Validate a mapping as a cluster file; every failure is a :class:`ConfigError` naming the field."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, type(data).__name__, "a mapping with 'settings' and 'nodes'")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise ConfigError(source, bad[0], "a mapping with 'settings' and 'nodes'", "its keys must be names")
    try:
        return ClusterConfig.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        inner = (err.get("ctx") or {}).get("error")
        if isinstance(inner, ConfigError):
            raise inner from None
        loc = ".".join(str(x) for x in err.get("loc", ())) or source
        if isinstance(inner, InvalidRequestError):  # e.g. an unknown GPU model, named where it stands
            raise ConfigError(loc, inner.value, inner.allowed, inner.detail) from None
        raise validation.typed_error(e, "", ClusterConfig, ConfigError) from None


#: The prefix of each settings knob's environment variable: ``ORCHESTRATOR_<FIELD>`` is the one other name of
#: ``settings.<field>`` (``ORCHESTRATOR_METRICS_PORT`` is ``metrics_port``, ``ORCHESTRATOR_DIRECT_CALLS`` is
#: ``direct_calls``), ``ORCHESTRATOR_TUNING_<FIELD>`` of ``settings.tuning.<field>``.
SETTINGS_ENV_PREFIX = "ORCHESTRATOR_"
#: Settings read as the text given, not as YAML (a name that YAML would read as a number or a boolean).
_TEXT_KNOBS = frozenset({"namespace", "head_name", "metrics_host", "mps_pipe_root", "discovery"})


def settings_env_name(knob: str) -> str:
    """The environment variable of a settings knob, named by its dotted path (``tuning.urgent_beat_s`` is
    ``ORCHESTRATOR_TUNING_URGENT_BEAT_S``)."""
    return SETTINGS_ENV_PREFIX + knob.replace(".", "_").upper()


def settings_knobs() -> list[str]:
    """Every settings knob as a dotted path: each field of :class:`RuntimeSettings` but ``tuning``, and each of
    :class:`Tuning` as ``tuning.<field>`` (the section itself has no variable: each of its knobs has one)."""
    return ([n for n in RuntimeSettings.model_fields if n != "tuning"]
            + [f"tuning.{n}" for n in Tuning.model_fields])


def with_environment(config: ClusterConfig, environ: Mapping[str, str] | None = None) -> ClusterConfig:
    """``config`` with each settings knob the environment names (``ORCHESTRATOR_<FIELD>``, or
    ``ORCHESTRATOR_TUNING_<FIELD>`` for a tuning knob; a YAML scalar or list) taking the place of the file's
    value: the one precedence rule -- a command's flag (applied by the command, after this) over the environment
    over the file over the default -- applied here only. A value the knob refuses is a :class:`ConfigError`
    naming the variable."""
    import yaml

    environ = os.environ if environ is None else environ
    updates: dict[str, Any] = {}  # knob (dotted path) -> its value from the environment
    for knob in settings_knobs():
        raw = environ.get(settings_env_name(knob))
        if raw is None or raw == "":
            continue
        try:
            updates[knob] = yaml.safe_load(raw) if knob not in _TEXT_KNOBS else raw
        except yaml.YAMLError:
            updates[knob] = raw
    if not updates:
        return config
    data = config.settings.model_dump(mode="json")
    for knob, value in updates.items():
        section, _, field = knob.rpartition(".")
        (data[section] if section else data)[field] = value
    try:
        settings = RuntimeSettings.model_validate(data)
    except ValidationError as e:
        inner = (e.errors()[0].get("ctx") or {}).get("error")
        t = inner if isinstance(inner, ConfigError) else validation.typed_error(e, "settings", RuntimeSettings,
                                                                               ConfigError)
        path = t.field.removeprefix("settings.").split(".")
        knob = ".".join(path[:2]) if path[0] == "tuning" else path[0]
        raise ConfigError(settings_env_name(knob) if knob in updates else t.field, t.value, t.allowed,
                          detail=t.detail) from None
    return config.model_copy(update={"settings": settings})


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> ClusterConfig:
    """Read and validate a cluster file; the environment's settings knobs over it (:func:`with_environment`)."""
    p = Path(path)
    data = read_yaml(p)
    if isinstance(data, dict) and "scheduler_file" in data:
        # The priority classes and queues may live in their own file (configs/priorities.yaml).
        data = dict(data)
        ref = p.parent / str(data.pop("scheduler_file"))
        data["scheduler"] = SchedulerConfig.load(ref).model_dump(mode="json")
    return with_environment(parse_config(data, str(p)), environ)


#: The demo cluster the package ships (``configs/cluster.demo.yaml``), a real path wherever it is installed.
DEMO_CONFIG = datafiles.config_file("cluster.demo.yaml")
