"""The head actor: one detached, named Ray actor per cluster, in our own namespace.

A thin wrapper around :class:`~orchestrator.control.service.HeadService` (read
it and :class:`~orchestrator.control.controller.HeadController` for the
contract: hard state in the GCS store before acting, idempotent methods,
desired apart from actual). The wrapper adds only what needs Ray or an event
loop:

* on start -- and on every restart, since Ray restarts it (``max_restarts=-1``)
  -- the service restores itself from the journal in the GCS KV table
  (:func:`~.store.load_journal`);
* group commit (:class:`~.store.GroupCommit`): the service's writes go to the journal in
  memory; every reply, and every job's submission to Ray, waits until the journal's batch
  holding what was changed before it is in the GCS. Calls that change state while a batch is
  being written share the next one. So a reply never tells a client of a state a restarted head
  would not restore, and no Ray job starts on a grant it would not restore. While the GCS cannot
  be written, the batch is retried with back-off and replies wait (the client's call timeout
  bounds them; its retry is idempotent);
* a reconcile loop: every ``reconcile_interval_s``, or at once after a call
  that may make the queue schedulable (:data:`WAKES`) or a job API answer that leaves
  work (:meth:`HeadService.loop_due`), it runs one :meth:`HeadService.cycle`, and flushes
  only when a job is due to start or stop, or no call woke it (:meth:`HeadActor._loop`);
* ``wait_lease`` and ``acquire_lease``, which wait on the event loop without
  blocking other calls and without polling: each waiter is a future that the
  loop resolves after the cycle (or the fast grant path) that settled its lease.
  ``acquire_lease`` queues, tries the fast grant path
  (:meth:`HeadService.grant_now`) and waits, in one call: the SDK's lease
  cycle is one call to get the devices and one to give them back;
* Ray's job API called off the loop (:func:`launch_off_loop`, one thread): a job's submission (or
  stop, or the deletion of a pruned job's record) is blocking HTTP, seconds when Ray's job head has no agent; its answer is applied back on the loop. A job's
  log is read off the loop too, on a thread of its own (:meth:`HeadActor.job_logs`);
* the channel (:mod:`.channel`, gRPC): clients' quick calls served on the loop, the batches that arrive in one
  turn carried out as one batch by the same code as :meth:`HeadActor.call_many`
  (:meth:`HeadActor._answer_batches`, then the group commit), at about a tenth of a Ray call's cost each;
* waking a node's agent when the head has a checkpoint to ask for or a lease to
  revoke there (:meth:`HeadService.agent_work`), so the
  agent acts within a call's latency instead of a heartbeat interval;
* the queue's demand for nodes sent to Ray's autoscaler (``settings.autoscaler_demand``,
  :meth:`HeadActor._tell_autoscaler`): looked at every ``tuning.autoscaler_demand_every_s``, sent off the loop
  (one thread) only when it changed since Ray last took it; a failed send is logged and sent again a period
  later, and never stops the loop.

Its public methods are made from :data:`orchestrator.core.api.HEAD_METHODS`,
one per method of :class:`~orchestrator.core.api.HeadApi`, each answering
``{"ok": value}`` or ``{"error": typed error}`` (:mod:`.wire`);
:class:`~.client.HeadClient` unwraps them. A test checks the three agree.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import secrets
import sys
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

from orchestrator.control.demand import DemandPacer
from orchestrator.control.edge import check_args, check_batch
from orchestrator.control.journal import Journal
from orchestrator.control.jobs import AdmissionOnlyRunner, JobApiCall, take_due
from orchestrator.control.nodes import RayNodeInfo
from orchestrator.control.service import Begun, HeadService
from orchestrator.core.credentials import ANONYMOUS, CALLER_KWARG, Principal, calling_as
from orchestrator.core.api import HEAD_METHODS, HeadApi
from orchestrator.core.config import ClusterConfig, RuntimeSettings, SimNode
from orchestrator.core.errors import JobApiUnavailableError
from orchestrator.rayport import ray_api
from orchestrator.rayport.channel import HeadChannel, as_json
from orchestrator.rayport.store import GroupCommit, gcs_table
from orchestrator.rayport.wire import answer, fault

log = logging.getLogger(__name__)

#: Calls after which the queue may have become schedulable: the loop runs a cycle at once.
WAKES = frozenset({"request_lease", "acquire_lease_now", "release", "submit_job", "cancel_job", "job_ack_checkpoint",
                   "register_agent", "update_inventory", "heartbeat", "repartition_mig"})


def launch_off_loop(service: HeadService, pool: Executor, loop: asyncio.AbstractEventLoop,
                    then: Callable[[], None]) -> int:
    """Hand every call now due to Ray's job API (:func:`~orchestrator.control.jobs.launches.take_due`: the
    stops and deletes, then the submissions) to ``pool``, and apply each answer back on ``loop`` (each call's
    ``apply``: :meth:`HeadService.chore_done`, :meth:`HeadService.submission_sent`), then call ``then``.
    Returns how many submissions went. Call only once the store holds every write made so far (the loop
    awaits its group commit first); an in-process head makes the same calls on one thread
    (:func:`~orchestrator.control.jobs.launches.run_due`).

    The job API is blocking HTTP that can take seconds (Ray's job head waits 10 s for an agent before it
    answers "no available agent"); made on the loop, it stopped every call and cycle of the head meanwhile.
    Invariants: the service is read and changed only on ``loop``; ``pool`` runs only the call itself; on a
    one-thread ``pool`` the stops go first, so a preempted attempt is stopped before its successor starts."""
    calls = take_due(service)
    for call in calls:
        _off_loop(pool, loop, call, then)
    return sum(1 for call in calls if call.submission)


def _off_loop(pool: Executor, loop: asyncio.AbstractEventLoop, call: JobApiCall, then: Callable[[], None]) -> None:
    """``call.send`` on ``pool``; its answer applied with ``call.apply`` back on ``loop``, then ``then()``."""

    def answered(fut: asyncio.Future[Exception | None]) -> None:
        try:
            error = fut.result()
        except BaseException as e:  # the call never ran (the pool is shutting down): it is asked again later
            error = JobApiUnavailableError(call.item.submission_id, f"not sent: {type(e).__name__}: {e}")
        call.apply(call.item, error)
        then()

    loop.run_in_executor(pool, call.send, call.item).add_done_callback(answered)


class RayClusterPort:
    """:class:`~orchestrator.control.service.ClusterPort` over the GCS tables and Ray actors."""

    def __init__(self, settings: RuntimeSettings, start: Callable[..., Any]) -> None:
        self.settings = settings
        self._start = start

    def alive_nodes(self) -> list[RayNodeInfo]:
        return ray_api.alive_nodes()

    def holders_alive(self, holders: Sequence[str]) -> Mapping[str, bool]:
        return ray_api.actors_alive(holders)

    def start_agent(self, node_name: str, ray_node_id: str, sim_node: SimNode | None, agent_key: str) -> None:
        self._start(node_name, ray_node_id, self.settings, sim_node.model_dump(mode="json") if sim_node else None,
                    agent_key)


class HeadActor:
    """See the module docstring; the API methods are added below the class from :data:`HEAD_METHODS`."""

    def __init__(self, settings: dict[str, Any], cluster: dict[str, Any], start_agent: Callable[..., Any],
                 token_secret: str | None = None) -> None:
        s = RuntimeSettings.model_validate(settings)
        # Ray's threads hand each call to the loop and each reply back under the GIL; with Python's 5 ms
        # default a busy loop kept them waiting and capped the grants a second (docs/load.md).
        sys.setswitchinterval(s.head_switch_interval_s)
        table = self._table = gcs_table(s.namespace)
        journal = Journal.load(table)
        tuning = s.tuning
        runner = (ray_api.RayJobRunner(timeout_s=tuning.job_api_timeout_s, id_reuse_quiet_s=tuning.id_reuse_quiet_s,
                                       status_read_timeout_s=tuning.status_read_timeout_s)
                  if s.job_runner == "ray" else AdmissionOnlyRunner())
        self.service = HeadService(s, ClusterConfig.model_validate(cluster), journal, runner,
                                   RayClusterPort(s, start_agent), clock=time.time,
                                   token_secret=bytes.fromhex(token_secret) if token_secret else None)
        # what the restore wrote goes in its first batch
        self.commit = GroupCommit(journal, table, self.service.metrics, retry_first_s=tuning.commit_retry_first_s,
                                  retry_max_s=tuning.commit_retry_max_s)
        port = s.metrics_port  # ORCHESTRATOR_METRICS_PORT/_HOST were applied where the settings were loaded
        if port:
            host = s.metrics_host
            try:
                self.service.metrics_port = self.service.metrics.serve(port, host)
                reach = host if host not in ("0.0.0.0", "::", "") else ray_api.node_ip()
                self.service.metrics_url = f"http://{reach}:{self.service.metrics_port}/metrics"
            except OSError:
                log.exception("could not serve metrics on %s:%s", host, port)
        self._wake = asyncio.Event()
        self._told: set[tuple[str, str]] = set()  # agent work each agent has been woken for
        self._agents: dict[str, tuple[str | None, Any]] = {}  # node -> (agent incarnation, its handle): _agent
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}  # lease id -> callers waiting for it to settle
        self._home = asyncio.get_event_loop()  # the loop the cycle task runs on
        self._job_api = ThreadPoolExecutor(1, thread_name_prefix="rgo-job-api")  # Ray's job API, off the loop
        self._job_logs = ThreadPoolExecutor(1, thread_name_prefix="rgo-job-logs")  # log reads, off the loop too
        # the demand for nodes: when it is looked at and sent (None: settings.autoscaler_demand off), and the
        # thread that sends it (a GCS write: off the loop)
        self._demand = DemandPacer(tuning.autoscaler_demand_every_s) if s.autoscaler_demand else None
        self._autoscaler = ThreadPoolExecutor(1, thread_name_prefix="rgo-autoscaler")
        self._task = self._home.create_task(self._loop())
        # The grant path's own door (:mod:`.channel`, gRPC): the same batches as call_many, without Ray's per-call cost.
        self.direct = (HeadChannel(self._answer_batches, self.commit.durable, secrets.token_urlsafe(32),
                                   metrics=self.service.metrics, window_s=tuning.channel_window_s,
                                   max_wait_s=tuning.channel_max_wait_s, call_grace_s=tuning.channel_call_grace_s)
                       if s.direct_calls else None)
        self._direct_up = self._home.create_task(self._open_direct()) if self.direct is not None else None

    async def _open_direct(self) -> None:
        assert self.direct is not None
        try:
            await self.direct.start(ray_api.node_ip())
        except OSError:
            log.exception("head: the channel could not listen; clients call the actor instead")

    async def direct_endpoint(self) -> dict[str, Any]:
        """Where the channel listens, its token and certificate (:class:`~.channel.Endpoint` as JSON), or ``None`` when
        there is none (``settings.direct_calls`` off, or it could not listen): clients then call ``call_many``."""
        if self._direct_up is not None:
            await asyncio.shield(self._direct_up)
        ep = self.direct.endpoint if self.direct is not None else None
        return {"ok": ep.to_json() if ep is not None else None}

    def _poke(self) -> None:
        """Wake the cycle task (thread-safe: Ray may run calls on another thread's loop than the task's)."""
        self._home.call_soon_threadsafe(self._wake.set)

    def _wake_agents(self) -> None:
        """Wake the agents whose work gained an item this cycle (fire and forget: the heartbeat is the backstop).

        Each agent's handle is looked up once per incarnation (the one its node's record names) and kept: a lookup
        is a blocking GCS call on the loop, and a grant gives its node's agent work (a hold) every time."""
        work = self.service.agent_work()
        for node, items in work.items():
            if items - self._told:
                try:
                    self._agent(node).wake.remote()
                except Exception as e:  # no such agent (yet): it learns on its next heartbeat
                    self._agents.pop(node, None)
                    log.debug("could not wake the agent of %s: %s", node, e)
        self._told = set().union(*work.values()) if work else set()

    def _agent(self, node: str) -> Any:
        """The handle of ``node``'s agent actor, looked up again when another incarnation has registered there."""
        rec = self.service.ctl.nodes.records.get(node)
        incarnation = rec.incarnation if rec is not None else None
        kept = self._agents.get(node)
        if kept is None or kept[0] != incarnation:
            kept = self._agents[node] = (incarnation, ray_api.get_actor(ray_api.agent_name(node),
                                                                        self.service.settings.namespace))
        return kept[1]

    async def _loop(self) -> None:
        """Cycle, wake agents and waiters; then, if a job is due to start or stop, or no call woke the loop,
        flush and hand the job API what is due.

        Invariant: nothing goes to Ray's job API before the batch that made it due is in the GCS. What a cycle
        wrote otherwise (a job now running, a lease renewed or expired) needs no flush of its own: it rides
        with the next caller's batch (every reply waits for everything changed before it), or, with no caller
        for a whole interval, with the timer's flush. One GCS write a lone submission instead of two."""
        idle = True  # woken by the timer, not by a call whose reply will flush what this cycle writes
        while True:
            t0 = time.monotonic()
            self.service.cycle_safely()
            self._wake_agents()
            self._notify()
            self._tell_autoscaler()
            if idle or self.service.launch_due():
                await self.commit.durable()  # what the cycle admitted is in the GCS: now start it
                launch_off_loop(self.service, self._job_api, self._home, self._answered)
            took = time.monotonic() - t0
            if took > 1.0:  # the loop that hears heartbeats was busy this long
                log.warning("head: one cycle took %.1fs", took)
            try:
                await asyncio.wait_for(self._wake.wait(), self.service.settings.reconcile_interval_s)
                idle = False
            except asyncio.TimeoutError:
                idle = True
            self._wake.clear()

    def _tell_autoscaler(self) -> None:
        """Send the queue's demand for nodes to Ray's autoscaler when the pacer says it is time and it changed
        (:class:`~orchestrator.control.demand.DemandPacer`): computed on the loop, sent on its own thread, the
        outcome handed back to the pacer on the loop. A failure is logged, never raised: the loop goes on, and
        the pacer sends the demand again at its next look."""
        pacer, now = self._demand, time.monotonic()
        if pacer is None or not pacer.due(now):
            return
        try:
            demand = self.service.autoscaler_demand()
        except Exception:
            pacer.last_look = now  # the look is spent: the next one comes a period later
            log.exception("head: the demand for nodes could not be computed; tried again in %gs", pacer.every_s)
            return
        shapes = demand.shapes()
        if not pacer.look(shapes, now):
            return
        if demand.left_out:
            log.info("head: %d pending bundle(s) over autoscaler_demand_max_bundles left out of the demand",
                     demand.left_out)

        def sent(fut: asyncio.Future[None]) -> None:
            try:
                fut.result()
            except BaseException as e:
                log.warning("head: Ray's autoscaler did not take the demand (%d bundles): %s: %s; tried again in %gs",
                            len(shapes), type(e).__name__, e, pacer.every_s)
                pacer.done(time.monotonic(), f"{type(e).__name__}: {e}")
                return
            pacer.done(time.monotonic())
            log.info("head: asked Ray's autoscaler for %d bundle(s)", len(shapes))

        bundles = [dict(shape) for shape in shapes]
        send = functools.partial(ray_api.request_resources, bundles, record_in=self._table)
        self._home.run_in_executor(self._autoscaler, send).add_done_callback(sent)

    def _answered(self) -> None:
        """After the job API's answer was applied: wake the loop only if it has work now
        (:meth:`HeadService.loop_due`). A submission Ray took leaves it asleep: the cycle it woke after every
        job did nothing but delay the next caller's call and reply (docs/load.md, the grant path)."""
        if self.service.loop_due():
            self._poke()

    def _notify(self) -> None:
        """Resolve the waiters of every lease that has settled (handed out, or ended for good)."""
        for lease_id in [lid for lid in self._waiters if self.service.lease_settled(lid) is not None]:
            for fut in self._waiters.pop(lease_id):
                # Thread-safe: Ray may run the loop task and the calls on different threads' loops.
                fut.get_loop().call_soon_threadsafe(_resolve, fut)

    async def _settled(self, lease_id: str, timeout: float, key: str | None) -> dict[str, Any]:
        """Wait (a future, no polling) until the lease or its latest attempt is handed out or has ended."""
        deadline = time.monotonic() + timeout
        while True:
            reply = answer(self.service.lease_settled, lease_id, key)
            if "error" in reply or reply["ok"] is not None:
                return reply
            left = deadline - time.monotonic()
            if left <= 0:
                return answer(_raise, self.service.lease_timeout(lease_id, timeout))
            fut = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(lease_id, []).append(fut)
            try:
                await asyncio.wait_for(fut, left)
            except asyncio.TimeoutError:
                pass
            finally:
                waiting = self._waiters.get(lease_id)
                if waiting is not None and fut in waiting:
                    waiting.remove(fut)
                    if not waiting:
                        del self._waiters[lease_id]

    def _who(self, creds: Any) -> dict[str, Any]:
        """The caller a call's credentials prove (``{"ok": Principal}``), or the error that refuses them."""
        return answer(self.service.caller, creds)

    def _entry(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The caller (``_caller``) and the arguments of a call to ``name`` that the actor answers itself (a wait, a
        log read): ``{"ok": (principal, {parameter: value})}`` once the caller is known and the arguments fit the
        declaration (:func:`check_args`, as for every forwarded method), else the error that refuses them -- never
        an exception across the boundary, whatever a caller sends."""
        who = self._who(kwargs.pop(CALLER_KWARG, None))
        if "error" in who:
            return who
        with calling_as(who["ok"]):
            bad = answer(check_args, name, args, kwargs)
        if "error" in bad:
            return bad
        params = inspect.signature(getattr(HeadApi, name)).bind(None, *args, **kwargs)
        params.apply_defaults()
        return {"ok": (who["ok"], {k: v for k, v in params.arguments.items() if k != "self"})}

    async def wait_lease(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Wait on the event loop until the lease (or its latest attempt) is handed out or has ended."""
        entry = self._entry("wait_lease", args, kwargs)
        if "error" in entry:
            return entry
        _, a = entry["ok"]
        reply = await self._settled(a["lease_id"], a["timeout"], a["key"])
        await self.commit.durable()
        return reply

    async def job_logs(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """``HeadApi.job_logs``: the attempt is found on the loop, its log read off it (a call out of the head:
        Ray's job API, or a task on the driver's node; :meth:`RayJobRunner.logs`). Only for the job's owner."""
        entry = self._entry("job_logs", args, kwargs)
        if "error" in entry:
            return entry
        who, a = entry["ok"]
        with calling_as(who):
            source = answer(self.service.job_log_source, a["job_id"], a["attempt"])
        if "error" in source or source["ok"] is None:
            return source if "error" in source else {"ok": ""}
        text = await asyncio.get_running_loop().run_in_executor(self._job_logs, self.service.read_job_log,
                                                                source["ok"])
        return {"ok": text}

    async def acquire_lease(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Queue, try the fast grant path, wait: ``HeadApi.acquire_lease``."""
        entry = self._entry("acquire_lease", args, kwargs)
        if "error" in entry:
            return entry
        who, a = entry["ok"]
        with calling_as(who):
            reply = await self._acquire(a["lease_request"], a["timeout"], a["key"], a["holder"])
        await self.commit.durable()
        return reply

    async def _acquire(self, lease_request: dict[str, Any], timeout: float, key: str | None,
                       holder: str | None) -> dict[str, Any]:
        bad = answer(check_args, "acquire_lease", (lease_request, timeout, key, holder), {})
        if "error" in bad:
            return bad
        queued = answer(self.service.request_lease_now, lease_request)
        if "error" in queued:
            return queued
        self._poke()  # the cycle does the rest: agents, jobs, metrics (and the queue, if not granted now)
        settled = await self._settled(queued["ok"], timeout, key)
        if "error" in settled:
            return settled
        return answer(self.service.activate_settled, settled["ok"], key, holder)

    async def call_many(self, calls: Any) -> bytes:
        """Calls of :data:`~orchestrator.core.api.BATCHED` methods in one Ray call, for a client that cannot reach the
        channel (:mod:`.channel`): ``calls`` is a list of ``[method, args, kwargs]``; the answer, ``{"ok": [...]}``,
        holds each one's own envelope, in order, as its own call would have answered it -- as JSON, the channel's
        encoding, so a client gets the same types whichever way its call went.

        Invariants: the calls are carried out in order, each on its own (one's error is its own answer, never the
        others'), except that the requests the calls of :data:`HeadService.PLANNED` queue are planned together,
        once, after all of them (:meth:`HeadService.begin`), and those calls are answered after that plan; the
        loop is woken once if any of them would have woken it; and, as for every call, no answer leaves before
        the group commit holding what all of them changed is in the GCS."""
        reply = self._answer_batches([calls])[0]
        if "error" not in reply:
            await self.commit.durable()
        return as_json(reply, calls)

    def _answer_batches(self, batches: Sequence[Any]) -> list[dict[str, Any]]:
        """Each batch's ``call_many`` answer, all carried out together (the channel's calls that came in one
        turn of the loop, :mod:`.channel`): each batch checked on its own (a malformed one is refused whole, alone),
        the calls of the rest answered as one (:meth:`_answer_together`), and the loop woken once if any of them
        would have woken it. The caller waits for the group commit before it answers any of them."""
        checked = [answer(check_batch, b) for b in batches]
        calls = [c for b in checked if "ok" in b for c in b["ok"]]
        replies = iter(self._answer_together(calls))
        out = [b if "error" in b else {"ok": [next(replies) for _ in b["ok"]]} for b in checked]
        if any(name in WAKES for name, _, _ in calls):
            self._poke()
        return out

    def _answer_together(self, calls: Sequence[tuple[str, Sequence[Any], Mapping[str, Any]]]) -> list[dict[str, Any]]:
        """Each call's envelope: a call of :data:`HeadService.PLANNED` begun (:meth:`HeadService.begin`), any other
        carried out, in order; then one fast grant path for the requests the begun ones queued, and each of those
        finished with its report. Each call is carried out as the caller its own credentials prove
        (``_caller`` beside its arguments)."""
        begun: list[dict[str, Any]] = []
        whos: list[Principal] = []
        for name, args, kwargs in calls:
            kwargs = dict(kwargs)
            who = self._who(kwargs.pop(CALLER_KWARG, None))
            whos.append(who.get("ok", ANONYMOUS))
            if "error" in who:
                begun.append(who)
                continue
            with calling_as(who["ok"]):
                begun.append(self._answer_call(name, self.service.begin, name, args, kwargs)
                             if name in HeadService.PLANNED
                             else self._answer_call(name, getattr(self.service, name), *args, **kwargs))
        report = self.service.plan_begun([b["ok"] for b in begun if isinstance(b.get("ok"), Begun)])
        out = []
        for (name, _, _), b, who_ in zip(calls, begun, whos):
            if isinstance(b.get("ok"), Begun):
                with calling_as(who_):
                    b = self._answer_call(name, b["ok"].finish, report)
            out.append(b)
        return out

    def _answer_call(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """``fn`` (``HeadService.<name>``, or a half of it) in the wire envelope, alone or in a batch: a typed error
        as the caller's answer, and a fault of the head's (any other exception) logged and answered as an
        ``OrchestratorError``, so that it is this call's answer, never a batch's nor an untyped ``RayTaskError``."""
        try:
            return answer(fn, *args, **kwargs)
        except Exception as e:
            log.exception("%s failed in the head", name)
            return fault(f"the head failed on {name}", e)


def _resolve(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)


def _raise(e: Exception) -> None:
    raise e


def _forward(name: str) -> Callable[..., Any]:
    """An actor method answering ``HeadService.<name>`` in the wire envelope (waking the loop if in WAKES)."""
    declared = getattr(HeadApi, name)

    @functools.wraps(declared)
    async def method(self: HeadActor, *args: Any, **kwargs: Any) -> dict[str, Any]:
        who = self._who(kwargs.pop(CALLER_KWARG, None))
        if "error" in who:
            return who
        with calling_as(who["ok"]):
            reply = self._answer_call(name, getattr(self.service, name), *args, **kwargs)
        if name in WAKES:
            self._poke()
        await self.commit.durable()
        return reply

    del method.__wrapped__  # Ray must see the forwarder itself (async, any arguments), not the declaration
    return method


for _name in HEAD_METHODS:
    if _name not in HeadActor.__dict__:
        setattr(HeadActor, _name, _forward(_name))
