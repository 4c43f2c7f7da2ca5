"""The head actor's job submissions and stops leave its event loop free (``rayport.head.launch_off_loop``).

The real :class:`HeadService` over the demo cluster's simulated agents, on a real asyncio loop, as the head
actor runs it; Ray's job API is stood in for (named as such) by a runner whose ``submit`` (or ``stop``) blocks
until the test lets it go, as Ray's job head does for 10 s when it has no agent.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Awaitable, Callable

from headless import SimulatedCluster

from orchestrator.control.jobs import AdmissionOnlyRunner
from orchestrator.control.service import HeadService
from orchestrator.control.store import MemoryStore
from orchestrator.core.config import DEMO_CONFIG, RuntimeSettings, load_config
from orchestrator.rayport.head import launch_off_loop


class Gated(AdmissionOnlyRunner):
    """Ray's job API stood in for: the call a subclass holds blocks until ``gate`` is set, and records the thread it
    ran on (the rest is :class:`AdmissionOnlyRunner`'s)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.threads: list[str] = []

    def _hold(self) -> None:
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        assert self.gate.wait(10), "the test never let the call go"


class GatedJobApi(Gated):
    """``submit`` is held."""

    def submit(self, submission_id: str, *args: Any) -> None:
        self._hold()
        super().submit(submission_id, *args)


class GatedStops(Gated):
    """``stop`` is held; a submitted job runs until stopped."""

    def __init__(self) -> None:
        super().__init__()
        self.stopped: list[str] = []

    def status(self, submission_id: str) -> str | None:
        return "RUNNING" if submission_id in self._known else None

    def stop(self, submission_id: str) -> None:
        self._hold()
        self.stopped.append(submission_id)


#: The head actor's one job-API thread, as the stand-in records it.
JOB_API_THREAD = "rgo-job-api_0"


def _on_the_heads_loop(scenario: Callable[[asyncio.AbstractEventLoop, Executor], Awaitable[None]]) -> None:
    """``scenario(loop, pool)`` on a real asyncio loop with a one-thread ``pool`` for Ray's job API, as the head
    actor runs :func:`launch_off_loop`."""

    async def run() -> None:
        with ThreadPoolExecutor(1, thread_name_prefix=JOB_API_THREAD.removesuffix("_0")) as pool:
            await scenario(asyncio.get_running_loop(), pool)

    asyncio.run(run())


async def _while_held(api: Gated, service: HeadService, cluster: SimulatedCluster, answered: threading.Event,
                      check: Any) -> None:
    """Once ``api`` holds its call: the loop goes on (agents beat, cycles run, ``check()`` holds) and the answer
    has not come; then let the call go and wait for the answer to be applied."""
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, api.entered.wait, 5)
    for _ in range(5):
        await asyncio.sleep(0.02)
        cluster.beat(service)
        service.cycle()
        check()
        assert not answered.is_set()
    api.gate.set()
    for _ in range(200):
        if answered.is_set():
            break
        await asyncio.sleep(0.01)


def _head_with_a_job(api: AdmissionOnlyRunner, applied: str) -> tuple[HeadService, SimulatedCluster, str, list[str]]:
    """The head service as the actor runs it (its one mode) over ``api``, one whole-card job submitted
    and admitted; the threads the service's ``applied`` method (the answer's side) then runs on are recorded."""
    config = load_config(DEMO_CONFIG)
    settings = RuntimeSettings(heartbeat_interval_s=0.1, agent_ttl_s=5.0, reconcile_interval_s=0.05)
    cluster = SimulatedCluster(config, settings)
    service = HeadService(settings, config, MemoryStore(), api, cluster)
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

    async def scenario(loop: asyncio.AbstractEventLoop, pool: Executor) -> None:
        assert launch_off_loop(service, pool, loop, answered.set) == 1

        def meanwhile() -> None:  # Ray holds the submission: calls are answered, nothing is taken twice
            assert service.get_job(job)["state"] == "admitted"
            assert launch_off_loop(service, pool, loop, answered.set) == 0

        await _while_held(api, service, cluster, answered, meanwhile)

    _on_the_heads_loop(scenario)
    assert answered.is_set()
    assert api.threads == [JOB_API_THREAD] and applied_on == ["MainThread"]
    d = service.get_job(job)
    assert d["state"] == "running" and d["lease"]["state"] == "active"


def test_a_stop_ray_holds_for_seconds_does_not_stop_the_heads_loop() -> None:
    # cancel_job stopped the Ray job on the head's loop: a job API without an agent held every call and cycle.
    api = GatedStops()
    service, cluster, job, applied_on = _head_with_a_job(api, "chore_done")
    answered = threading.Event()

    async def scenario(loop: asyncio.AbstractEventLoop, pool: Executor) -> None:
        launch_off_loop(service, pool, loop, lambda: None)
        for _ in range(100):  # the submission's answer comes back on the loop
            if service.get_job(job)["state"] == "running":
                break
            await asyncio.sleep(0.01)
        assert service.cancel_job(job)["state"] == "cancelled" and not api.entered.is_set()
        launch_off_loop(service, pool, loop, answered.set)
        other = service.submit_job({"name": "u", "entrypoint": "true", "gpu": {"kind": "whole", "count": 1}})

        def meanwhile() -> None:  # Ray holds the stop: calls are answered, a new job is admitted
            assert service.get_job(other["job_id"])["state"] in ("admitted", "running")
            assert service.take_chores() == []  # not handed out twice

        await _while_held(api, service, cluster, answered, meanwhile)

    _on_the_heads_loop(scenario)
    assert answered.is_set()
    assert api.stopped == [f"{job}.a1"] and api.threads == [JOB_API_THREAD] and applied_on == ["MainThread"]
