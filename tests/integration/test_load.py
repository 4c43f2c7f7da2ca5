"""A short ``bench/load.py`` on a real local cluster: every job and lease accounted for (no timing asserted).

One cluster for the module: the bench's own (``load.config()``: the demo nodes, namespace ``rgo-load``,
``job_runner: none``) started with the launcher in a state directory under /tmp, stopped afterwards.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from orchestrator.control.service import JOB_STATUS_POLL_S
from orchestrator.deploy.local import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # spawned clients import it by name too
import load  # noqa: E402

from tests.integration.heads import until  # noqa: E402

pytestmark = pytest.mark.ray


#: The head's /metrics port on loopback, chosen when the module's cluster starts, not at collection (by then
#: another module's Ray processes may have taken it).
METRICS: dict[str, int] = {}


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    from orchestrator.deploy import local

    saved = dict(os.environ)
    state_dir = Path(tempfile.mkdtemp(prefix="rgo-load-it-", dir="/tmp"))
    cfg = load.config()
    METRICS["port"] = free_port()
    cfg = cfg.model_copy(update={"settings": cfg.settings.model_copy(
        update={"metrics_port": METRICS["port"], "metrics_host": "127.0.0.1"})})
    try:
        yield local.up_local(cfg, state_dir, progress=lambda m: None).address
    finally:
        local.down(state_dir, progress=lambda m: None)
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(state_dir, ignore_errors=True)


def test_fifty_jobs_and_twenty_leases_from_two_clients_none_lost_or_duplicated(address: str) -> None:
    out: dict[str, Any] = load.run(address, jobs=50, leases=20, clients=2, threads=4, share=0.05)
    assert out["errors"] == []
    assert (out["lost"], out["duplicated"], out["admitted"]) == (0, 0, 50), out
    assert (out["leases"]["lost"], out["leases"]["duplicated"]) == (0, 0), out
    assert out["bare_actor_call_p50_ms"] > 0 and out["bare_actor_call_loaded_p50_ms"] > 0
    assert out["transport"] == "direct" and out["calls_per_batch"] >= 1, out  # the head's direct channel


def test_jobs_paced_at_a_rate_arrive_on_their_schedule_and_are_all_accounted_for(address: str) -> None:
    # --rate: 20 jobs at 50 a second from two clients take at least the 0.38 s their schedule spans, whatever
    # the head could take; unpaced, they went in a few tens of ms here.
    out: dict[str, Any] = load.run(address, jobs=20, leases=0, clients=2, threads=4, share=0.05, rate=50.0)
    assert out["errors"] == [] and (out["lost"], out["duplicated"], out["admitted"]) == (0, 0, 20), out
    assert out["rate"] == 50.0 and out["grants_per_s"] <= 50 * 1.1, out
    assert out["load_wall_s"] >= 19 / 50, out
    # the no-op calls that say what Ray alone gives those callers go on the same schedule
    assert out["bare_actor_call_loaded_wall_s"] >= 19 / 50, out


def _counted() -> tuple[float, ...]:
    """The head's GCS writes and reconcile cycles so far (``orchestrator_state_commits_total``,
    ``orchestrator_reconcile_cycles_total``), read over HTTP."""
    return load.head_counters(_metrics_url(), "orchestrator_state_commits_total", "orchestrator_reconcile_cycles_total")


def _metrics_url() -> str:
    return f"http://127.0.0.1:{METRICS['port']}/metrics"


def test_a_lone_callers_job_costs_the_head_one_gcs_write_and_one_cycle(address: str) -> None:
    # The head's loop flushed after every cycle and ran one after every job API answer: a lone submission was
    # two GCS writes (its admission, then Ray's answer: running) and two cycles, and the second of each delayed
    # the caller's next call and reply. What a cycle writes now rides with the next caller's batch, and an
    # answer that leaves no work wakes nobody. The rest: heartbeats, status reads, the timer's ticks.
    jobs = 60
    writes, cycles = _counted()
    t0 = time.monotonic()
    out: dict[str, Any] = load.run(address, jobs=jobs, leases=0, clients=1, threads=1, share=0.05)
    wall, cfg = time.monotonic() - t0, load.config()
    ticks = wall / cfg.settings.reconcile_interval_s  # at most; the timer ticks only while no call comes
    beats = wall / cfg.settings.heartbeat_interval_s * len(cfg.nodes)  # each heartbeat wakes the loop
    # the jobs' status read (every status_poll_s) ends the admitted jobs: its write rides with a caller's batch
    # when one comes in time, else it is one of its own -- more of them the slower the machine runs the caller
    polls = wall / JOB_STATUS_POLL_S
    assert out["errors"] == [] and (out["lost"], out["duplicated"], out["admitted"]) == (0, 0, jobs), out
    writes, cycles = (after - before for after, before in zip(_counted(), (writes, cycles)))
    print(f"{jobs} jobs: {writes} writes, {cycles} cycles, {ticks:.0f} ticks, {beats:.0f} heartbeats, "
          f"{polls:.0f} status reads")
    assert jobs <= writes <= jobs * 1.2 + beats + polls, (writes, beats, polls)
    # Cycles vary more than writes from run to run: 73-89 over sixteen runs here through the direct channel,
    # 73-77 over six through the actor. The bound is 1.5 a job (it was 1.2, and one run from a fresh clone
    # went past it), still well under the two a job this replaced (136 for 60 jobs).
    assert jobs <= cycles <= jobs * 1.5 + ticks + beats, (cycles, ticks, beats)


def test_the_accounting_sees_a_lost_and_a_duplicated_job() -> None:
    # The bench's own check must be able to fail: a job never admitted, one run twice, one nobody sent.
    seen = [{"job_id": "a", "state": "succeeded", "attempt": 1,
             "history": [{"state": "queued", "at": 1.25}, {"state": "admitted", "at": 2.0}]},
            {"job_id": "b", "state": "queued", "attempt": 1, "history": []},
            {"job_id": "c", "state": "succeeded", "attempt": 2, "history": [{"state": "admitted", "at": 3.0}]},
            {"job_id": "x", "state": "succeeded", "attempt": 1, "history": []}]
    got = load.account_jobs([("a", 1.0), ("b", 1.0), ("c", 1.0)], seen, 3)
    assert (got["lost"], got["duplicated"], got["admitted"]) == (1, 2, 2)
    # the grant's two legs, split at the head's QUEUED record, over the jobs that have one (c has none)
    assert (got["call_to_queued_p50_ms"], got["queued_to_admitted_p50_ms"]) == (250.0, 750.0), got


def _direct_counted() -> tuple[float, ...]:
    """The frames the head's direct channel carried and the batches it made of them, read over HTTP."""
    return load.head_counters(_metrics_url(), *load.DIRECT)


@pytest.mark.parametrize("direct", [False, True], ids=["actor-calls", "direct-channel"])
def test_submissions_from_many_threads_share_calls_and_each_gets_its_own_answer(address: str, direct: bool) -> None:
    # One driver, 16 threads, 64 submissions (every fourth one malformed), each with its own answer -- its own job,
    # or the head's typed refusal naming its own field. Through the actor: one call_many each, answered in the
    # channel's JSON. Through the channel (rayport/channel.py, gRPC): each call goes at once, and the head makes
    # fewer batches of them than there were calls.
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator.core.errors import InvalidRequestError
    from orchestrator.rayport import ray_api
    from orchestrator.rayport.client import HeadClient

    ray_api.connect(address, load.NAMESPACE)
    try:
        head = HeadClient(load.NAMESPACE, direct=direct)
        head.ping()
        frames, batches = _direct_counted()

        def submit(i: int) -> Any:
            gpu = {"kind": "timeslice", "fraction": 0.01} if i % 4 else {"kind": "timeslice", "fraction": 7}
            try:
                return head.submit_job({"name": "many", "entrypoint": "true", "gpu": gpu}, f"many-{direct}-{i}")
            except InvalidRequestError as e:
                return e

        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(submit, range(64)))
        for i, g in enumerate(got):
            if i % 4:
                assert isinstance(g, dict) and g["job_id"] == f"many-{direct}-{i}" and g["state"] != "queued", (i, g)
            else:
                assert isinstance(g, InvalidRequestError) and "fraction" in g.field, (i, g)
        frames, batches = (after - before for after, before in zip(_direct_counted(), (frames, batches)))
        if direct:
            assert head.actor_sends == 0 and frames == 64 and batches < 64, (frames, batches)
        else:
            assert head.actor_sends == 64 and frames == 0, (head.actor_sends, frames)
        assert head.get_job(f"many-{direct}-5")["job_id"] == f"many-{direct}-5"  # a lone call afterwards
        raw = head.handle
        import ray

        import orjson

        refused = orjson.loads(ray.get(raw.call_many.remote([["wait_lease", ["x", 1.0], {}]]), timeout=30))
        assert refused["error"]["type"] == "InvalidRequestError"
        assert refused["error"]["fields"]["field"] == "calls[0].method", refused
    finally:
        ray_api.disconnect()


def test_the_connections_of_one_driver_share_its_head_client_until_the_head_is_found_gone(address: str) -> None:
    # lease() opens a connection per call: each looked the head up in the GCS and had a client of its own, so
    # a driver's threads' releases never went together. Now one client per driver and head, until a call
    # finds the head's actor dead; then the next connection looks it up again.
    import ray

    from orchestrator.core.errors import NotConnectedError
    from orchestrator.rayport import ray_api
    from orchestrator.sdk.connect import open_connection
    from orchestrator.sdk.leases import lease

    ray_api.connect(address, load.NAMESPACE)
    try:
        a, b = open_connection(namespace=load.NAMESPACE), open_connection(namespace=load.NAMESPACE)
        assert a.head is b.head
        with lease("timeslice:0.05", namespace=load.NAMESPACE, timeout=60) as held:
            assert held.head is a.head
        dead = ray_api.remote_class(load.Noop, by_value=load).options(num_cpus=0).remote()
        ray.get(dead.ping.remote(), timeout=60)
        ray.kill(dead, no_restart=True)  # asynchronous: a call may still be answered until it has died

        def died() -> bool:
            try:
                ray.get(dead.ping.remote(), timeout=30)
            except ray.exceptions.RayActorError:
                return True
            return False

        until("the killed stand-in to die", died, timeout=30, every_s=0.05)
        a.head.handle = dead  # as if the head's actor had died under this driver's client
        with pytest.raises(NotConnectedError):
            a.head.ping()  # (the stand-in has a ping too: what fails is that its actor is dead)
        assert a.head.gone
        c = open_connection(namespace=load.NAMESPACE)
        assert c.head is not a.head and not c.head.gone
        assert c.head.get_lease(held.lease_id)["state"] == "released"
    finally:
        ray_api.disconnect()
