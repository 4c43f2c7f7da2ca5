"""From a granted lease to what a workload needs to run on its devices. Pure.

A :class:`Handout` is plain data (JSON-safe) that :func:`orchestrator.rayport.ray_api.actor_options`
turns into Ray actor options. On a node that advertises Ray's ``GPU`` (every node ``orchestrator up`` starts)
the holder runs in its lease's placement group instead, asking for ``num_gpus`` (``docs/ray-native.md``); the
group's bundle carries ``num_gpus`` and the per-card shares below. Elsewhere:

* **node affinity** -- ``NodeAffinitySchedulingStrategy(node_id, soft=False)``:
  the devices are on that node and nowhere else;
* **resources** -- the lease's share of each of its cards' own Ray resource,
  ``{"rgo-gpu-<index>": share}`` (:func:`card_shares`): on nodes that declare
  one resource per card (our KubeRay manifests, with Ray's ``GPU`` at 0), Ray then
  places exactly what the ledger granted, and nothing outside the orchestrator can take a card;
* **num_gpus** -- the same share of Ray's ``GPU`` resource, used instead on a
  node that declares no per-card resources (a Ray cluster we attached to), so
  Ray's own accounting stays truthful in sum (:func:`ray_num_gpus`);
* **env vars** through ``runtime_env`` (:func:`device_env`):
  ``CUDA_VISIBLE_DEVICES`` names the GPU or MIG *UUID* the ledger chose and
  ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1`` tells Ray not to overwrite
  it with the GPU ids of its own bookkeeping; MPS shares also get
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
  and ``CUDA_MPS_PIPE_DIRECTORY``; every lease gets ``ORCHESTRATOR_LEASE_ID`` and
  ``ORCHESTRATOR_FENCING_TOKEN`` so the holder can activate and release it.

A gang's workers each get their own hand-out; :func:`gang_bundle` and :func:`gang_bundle_pin` turn them
into the bundles of the gang's placement group (``docs/gang.md``).

Why the numbers are what they are is in ``docs/runtime.md`` ("Ray's
accounting and our leases").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from orchestrator.core import env as E
from orchestrator.core.allocation import Allocation
from orchestrator.core.catalogue import gpu_model
from orchestrator.core.config import RAY_NODE_ID_LABEL, RuntimeSettings, card_resource
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.lease import Lease
from orchestrator.core.request import ShareKind

NOSET_CUDA_VISIBLE_DEVICES = E.RAY_NOSET_CUDA_VISIBLE_DEVICES

#: Ray keeps resource quantities to 4 decimals (FixedPoint); shares are rounded *down*
#: to that grid so the shares of one card never sum above 1.0 in Ray's books.
_RAY_GRID = 10_000


def _floor_grid(x: float) -> float:
    return math.floor(x * _RAY_GRID + 1e-9) / _RAY_GRID


def ray_num_gpus(a: Allocation, *, timeslice_capacity_milli: int = 1000) -> float:
    """The ``num_gpus`` an actor holding ``a`` declares to Ray.

    * whole: the number of cards (an integer: Ray then takes whole GPU instances);
    * MIG: compute slices / 7 of the card (``3g.40gb`` -> 0.4285);
    * MPS: the SM percentage (30% -> 0.3);
    * time-slice: the fraction divided by the oversubscription, so a card's
      time-slices never sum above 1.0 in Ray's books even when ours allow 2.0.
    """
    if a.kind is ShareKind.WHOLE:
        return float(len(a.gpu_indices))
    if a.kind is ShareKind.MIG:
        prof = gpu_model(a.model or "").profile(a.mig_profile or "")
        return _floor_grid(prof.compute_fraction)
    if a.kind is ShareKind.MPS:
        return _floor_grid((a.sm_percent or a.milli // 10) / 100)
    return _floor_grid(a.milli / timeslice_capacity_milli)


def card_shares(a: Allocation, *, timeslice_capacity_milli: int = 1000) -> dict[str, float]:
    """The lease's share of each card's Ray resource: ``{"rgo-gpu-<index>": share}``.

    Invariant: for every card, the shares of the leases the ledger holds on it sum to at most 1.0, so Ray
    can always place every granted holder at once (whole: 1 per card; the others: :func:`ray_num_gpus`,
    floored to Ray's grid, on their one card)."""
    if a.kind is ShareKind.WHOLE:
        return {card_resource(i): 1.0 for i in a.gpu_indices}
    return {card_resource(a.gpu_indices[0]): ray_num_gpus(a, timeslice_capacity_milli=timeslice_capacity_milli)}


def mps_pipe_directory(root: str, gpu_index: int) -> str:
    """One MPS control daemon per GPU, each with its own pipe directory (as NVIDIA's device plugin does)."""
    return f"{root.rstrip('/')}/gpu-{gpu_index}"


def device_env(a: Allocation, *, lease_id: str, fencing_token: int, mps_pipe_root: str,
               mig_uuid: str | None = None) -> dict[str, str]:
    """Environment variables that bind a process to exactly the devices of ``a``.

    ``mig_uuid`` overrides the allocation's (a MIG instance the agent created on
    demand). Raises :class:`InvalidRequestError` for a MIG allocation with no UUID.
    """
    env = {E.RAY_NOSET_CUDA_VISIBLE_DEVICES: "1", E.LEASE_ID: lease_id, E.FENCING_TOKEN: str(fencing_token),
           E.SHARE_KIND: a.kind.value, E.NODE: a.node_name}
    if a.kind is ShareKind.MIG:
        uuid = mig_uuid or a.mig_uuid
        if not uuid:
            raise InvalidRequestError("allocation.mig_uuid", None, "a MIG device UUID",
                                      detail=f"lease {lease_id}: the MIG instance has not been created yet")
        env[E.CUDA_VISIBLE_DEVICES] = uuid
        env[E.MIG_PROFILE] = a.mig_profile or ""
        return env
    env[E.CUDA_VISIBLE_DEVICES] = ",".join(a.gpu_uuids)
    if a.kind is ShareKind.MPS:
        env[E.MPS_ACTIVE_THREAD_PERCENTAGE] = str(a.sm_percent)
        if a.memory_mib:
            # Keyed by the device index *the client sees*: CUDA_VISIBLE_DEVICES leaves it one device, 0.
            env[E.MPS_PINNED_DEVICE_MEM_LIMIT] = f"0={a.memory_mib}M"
        env[E.MPS_PIPE_DIRECTORY] = mps_pipe_directory(mps_pipe_root, a.gpu_indices[0])
        if a.client_priority is not None:
            env[E.MPS_CLIENT_PRIORITY] = str(a.client_priority)
    elif a.kind is ShareKind.TIMESLICE:
        env[E.TIMESLICE_MILLI] = str(a.milli)
    if a.memory_mib and a.kind in (ShareKind.MPS, ShareKind.TIMESLICE):
        env[E.MEMORY_LIMIT_MIB] = str(a.memory_mib)  # sdk.context.apply_limits turns it into a memory fraction
    return env


@dataclass(frozen=True, slots=True)
class Handout:
    """What a lease holder is started with. JSON-safe; see the module docstring."""

    node_id: str
    node_name: str
    num_gpus: float
    num_cpus: float = 0.0
    env_vars: dict[str, str] = field(default_factory=dict)
    resources: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        # What ``asdict`` gives, built directly: it is on every lease view (asdict deep-copies field by field).
        return {"node_id": self.node_id, "node_name": self.node_name, "num_gpus": self.num_gpus,
                "num_cpus": self.num_cpus, "env_vars": dict(self.env_vars), "resources": dict(self.resources)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Handout":
        return cls(node_id=d["node_id"], node_name=d["node_name"], num_gpus=float(d["num_gpus"]),
                   num_cpus=float(d.get("num_cpus", 0.0)), env_vars=dict(d.get("env_vars", {})),
                   resources={k: float(v) for k, v in d.get("resources", {}).items()})


def make_handout(a: Allocation, *, ray_node_id: str, lease_id: str, fencing_token: int, mps_pipe_root: str,
                 timeslice_capacity_milli: int = 1000, mig_uuid: str | None = None) -> Handout:
    """The handout of a granted lease (see the module docstring)."""
    return Handout(
        node_id=ray_node_id, node_name=a.node_name,
        num_gpus=ray_num_gpus(a, timeslice_capacity_milli=timeslice_capacity_milli),
        num_cpus=a.cpu_milli / 1000,
        resources=card_shares(a, timeslice_capacity_milli=timeslice_capacity_milli),
        env_vars=device_env(a, lease_id=lease_id, fencing_token=fencing_token, mps_pipe_root=mps_pipe_root,
                            mig_uuid=mig_uuid),
    )


def lease_handout(lease: Lease, ray_node_id: str, settings: RuntimeSettings, *,
                  mig_uuid: str | None = None, node_gpu_uuids: Sequence[str] = ()) -> Handout | None:
    """The one place a lease's device environment is built (the agent receives it, never rebuilds it);
    None for an on-demand MIG slice until the agent reports the instance it made."""
    a = lease.allocation
    assert a is not None
    if a.kind is ShareKind.MIG and not (mig_uuid or a.mig_uuid):
        return None
    h = make_handout(a, ray_node_id=ray_node_id, lease_id=lease.lease_id, fencing_token=lease.fencing_token,
                     mps_pipe_root=settings.mps_pipe_root,
                     timeslice_capacity_milli=settings.timeslice_capacity_milli, mig_uuid=mig_uuid)
    h.env_vars[E.NAMESPACE] = settings.namespace  # where the node's agent keeps the lease's placement group
    if a.kind is ShareKind.WHOLE and len(a.gpu_indices) > 1 and node_gpu_uuids:
        # the node's cards by index: a worker inside this lease lets Ray give each task its own card of it
        # (rayport.native._narrow_per_task)
        h.env_vars[E.NODE_GPU_UUIDS] = ",".join(node_gpu_uuids)
    return h


# ---- gangs: one placement-group bundle per worker ------------------------------------------------
def gang_bundle(h: Mapping[str, Any]) -> dict[str, float]:
    """Worker ``h``'s bundle of the gang's placement group: its card shares (``rgo-gpu-<i>``), or its share of
    Ray's ``GPU`` on a node that declares no cards, and its CPUs. The node is pinned apart, by
    :func:`gang_bundle_pin` (a bundle's resources cannot name a node)."""
    bundle = dict(h.get("resources") or {}) or ({"GPU": float(h["num_gpus"])} if h.get("num_gpus") else {})
    if h.get("num_cpus"):
        bundle["CPU"] = float(h["num_cpus"])
    return bundle or {"CPU": 0.001}  # Ray refuses an empty bundle


def gang_bundle_pin(h: Mapping[str, Any]) -> dict[str, str]:
    """The label selector that holds worker ``h``'s bundle to its lease's node: Ray's own node-id label,
    which every node has (ours, KubeRay pods, clusters we attached to)."""
    return {RAY_NODE_ID_LABEL: h["node_id"]}


def gang_worker_env(handouts: Sequence[Mapping[str, Any]], node_id: str, local_rank: int) -> dict[str, str]:
    """The device environment of the ``local_rank``-th worker running on ``node_id``: the gang's workers
    on that node in worker order, so a trainer whose workers are numbered per node (Ray Train's local rank)
    binds each to its own lease's devices. Raises ``InvalidRequestError`` naming the node when the gang has
    no such worker there."""
    here = [h for h in handouts if h["node_id"] == node_id]
    if not 0 <= local_rank < len(here):
        raise InvalidRequestError("local_rank", local_rank, f"0..{len(here) - 1}",
                                  detail=f"the gang has {len(here)} worker(s) on node {node_id}")
    return dict(here[local_rank]["env_vars"])
