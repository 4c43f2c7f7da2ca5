"""The head actor's job submissions and stops leave its event loop free (``rayport.head.launch_off_loop``).

The real :class:`HeadService` over the demo cluster's simulated agents, on a real asyncio loop, as the head
actor runs it; Ray's job API is stood in for (named as such) by a runner whose ``submit`` (or ``stop``) blocks
until the test lets it go, as Ray's job head does for 10 s when it has no agent.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from headless import SimulatedCluster

from orchestrator.control.jobs import AdmissionOnlyRunner
from orchestrator.control.service import HeadService
from orchestrator.control.store import MemoryStore
from orchestrator.core.config import DEMO_CONFIG, RuntimeSettings, load_config
from orchestrator.rayport.head import launch_off_loop


class GatedJobApi(AdmissionOnlyRunner):
    """Ray's job API stood in for: ``submit`` blocks until ``gate`` is set, and records the thread it ran on
    (the rest is :class:`AdmissionOnlyRunner`'s)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.threads: list[str] = []

    def submit(self, submission_id: str, *args: Any) -> None:
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        assert self.gate.wait(10), "the test never let the submission go"
        super().submit(submission_id, *args)


def _head_with_a_job(api: AdmissionOnlyRunner, applied: str) -> tuple[HeadService, SimulatedCluster, str, list[str]]:
    """The head service as the actor runs it (``launch_in_cycle=False``) over ``api``, one whole-card job submitted
    and admitted; the threads the service's ``applied`` method (the answer's side) then runs on are recorded."""
    config = load_config(DEMO_CONFIG)
    settings = RuntimeSettings(heartbeat_interval_s=0.1, agent_ttl_s=5.0, reconcile_interval_s=0.05)
    cluster = SimulatedCluster(config, settings)
    service = HeadService(settings, config, MemoryStore(), api, cluster, launch_in_cycle=False)
    for _ in range(3):
        cluster.beat(service)
        service.cycle()
    job = service.submit_job({"name": "t", "entrypoint": "true", "gpu": {"kind": "whole", "count": 1}})["job_id"]
    service.cycle()
    assert service.get_job(job)["state"] == "admitted"
    applied_on: list[str] = []
    real = getattr(service, applied)

    def recorded(*args: Any) -> str:
        applied_on.append(threading.current_thread().name)
        return real(*args)

    setattr(service, applied, recorded)
    return service, cluster, job, applied_on


def test_a_submission_ray_holds_for_seconds_does_not_stop_the_heads_loop() -> None:
    api = GatedJobApi()
    service, cluster, job, applied_on = _head_with_a_job(api, "submission_sent")
    answered = threading.Event()

    async def run() -> None:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1, thread_name_prefix="rgo-job-api") as pool:
            assert launch_off_loop(service, pool, loop, answered.set) == 1
            await loop.run_in_executor(None, api.entered.wait, 5)
            # Ray holds the submission: the loop goes on -- calls are answered, cycles run.
            for _ in range(5):
                await asyncio.sleep(0.02)
                cluster.beat(service)
                service.cycle()
                assert service.get_job(job)["state"] == "admitted" and not answered.is_set()
            assert launch_off_loop(service, pool, loop, answered.set) == 0  # not taken twice meanwhile
            api.gate.set()
            for _ in range(200):
                if answered.is_set():
                    break
                await asyncio.sleep(0.01)

    asyncio.run(run())
    assert answered.is_set()
    assert api.threads == ["rgo-job-api_0"] and applied_on == ["MainThread"]
    d = service.get_job(job)
    assert d["state"] == "running" and d["lease"]["state"] == "active"


class GatedStops(AdmissionOnlyRunner):
    """Ray's job API stood in for: ``stop`` blocks until ``gate`` is set, and records the thread it ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.stops: list[tuple[str, str]] = []

    def status(self, submission_id: str) -> str | None:
        return "RUNNING" if submission_id in self._known else None  # a job that runs until stopped

    def stop(self, submission_id: str) -> None:
        self.entered.set()
        assert self.gate.wait(10), "the test never let the stop go"
        self.stops.append((submission_id, threading.current_thread().name))


def test_a_stop_ray_holds_for_seconds_does_not_stop_the_heads_loop() -> None:
    # cancel_job stopped the Ray job on the head's loop: a job API without an agent held every call and cycle.
    api = GatedStops()
    service, cluster, job, applied_on = _head_with_a_job(api, "chore_done")
    answered = threading.Event()

    async def run() -> None:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1, thread_name_prefix="rgo-job-api") as pool:
            launch_off_loop(service, pool, loop, lambda: None)
            for _ in range(100):  # the submission's answer comes back on the loop
                if service.get_job(job)["state"] == "running":
                    break
                await asyncio.sleep(0.01)
            assert service.cancel_job(job)["state"] == "cancelled" and not api.entered.is_set()
            launch_off_loop(service, pool, loop, answered.set)
            await loop.run_in_executor(None, api.entered.wait, 5)
            # Ray holds the stop: the loop goes on -- calls are answered, cycles run, the freed card is granted.
            other = service.submit_job({"name": "u", "entrypoint": "true", "gpu": {"kind": "whole", "count": 1}})
            for _ in range(5):
                await asyncio.sleep(0.02)
                cluster.beat(service)
                service.cycle()
                assert not answered.is_set()
            assert service.get_job(other["job_id"])["state"] in ("admitted", "running")
            assert service.take_chores() == []  # not handed out twice meanwhile
            api.gate.set()
            for _ in range(200):
                if answered.is_set():
                    break
                await asyncio.sleep(0.01)

    asyncio.run(run())
    assert answered.is_set()
    assert api.stops == [(f"{job}.a1", "rgo-job-api_0")] and applied_on == ["MainThread"]
