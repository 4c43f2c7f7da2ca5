"""Finding the head and connecting to it: the SDK's one module that talks to Ray directly.

**Finding the head** (:func:`discover`), in this order -- the same as every
``orchestrator`` command:

1. an explicit ``address`` (``host:port`` or ``auto``);
2. inside a Ray job (``ray job submit`` or one the head started) the job's
   own cluster (Ray's job supervisor sets ``RAY_ADDRESS``); a driver that has
   already called ``ray.init`` is used as it is;
3. the state file ``orchestrator up`` wrote (:mod:`orchestrator.core.statefile`),
   with its auth settings;
4. ``auto``.

The head's namespace and name come from the arguments, else
``ORCHESTRATOR_NAMESPACE`` / ``ORCHESTRATOR_HEAD_NAME`` (the head sets them
inside its jobs), else the state file, else ``rgo`` / ``rgo-head``.

**Fate sharing.** :meth:`Connection.holder_id` names this driver's holder: a
small actor owned by the calling driver, made on first use and kept for the
driver's life, so every lease the driver takes is activated with the same one
(Ray makes actors at 1-3 a second on a loaded host: one per lease made the
default ``lease()`` cost 0.7 s). When the driver dies, Ray kills the holder and
the head's dead-holder check frees everything activated with it.

**One head client per driver.** Every :class:`Connection` of one driver (Ray job) to one head shares one
:class:`~orchestrator.rayport.client.HeadClient`: the head is looked up once, not once per ``lease()``, and
the quick calls of the driver's threads share its channel (:mod:`orchestrator.rayport.channel`). A client
that found the head's actor dead is not handed out again: the next connection looks the head up afresh.

Ray is imported only when a connection is made (``import orchestrator.sdk``
stays free of Ray, which takes a second to import): the heavy-dependency
exception to our no-imports-in-functions rule.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from orchestrator.core import env as E
from orchestrator.core.api import HeadApi
from orchestrator.core.errors import HeadNotFoundError, OrchestratorError
from orchestrator.core.statefile import State, default_state_dir

DEFAULT_NAMESPACE = "rgo"
DEFAULT_HEAD_NAME = "rgo-head"


@dataclass(frozen=True, slots=True)
class Target:
    """Where the head is, and why we think so (``source``, for messages)."""

    address: str | None  # None: the driver is (or will be) connected by Ray itself (inside a Ray job)
    namespace: str
    head_name: str
    source: str
    env: Mapping[str, str] = field(default_factory=dict)  # from the state file: auth, RAY_TMPDIR


def discover(address: str | None = None, *, namespace: str | None = None, head_name: str | None = None,
             state_dir: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None,
             connected: bool = False) -> Target:
    """Where to find the head; see the module docstring for the order. Reads the state file, nothing else."""
    env = os.environ if environ is None else environ
    in_ray = connected or E.RAY_JOB_CONFIG in env
    sd = Path(state_dir) if state_dir is not None else default_state_dir()
    state = None if (in_ray and not address) else State.load(sd)
    if address:
        addr, source = address, "--address"
    elif connected:
        addr, source = None, "this driver's Ray connection"
    elif E.RAY_JOB_CONFIG in env:
        addr, source = None, "the Ray job's cluster (RAY_ADDRESS)"
    elif state is not None:
        addr, source = state.address, f"the state file in {sd}"
    else:
        addr, source = "auto", f"auto, no state file in {sd}"
    ns = namespace or env.get(E.NAMESPACE) or (state.namespace if state else None) or DEFAULT_NAMESPACE
    hn = head_name or env.get(E.HEAD_NAME) or (state.head_name if state else None) or DEFAULT_HEAD_NAME
    return Target(addr, ns, hn, source, dict(state.env) if state else {})


class Connection:
    """A driver connection to the cluster plus a head client; closes only what it opened.

    Finding the cluster takes at most ``connect_timeout_s`` (default ``ORCHESTRATOR_CONNECT_TIMEOUT_S``,
    else 10 s) and each way it can fail has its own error (exit 3 on the command line):
    :class:`~orchestrator.core.errors.ClusterNotFoundError`, :class:`~orchestrator.core.errors.ClusterAuthError`,
    :class:`~orchestrator.core.errors.HeadNotFoundError`; each names the address and how it was found."""

    def __init__(self, target: Target, *, connect_timeout_s: float | None = None) -> None:
        import ray

        from orchestrator.rayport import ray_api
        from orchestrator.rayport.client import HeadClient

        self.target = target
        self._ray_api = ray_api
        self.owned = not ray.is_initialized()
        if self.owned:
            os.environ.update(target.env)
        try:
            address = ray_api.connect(target.address, target.namespace, timeout_s=connect_timeout_s,
                                      source=target.source)
            key = (ray.get_runtime_context().get_job_id(), target.namespace, target.head_name)
            with _HEADS_LOCK:
                head = _HEADS.get(key)
                if head is None or head.gone:
                    if not ray_api.named_actor_alive(target.head_name, target.namespace):
                        raise HeadNotFoundError(address, target.source, target.namespace, target.head_name)
                    head = HeadClient(target.namespace, target.head_name)
                    for k in [k for k in _HEADS if k[0] != key[0]]:  # an earlier Ray connection's: no use now
                        del _HEADS[k]
                    _HEADS[key] = head
            self.head: HeadApi = head
        except OrchestratorError:
            self.close()
            raise

    def start_holder(self) -> tuple[Any, str]:
        """A tiny actor owned by this driver: it dies with the driver, and the head frees what it held."""
        import ray

        actor = ray.remote(num_cpus=0, max_restarts=0)(_Holder).remote()
        ray.get(actor.__ray_ready__.remote(), timeout=120)
        return actor, actor._actor_id.hex()

    def holder_id(self) -> str:
        """The id of this driver's holder (see "Fate sharing" in the module docstring): started on first use,
        then reused by every lease of this driver. A new Ray connection (a new job id) gets a new one."""
        import ray

        global _HOLDER
        job = ray.get_runtime_context().get_job_id()
        if _HOLDER is None or _HOLDER[0] != job:
            actor, aid = self.start_holder()
            _HOLDER = (job, actor, aid)
        return _HOLDER[2]

    def stop_holder(self, actor: Any) -> None:
        import ray

        ray.kill(actor, no_restart=True)

    def close(self) -> None:
        if self.owned:
            self._ray_api.disconnect()
            self.owned = False


#: This driver's holder: (Ray job id of the connection it belongs to, the actor, its id).
_HOLDER: tuple[str, Any, str] | None = None

#: This driver's head clients, by (Ray job id, namespace, head name): see "One head client per driver".
_HEADS: dict[tuple[str, str, str], Any] = {}
_HEADS_LOCK = threading.Lock()


class _Holder:
    """A lease's stand-in holder (see "Fate sharing" in the module docstring)."""

    def ping(self) -> bool:
        return True


def connected() -> bool:
    """Whether this process is already a Ray driver (never imports Ray just to ask)."""
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


def open_connection(address: str | None = None, *, namespace: str | None = None, head_name: str | None = None,
                    state_dir: str | os.PathLike[str] | None = None,
                    connect_timeout_s: float | None = None) -> Connection:
    """Find the head (:func:`discover`) and connect this process to its cluster (see :class:`Connection`)."""
    return Connection(discover(address, namespace=namespace, head_name=head_name, state_dir=state_dir,
                               connected=connected()), connect_timeout_s=connect_timeout_s)


def connect_head(address: str | None = None, *, namespace: str | None = None, head_name: str | None = None,
                 state_dir: str | os.PathLike[str] | None = None) -> HeadApi:
    """A head client for this process, connecting it as a driver when it is not one yet."""
    return open_connection(address, namespace=namespace, head_name=head_name, state_dir=state_dir).head
