"""Every environment variable the orchestrator reads or sets, by name, in one place.

Ours all start with ``ORCHESTRATOR_``. Three groups:

* **the lease's devices** -- set on every process that holds a lease (a Ray
  job the head starts, an actor started with a lease's ``actor_options``):
  which lease, its fencing token, the share kind and node, and NVIDIA's own
  ``CUDA_VISIBLE_DEVICES`` and ``CUDA_MPS_*`` that bind the process to the
  devices;
* **the job** -- set on a Ray job the head starts: its id, the head to talk to,
  where to checkpoint and what to resume from (read by
  :func:`orchestrator.sdk.context.job_context`);
* **the tools** -- read by our commands and processes: where ``up`` keeps its
  state, the metrics endpoint, Ray's auth and temp-dir settings we pass on.

Invariant: code refers to these names through the constants below, never by a
string literal of its own, so a rename is one edit.
"""

from __future__ import annotations

# ---- the lease's devices ------------------------------------------------------------------------
LEASE_ID = "ORCHESTRATOR_LEASE_ID"
FENCING_TOKEN = "ORCHESTRATOR_FENCING_TOKEN"
SHARE_KIND = "ORCHESTRATOR_SHARE_KIND"
NODE = "ORCHESTRATOR_NODE"
#: The lease's node's GPU UUIDs by index (on multi-card whole leases): what Ray's instance ids map through.
NODE_GPU_UUIDS = "ORCHESTRATOR_NODE_GPU_UUIDS"
MIG_PROFILE = "ORCHESTRATOR_MIG_PROFILE"
TIMESLICE_MILLI = "ORCHESTRATOR_TIMESLICE_MILLI"
#: Memory a time-slice or MPS holder may allocate, in MiB (the workload context applies it).
MEMORY_LIMIT_MIB = "ORCHESTRATOR_MEMORY_LIMIT_MIB"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
MPS_ACTIVE_THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MPS_PINNED_DEVICE_MEM_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"
MPS_LOG_DIRECTORY = "CUDA_MPS_LOG_DIRECTORY"
MPS_CLIENT_PRIORITY = "CUDA_MPS_CLIENT_PRIORITY"
MPS_PREFIX = "CUDA_MPS_"
#: Ray calls the function this names from ``ray.init`` in a driver (``module.function``): the job layer names
#: :func:`orchestrator.rayport.native.runtime_env_hook`, which steers a leased driver's GPU work into its lease.
RAY_RUNTIME_ENV_HOOK = "RAY_RUNTIME_ENV_HOOK"
NATIVE_HOOK = "orchestrator.rayport.native.runtime_env_hook"
#: "1": a driver that holds no lease gets a lease of its own for each task or actor asking for ``num_gpus``
#: (``orchestrator up`` sets it, with the hook, on every raylet, so Ray job drivers inherit it).
RAY_AUTO_LEASE = "ORCHESTRATOR_RAY_AUTO_LEASE"
#: How a fractional ``num_gpus`` is granted: mps | timeslice | mig (``settings.fractional_gpu``).
FRACTIONAL_GPU = "ORCHESTRATOR_FRACTIONAL_GPU"
#: How long such a task's ``.remote()`` waits for its lease before it fails (seconds; default an hour).
AUTO_LEASE_WAIT_S = "ORCHESTRATOR_AUTO_LEASE_WAIT_S"
#: What a task or actor's own lease asks, read from its ``runtime_env`` env vars (else this process's): the
#: request in the CLI's ``--gpu`` grammar (instead of the ``num_gpus`` mapping; the task then takes the lease's whole
#: share), its priority class and its queue. A Serve deployment names them in ``ray_actor_options``.
GPU_REQUEST = "ORCHESTRATOR_GPU_REQUEST"
PRIORITY_CLASS = "ORCHESTRATOR_PRIORITY_CLASS"
QUEUE = "ORCHESTRATOR_QUEUE"
#: "1" in Serve's controller started by the orchestrator's inference service (``LeasedService``): the setup hook
#: :data:`SERVE_SETUP_HOOK`, which our drivers give their job, installs the lease path there and nowhere else.
SERVE_LEASES = "ORCHESTRATOR_SERVE_LEASES"
SERVE_SETUP_HOOK = "orchestrator.rayport.native.serve_controller_setup"
#: The ``worker_process_setup_hook`` the native hook gives a leased driver's job (every worker steers too).
NATIVE_WORKER_SETUP = "orchestrator.rayport.native.worker_setup"
#: Tells Ray not to overwrite ``CUDA_VISIBLE_DEVICES`` with the ids of its own bookkeeping.
RAY_NOSET_CUDA_VISIBLE_DEVICES = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"

# ---- the job -------------------------------------------------------------------------------------
JOB_ID = "ORCHESTRATOR_JOB_ID"
NAMESPACE = "ORCHESTRATOR_NAMESPACE"
HEAD_NAME = "ORCHESTRATOR_HEAD_NAME"
CHECKPOINT_DIR = "ORCHESTRATOR_CHECKPOINT_DIR"
RESUME_FROM = "ORCHESTRATOR_RESUME_FROM"
ATTEMPT = "ORCHESTRATOR_ATTEMPT"
#: A gang job's driver: every worker's hand-out, in worker order, as JSON (``sdk.leases.JobGang`` reads it).
GANG = "ORCHESTRATOR_GANG"
#: Seconds between two calls to the head from one poll (override for tests or chatty jobs).
POLL_S = "ORCHESTRATOR_POLL_S"
#: Ray's job supervisor sets this in every job driver's environment.
RAY_JOB_CONFIG = "RAY_JOB_CONFIG_JSON_ENV_VAR"

# ---- the tools -----------------------------------------------------------------------------------
STATE_DIR = "ORCHESTRATOR_STATE_DIR"
#: Seconds finding the cluster may take before a command says why it cannot (``--connect-timeout``).
CONNECT_TIMEOUT_S = "ORCHESTRATOR_CONNECT_TIMEOUT_S"
#: "0": a client calls the head's actor only, never its channel (rayport/channel.py); any other value, or
#: unset, uses the channel where the head has one this process can reach.
DIRECT_CALLS = "ORCHESTRATOR_DIRECT_CALLS"
METRICS_PORT = "ORCHESTRATOR_METRICS_PORT"
METRICS_HOST = "ORCHESTRATOR_METRICS_HOST"
DASHBOARD_PORT = "ORCHESTRATOR_DASHBOARD_PORT"
#: A folder of the openb trace repository (e.g. ``../shared/traces/openb``) whose share-heavy list the dashboard's
#: schemes' comparison replays; unset, it replays the small sample the package ships.
OPENB_DIR = "ORCHESTRATOR_OPENB_DIR"
#: Set in every process of a local cluster: its ``sitecustomize`` keeps loopback addresses loopback.
KEEP_LOOPBACK = "ORCHESTRATOR_KEEP_LOOPBACK"
#: ``1`` lets a node's agent destroy and create MIG instances through NVML (live repartitioning); unset, refused.
ALLOW_MIG_RECONFIGURE = "ORCHESTRATOR_ALLOW_MIG_RECONFIGURE"
#: Kubernetes: the node a pod runs on, the pool it belongs to and the pool's sharing mode.
K8S_NODE_NAME = "ORCHESTRATOR_NODE_NAME"
K8S_POOL = "ORCHESTRATOR_POOL"
K8S_SHARING = "ORCHESTRATOR_SHARING"
RAY_AUTH_MODE = "RAY_AUTH_MODE"
RAY_AUTH_TOKEN = "RAY_AUTH_TOKEN"
RAY_AUTH_TOKEN_PATH = "RAY_AUTH_TOKEN_PATH"
RAY_TMPDIR = "RAY_TMPDIR"
RAY_USAGE_STATS_ENABLED = "RAY_USAGE_STATS_ENABLED"
