"""The head's API, declared once.

:class:`HeadApi` is the one list of what the head answers. Three things take
their shape from it, and a test checks each against it:

* :class:`orchestrator.control.service.HeadService` implements it, in process,
  over the controller and the job layer (no Ray);
* :class:`orchestrator.rayport.head.HeadActor` exposes every method of it as
  a Ray actor method (async, answering the wire envelope);
* :class:`orchestrator.rayport.client.HeadClient` calls them and raises the
  head's typed errors again.

Every argument and result is JSON-safe (dicts, lists, strings, numbers): the
head validates what it receives into the typed models itself, once, at this
edge. State-changing methods are idempotent, because the actor's callers
retry across a head restart.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Mapping, Protocol, Sequence

Json = dict[str, Any]


class HeadApi(Protocol):
    """What the head answers; see the module docstring. Unknown ids raise ``UnknownObjectError``."""

    # ---- leases --------------------------------------------------------------------------------
    def request_lease(self, lease_request: Mapping[str, Any]) -> str:
        """Queue a :class:`~orchestrator.core.lease.LeaseRequest`; returns its id (a retry with the same id and request too)."""
        ...

    def get_lease(self, lease_id: str, key: str | None = None) -> Json:
        """The lease's public view; the fencing token only with the requester's ``key`` (else redacted)."""
        ...

    def wait_lease(self, lease_id: str, timeout: float, key: str | None = None) -> Json:
        """Wait until the lease (or its latest attempt) is handed out or has ended; ``LeaseTimeoutError`` after ``timeout``.
        The token is in the answer only with the requester's ``key``."""
        ...

    def acquire_lease(self, lease_request: Mapping[str, Any], timeout: float, key: str | None = None,
                      holder: str | None = None) -> Json:
        """``request_lease`` and ``wait_lease`` in one call (the SDK's grant path): queue the request, grant it at
        once when nothing else waits (the fast path), else wait for the cycle that grants it; ``LeaseTimeoutError``
        after ``timeout`` (the request stays queued: the caller withdraws it). With the requester's ``key`` and a
        ``holder`` (an actor id), a granted lease is activated by that holder before the answer."""
        ...

    def acquire_lease_now(self, lease_request: Mapping[str, Any], key: str | None = None,
                          holder: str | None = None) -> Json:
        """``acquire_lease`` without its wait: queue the request and grant it in this call when it is alone in the
        queue and fits (the fast grant path). The answer is the lease's view: handed out (activated by ``holder``
        with the requester's ``key``, as ``acquire_lease`` does), or pending -- it stays queued: wait for it with
        ``wait_lease`` or withdraw it with ``release``. It never waits, so a client's threads send theirs
        together (:data:`BATCHED`): the SDK's ``lease()`` tries this first and waits only when it must."""
        ...

    def activate(self, lease_id: str, token: int, holder: str | None = None, workload: str | None = None,
                 key: str | None = None) -> Json:
        """The holder started on the devices (a stale token is refused; ``key``, the requester's, is needed in
        every state). ``workload`` names what runs on them (``actor:<ns>/<name>``, ``job:<id>``, ``pid:<n>``) so
        the node's agent can stop it when it is revoked."""
        ...

    def release(self, lease_id: str, token: int | None = None, reason: str = "released by its holder",
                key: str | None = None, when_gone: bool = False) -> Json:
        """Give the devices back, or withdraw a pending request: the requester's ``key`` in every state, and the
        current token while the lease holds devices. ``when_gone``: once the lease's holder is dead (it is being
        stopped), released with ``reason``, not lost; until then it keeps its devices. Idempotent."""
        ...

    def ack_preemption(self, lease_id: str, token: int, checkpoint_path: str | None = None,
                       key: str | None = None) -> Json:
        """The holder of a lease being preempted (checkpointing) checkpointed to ``checkpoint_path`` (None: it
        just stopped): the lease ends preempted, its devices go on, and a lease asked with ``requeue_on_preempt``
        is queued again to resume from the path. Idempotent; a stale token or a wrong ``key`` is refused. A gang's
        requester acks each worker's lease with the one checkpoint of the run."""
        ...

    def explain_lease(self, lease_id: str) -> Json:
        """Why the lease is where it is: its position and reasons while pending, its placement once granted."""
        ...

    # ---- jobs ----------------------------------------------------------------------------------
    def submit_job(self, spec: Mapping[str, Any], job_id: str | None = None) -> Json:
        """Queue a :class:`~orchestrator.core.job.JobSpec` (refused at once when it can never run)."""
        ...

    def get_job(self, job_id: str) -> Json: ...

    def list_jobs(self) -> list[Json]:
        """Every job the head keeps (``ended_retention_s``), each in full: its cost grows with all of them."""
        ...

    def job_board(self, limit: int = 200) -> Json:
        """What a live view of the jobs shows, in one reply that grows with ``limit``, not with the jobs kept:
        ``counts`` over every job (``jobs``, ``waiting_for_lease``, ``ever_ran``, ``resumed_live``,
        ``resumptions``), ``decisions`` (the latest transitions, newest first, with the head's reasons),
        ``jobs`` (rows of the live jobs and the latest ended ones, ``limit`` (1 to 5000) in all, in submission
        order) and ``lease_jobs`` (each live job's lease ids -> its id)."""
        ...

    def cancel_job(self, job_id: str) -> Json:
        """Stop the job in any state and release its lease. Idempotent."""
        ...

    def job_logs(self, job_id: str, attempt: int | None = None) -> str:
        """The driver log of the job's current attempt, or of ``attempt`` (1 is the first; a preempted job's
        earlier attempts keep theirs)."""
        ...

    def explain_job(self, job_id: str) -> Json: ...

    def job_preemption_requested(self, job_id: str) -> Json:
        """Asked by a running job between steps: whether it must checkpoint now, and by when."""
        ...

    def job_ack_checkpoint(self, job_id: str, path: str, step: int | None = None, token: int | None = None) -> Json:
        """The job wrote the checkpoint at ``path``: while preempting it is stopped and requeued to resume.
        ``token`` is its lease's fencing token (``ORCHESTRATOR_FENCING_TOKEN``), needed in every state: a wrong
        or missing one is refused, and so is an acknowledgement while the job holds no devices."""
        ...

    # ---- the cluster ---------------------------------------------------------------------------
    def status(self) -> Json:
        """Nodes, live and recently ended leases, the queue and the head's settings."""
        ...

    def ping(self) -> Json: ...

    def agent_inventories(self) -> list[Json]:
        """The inventory every registered agent reported (what the Kubernetes cross-check compares with node labels)."""
        ...

    def report_inventory_check(self, report: Mapping[str, Any]) -> Json:
        """Keep the latest cross-check of the agents' inventories against Kubernetes node labels.

        ``report`` is ``{"nodes": [...], "disagreements": [{"node", "field", "severity", ...}, ...]}``
        (``orchestrator.deploy.k8s.inventory.InventoryReport.to_dict``); the head exports it as
        ``orchestrator_inventory_disagreements{node,field,severity}`` and in ``status``. The last report wins."""
        ...

    def metric_samples(self) -> Json:
        """The head's Prometheus samples as JSON (``{"at": time, "samples": [[name, labels, value], ...]}``)."""
        ...

    def metric_history(self, since: float | None = None) -> Json:
        """The live page's curves, as the head keeps them (:mod:`orchestrator.control.curves`): a bounded ring of
        points, one a second for the last hour, each taken after ``since`` (the head's wall clock; None: all kept).
        ``{"at", "origin" (where each point's ``t`` counts from: a new one means a restarted head), "every_s",
        "max_points", "rate_s", "window_s", "points": [{"t", "at", "grants_per_s", ..., "util": {node: ratio}}]}``."""
        ...

    def record_inference(self, service: str, latencies_s: Sequence[float], slo_s: float | None = None) -> Json:
        """A running service reports requests it served and their latencies (seconds); counted in the metrics
        under its name if ``settings.inference_services`` registers it, else under ``other`` (the reply's
        ``service`` says which)."""
        ...

    def repartition_mig(self, target: str | Mapping[str, Any], dry_run: bool = False) -> Json:
        """Give MIG cards a new layout, live: ``target`` is a preset name (``inference``: every card filled
        with its smallest slice; ``training``: one full-card slice) or the fields of
        :class:`~orchestrator.scheduling.repartition.MigTarget`. The head plans the fewest GPUs to change,
        cordons them, drains only their leases through the checkpoint path, has the agents apply the layout and
        uncordons them (``status()["repartitions"]`` follows each). Returns ``{"plan", "started", "dry_run"}``;
        ``dry_run`` plans only."""
        ...

    def set_day_clock(self, day_clock: Mapping[str, Any]) -> Json:
        """Start the head's time of day anew: ``{"speedup": 720, "start": "06:00"}`` (a compressed day that
        begins now, as ``settings.day_clock`` does at start-up). A scenario calls it when its day begins, so
        time windows change when its load does. Returns the window status at the new time."""
        ...

    def announce_dashboard(self, url: str, ttl_s: float = 30.0) -> Json:
        """A live dashboard serves at ``url``; ``status`` reports it for ``ttl_s`` unless announced again."""
        ...

    # ---- agents (node side) ----------------------------------------------------------------------
    def register_agent(self, node_name: str, ray_node_id: str, incarnation: str, inventory: Mapping[str, Any]) -> Json:
        ...

    def heartbeat(self, node_name: str, incarnation: str, allocated: Sequence[str] = (),
                  rejected: Mapping[str, str] | None = None, mig_uuids: Mapping[str, str] | None = None,
                  utilization: Mapping[str, float] | None = None, revoked: Sequence[str] = (),
                  checkpointed: Mapping[str, str] | None = None,
                  reconfigure_failed: Mapping[str, str] | None = None) -> Json:
        """``utilization``: GPU index (as a string) -> busy fraction, where the agent can measure it (NVML);
        ``revoked``: leases whose workload the agent stopped; ``checkpointed``: lease -> path its actor wrote;
        ``reconfigure_failed``: GPU index -> why the MIG layout asked for was not applied.
        The reply: what to hold (``assignments``), what to stop (``revocations``) and the MIG layouts to
        apply (``reconfigure``: GPU index -> ``[{"profile", "start"}, ...]``)."""
        ...

    def update_inventory(self, node_name: str, incarnation: str, inventory: Mapping[str, Any]) -> Json: ...


class Caller(str, Enum):
    """Who may call a method (:data:`CALLERS`). The head checks the caller's identity at its edge
    (``control/edge.py``: administrator, agent of the node named by ``node_name``), and the object's
    capability where it looks the object up (the lease's key, the job's owner). Administrators and the
    head itself pass every identity check; a lease's key is needed whoever calls."""

    ANYONE = "anyone"  # read-only public views (no token in them), and asking for a lease or a job
    LEASE_HOLDER = "the lease's requester or holder (its key)"
    JOB_HOLDER = "the job itself (its lease's token)"
    JOB_OWNER = "the job's owner (the user key it was submitted with) or an administrator"
    AGENT = "the agent of the node it names"
    ADMIN = "an administrator"


#: Every method of :class:`HeadApi` and who may call it (a test checks each is declared and enforced).
CALLERS: Mapping[str, Caller] = {
    "request_lease": Caller.ANYONE, "get_lease": Caller.ANYONE, "wait_lease": Caller.ANYONE,
    "acquire_lease": Caller.ANYONE, "acquire_lease_now": Caller.ANYONE,
    "activate": Caller.LEASE_HOLDER, "release": Caller.LEASE_HOLDER, "ack_preemption": Caller.LEASE_HOLDER,
    "explain_lease": Caller.ANYONE,
    "submit_job": Caller.ANYONE, "get_job": Caller.ANYONE, "list_jobs": Caller.ANYONE, "job_board": Caller.ANYONE,
    "cancel_job": Caller.JOB_OWNER, "job_logs": Caller.JOB_OWNER, "explain_job": Caller.ANYONE,
    "job_preemption_requested": Caller.ANYONE, "job_ack_checkpoint": Caller.JOB_HOLDER,
    "status": Caller.ANYONE, "ping": Caller.ANYONE, "agent_inventories": Caller.ANYONE,
    "report_inventory_check": Caller.ADMIN, "metric_samples": Caller.ANYONE, "metric_history": Caller.ANYONE,
    "record_inference": Caller.ANYONE,
    "repartition_mig": Caller.ADMIN, "set_day_clock": Caller.ADMIN, "announce_dashboard": Caller.ADMIN,
    "register_agent": Caller.AGENT, "heartbeat": Caller.AGENT, "update_inventory": Caller.AGENT,
}

#: The names of the head's methods, in declaration order.
HEAD_METHODS: tuple[str, ...] = tuple(n for n in HeadApi.__dict__ if not n.startswith("_") and callable(HeadApi.__dict__[n]))

#: The head's quick methods: what its channel carries (:mod:`orchestrator.rayport.channel`), several in one batch
#: (``HeadActor.call_many`` takes the same batches from a client without the channel). Each neither waits on the head nor calls
#: out of it (Ray's job API, an agent), so a batch holds the head's loop only for the head's own work.
BATCHED: frozenset[str] = frozenset({"submit_job", "get_job", "get_lease", "request_lease", "acquire_lease_now",
                                     "activate", "release"})

#: The most calls one ``call_many`` may carry.
MAX_BATCH_CALLS = 1024
