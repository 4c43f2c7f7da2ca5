"""The whole head, in-process, for tests that would otherwise need a fake of it. No Ray.

:class:`InProcessHead` is the real :class:`~orchestrator.control.service.HeadService`
(controller, job layer, metrics) over a :class:`~orchestrator.control.store.MemoryStore`,
with the real agent logic (:class:`~orchestrator.control.agent.AgentCore` over the
simulated discovery backend) for every node of a cluster file. A background
thread runs the head's cycle and the agents' heartbeats every ``tick_s``, as
the head actor's event loop and the agent actors do, and after each cycle hands
Ray's job API what the cycle made due
(:func:`~orchestrator.control.jobs.launches.run_due`, where the actor runs
``launch_off_loop`` after its group commit); every API call takes the same
lock, so calls and cycles never interleave (the actor is single-threaded too).

Only two boundaries are stood in for, and named so:

* Ray's job API -- :class:`LocalProcessRunner` runs each entrypoint as a real
  local process with the job's environment (exit code 0 -> SUCCEEDED);
* the GCS actor table -- a holder id is alive until :meth:`InProcessHead.kill_holder`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from orchestrator.core.credentials import calling_as
from orchestrator.control.agent import AgentCore
from orchestrator.control.discovery.simulated import SimulatedBackend
from orchestrator.control.jobs import run_due
from orchestrator.control.nodes import RayNodeInfo
from orchestrator.control.service import HeadService
from orchestrator.control.store import MemoryStore
from orchestrator.core.api import HEAD_METHODS
from orchestrator.core.config import DEMO_CONFIG, ClusterConfig, RuntimeSettings, SimNode, load_config
from orchestrator.core.errors import NotConnectedError


class LocalProcessRunner:
    """Ray's job API stood in for by local processes: ``submit`` starts the entrypoint in a shell."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.stopped: set[str] = set()
        self.submitted: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []

    def submit(self, submission_id: str, entrypoint: str, runtime_env: dict[str, Any],
               label_selector: dict[str, str], handout: dict[str, Any], metadata: dict[str, str]) -> None:
        if submission_id in self.procs:
            return  # taken already (JobRunner.submit is idempotent per id)
        env = {**os.environ, **runtime_env.get("env_vars", {})}
        log = open(self.workdir / f"{submission_id}.log", "wb")  # noqa: SIM115 - closed with the process
        self.submitted[submission_id] = {"entrypoint": entrypoint, "env": runtime_env.get("env_vars", {}),
                                         "label_selector": label_selector, "handout": handout}
        self.procs[submission_id] = subprocess.Popen(entrypoint, shell=True, env=env, stdout=log,
                                                     stderr=subprocess.STDOUT, start_new_session=True)

    def status(self, submission_id: str) -> str | None:
        p = self.procs.get(submission_id)
        if p is None:
            return None
        rc = p.poll()
        if rc is None:
            return "RUNNING"
        if submission_id in self.stopped:
            return "STOPPED"
        return "SUCCEEDED" if rc == 0 else "FAILED"

    def status_many(self, submission_ids: Sequence[str]) -> dict[str, str | None]:
        return {s: self.status(s) for s in submission_ids}

    def stop(self, submission_id: str) -> None:
        p = self.procs.get(submission_id)
        if p is not None and p.poll() is None:
            self.stopped.add(submission_id)
            os.killpg(p.pid, signal.SIGTERM)

    def delete(self, submission_id: str) -> None:
        """As Ray's ``delete_job``: refused while the job runs; then the id is free to be submitted again."""
        p = self.procs.get(submission_id)
        if p is None:
            raise RuntimeError(f"Job {submission_id} does not exist")
        if p.poll() is None:
            raise RuntimeError(f"Job {submission_id} is not in a terminal state")
        del self.procs[submission_id]
        self.submitted.pop(submission_id, None)
        self.stopped.discard(submission_id)
        self.deleted.append(submission_id)

    def logs(self, submission_id: str) -> str:
        path = self.workdir / f"{submission_id}.log"
        return path.read_text() if path.exists() else ""

    def close(self) -> None:
        for sid in list(self.procs):
            self.stop(sid)
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def ray_node_id(name: str) -> str:
    """A stable node id of Ray's shape (56 hex digits) for a simulated node."""
    return hashlib.sha224(name.encode()).hexdigest()


class SimulatedCluster:
    """The :class:`~orchestrator.control.service.ClusterPort` of a cluster file: real agent cores, no Ray."""

    def __init__(self, config: ClusterConfig, settings: RuntimeSettings) -> None:
        self.config = config
        self.settings = settings
        self.agents: dict[str, AgentCore] = {}
        self.registered: set[str] = set()
        self.dead_holders: set[str] = set()
        self.down: set[str] = set()  # nodes whose Ray node left
        self.agent_keys: dict[str, str] = {}  # node -> the key the head started its agent with

    def alive_nodes(self) -> list[RayNodeInfo]:
        return [RayNodeInfo(ray_node_id(n.name), n.name) for n in self.config.nodes if n.name not in self.down]

    def holders_alive(self, holders: Sequence[str]) -> Mapping[str, bool]:
        return {h: h not in self.dead_holders for h in holders}

    def start_agent(self, node_name: str, ray_node_id: str, sim_node: SimNode | None, agent_key: str) -> None:
        self.agents[node_name] = AgentCore(node_name, ray_node_id, SimulatedBackend(sim_node, node_name=node_name),
                                           self.settings)
        self.agent_keys[node_name] = agent_key
        self.registered.discard(node_name)

    def beat(self, head: HeadService) -> None:
        """One heartbeat of every live agent (registering first), as the agent actors' loops do: each call made as
        the agent, with the key the head gave it (as the head's transport would carry it)."""
        for name, core in list(self.agents.items()):
            if name in self.down:
                continue
            with calling_as(head.caller({"agent": self.agent_keys[name], "node": name})):
                self._beat(head, name, core)

    def _beat(self, head: HeadService, name: str, core: AgentCore) -> None:
        if name not in self.registered:
            ack = head.register_agent(**core.registration())
            core.apply_assignments(ack["assignments"], ack.get("revocations"))
            self.registered.add(name)
        reply = head.heartbeat(**core.heartbeat_payload())
        if reply.get("reregister"):
            self.registered.discard(name)
            return
        core.apply_assignments(reply.get("assignments", {}), reply.get("revocations"), reply.get("reconfigure"))
        changed = core.poll_health(0.0)  # a new MIG layout (or health) is pushed, as the agent actor does
        if changed is not None:
            head.update_inventory(core.node_name, core.incarnation, changed.model_dump(mode="json"))


class InProcessHead:
    """:class:`HeadService` behind a lock, driven by a background thread; see the module docstring.

    Every :data:`~orchestrator.core.api.HEAD_METHODS` method is available on it and
    recorded in ``calls``. ``unreachable = True`` makes every call raise
    ``NotConnectedError``, as the Ray client does when the head does not answer.
    """

    def __init__(self, config: ClusterConfig | None = None, *, settings: RuntimeSettings | None = None,
                 tick_s: float = 0.02, workdir: Path | None = None, clock: Callable[[], float] = time.time) -> None:
        self.config = config or load_config(DEMO_CONFIG)
        self.settings = settings or RuntimeSettings(heartbeat_interval_s=0.1, agent_ttl_s=5.0,
                                                    reconcile_interval_s=tick_s)
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="rgo-inprocess-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.runner = LocalProcessRunner(self.workdir)
        self.cluster = SimulatedCluster(self.config, self.settings)
        self.store = MemoryStore()
        self.service = HeadService(self.settings, self.config, self.store, self.runner, self.cluster, clock=clock,
                                   status_poll_s=0.0)
        self.lock = threading.RLock()
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.unreachable = False
        self.tick_s = tick_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="inprocess-head", daemon=True)
        self._thread.start()
        self.wait_for(lambda: len(self.service.ctl.registered_nodes()) == len(self.config.nodes), 10,
                      "every simulated agent registered")

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self.lock:
                self.cluster.beat(self.service)
                self.service.cycle_safely()
                run_due(self.service)  # the store (a MemoryStore) holds every write: as the actor after its flush
            self._stop.wait(self.tick_s)

    def wait_for(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                if cond():
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g}s waiting for: {what}")
            time.sleep(0.01)

    def wait_lease(self, lease_id: str, timeout: float, key: str | None = None) -> dict[str, Any]:
        """As the actor answers it: poll the service between cycles of the background thread."""
        self._record("wait_lease", (lease_id, timeout))
        return self._settled(lease_id, timeout, key)

    def _settled(self, lease_id: str, timeout: float, key: str | None) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                d = self.service.lease_settled(lease_id, key)
                if d is not None:
                    return d
                if time.monotonic() >= deadline:
                    raise self.service.lease_timeout(lease_id, timeout)
            time.sleep(0.01)

    def acquire_lease(self, lease_request: Mapping[str, Any], timeout: float, key: str | None = None,
                      holder: str | None = None) -> dict[str, Any]:
        """As the actor answers it: queue, the fast grant path, then wait between cycles of the background thread."""
        self._record("acquire_lease", (lease_request, timeout))
        lease_request = _wire(lease_request)
        with self.lock:
            lease_id = self.service.request_lease_now(lease_request)
        settled = self._settled(lease_id, timeout, key)
        with self.lock:
            return _wire(self.service.activate_settled(settled, key, holder))

    def kill_holder(self, holder: str) -> None:
        with self.lock:
            self.cluster.dead_holders.add(holder)

    def methods(self) -> list[str]:
        return [m for m, _ in self.calls]

    def _record(self, name: str, args: tuple[Any, ...]) -> None:
        if self.unreachable:
            raise NotConnectedError(f"orchestrator head did not answer {name}: unreachable (test)")
        self.calls.append((name, args))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.runner.close()


def _wire(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _method(name: str) -> Callable[..., Any]:
    @functools.wraps(getattr(HeadService, name))
    def call(self: InProcessHead, *args: Any, **kwargs: Any) -> Any:
        self._record(name, args)
        args, kwargs = _wire(args), _wire(kwargs)  # what crosses the Ray port is JSON, both ways
        with self.lock:
            return _wire(getattr(self.service, name)(*args, **kwargs))

    return call


for _name in HEAD_METHODS:
    if _name not in InProcessHead.__dict__:
        setattr(InProcessHead, _name, _method(_name))
