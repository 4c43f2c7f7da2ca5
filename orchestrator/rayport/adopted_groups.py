"""Placement groups a leased process makes on its leases' capacity: Ray Train's worker group, a Tune trial's, a
Serve replica's, a gang job's.

A lease's capacity is the placement group its node's agent made (``rgo-lease/<node>/<lease id>``). A group that
the lease's holder makes for GPU work takes its place: the agent *lends* the lease (removes its own group), the
holder's group is made pinned to the lease's node (a node-id label selector on every bundle, so it lands on exactly
that capacity), and the agent *adopts* it (removes it with the lease). :func:`make_group_in_lease` does this for
one lease, :class:`_GangLeases` for a gang job's leases (bundle ``i`` on worker ``i``'s lease), and
:class:`~orchestrator.rayport.auto_leases._AutoLeases` for a lease asked for the group itself.

Invariants:

* one placement group per lease: a second ``lend`` is refused, and the call fails with :class:`LeaseCapacityError`;
* a group never asks for more GPU than its leases hold (all its bundles together against one lease; bundle ``i``
  against gang worker ``i``'s lease), checked before the agent lends anything;
* each group made on leased capacity has an entry in :data:`_ADOPTED` (group id -> lease, token, how to end it)
  from the moment it is adopted until Ray's ``remove_placement_group`` removes it, and that removal ends the
  lease's use of it (the agent takes the capacity back, or the head releases a group's own lease):
  :func:`_wrap_groups` routes Ray's two functions through here;
* a group that asks for no GPU is Ray's as usual.
"""

from __future__ import annotations

import functools
from typing import Any

import ray

from orchestrator.core import env as E
from orchestrator.core.config import RAY_NODE_ID_LABEL
from orchestrator.rayport.held_lease import LeaseCapacityError, _Lease, _quietly
from orchestrator.rayport.lease_groups import advertises_gpus

#: group id (hex) -> (lease, token, how to end it): the groups this process made on a lease's capacity
_ADOPTED: dict[str, tuple[str, int, Any]] = {}


def _gpus_in(bundles: Any) -> list[float]:
    return [float((b or {}).get("GPU", 0.0)) for b in bundles]


def _pinned(bundles: Any, selectors: Any, node_id: str) -> list[dict[str, str]]:
    sel = list(selectors or [{} for _ in bundles])
    return [{**(s or {}), RAY_NODE_ID_LABEL: node_id} for s in sel]


def make_group_in_lease(lease: "_Lease", original: Any, bundles: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    """A placement group the holder of ``lease`` makes for GPU work (Train's worker group): the lease's own group is
    removed by the node's agent, the holder's group is made pinned to the node (so it lands on exactly that
    capacity) and adopted by the agent: removed with the lease. Asking for more GPU than the lease holds fails
    with :class:`LeaseCapacityError`."""
    found = lease.group()
    if found is None:
        return original(bundles, *args, **kwargs)
    pg, bundle = found
    asked, holds = sum(_gpus_in(bundles)), bundle.get("GPU", 0.0)
    if asked > holds + 1e-9:
        raise LeaseCapacityError("placement_group.bundles", asked, f"at most {holds:g} GPU in all",
                                 detail=f"a placement group asks for {asked:g} GPU but lease {lease.lease_id} on "
                                        f"{lease.node_name} holds {holds:g}")
    node_id = lease.ray_node_id
    token = int(lease.token or 0)
    agent = lease.agent()
    if not ray.get(agent.lend.remote(lease.lease_id, token), timeout=30):
        raise LeaseCapacityError("placement_group", "a second group", "one placement group per lease",
                                 detail=f"lease {lease.lease_id}'s capacity is already another placement group's; "
                                        f"remove that one first, or make GPU work that needs several groups from a "
                                        f"driver without a lease (each group then gets a lease of its own)")
    lease.forget_group()
    kwargs = {**kwargs, "bundle_label_selector": _pinned(bundles, kwargs.get("bundle_label_selector"), node_id)}
    group = original(bundles, *args, **kwargs)
    ray.get(agent.adopt.remote(lease.lease_id, token, group.id.hex()), timeout=30)
    _ADOPTED[group.id.hex()] = (lease.lease_id, token, lambda: _give_back(agent, lease, token))
    return group


def _give_back(agent: Any, lease: "_Lease", token: int) -> None:
    lease.forget_group()
    ray.get(agent.give_back.remote(lease.lease_id, token), timeout=30)


def _wrap_groups(make: Any) -> None:
    """Route ``ray.util.placement_group`` (and its removal) through ``make(original, bundles, args, kwargs)``,
    in ``ray.util`` and in every Ray module that imported them by name already."""
    import sys

    mod = sys.modules["ray.util.placement_group"]
    original_make, original_remove = mod.placement_group, mod.remove_placement_group

    @functools.wraps(original_make)
    def placement_group(bundles: Any, *args: Any, **kwargs: Any) -> Any:
        if sum(_gpus_in(bundles)) <= 0:
            return original_make(bundles, *args, **kwargs)
        return make(original_make, bundles, args, kwargs)

    @functools.wraps(original_remove)
    def remove_placement_group(group: Any) -> None:
        original_remove(group)
        entry = _ADOPTED.pop(group.id.hex(), None)
        if entry is not None:
            _quietly(entry[2])

    for m in list(sys.modules.values()):
        name = getattr(m, "__name__", "") or ""
        if not (name == "ray" or name.startswith("ray.")):
            continue
        for attr, old, new in (("placement_group", original_make, placement_group),
                               ("remove_placement_group", original_remove, remove_placement_group)):
            if getattr(m, attr, None) is old:
                setattr(m, attr, new)


class _GangLeases:
    """The driver of a gang job (``orchestrator submit --gpu 2x1``) and its job's workers (Ray Train's controller):
    a placement group with one GPU bundle per gang worker, in worker order, takes every worker's lease (each
    node's agent lends it and adopts the group; bundle ``i`` is pinned to worker ``i``'s node). So
    ``ScalingConfig(num_workers=N, use_gpu=True)`` runs each Train worker on its own lease."""

    def __init__(self, handouts: list[dict[str, Any]], namespace: str | None) -> None:
        self.handouts, self.namespace = handouts, namespace

    def members(self) -> list[_Lease]:
        out = []
        for h in self.handouts:
            env = h.get("env_vars") or {}
            token = str(env.get(E.FENCING_TOKEN, ""))
            out.append(_Lease(env[E.LEASE_ID], h["node_name"], self.namespace,
                              int(token) if token.isdigit() else None, h["node_id"]))
        return out

    def group_for(self, original: Any, bundles: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        members = self.members()
        if not members or not advertises_gpus(members[0].ray_node_id):
            return original(bundles, *args, **kwargs)
        gpus = _gpus_in(bundles)
        if len(bundles) != len(members):
            raise LeaseCapacityError("placement_group.bundles", len(bundles), f"{len(members)}: one per gang worker",
                                     detail="a gang's placement group has one bundle per worker, in worker order")
        for i, (m, g, h) in enumerate(zip(members, gpus, self.handouts)):
            if g > float(h.get("num_gpus") or 0) + 1e-9:
                raise LeaseCapacityError(f"placement_group.bundles[{i}].GPU", g, f"at most {h.get('num_gpus')}",
                                         detail=f"gang worker {i}'s lease {m.lease_id} holds {h.get('num_gpus')}")
        lent: list[_Lease] = []
        try:
            for m in members:
                if not ray.get(m.agent().lend.remote(m.lease_id, int(m.token or 0)), timeout=30):
                    raise LeaseCapacityError("placement_group", "a second group", "one placement group per lease",
                                             detail=f"gang lease {m.lease_id} is already another group's")
                lent.append(m)
            sel = list(kwargs.get("bundle_label_selector") or [{} for _ in bundles])
            kwargs = {**kwargs, "bundle_label_selector": [
                {**(s or {}), RAY_NODE_ID_LABEL: m.ray_node_id} for s, m in zip(sel, members)]}
            group = original(bundles, *args, **kwargs)
        except Exception:
            for m in lent:
                _quietly(_give_back, m.agent(), m, int(m.token or 0))
            raise
        for m in members:
            ray.get(m.agent().adopt.remote(m.lease_id, int(m.token or 0), group.id.hex()), timeout=30)
        _ADOPTED[group.id.hex()] = ("gang", 0, lambda: [_give_back(m.agent(), m, int(m.token or 0)) for m in members])
        return group
