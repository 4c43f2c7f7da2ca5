"""The Python SDK: submit jobs to the orchestrator, and take leases from inside any Ray driver.

Two ways to use GPUs through the orchestrator:

* **jobs** -- ``Client().submit(JobSpec(...))`` hands a shell command to the
  head, which queues it, admits it when its lease is granted and runs it as a
  Ray job with the lease's devices. The returned :class:`JobHandle` follows it
  (``status``, ``wait``, ``logs``, ``cancel``, ``explain``);
* **leases** -- ``with orchestrator.lease(GpuRequest.mig("1g.10gb")) as l:``
  inside a driver that is already running (a notebook, a script started with
  plain ``ray job submit``) blocks until the head grants the devices;
  ``l.actor_options()`` starts actors on them; leaving the block releases them.

**Finding the head.** The same order as ``orchestrator status``:

1. an explicit ``address`` (``host:port`` or ``auto``);
2. inside a Ray job (``ray job submit`` or one the head started) the job's
   own cluster (Ray's job supervisor sets ``RAY_ADDRESS``); a driver that has
   already called ``ray.init`` is used as it is;
3. the state file ``orchestrator up`` wrote (``--state-dir``, default
   ``$RGO_STATE_DIR`` or ``$TMPDIR/rgo-<uid>``), with its auth settings;
4. ``auto``.

The head's namespace and name come from the arguments, else
``ORCHESTRATOR_NAMESPACE`` / ``ORCHESTRATOR_HEAD_NAME`` (the head sets them
inside its jobs), else the state file, else ``rgo`` / ``rgo-head``.

**Idempotent submission.** ``submit`` picks the job id on the client
(``<name>-<6 hex>``) unless given one, so a call the head's actor retries
after a restart finds the job it already made instead of making a second.

**Fate sharing.** A lease taken with :func:`lease` is activated with a small
holder actor owned by the calling driver; when the driver dies without
leaving the block, Ray kills that actor and the head's dead-holder check
frees the devices.

Nothing here imports Ray until a connection is needed; every Ray call goes
through :mod:`orchestrator.runtime.ray_api` except the holder actor's.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol

from orchestrator.context import ENV_HEAD_NAME, ENV_JOB_ID, ENV_NAMESPACE, Poll
from orchestrator.errors import InvalidRequestError, LeaseTimeoutError, OrchestratorError
from orchestrator.job import JOB_TRANSITIONS, JobSpec
from orchestrator.model.request import GpuRequest

__all__ = ["Client", "JobHandle", "Lease", "lease", "Target", "discover", "connect_head", "as_spec", "as_request",
           "JobWaitTimeoutError", "TERMINAL_STATES"]

#: Ray's job supervisor sets this in every job driver's environment.
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
TERMINAL_STATES = frozenset(s.value for s in JOB_TRANSITIONS.terminal)
_LIVE_LEASE = {"pending", "granted", "active", "checkpointing"}


class JobWaitTimeoutError(OrchestratorError, TimeoutError):
    """A job did not reach a terminal state within the caller's timeout. Retryable: wait again."""

    retryable = True

    def __init__(self, job_id: str, timeout_s: float, state: str, summary: str = "") -> None:
        self.job_id, self.timeout_s, self.state, self.summary = job_id, timeout_s, state, summary
        msg = f"job {job_id} still {state} after {timeout_s:g}s"
        if summary:
            msg += f": {summary}"
        super().__init__(msg)


class HeadApi(Protocol):
    """What the SDK calls on :class:`~orchestrator.runtime.ray_api.HeadClient` (fakes in tests implement it)."""

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any: ...
    def submit_job(self, spec: dict[str, Any], job_id: str | None = None) -> dict[str, Any]: ...
    def get_job(self, job_id: str) -> dict[str, Any]: ...
    def list_jobs(self) -> list[dict[str, Any]]: ...
    def cancel_job(self, job_id: str) -> dict[str, Any]: ...
    def job_logs(self, job_id: str) -> str: ...
    def explain_job(self, job_id: str) -> dict[str, Any]: ...
    def request_lease(self, lease_request: Mapping[str, Any]) -> str: ...
    def get_lease(self, lease_id: str) -> dict[str, Any]: ...
    def wait_lease(self, lease_id: str, timeout: float) -> dict[str, Any]: ...
    def activate(self, lease_id: str, token: int, holder: str | None = None) -> dict[str, Any]: ...
    def release(self, lease_id: str, token: int | None, reason: str = ...) -> dict[str, Any]: ...
    def status(self) -> dict[str, Any]: ...


# ---- finding and connecting to the head ----------------------------------------------------------
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
    from orchestrator.runtime.launcher import State, default_state_dir

    env = os.environ if environ is None else environ
    in_ray = connected or RAY_JOB_ENV in env
    sd = Path(state_dir) if state_dir is not None else default_state_dir()
    state = None if (in_ray and not address) else State.load(sd)
    if address:
        addr, source = address, "--address"
    elif connected:
        addr, source = None, "this driver's Ray connection"
    elif RAY_JOB_ENV in env:
        addr, source = None, "the Ray job's cluster (RAY_ADDRESS)"
    elif state is not None:
        addr, source = state.address, f"the state file in {sd}"
    else:
        addr, source = "auto", f"auto (no state file in {sd})"
    ns = namespace or env.get(ENV_NAMESPACE) or (state.namespace if state else None) or "rgo"
    hn = head_name or env.get(ENV_HEAD_NAME) or (state.head_name if state else None) or "rgo-head"
    return Target(addr, ns, hn, source, dict(state.env) if state else {})


class Connection:
    """A driver connection to the cluster plus a :class:`HeadClient`; closes only what it opened."""

    def __init__(self, target: Target) -> None:
        import ray

        from orchestrator.runtime import ray_api

        self.target = target
        self._ray_api = ray_api
        self.owned = not ray.is_initialized()
        if self.owned:
            os.environ.update(target.env)
            ray_api.connect(target.address, target.namespace)
        try:
            self.head: HeadApi = ray_api.HeadClient(target.namespace, target.head_name)
        except OrchestratorError as e:
            self.close()
            raise type(e)(f"{e} (found through {target.source})") from None

    def start_holder(self) -> tuple[Any, str]:
        """A tiny actor owned by this driver: it dies with the driver, and the head frees what it held."""
        import ray

        actor = ray.remote(num_cpus=0, max_restarts=0)(_Holder).remote()
        ray.get(actor.__ray_ready__.remote(), timeout=120)
        return actor, actor._actor_id.hex()

    def stop_holder(self, actor: Any) -> None:
        import ray

        ray.kill(actor, no_restart=True)

    def close(self) -> None:
        if self.owned:
            self._ray_api.disconnect()
            self.owned = False


class _Holder:
    """The lease's stand-in holder (see "Fate sharing" in the module docstring)."""

    def ping(self) -> bool:
        return True


def _connected() -> bool:
    import sys

    ray = sys.modules.get("ray")  # never import Ray just to ask
    return bool(ray is not None and ray.is_initialized())


def connect_head(address: str | None = None, *, namespace: str | None = None, head_name: str | None = None,
                 state_dir: str | os.PathLike[str] | None = None) -> HeadApi:
    """A :class:`HeadClient` for this process, connecting it as a driver when it is not one yet."""
    return Connection(discover(address, namespace=namespace, head_name=head_name, state_dir=state_dir,
                               connected=_connected())).head


# ---- validation before any network call ----------------------------------------------------------
def as_request(gpu: GpuRequest | str | int | Mapping[str, Any]) -> GpuRequest:
    """A :class:`GpuRequest` from itself, a ``--gpu`` string, a number of cards or a dict. Raises on bad input."""
    if isinstance(gpu, GpuRequest):
        return gpu
    if isinstance(gpu, bool):
        raise InvalidRequestError("gpu", gpu, "a GpuRequest, a --gpu string or a number of cards")
    if isinstance(gpu, int):
        return GpuRequest.parse(str(gpu))
    if isinstance(gpu, str):
        return GpuRequest.parse(gpu)
    if isinstance(gpu, Mapping):
        return GpuRequest(**dict(gpu))
    raise InvalidRequestError("gpu", gpu, "a GpuRequest, a --gpu string or a number of cards")


def as_spec(spec: JobSpec | Mapping[str, Any]) -> JobSpec:
    """A :class:`JobSpec` from itself or a dict whose ``gpu`` may be a ``--gpu`` string. Raises on bad input."""
    if isinstance(spec, JobSpec):
        return spec
    d = dict(spec)
    if "gpu" in d and not isinstance(d["gpu"], GpuRequest):
        d["gpu"] = as_request(d["gpu"])
    return JobSpec(**d)


def new_job_id(name: str) -> str:
    slug = re.sub(r"[^a-z0-9-]", "-", name.lower())[:40].strip("-") or "job"
    return f"{slug}-{secrets.token_hex(3)}"


# ---- jobs ----------------------------------------------------------------------------------------
class Client:
    """The orchestrator, as a program sees it. See the module docstring for how it finds the head.

    ``head`` injects a head client (tests pass a fake; nothing connects then).
    Use as a context manager, or call :meth:`close`, to disconnect a driver the
    client connected itself; a driver that was already connected stays so.
    """

    def __init__(self, address: str | None = None, *, namespace: str | None = None, head_name: str | None = None,
                 state_dir: str | os.PathLike[str] | None = None, head: HeadApi | None = None) -> None:
        self._conn: Connection | None = None
        if head is None:
            self._conn = Connection(discover(address, namespace=namespace, head_name=head_name, state_dir=state_dir,
                                             connected=_connected()))
            head = self._conn.head
        self.head = head

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def submit(self, spec: JobSpec | Mapping[str, Any], *, job_id: str | None = None) -> "JobHandle":
        """Queue a job; refused at once (``InvalidRequestError`` naming the field) when it can never run."""
        spec = as_spec(spec)  # local refusals before any call
        info = self.head.submit_job(spec.model_dump(mode="json"), job_id or new_job_id(spec.name))
        return JobHandle(self.head, info["job_id"], info)

    def job(self, job_id: str) -> "JobHandle":
        """A handle on a job submitted earlier (raises ``UnknownObjectError`` for an unknown id)."""
        return JobHandle(self.head, job_id, self.head.get_job(job_id))

    def jobs(self) -> list[dict[str, Any]]:
        return self.head.list_jobs()

    def status(self) -> dict[str, Any]:
        """Nodes, leases and queue at once (what ``orchestrator status`` shows)."""
        return self.head.status()

    def nodes(self) -> list[dict[str, Any]]:
        return self.head.status()["nodes"]

    def leases(self) -> list[dict[str, Any]]:
        """Live leases (pending, granted, active, checkpointing)."""
        return self.head.status()["leases"]

    def queue(self) -> list[dict[str, Any]]:
        """Pending leases in the order the scheduler considers them, each with why it waits."""
        return self.head.status()["queue"]


class JobHandle:
    """One submitted job. ``info`` is the job dict last seen (``Job.to_dict()`` plus its ``lease``)."""

    def __init__(self, head: HeadApi, job_id: str, info: dict[str, Any] | None = None) -> None:
        self.head = head
        self.job_id = job_id
        self.info = info or {}

    def __repr__(self) -> str:
        return f"JobHandle({self.job_id!r}, state={self.info.get('state')!r})"

    @property
    def state(self) -> str | None:
        return self.info.get("state")

    def status(self) -> dict[str, Any]:
        self.info = self.head.get_job(self.job_id)
        return self.info

    def wait(self, timeout: float | None = None, *, poll_s: float = 0.5, max_poll_s: float = 2.0,
             on_change: Callable[[dict[str, Any]], None] | None = None,
             clock: Callable[[], float] | None = None, sleep: Callable[[float], None] | None = None) -> dict[str, Any]:
        """Wait for succeeded, failed or cancelled; return the final job dict.

        ``on_change`` sees the job dict each time its state or message changes
        (the CLI prints progress from it). Polls every ``poll_s``, backing off
        to ``max_poll_s``. Raises :class:`JobWaitTimeoutError` after ``timeout``.
        """
        clock = clock or time.monotonic
        sleep = sleep or time.sleep
        deadline = None if timeout is None else clock() + timeout
        seen: tuple[Any, ...] | None = None
        delay = poll_s
        while True:
            d = self.status()
            key = (d.get("state"), d.get("message"), d.get("attempt"))
            if key != seen:
                seen, delay = key, poll_s
                if on_change is not None:
                    on_change(d)
            if d["state"] in TERMINAL_STATES:
                return d
            if deadline is not None and clock() >= deadline:
                summary = ""
                try:
                    summary = self.explain().get("summary", "")
                except OrchestratorError:
                    pass
                raise JobWaitTimeoutError(self.job_id, float(timeout or 0), d["state"], summary)
            step = delay if deadline is None else max(0.0, min(delay, deadline - clock()))
            sleep(step)
            delay = min(max_poll_s, delay * 1.5)

    def logs(self) -> str:
        """The Ray job's output so far (the current attempt's)."""
        return self.head.job_logs(self.job_id)

    def cancel(self) -> dict[str, Any]:
        """Stop the job (queued, running or checkpointing) and release its lease. Idempotent."""
        self.info = self.head.cancel_job(self.job_id)
        return self.info

    def explain(self) -> dict[str, Any]:
        """Why it waits (grouped reasons, queue position, what preemption would admit it), or why it runs where it does."""
        return self.head.explain_job(self.job_id)


# ---- leases from inside a driver -----------------------------------------------------------------
class Lease:
    """A granted lease, inside a ``with orchestrator.lease(...)`` block.

    ``env`` is what the devices need in a process's environment
    (``CUDA_VISIBLE_DEVICES`` = GPU or MIG UUIDs, ``CUDA_MPS_*``...);
    :meth:`actor_options` gives Ray actor options that start one holder on
    exactly these devices, on the lease's node. One actor per lease: its
    ``num_gpus`` is the lease's share, so a second one would count twice in
    Ray's accounting.
    """

    def __init__(self, head: HeadApi, info: dict[str, Any], *, poll_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.head = head
        self.info = info
        self.released = False
        self._poll = Poll(self._checkpoint_asked, poll_s, what=f"lease {self.lease_id}", clock=clock)

    def __repr__(self) -> str:
        return f"Lease({self.lease_id!r}, state={self.info.get('state')!r}, node={self.node!r})"

    @property
    def lease_id(self) -> str:
        return self.info["lease_id"]

    @property
    def fencing_token(self) -> int:
        return int(self.info["fencing_token"])

    @property
    def handout(self) -> dict[str, Any]:
        return self.info["handout"]

    @property
    def node(self) -> str | None:
        return (self.info.get("allocation") or {}).get("node")

    @property
    def allocation(self) -> dict[str, Any]:
        return dict(self.info.get("allocation") or {})

    @property
    def env(self) -> dict[str, str]:
        return dict(self.handout["env_vars"])

    @property
    def cuda_visible_devices(self) -> str:
        return self.handout["env_vars"].get("CUDA_VISIBLE_DEVICES", "")

    def actor_options(self, *, extra_env: Mapping[str, str] | None = None, **options: Any) -> dict[str, Any]:
        """Ray actor options for one holder of this lease; ``options`` (``num_cpus``, ``name``...) are added."""
        from orchestrator.runtime import ray_api

        out = ray_api.actor_options(self.handout, extra_env=extra_env)
        out.update(options)
        return out

    def refresh(self) -> dict[str, Any]:
        self.info = self.head.get_lease(self.lease_id)
        return self.info

    def preemption_requested(self) -> bool:
        """True once the head wants these devices back (the lease is checkpointing, or ended). Rate-limited."""
        return self._poll.ask()

    def _checkpoint_asked(self) -> bool:
        return self.refresh()["state"] not in ("granted", "active")

    def release(self, reason: str = "released by its holder") -> dict[str, Any]:
        """Give the devices back (idempotent). Leaving the ``with`` block does this."""
        d = self.head.release(self.lease_id, self.fencing_token, reason)
        self.info, self.released = d, True
        return d


@contextmanager
def lease(request: GpuRequest | str | int | Mapping[str, Any], *, priority: str | None = None,
          queue: str = "default", timeout: float = 300.0, owner: str | None = None, lease_id: str | None = None,
          address: str | None = None, namespace: str | None = None, head_name: str | None = None,
          state_dir: str | os.PathLike[str] | None = None, head: HeadApi | None = None,
          fate_share: bool = True, poll_s: float = 1.0) -> Iterator[Lease]:
    """Block until the head grants ``request``; yield the :class:`Lease`; release it when the block ends.

    ``priority`` is a priority class (``inference``, ``training``, ``batch`` or
    one from the config; None = the config's default). Raises
    ``InvalidRequestError`` (naming the field) for a request that can never be
    granted, ``LeaseTimeoutError`` (with the scheduler's reason) when it is not
    granted within ``timeout`` -- the pending request is withdrawn then.
    """
    req = as_request(request)  # local refusals before any call
    conn: Connection | None = None
    if head is None:
        conn = Connection(discover(address, namespace=namespace, head_name=head_name, state_dir=state_dir,
                                   connected=_connected()))
        head = conn.head
    lid = lease_id or f"lease-{secrets.token_hex(4)}"
    holder: Any = None
    handle: Lease | None = None
    requested = failed = False
    why = "holder left the lease block"
    try:
        head.request_lease({"lease_id": lid, "request": req.model_dump(mode="json"),
                            "owner": owner or _default_owner(), "priority_class": priority or "", "queue": queue,
                            "requeue_on_loss": False})
        requested = True
        info = head.wait_lease(lid, timeout)
        if info.get("state") not in ("granted", "active") or not info.get("handout"):
            last = (info.get("history") or [{}])[-1].get("reason", "")
            raise OrchestratorError(f"lease {lid} ended before it was handed out: {info.get('state')} ({last})")
        holder_id = None
        if fate_share and conn is not None:
            holder, holder_id = conn.start_holder()
        info = {**info, **head.activate(lid, int(info["fencing_token"]), holder_id)}
        handle = Lease(head, info, poll_s=poll_s)
        yield handle
    except LeaseTimeoutError:
        why, failed = f"not granted within {timeout:g}s; withdrawn by its requester", True
        raise
    except BaseException as e:
        why, failed = f"holder left the lease block with {type(e).__name__}", True
        raise
    finally:
        try:
            if handle is not None:
                if not handle.released:
                    handle.release(why)
            elif requested:
                _withdraw(head, lid, why)
        except OrchestratorError:
            if not failed:
                raise  # otherwise the error that ended the block matters more
        finally:
            if holder is not None and conn is not None:
                try:
                    conn.stop_holder(holder)
                except Exception:
                    pass  # it dies with the driver anyway
            if conn is not None:
                conn.close()


def _withdraw(head: HeadApi, lease_id: str, reason: str) -> None:
    """Release a lease in whatever live state it is (pending needs no token); ended ones are left alone."""
    d = head.get_lease(lease_id)
    if d["state"] in _LIVE_LEASE:
        head.release(lease_id, d.get("fencing_token") if d["state"] != "pending" else None, reason)


def _default_owner() -> str:
    import socket

    job = os.environ.get(ENV_JOB_ID)
    if job:
        return f"job:{job}"
    return f"driver:{socket.gethostname()}:{os.getpid()}"
