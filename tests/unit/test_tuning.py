"""The tuning constants reach what they tune (#35 item 4): each component reads its knob from the settings it is
built with (``settings.tuning``), not from its module constant, which stays only as the default. No Ray."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pytest

from orchestrator.control import service as service_mod
from orchestrator.control.controller import HeadController
from orchestrator.control.jobs import AdmissionOnlyRunner
from orchestrator.control.jobs.executor import Executor, Retry
from orchestrator.control.nodes import RayNodeInfo
from orchestrator.control.service import HeadService
from orchestrator.control.store import MemoryStore
from orchestrator.core.config import ClusterConfig, RuntimeSettings, SimNode, Tuning

TUNED = Tuning(holder_check_every_s=5.0, tables_every_s=7.0, job_status_poll_s=3.0, heap_freeze_every_s=11.0,
               heap_full_every_s=13.0, curves_every_s=2.0, curves_rate_s=6.0, curves_window_s=40.0,
               submit_backoff_first_s=4.0, submit_backoff_max_s=9.0, commit_retry_first_s=0.5, commit_retry_max_s=1.5,
               channel_window_s=0.002, channel_max_wait_s=0.02, channel_call_grace_s=12.0,
               hold_place_timeout_s=3.0, hold_return_wait_s=0.5, lend_timeout_s=8.0, job_api_timeout_s=4.0,
               id_reuse_quiet_s=20.0, status_read_timeout_s=2.0, autoscaler_demand_every_s=9.0,
               autoscaler_demand_max_bundles=1)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Port:
    """A :class:`~orchestrator.control.service.ClusterPort` with no nodes that counts its table reads."""

    def __init__(self) -> None:
        self.reads = 0

    def alive_nodes(self) -> list[RayNodeInfo]:
        self.reads += 1
        return []

    def holders_alive(self, holders: Sequence[str]) -> Mapping[str, bool]:
        return {h: True for h in holders}

    def start_agent(self, node_name: str, ray_node_id: str, sim_node: SimNode | None, agent_key: str) -> None:
        raise AssertionError("no nodes, no agents")


def _service(tuning: Tuning, **kw: Any) -> tuple[HeadService, Port, Clock]:
    port, clock = Port(), Clock()
    head = HeadService(RuntimeSettings(tuning=tuning), ClusterConfig(), MemoryStore(), AdmissionOnlyRunner(), port,
                       clock=clock, **kw)
    return head, port, clock


def test_the_controller_checks_holders_as_often_as_its_settings_say() -> None:
    clock = Clock()
    ctl = HeadController(RuntimeSettings(tuning=TUNED), MemoryStore(), clock=clock)
    checks: list[float] = []
    ctl._release_dead_holders = lambda report: checks.append(clock.now)  # type: ignore[method-assign]  # noqa: SLF001
    for _ in range(12):
        ctl.reconcile()
        clock.now += 1.0
    assert checks == [1000.0, 1005.0, 1010.0]  # every 5 s, not every HOLDER_CHECK_EVERY_S (1 s)


def test_the_service_reads_the_node_table_and_polls_jobs_as_its_settings_say(monkeypatch: pytest.MonkeyPatch) -> None:
    times = iter(range(10_000))
    monkeypatch.setattr(service_mod.time, "monotonic", lambda: float(next(times)))  # one second a call
    head, port, _ = _service(TUNED)
    for _ in range(15):
        head.cycle()
    assert port.reads == 2  # at 0 and after 7 s (tables_every_s), not every second
    assert head.jobs.status_poll_s == 3.0
    assert _service(TUNED, status_poll_s=0.0)[0].jobs.status_poll_s == 0.0  # the caller's own value wins
    assert _service(Tuning())[0].jobs.status_poll_s == service_mod.JOB_STATUS_POLL_S


def test_the_service_tends_its_heap_and_curves_as_its_settings_say(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []
    real = service_mod.decide_heap

    def spy(state: Any, **kw: Any) -> Any:
        seen.append(kw)
        return real(state, **kw)

    monkeypatch.setattr(service_mod, "decide_heap", spy)
    head, _, _ = _service(TUNED)
    head.cycle()
    assert (seen[-1]["freeze_every_s"], seen[-1]["full_every_s"]) == (11.0, 13.0)
    curves = head.metrics.curves
    assert (curves.every_s, curves.rate_s, curves.window_s) == (2.0, 6.0, 40.0)


def test_the_demand_for_nodes_is_capped_and_paced_as_its_settings_say() -> None:
    from orchestrator.control.demand import DemandPacer

    head, _, _ = _service(TUNED)  # no node yet: every request waits with wait.no_fit
    for i in range(3):
        head.request_lease({"lease_id": f"w-{i}", "request": "2"})
    head.cycle()
    got = head.autoscaler_demand()
    assert [dict(s) for s in got.shapes()] == [{"GPU": 2}] and got.left_out == 2  # max_bundles=1, not 100
    assert head.status()["autoscaler_demand"] == got.to_json()
    assert len(_service(Tuning())[0].autoscaler_demand().bundles) == 0  # nothing pending
    # the head actor's pacer is built from the knob (rayport.head; the actor itself needs Ray: tests/integration)
    assert DemandPacer(TUNED.autoscaler_demand_every_s).every_s == 9.0


def test_the_job_layer_backs_off_as_its_settings_say() -> None:
    head, _, _ = _service(TUNED)
    ex = head.jobs.executor
    at, waits = 100.0, []
    for _ in range(5):
        retry, gave_up = ex.submit_failed("job-1.a1", at)
        assert not gave_up
        waits.append(retry.due - at)
        at = retry.due
    assert waits == [4.0, 8.0, 9.0, 9.0, 9.0]  # from submit_backoff_first_s, doubled, at most submit_backoff_max_s
    assert Retry.after(None, 0.0).due == 1.0 and Executor(AdmissionOnlyRunner(), clock=lambda: 0.0,
                                                             retry_for_s=60)._backoff == (1.0, 30.0)  # defaults


def test_the_head_actors_parts_take_their_knobs() -> None:
    """What the head and the agent actors build from their settings (rayport.head, rayport.agent) takes each knob;
    its defaults are the module constants (the actors themselves need Ray: tests/integration)."""
    from orchestrator.control.journal import Journal, MemoryKv
    from orchestrator.rayport import channel, holds, store
    from orchestrator.rayport.ray_api import RayJobRunner

    t = TUNED
    table = MemoryKv()
    commit = store.GroupCommit(Journal(table), table, retry_first_s=t.commit_retry_first_s,
                               retry_max_s=t.commit_retry_max_s)
    assert commit._backoff == (0.5, 1.5)  # noqa: SLF001
    assert store.GroupCommit(Journal(table), table)._backoff == (store.RETRY_FIRST_S, store.RETRY_MAX_S)  # noqa: SLF001

    async def durable() -> None:
        return None

    ch = channel.HeadChannel(lambda batches: [], durable, "token", window_s=t.channel_window_s,
                             max_wait_s=t.channel_max_wait_s, call_grace_s=t.channel_call_grace_s)
    assert (ch._window_s, ch._max_wait_s, ch._call_grace_s) == (0.002, 0.02, 12.0)  # noqa: SLF001
    held = holds.RayHolds("n", "ray-n", place_timeout_s=t.hold_place_timeout_s, return_wait_s=t.hold_return_wait_s,
                          lend_timeout_s=t.lend_timeout_s)
    assert (held.place_timeout_s, held.return_wait_s, held.lend_timeout_s) == (3.0, 0.5, 8.0)
    runner = RayJobRunner("http://127.0.0.1:1", timeout_s=t.job_api_timeout_s, id_reuse_quiet_s=t.id_reuse_quiet_s,
                          status_read_timeout_s=t.status_read_timeout_s)
    assert (runner._timeout_s, runner._id_reuse_quiet_s, runner._status_read_timeout_s) == (4.0, 20.0, 2.0)  # noqa: SLF001


def test_an_earlier_job_under_the_id_is_waited_out_for_the_runners_quiet_time() -> None:
    import time

    from orchestrator.core.errors import JobApiUnavailableError
    from orchestrator.rayport.ray_api import RayJobRunner

    class Record:
        end_time = int((time.time() - 15) * 1000)  # ended 15 s ago

    deleted: list[str] = []
    quiet = RayJobRunner("http://127.0.0.1:1", id_reuse_quiet_s=20.0)
    with pytest.raises(JobApiUnavailableError, match="under 20 s ago"):
        quiet._clear_earlier("job-1.a1", Record())  # noqa: SLF001
    default = RayJobRunner("http://127.0.0.1:1")
    default.delete = deleted.append  # type: ignore[method-assign]
    default._clear_earlier("job-1.a1", Record())  # noqa: SLF001  # past the default 10 s: deleted
    assert deleted == ["job-1.a1"]



def test_every_tuning_knob_is_documented() -> None:
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "runtime.md").read_text()
    assert "### Tuning: `settings.tuning`" in doc
    assert [k for k in Tuning.model_fields if f"`{k}`" not in doc] == []
