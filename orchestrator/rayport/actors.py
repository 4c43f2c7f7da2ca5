"""Creating the orchestrator's actors, the head and one agent per GPU node, and removing all it made in Ray.

The head is given :func:`start_agent` as an argument (dependency injection,
so :mod:`.head` does not import this module that imports it).
"""

from __future__ import annotations

import os
import re
import secrets
import time
from typing import Any, Mapping, Sequence

import ray

from orchestrator.core.config import ClusterConfig, RuntimeSettings
from orchestrator.core.credentials import HEAD_SECRET_ENV, client_credentials, digest
from orchestrator.core.errors import ConfigError
from orchestrator.rayport.agent import AgentActor
from orchestrator.rayport.head import HeadActor
from orchestrator.control.holds import HOLD_PREFIX, LEASE_PREFIX
from orchestrator.rayport.ray_api import (agent_name, kill_named, named_actor_alive, pin, remove_named_groups,
                                          withdraw_request)
from orchestrator.rayport.store import gcs_table


def start_head(settings: RuntimeSettings, cluster: ClusterConfig, *, node_id: str | None = None,
               admin_key: str | None = None, token_secret: str | None = None) -> Any:
    """Create the detached head actor (or return the running one: ``get_if_exists``).

    ``max_restarts=-1``: Ray restarts a head that dies, and it resumes from the GCS
    store; ``max_task_retries=-1``: calls in flight across a restart are retried,
    which is safe because every state-changing method is idempotent.

    Its administrator (``settings.admin_key_sha256``, when that is unset): whoever holds ``admin_key``, else the
    starter's own administrator key (:func:`~orchestrator.core.credentials.client_credentials`), else nobody.

    ``token_secret`` (hex): what its fencing tokens are made from; it reaches the head as a constructor argument,
    so a head Ray restarts keeps it, and never the GCS KV. ``up`` keeps one in the state folder (0600) so a head
    made again over the same journal derives the same tokens; on Kubernetes it comes from a Secret through
    ``ORCHESTRATOR_HEAD_SECRET`` (the head's supervisor makes the head again after it is killed); else a new one.
    """
    if settings.admin_key_sha256 is None:
        key = admin_key or client_credentials(create_user_key=False).get("admin")
        if key:
            settings = settings.model_copy(update={"admin_key_sha256": digest(key)})
    opts: dict[str, Any] = dict(name=settings.head_name, namespace=settings.namespace, lifetime="detached",
                                get_if_exists=True, max_restarts=-1, max_task_retries=-1, num_cpus=0,
                                max_concurrency=1000)
    if node_id:
        opts["scheduling_strategy"] = pin(node_id, soft=True)  # the Ray head node, while it stands
    secret = token_secret or os.environ.get(HEAD_SECRET_ENV) or secrets.token_hex(32)
    if not re.fullmatch(r"[0-9a-fA-F]{32,128}", secret):
        raise ConfigError(HEAD_SECRET_ENV, "<secret>", "32 to 128 hex digits (openssl rand -hex 32)")
    return ray.remote(HeadActor).options(**opts).remote(settings.model_dump(mode="json"),
                                                         cluster.model_dump(mode="json"), start_agent, secret)


def start_agent(node_name: str, ray_node_id: str, settings: RuntimeSettings, sim_node: Mapping[str, Any] | None,
                agent_key: str) -> Any:
    """Create the detached agent of one node, pinned there (``soft=False``), with ``agent_key``, the credential the
    head made for it (only the head calls this: the key reaches the agent's constructor, no driver).

    An older agent of the node that is still alive but silent is killed first;
    Ray frees the name once the old actor is dead, so creation is retried briefly.
    """
    name = agent_name(node_name)
    kill_named(name, settings.namespace)
    opts = dict(name=name, namespace=settings.namespace, lifetime="detached", max_restarts=0, num_cpus=0,
                scheduling_strategy=pin(ray_node_id, soft=False))
    cls = ray.remote(AgentActor).options(**opts)
    deadline = time.monotonic() + 5.0
    while True:
        try:
            return cls.remote(node_name, ray_node_id, settings.model_dump(mode="json"), dict(sim_node) if sim_node else None,
                              agent_key)
        except ValueError:  # the name is still held by the actor just killed
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def stop_orchestrator(namespace: str, head_name: str, node_names: Sequence[str], *,
                      timeout_s: float = 15.0) -> list[str]:
    """Remove what an orchestrator made in Ray, on a driver connected to its cluster: its head, its agents and
    their detached holds and lease groups (which outlive an agent so that its successor adopts them, so a stop
    for good must remove them, or the cluster's cards stay held with nobody to lend them), and the head's request
    to Ray's autoscaler (which Ray keeps until the next one: left, an autoscaling cluster would keep the nodes it
    grew for a queue that is gone; only while it is still the head's, :func:`~.ray_api.withdraw_request`); the
    names removed.
    Only its own: the actors named in ``namespace`` and the groups named for ``node_names`` (the user's own
    groups are left alone). Its journal (GCS KV) stays, for a later ``up`` over it.

    Order: the actors are killed and seen dead (``ray.kill`` only asks; an agent still running could make a new
    hold after the groups were listed) before the groups are removed, and the groups are listed again until a
    pass finds none (a group asked for just before its agent died may reach the GCS a moment later); each bounded
    by ``timeout_s``."""
    names = [head_name] + [agent_name(n) for n in node_names]
    gone = [n for n in names if kill_named(n, namespace)]
    deadline = time.monotonic() + timeout_s
    while any(named_actor_alive(n, namespace) for n in gone) and time.monotonic() < deadline:
        time.sleep(0.1)
    if withdraw_request(gcs_table(namespace)) == "cleared":
        gone.append("autoscaler request")
    prefixes = [f"{p}{n}/" for p in (HOLD_PREFIX, LEASE_PREFIX) for n in node_names]
    removed = remove_named_groups(prefixes)
    while time.monotonic() < deadline:
        time.sleep(0.3)
        again = remove_named_groups(prefixes)
        if not again:
            break
        removed += again
    return gone + removed
