"""The head actor: one detached, named Ray actor per cluster, in our own namespace.

A thin wrapper around :class:`~orchestrator.control.controller.HeadController`
(read its docstring for the contract: hard state in the GCS store before
acting, idempotent methods, desired apart from actual). The wrapper adds only
what needs Ray or an event loop:

* on start -- and on every restart, since Ray restarts it (``max_restarts=-1``)
  -- it restores the controller from the GCS KV store;
* a reconcile loop: every ``reconcile_interval_s`` (or at once when a request
  arrives) it reads the live Ray nodes, runs one controller cycle and starts
  the agents the cycle asks for;
* ``wait_lease``, which waits on the event loop without blocking other calls.

Every public method answers ``{"ok": value}`` or ``{"error": typed error}``
(:mod:`orchestrator.rayport.wire`); :class:`orchestrator.rayport.ray_api.HeadClient`
unwraps them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from orchestrator.core.errors import LeaseTimeoutError
from orchestrator.core.lease import LeaseState
from orchestrator.core.config import ClusterConfig, RuntimeSettings
from orchestrator.control.controller import HeadController
from orchestrator.control.store import GcsKvStore
from orchestrator.rayport.wire import answer

log = logging.getLogger(__name__)

#: How often the wrapper re-reads the GCS node and actor tables (the reconcile loop runs faster).
_TABLES_EVERY_S = 1.0


class HeadActor:
    def __init__(self, settings: dict[str, Any], cluster: dict[str, Any]) -> None:
        from orchestrator.rayport import ray_api

        self.ray_api = ray_api
        self.settings = RuntimeSettings.model_validate(settings)
        self.cluster = ClusterConfig.model_validate(cluster)
        self._alive_cache: tuple[float, dict[str, bool]] = (0.0, {})
        self.ctl = HeadController(self.settings, GcsKvStore(self.settings.namespace), clock=time.time,
                                  holder_probe=self._holders_alive, sched_config=self.cluster.scheduler)
        self.restored = self.ctl.restore()
        from orchestrator.control.jobs import JobManager

        self.jobs = JobManager(self.ctl, self.ctl.store, ray_api.RayJobRunner(), clock=time.time,
                               namespace=self.settings.namespace, head_name=self.settings.head_name,
                               status_poll_s=0.5)
        self.jobs.restore()
        from orchestrator.control.metrics import HeadMetrics

        self.metrics = HeadMetrics()
        self.metrics_port: int | None = None
        port = self.settings.metrics_port or int(os.environ.get("ORCHESTRATOR_METRICS_PORT", "0") or 0)
        if port:
            host = os.environ.get("ORCHESTRATOR_METRICS_HOST", self.settings.metrics_host)
            try:
                self.metrics_port = self.metrics.serve(port, host)
            except OSError:
                log.exception("could not serve metrics on %s:%s", host, port)
        self.started_at = time.time()
        self._nodes_read_at = 0.0
        self._wake = asyncio.Event()
        self._task = asyncio.get_event_loop().create_task(self._loop())

    def _holders_alive(self, holders: Any) -> dict[str, bool]:
        at, cached = self._alive_cache
        if time.monotonic() - at > _TABLES_EVERY_S or any(h not in cached for h in holders):
            cached = self.ray_api.actors_alive(holders)
            self._alive_cache = (time.monotonic(), cached)
        return cached

    async def _loop(self) -> None:
        while True:
            try:
                self._cycle()
            except Exception:  # never let one bad cycle stop the loop; the next one retries
                log.exception("reconcile cycle failed")
            try:
                await asyncio.wait_for(self._wake.wait(), self.settings.reconcile_interval_s)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    def _cycle(self) -> None:
        if time.monotonic() - self._nodes_read_at > _TABLES_EVERY_S:
            self.ctl.observe_ray_nodes(self.ray_api.alive_nodes())
            self._nodes_read_at = time.monotonic()
        report = self.ctl.reconcile()
        for start in report.start_agents:
            sim = self.cluster.node(start.node_name)
            try:
                self.ray_api.start_agent(start.node_name, start.ray_node_id, self.settings,
                                         sim.model_dump(mode="json") if sim else None)
                log.info("started agent on %s (%s)", start.node_name, start.reason)
            except Exception:
                log.exception("could not start the agent of %s", start.node_name)
            self.ctl.agent_start_requested(start.node_name)
        for event in self.jobs.reconcile():
            log.info("%s", event)
        self.metrics.update(self.ctl, report)
        if report.lost_nodes or report.lost_leases:
            log.warning("lost nodes %s, lost leases %s, requeued %s", report.lost_nodes, report.lost_leases,
                        report.requeued)

    # ---- public API ----------------------------------------------------------------------------
    async def ping(self) -> dict[str, Any]:
        return {"ok": {"restored_leases": self.restored, "started_at": self.started_at,
                       "registered_nodes": self.ctl.registered_nodes(), "metrics_port": self.metrics_port}}

    async def request_lease(self, lease_request: dict[str, Any]) -> dict[str, Any]:
        reply = answer(self.ctl.request_lease, lease_request)
        self._wake.set()
        return reply

    async def get_lease(self, lease_id: str) -> dict[str, Any]:
        return answer(self.ctl.get_lease, lease_id)

    async def wait_lease(self, lease_id: str, timeout: float) -> dict[str, Any]:
        """Wait until the lease (or its latest requeued attempt) is handed out or has ended."""
        deadline = time.monotonic() + timeout
        while True:
            reply = answer(lambda: self.ctl.get_lease(self.ctl.current_attempt(lease_id)))
            if "error" in reply:
                return reply
            d = reply["ok"]
            state = LeaseState(d["state"])
            if (state is not LeaseState.PENDING and d.get("handout")) or state in (
                    LeaseState.RELEASED, LeaseState.PREEMPTED, LeaseState.EXPIRED) or (
                    state is LeaseState.LOST and not d.get("requeued_as")):
                return reply
            if time.monotonic() >= deadline:
                return answer(_raise_timeout, d, timeout)
            await asyncio.sleep(0.05)

    async def activate(self, lease_id: str, token: int, holder: str | None = None) -> dict[str, Any]:
        return answer(self.ctl.activate, lease_id, token, holder)

    async def release(self, lease_id: str, token: int | None = None, reason: str = "released by its holder") -> dict[str, Any]:
        reply = answer(self.ctl.release, lease_id, token, reason)
        self._wake.set()
        return reply

    async def status(self) -> dict[str, Any]:
        return answer(self.ctl.status)

    # ---- jobs ----------------------------------------------------------------------------------
    async def submit_job(self, spec: dict[str, Any], job_id: str | None = None) -> dict[str, Any]:
        reply = answer(self.jobs.submit, spec, job_id)
        self._wake.set()
        return reply

    async def get_job(self, job_id: str) -> dict[str, Any]:
        return answer(self.jobs.get, job_id)

    async def list_jobs(self) -> dict[str, Any]:
        return answer(self.jobs.list)

    async def cancel_job(self, job_id: str) -> dict[str, Any]:
        reply = answer(self.jobs.cancel, job_id)
        self._wake.set()
        return reply

    async def job_logs(self, job_id: str) -> dict[str, Any]:
        return answer(self.jobs.logs, job_id)

    async def explain_job(self, job_id: str) -> dict[str, Any]:
        return answer(self.jobs.explain, job_id)

    async def job_preemption_requested(self, job_id: str) -> dict[str, Any]:
        return answer(self.jobs.preemption_requested, job_id)

    async def job_ack_checkpoint(self, job_id: str, path: str, step: int | None = None) -> dict[str, Any]:
        reply = answer(self.jobs.ack_checkpoint, job_id, path, step)
        self._wake.set()
        return reply

    async def register_agent(self, node_name: str, ray_node_id: str, incarnation: str,
                             inventory: dict[str, Any]) -> dict[str, Any]:
        reply = answer(self.ctl.register_agent, node_name, ray_node_id, incarnation, inventory)
        self._wake.set()
        return reply

    async def heartbeat(self, node_name: str, incarnation: str, allocated: list[str] | None = None,
                        rejected: dict[str, str] | None = None, mig_uuids: dict[str, str] | None = None) -> dict[str, Any]:
        return answer(self.ctl.heartbeat, node_name, incarnation, allocated or (), rejected, mig_uuids)

    async def update_inventory(self, node_name: str, incarnation: str, inventory: dict[str, Any]) -> dict[str, Any]:
        reply = answer(self.ctl.update_inventory, node_name, incarnation, inventory)
        self._wake.set()
        return reply


def _raise_timeout(d: dict[str, Any], timeout: float) -> None:
    raise LeaseTimeoutError(d["request"], timeout, d.get("why_pending") or f"lease is {d['state']}")
