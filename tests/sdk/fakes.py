"""Fakes for the SDK and CLI unit tests. No Ray.

:class:`FakeHead` stands in for :class:`orchestrator.rayport.client.HeadClient`
with the head-side contract the SDK relies on: job dicts are real
``Job.to_dict()`` values plus ``lease``; unknown ids raise
``UnknownObjectError``; cluster-dependent refusals (unknown priority class,
a MIG profile no GPU of "the cluster" offers) raise ``InvalidRequestError``
naming the field; ``submit_job`` and ``request_lease`` are idempotent by id.
Tests script a job's progress with :meth:`FakeHead.script`.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any, Mapping

from orchestrator.core.errors import InvalidRequestError, LeaseTimeoutError, NotConnectedError, UnknownObjectError
from orchestrator.core.job import Job, JobSpec, JobState
from orchestrator.core.priorities import SchedulerConfig

#: What "the cluster" of the fake offers: the demo cluster's fixed MIG layouts.
OFFERED_MIG = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb")

HANDOUT = {
    "node_id": "ab" * 28, "num_gpus": 1.0, "num_cpus": 0.0,
    "env_vars": {"CUDA_VISIBLE_DEVICES": "GPU-00000000-0000-0000-0000-000000000001",
                 "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", "ORCHESTRATOR_LEASE_ID": "?", "ORCHESTRATOR_FENCING_TOKEN": "7"},
}


class FakeHead:
    """An in-memory head (a fake of HeadClient); ``calls`` records every call in order."""

    def __init__(self, *, grant: bool = True, clock: Any = None) -> None:
        self.config = SchedulerConfig()
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.jobs: dict[str, Job] = {}
        self.scripts: dict[str, list[tuple[str, str]]] = {}
        self.logs: dict[str, str] = {}
        self.leases: dict[str, dict[str, Any]] = {}
        self.grant = grant
        self.clock = clock or (lambda: 1000.0)
        self.lease_states: list[str] = []  # get_lease answers these states in turn (then the last one)
        self.preemption_answers: list[bool] = []
        self.unreachable = False

    def _rec(self, method: str, *args: Any) -> None:
        if self.unreachable:
            raise NotConnectedError("orchestrator head did not answer: fake unreachable")
        self.calls.append((method, args))

    # ---- jobs ----------------------------------------------------------------------------------
    def submit_job(self, spec: dict[str, Any], job_id: str | None = None) -> dict[str, Any]:
        self._rec("submit_job", spec, job_id)
        js = JobSpec(**spec)
        if job_id in self.jobs:
            return self.get_job(job_id)
        cls_name, pclass = self.config.priority_class(js.priority)
        if js.gpu.profile is not None and js.gpu.profile not in OFFERED_MIG:
            raise InvalidRequestError("gpu.profile", js.gpu.profile, sorted(OFFERED_MIG),
                                      detail="no MIG-enabled GPU in the cluster offers this profile")
        jid = job_id or f"{js.name}-{len(self.jobs) + 1}"
        self.jobs[jid] = replace(Job.new(jid, js, priority=pclass.priority, priority_class=cls_name, now=self.clock()),
                                 attempt=1, lease_id=f"{jid}.a1")
        return self.get_job(jid)

    def script(self, job_id: str, *steps: tuple[str, str]) -> None:
        """Each later ``get_job`` moves the job one step: (state, reason)."""
        self.scripts[job_id] = list(steps)

    def _job(self, job_id: str) -> Job:
        if job_id not in self.jobs:
            raise UnknownObjectError("job", job_id)
        return self.jobs[job_id]

    def get_job(self, job_id: str) -> dict[str, Any]:
        self._rec("get_job", job_id)
        job = self._job(job_id)
        steps = self.scripts.get(job_id)
        if steps:
            state, reason = steps.pop(0)
            job = job.transition(JobState(state), now=self.clock(), reason=reason,
                                 message=reason if state in ("failed", "cancelled") else job.message)
            self.jobs[job_id] = job
        return {**job.to_dict(), "lease": None}

    def list_jobs(self) -> list[dict[str, Any]]:
        self._rec("list_jobs")
        return [{**j.to_dict(), "lease": None} for j in self.jobs.values()]

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        self._rec("cancel_job", job_id)
        job = self._job(job_id)
        if not job.terminal:
            self.jobs[job_id] = job.transition(JobState.CANCELLED, now=self.clock(), reason="cancelled by the user",
                                               message="cancelled by the user")
        return {**self.jobs[job_id].to_dict(), "lease": None}

    def job_logs(self, job_id: str) -> str:
        self._rec("job_logs", job_id)
        self._job(job_id)
        return self.logs.get(job_id, "")

    def explain_job(self, job_id: str) -> dict[str, Any]:
        self._rec("explain_job", job_id)
        job = self._job(job_id)
        return {"job_id": job_id, "name": job.spec.name, "state": job.state.value,
                "summary": f"pending at queue position 1: no node fits {job.spec.gpu.describe()}",
                "pending": {"position": 0, "reason": "no node fits", "reasons": [], "would_preempt": [],
                            "being_preempted": [], "preemption_blocked": ""},
                "placement": None, "preemptions": []}

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        self._rec(method, *args)
        if method == "job_preemption_requested":
            self._job(args[0])
            answer = self.preemption_answers.pop(0) if self.preemption_answers else False
            return {"requested": answer, "lease_id": None, "deadline": None, "reason": None}
        if method == "job_ack_checkpoint":
            return {**self._job(args[0]).to_dict(), "lease": None}
        raise AttributeError(method)

    def job_preemption_requested(self, job_id: str) -> dict[str, Any]:
        return self.call("job_preemption_requested", job_id)

    def job_ack_checkpoint(self, job_id: str, path: str, step: int | None = None) -> dict[str, Any]:
        return self.call("job_ack_checkpoint", job_id, path, step)

    # ---- leases --------------------------------------------------------------------------------
    def request_lease(self, lease_request: Mapping[str, Any]) -> str:
        self._rec("request_lease", dict(lease_request))
        lr = dict(lease_request)
        self.config.priority_class(lr.get("priority_class") or None)
        self.leases.setdefault(lr["lease_id"], {"lease_id": lr["lease_id"], "state": "pending", "fencing_token": None,
                                                "owner": lr.get("owner", ""), "handout": None, "allocation": None,
                                                "history": [{"at": 0.0, "state": "pending", "reason": "requested"}]})
        return lr["lease_id"]

    def wait_lease(self, lease_id: str, timeout: float) -> dict[str, Any]:
        self._rec("wait_lease", lease_id, timeout)
        if not self.grant:
            raise LeaseTimeoutError("1x whole", timeout, "1 node: not enough free GPUs [whole]")
        le = self.leases[lease_id]
        le.update(state="granted", fencing_token=7, handout=copy.deepcopy(HANDOUT),
                  allocation={"node": "a100-0", "kind": "whole", "gpu_indices": [0], "gpu_uuids": ["GPU-1"], "milli": 1000})
        return copy.deepcopy(le)

    def activate(self, lease_id: str, token: int, holder: str | None = None) -> dict[str, Any]:
        self._rec("activate", lease_id, token, holder)
        self.leases[lease_id].update(state="active", holder=holder)
        return copy.deepcopy(self.leases[lease_id])

    def get_lease(self, lease_id: str) -> dict[str, Any]:
        self._rec("get_lease", lease_id)
        if lease_id not in self.leases:
            raise UnknownObjectError("lease", lease_id)
        if self.lease_states:
            self.leases[lease_id]["state"] = self.lease_states.pop(0) if len(self.lease_states) > 1 else self.lease_states[0]
        return copy.deepcopy(self.leases[lease_id])

    def release(self, lease_id: str, token: int | None, reason: str = "released by its holder") -> dict[str, Any]:
        self._rec("release", lease_id, token, reason)
        le = self.leases[lease_id]
        if le["state"] not in ("released", "preempted", "expired", "lost"):
            le.update(state="released", release_reason=reason)
        return copy.deepcopy(le)

    def status(self) -> dict[str, Any]:
        self._rec("status")
        live = [le for le in self.leases.values() if le["state"] in ("pending", "granted", "active", "checkpointing")]
        return {
            "nodes": [{"name": "a100-0", "state": "registered", "model": "A100-80GB", "heartbeat_age_s": 0.2,
                       "gpus": [{"index": 0, "uuid": "GPU-1", "model": "A100-80GB", "memory_mib": 81920, "healthy": True,
                                 "health_reason": "", "mig": [], "leases": ["l-1"]}]}],
            "leases": copy.deepcopy(live),
            "queue": [{"lease_id": le["lease_id"], "request": "1x whole", "priority": 10, "owner": le["owner"],
                       "why_pending": "no node fits"} for le in live if le["state"] == "pending"],
        }

    def methods(self) -> list[str]:
        return [m for m, _ in self.calls]


class FakeClock:
    """A clock and a sleep that only moves it."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s
