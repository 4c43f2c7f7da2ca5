"""The lease a process holds, as Ray's own GPU API inside it sees it: its placement group, and a call steered into it.

A process the orchestrator started on a lease -- a job's driver or worker, a holder actor -- finds that lease in its
environment (:func:`orchestrator.rayport.native.lease_from_env`) as a :class:`_Lease`: the lease id, its node and
fencing token, and the placement group the node's agent made for it (``rgo-lease/<node>/<lease id>``, one bundle
``{"GPU": share, "CPU": cpus}``; :func:`~orchestrator.rayport.lease_groups.lease_group` finds it). :func:`steer`
puts a task's or actor's options inside that group.

Invariants:

* only a call that asks for GPUs and names no placement of its own is steered (:func:`_steerable`); any other call
  is Ray's as usual, so a driver's CPU work is not squeezed into the lease's CPUs;
* a steered call never asks for more GPU than the lease's bundle holds: it fails before it reaches Ray, with
  :class:`LeaseCapacityError` naming the lease and what it holds;
* on a node that advertises no Ray ``GPU`` there is no group, and nothing is steered;
* the group is looked up once and kept until :meth:`_Lease.forget_group` (the agent lent the lease's capacity to a
  placement group made here, or took it back);
* a call that only tidies up after us (:func:`_quietly`: a release, a give-back) never raises: the head expires or
  reclaims whatever it missed.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import ray

from orchestrator.rayport.lease_groups import DEFAULT_NAMESPACE, advertises_gpus, lease_group
from orchestrator.core.errors import InvalidRequestError

log = logging.getLogger(__name__)


class LeaseCapacityError(InvalidRequestError):
    """A task or actor inside a lease asked for more GPU than the lease holds."""


# ---- a driver (or a job's worker) that holds a lease --------------------------------------------
class _Lease:
    """The lease this process holds, read from its environment; its group looked up on first use."""

    def __init__(self, lease_id: str, node_name: str, namespace: str | None, token: int | None = None,
                 ray_node_id: str | None = None) -> None:
        self.lease_id, self.node_name, self.namespace, self.token = lease_id, node_name, namespace, token
        self._node_id = ray_node_id  # None: this process's node (a lease's holder runs on its node)
        self._group: Any = None
        self._bundle: dict[str, float] | None = None

    def group(self) -> tuple[Any, dict[str, float]] | None:
        """The group and its bundle; None where the node advertises no Ray ``GPU`` (no groups there)."""
        if self._group is None:
            if not advertises_gpus(self.ray_node_id):
                return None
            self._group = lease_group(self.node_name, self.lease_id, self.namespace)
            self._bundle = {k: float(v) for k, v in self._group.bundle_specs[0].items()}
        assert self._bundle is not None
        return self._group, self._bundle

    @property
    def ray_node_id(self) -> str:
        return self._node_id or ray.get_runtime_context().get_node_id()

    def forget_group(self) -> None:
        """The group changed (lent to a placement group made here, or given back): look it up again."""
        self._group = None

    def agent(self) -> Any:
        from orchestrator.rayport import ray_api

        return ray.get_actor(ray_api.agent_name(self.node_name), namespace=self.namespace or DEFAULT_NAMESPACE)


def _gpus_asked(options: Mapping[str, Any]) -> float:
    return float(options.get("num_gpus") or 0.0)


def steer(lease: _Lease, options: dict[str, Any], what: str) -> dict[str, Any]:
    """``options`` of a task or actor about to be submitted, put inside ``lease``'s group when it asks for GPUs
    and names no placement of its own. Raises :class:`LeaseCapacityError` when it asks for more than the lease
    holds. Pure but for the group's lookup."""
    asked = _gpus_asked(options)
    if not _steerable(options):
        return options
    found = lease.group()
    if found is None:
        return options
    pg, bundle = found
    holds = bundle.get("GPU", 0.0)
    if asked > holds + 1e-9:
        raise LeaseCapacityError(
            "num_gpus", asked, f"at most {holds:g}",
            detail=f"{what} asks for {asked:g} GPU but lease {lease.lease_id} on {lease.node_name} holds {holds:g}; "
                   f"ask for a bigger lease (orchestrator submit --gpu N) or fewer GPUs")
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    out = dict(options)
    out["scheduling_strategy"] = PlacementGroupSchedulingStrategy(pg, 0, placement_group_capture_child_tasks=True)
    if "CPU" not in bundle and options.get("num_cpus") is None:
        out["num_cpus"] = 0  # the lease holds no CPUs: Ray's default of 1 could not fit in its group
    return out


def _steerable(options: Mapping[str, Any]) -> bool:
    """A call that asks for GPUs and names no placement of its own: no strategy, a string one (``"DEFAULT"``,
    ``"SPREAD"``: where Ray likes, which Serve's replicas say), or a soft node affinity (Serve's compaction)."""
    if _gpus_asked(options) <= 0 or options.get("placement_group") not in (None, "default"):
        return False
    strategy = options.get("scheduling_strategy")
    return strategy is None or isinstance(strategy, str) or getattr(strategy, "soft", False) is True


def _quietly(fn: Any, *args: Any) -> None:
    """``fn(*args)``, a call that only tidies up (a release, a give-back): a failure is logged, never raised."""
    try:
        fn(*args)
    except Exception as e:  # the head will expire or reclaim it
        log.info("orchestrator: %s", e)
