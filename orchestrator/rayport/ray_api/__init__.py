"""Ray's primitives as the orchestrator uses them, behind one thin layer: one module per Ray surface.

Nothing outside :mod:`orchestrator.rayport` (bar the SDK's ``connect`` and
the Serve app) imports ``ray``: the controller, the agent core, discovery,
handout and the launcher's command building are plain code, unit-tested
without Ray. The surfaces:

* :mod:`.connection` -- connecting a driver (:func:`connect`), keeping loopback
  addresses loopback (:func:`keep_loopback`), finding the cluster in bounded time
  with a typed one-line error, Ray's own CLI (:func:`ray_cli`);
* :mod:`.gcs_kv` -- the GCS key-value store (:class:`GcsKv`);
* :mod:`.actors` -- finding, pinning and killing named actors (:func:`get_head`,
  :func:`kill_named`; creating ours is :mod:`orchestrator.rayport.actors`), and the
  workload actors scenarios start;
* :mod:`.gcs_tables` -- reading the GCS node and actor tables (:func:`alive_nodes`, :func:`actors_alive`);
* :mod:`.devices` -- turning a lease's hand-out into what Ray is asked for (:func:`gpu_demand`,
  :func:`actor_options`);
* :mod:`.job_api` -- Ray's job API (:class:`RayJobRunner`, :func:`job_submission_client`);
* :mod:`.gangs` -- placement groups: a gang's (:func:`gang_placement_group`), removing an orchestrator's
  (:func:`remove_named_groups`);
* :mod:`.autoscaler` -- the autoscaler SDK: the head's demand for nodes (:func:`request_resources`), withdrawn
  when the orchestrator stops for good (:func:`withdraw_request`).

Every name is re-exported here: callers write ``from orchestrator.rayport import ray_api`` then
``ray_api.connect(...)``, or import a name from this package. Inside the package the modules import each other
directly (no module imports this ``__init__``), so replacing a name here (a test's monkeypatch) changes what
callers outside see, not what the package's own modules call.
"""

from __future__ import annotations

from orchestrator.rayport.ray_api.connection import (keep_loopback, connect, _refresh_auth, disconnect,
                                                     DEFAULT_CONNECT_TIMEOUT_S, connect_timeout_s,
                                                     token_sources, ray_cli)
from orchestrator.rayport.ray_api.gcs_kv import GcsKv
from orchestrator.rayport.ray_api.actors import (pin, get_head, kill_named, named_actor_pid, named_actor_record,
                                                 named_actor_alive, poll_ref, current_actor_id, node_ip,
                                                 current_node_id, remote_class, ship_by_value, get_actor, get,
                                                 kill, actor_states, actor_gone_errors)
from orchestrator.rayport.ray_api.gcs_tables import (alive_nodes, head_node_id, alive_nodes_all, actors_alive)
from orchestrator.rayport.ray_api.devices import (declares_cards, gpu_demand, actor_options)
from orchestrator.rayport.ray_api.job_api import (api_server_url, JOB_API_TIMEOUT_S, job_submission_client,
                                                  ID_REUSE_QUIET_S, STATUS_READ_TIMEOUT_S, RayJobRunner)
from orchestrator.rayport.ray_api.gangs import (gang_placement_group, remove_gang_placement_group,
                                                bundle_actor_options, remove_named_groups)
from orchestrator.rayport.ray_api.autoscaler import request_resources, withdraw_request
from orchestrator.rayport.lease_groups import advertises_gpus, agent_name, native_actor_options
from orchestrator.rayport.wire import unwrap

__all__ = [
    "keep_loopback", "connect", "disconnect", "DEFAULT_CONNECT_TIMEOUT_S", "connect_timeout_s",
    "token_sources", "ray_cli", "GcsKv", "pin", "get_head", "kill_named", "named_actor_pid",
    "named_actor_record", "named_actor_alive", "poll_ref", "current_actor_id", "node_ip", "current_node_id",
    "remote_class", "ship_by_value", "get_actor", "get", "kill", "actor_states", "actor_gone_errors",
    "alive_nodes", "head_node_id", "alive_nodes_all", "actors_alive", "declares_cards", "gpu_demand",
    "actor_options", "api_server_url", "JOB_API_TIMEOUT_S", "job_submission_client", "ID_REUSE_QUIET_S",
    "STATUS_READ_TIMEOUT_S", "RayJobRunner", "gang_placement_group", "remove_gang_placement_group", "remove_named_groups",
    "bundle_actor_options", "advertises_gpus", "agent_name", "native_actor_options", "unwrap", "request_resources",
    "withdraw_request",
]
