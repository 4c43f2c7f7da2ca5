"""Load on a real local cluster: jobs (and SDK leases) submitted concurrently from several processes.

Starts the demo cluster (``configs/cluster.demo.yaml``: three raylets on 127.0.0.1, the head actor and
three agents) with :func:`orchestrator.deploy.local.up_local` in a state directory of its own, in the
namespace ``rgo-load``, and stops it on exit and on SIGINT, SIGTERM and SIGHUP (and, through the
launcher's watchdog, when this process is SIGKILLed).

**What is measured.**

* ``--jobs N``: ``--clients`` processes (spawned, each one Ray driver with ``--threads`` threads; each
  connects and calls the head once, then all start together at a barrier) submit N jobs between them,
  each with its own id (``load-<run>-c<client>-<i>``, ``<run>`` new in every run), through ``HeadApi.submit_job``. A
  job asks for a time-slice small enough that the cluster holds every job at once (:func:`share_for`;
  ``--share`` sets it); its entrypoint is ``true``. The head runs with
  ``settings.job_runner: none``: an admitted job is handed to a runner that starts **no** Ray driver and
  reports it SUCCEEDED at the next batched status read (which frees its lease). So what is measured is
  **job admission**: submit -> lease queued -> lease granted -> job admitted -> recorded as started. A
  job's **grant latency** is the head's ADMITTED time (its history) minus the client's clock just before
  the submit call (one host, one clock). ``grants_per_s`` is jobs admitted / (last admission - first
  submit).
* ``--rate R``: the jobs arrive on a schedule (open loop), R a second from all clients together, evenly
  spaced, instead of as fast as the threads can send them; a job's latency counts from when it was due if
  every thread was busy then, so a send that comes late counts against the head (else from its send).
  What a grant costs at a given load, where the default (closed loop, ``--threads`` calls in flight per
  client) measures the most the head takes, and a latency that is mostly the queue those calls make
  (Little's law: in flight / throughput). The leases are not paced.
* ``--leases N``: the same processes take N SDK leases with ``orchestrator.lease()`` (the same share)
  (fate-shared with the driver's holder actor), each released at once. A lease's grant latency is the
  client's time from the ``lease()`` call to the yielded handle (request, grant, activation: one head
  call). Each client takes one lease before the start, not counted, which makes its holder actor.
* ``call_to_queued_p50_ms`` and ``queued_to_admitted_p50_ms``: a job's grant latency in two legs, split
  at the head's QUEUED record of it (its history): the call's way in (the client's own queue of calls,
  Ray, the head's mailbox, the checks), then the head's queue and plan; over the jobs that have both.
* ``submit_reply_p50_ms`` (``_p99_ms``, ``_max_ms``): the client's whole ``submit_job`` call (the grant,
  the group commit that makes it durable, the reply), what a caller waits for; a stall shows in the max.
* ``transport``: how the clients' quick calls reached the head: ``direct`` (its channel,
  :mod:`orchestrator.rayport.channel`, gRPC: each call at once, the head batching what arrives together) or
  ``actor`` (``--actor-calls``, or a head without the channel: Ray actor calls). ``calls_per_batch``: with
  ``actor``, submissions per Ray call to the head (one: each quick call is a ``call_many`` of its own); with
  ``direct``, calls per batch the head made of them (``orchestrator_channel_calls_total`` / ``..._batches_total``, over the run).
* ``bare_actor_call_p50_ms``: a no-op method of a no-op actor, called 200 times in a row from this
  process while the cluster is idle, in the same run. ``head_ping_p50_ms``: the head's own ``ping``,
  called the same way (the head is an asyncio actor: a call to it costs more than one to a plain actor).
  ``bare_actor_call_loaded_p50_ms`` (and p99): the same no-op actor called by the same clients and
  threads, all at once, as many times as they sent jobs, and with ``--rate`` on the jobs' schedule: what
  Ray alone gives that many callers at that pace (the floor under the grant latency there; a caller
  that waits between calls is answered slower than one in a tight loop, as the processes on both ends
  go idle); ``bare_actor_call_loaded_wall_s`` how long those calls took, the slowest client's.

**Accounting.** Afterwards this process reads every job once (``list_jobs``) and every lease
(``get_lease``): ``lost`` counts submitted ids that did not end succeeded (jobs) / released (leases),
or are missing; ``duplicated`` counts ids seen twice, jobs run on more than one attempt, leases granted
more than once, and jobs of this bench the clients did not submit.

Prints one JSON object (``--json``; else a summary): ``jobs``, ``lost``, ``duplicated``,
``grants_per_s``, ``grant_p50_ms``, ``grant_p99_ms``, ``bare_actor_call_p50_ms`` (the jobs), and
``leases`` (the same fields for the leases) when asked.

    .venv/bin/python bench/load.py --jobs 1000 --clients 8 --leases 1000 --json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import secrets
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from orchestrator.core.config import DEMO_CONFIG, ClusterConfig, load_config
from orchestrator.core.env import DIRECT_CALLS
from orchestrator.core.jsonout import stdout_to_stderr
from orchestrator.core.stats import rounded_quantile

NAMESPACE = "rgo-load"
NOOP = "rgo-load-noop"


def share_for(cfg: ClusterConfig, jobs: int) -> float:
    """The time-slice every job (and lease) asks for: small enough that the cluster holds twice ``jobs`` at once
    (at most 5% of a card; at least the 0.1% the time-slice capacity counts in). What is measured is then the
    head's grant path, not the turnover of a full cluster (an admitted job frees its share only at the next
    status read, every 0.5 s: 200 slots of 5% would cap the figure at ~400 grants/s whatever the head does);
    ``--share`` sets it instead."""
    cards = sum(n.gpus for n in cfg.nodes)
    return max(0.001, min(0.05, int(1000 * cards / (2 * max(1, jobs))) / 1000))


def config() -> ClusterConfig:
    cfg = load_config(DEMO_CONFIG)
    settings = cfg.settings.model_copy(update={"namespace": NAMESPACE, "job_runner": "none"})
    return cfg.model_copy(update={"settings": settings})


class Noop:
    """The plainest actor there is: one no-op method."""

    def ping(self, _caller: Any = None) -> None:
        """(``_caller``: the credentials a head client sends with every call, so the test that stands this actor in
        for a head's sees the call fail for the actor's death, not for its signature.)"""
        return None


# ---- one client process ------------------------------------------------------------------------
def client(address: str, tag: str, index: int, jobs: int, leases: int, threads: int, share: float,
           start: Any, again: Any, rate: float | None = None, clients: int = 1) -> dict[str, Any]:
    """Submit ``jobs`` jobs, then take ``leases`` leases, from ``threads`` threads; what each took. Every
    client connects and calls the head once, then waits at ``start`` (a barrier) so that all submit at once;
    then, all together again (``again``), as many no-op calls to the bench's no-op actor as it sent jobs (on
    the same schedule as the jobs when they had one).

    With a ``rate`` the jobs arrive on a schedule instead of as fast as the threads can send them: the
    ``clients`` together submit ``rate`` a second, evenly spaced, this client's ``i``-th job due at
    ``(i * clients + index) / rate`` seconds after the start. Its latency counts from when it was due when
    every thread was busy past that time (a slow head), so the wait counts against the head, not for it;
    from when it was sent otherwise (a sleep wakes up to a millisecond late on this VM, not the head's doing)."""
    from orchestrator.rayport import ray_api
    from orchestrator.rayport.client import HeadClient
    from orchestrator.sdk.leases import lease

    ray_api.connect(address, NAMESPACE)
    head = HeadClient(NAMESPACE)
    head.ping()
    gpu = {"kind": "timeslice", "fraction": share}
    if leases:  # this driver's holder actor, made before the start (Ray makes actors at 1-3 a second here)
        with lease(gpu, priority="batch", lease_id=f"{tag}-l{index}-warm", namespace=NAMESPACE, timeout=120):
            pass
    start.wait(300)
    begin = time.time()
    out: dict[str, Any] = {"jobs": [], "leases": [], "errors": [], "noop_ms": [], "reply_ms": []}
    noop = ray_api.get_actor(NOOP, NAMESPACE)

    def arrival(i: int, since: float) -> float:
        """When call ``i`` counts from: now, or with a ``rate`` when it is due after ``since``, however late a
        thread comes to send it (after sleeping until then if early)."""
        t0 = time.time()
        if rate:
            due = since + (i * clients + index) / rate
            if t0 < due:
                time.sleep(due - t0)
                t0 = time.time()  # sent when due: a sleep's own overshoot is not the head's
            else:
                t0 = due  # every thread was busy past its time: the wait counts against the callee
        return t0

    def submit(i: int) -> None:
        job_id = f"{tag}-c{index}-{i}"
        t0 = arrival(i, begin)
        try:
            head.submit_job({"name": "load", "entrypoint": "true", "gpu": gpu, "priority": "batch"}, job_id)
            out["reply_ms"].append((time.time() - t0) * 1000)
            out["jobs"].append((job_id, t0))
        except Exception as e:  # counted as lost by the accounting; said here too
            out["errors"].append(f"{job_id}: {type(e).__name__}: {e}")

    def take(i: int) -> None:
        lid = f"{tag}-l{index}-{i}"
        at, t0 = time.time(), time.perf_counter()
        try:
            with lease(gpu, priority="batch", lease_id=lid, namespace=NAMESPACE, timeout=120):
                took = time.perf_counter() - t0
            out["leases"].append((lid, took, at))
        except Exception as e:
            out["errors"].append(f"{lid}: {type(e).__name__}: {e}")

    def poke(i: int) -> None:  # on the jobs' schedule, if they had one (a paced caller wakes up slower)
        t0 = arrival(i, pokes_begin)
        ray_api.get(noop.ping.remote(), timeout=60)
        out["noop_ms"].append((time.time() - t0) * 1000)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(submit, range(jobs)))
        if leases:
            list(pool.map(take, range(leases)))
        again.wait(300)
        pokes_begin = time.time()
        list(pool.map(poke, range(jobs)))
        out["noop_wall_s"] = time.time() - pokes_begin
    out["batches"] = head.actor_sends  # the Ray calls that carried this client's submissions (no channel)
    out["direct"] = head.direct and head.actor_sends == 0  # every call went over the head's channel
    ray_api.disconnect()
    return out


# ---- the run -----------------------------------------------------------------------------------
def noop_actor() -> Any:
    """The bench's no-op actor (named :data:`NOOP`: the clients call it too)."""
    from orchestrator.rayport import ray_api

    # by value: the workers cannot import this file (run as __main__, or as `load` by the tests)
    actor = ray_api.remote_class(Noop, by_value=sys.modules[Noop.__module__]).options(
        num_cpus=0, name=NOOP, namespace=NAMESPACE).remote()
    ray_api.get(actor.ping.remote(), timeout=120)
    return actor


def bare_call_ms(call: Any, n: int = 200) -> list[float]:
    """``n`` calls of ``call`` in a row from this process, each timed (ms)."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def split(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def run(address: str, jobs: int, leases: int, clients: int, threads: int, share: float,
        rate: float | None = None) -> dict[str, Any]:
    from orchestrator.rayport import ray_api
    from orchestrator.rayport.client import HeadClient

    ray_api.connect(address, NAMESPACE)
    noop = noop_actor()
    bare = bare_call_ms(lambda: ray_api.get(noop.ping.remote(), timeout=60))
    head = HeadClient(NAMESPACE)
    head_ping = bare_call_ms(head.ping)
    metrics_url = head.status()["endpoints"]["metrics_url"]
    before = direct_counts(metrics_url)
    tag = f"load-{secrets.token_hex(3)}"  # this run's ids: a cluster may hold an earlier run's jobs and leases
    ctx = mp.get_context("spawn")  # Ray drivers do not survive fork
    with ctx.Manager() as manager, ctx.Pool(clients) as pool:
        start, again = manager.Barrier(clients + 1), manager.Barrier(clients)
        args = [(address, tag, i, j, le, threads, share, start, again, rate, clients)
                for i, (j, le) in enumerate(zip(split(jobs, clients), split(leases, clients)))]
        pending = pool.starmap_async(client, args)
        start.wait(300)  # every client connected: they submit from now on
        t0 = time.time()
        results = pending.get()
    wall = time.time() - t0
    submitted = [j for r in results for j in r["jobs"]]
    errors = [e for r in results for e in r["errors"]]
    deadline = time.monotonic() + 120
    while True:  # every job admitted and finished (the runner reports success at the next status read)
        mine = [j for j in head.list_jobs() if j["job_id"].startswith(f"{tag}-")]
        if all(j["state"] in ("succeeded", "failed", "cancelled") for j in mine) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    out = {"jobs": jobs, "clients": clients, "threads": threads, "share": share, "rate": rate,
           "load_wall_s": round(wall, 2)}
    out.update(account_jobs(submitted, mine, jobs))
    replies = [x for r in results for x in r["reply_ms"]]
    out["submit_reply_p50_ms"] = rounded_quantile(replies, 0.5)
    out["submit_reply_p99_ms"] = rounded_quantile(replies, 0.99)
    out["submit_reply_max_ms"] = _r(max(replies, default=None))
    batches = sum(r["batches"] for r in results)
    direct = all(r["direct"] for r in results)
    out["transport"] = "direct" if direct else "actor"
    if direct and before is not None and (after := direct_counts(metrics_url)) is not None:
        frames, made = after[0] - before[0], after[1] - before[1]
        out["calls_per_batch"] = round(frames / made, 2) if made else None
    else:
        out["calls_per_batch"] = round(len(replies) / batches, 2) if batches else None
    out["bare_actor_call_p50_ms"] = rounded_quantile(bare, 0.5) or 0.0
    out["bare_actor_call_p99_ms"] = rounded_quantile(bare, 0.99) or 0.0
    out["head_ping_p50_ms"] = rounded_quantile(head_ping, 0.5)
    loaded = [x for r in results for x in r["noop_ms"]]
    out["bare_actor_call_loaded_p50_ms"] = rounded_quantile(loaded, 0.5)
    out["bare_actor_call_loaded_p99_ms"] = rounded_quantile(loaded, 0.99)
    out["bare_actor_call_loaded_wall_s"] = round(max(r["noop_wall_s"] for r in results), 3)
    ray_api.kill(noop)
    if leases:
        out["leases"] = account_leases([x for r in results for x in r["leases"]], head, leases)
    out["errors"] = errors[:10]
    ray_api.disconnect()
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


DIRECT = ("orchestrator_channel_calls_total", "orchestrator_channel_batches_total")


def head_counters(url: str, *names: str) -> tuple[float, ...]:
    """The head's counters ``names`` (sample names, ``_total`` included; 0 where absent), read from its /metrics
    over HTTP with prometheus_client's own parser."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=5).read().decode()
    seen = {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}
    return tuple(seen.get(n, 0.0) for n in names)


def direct_counts(url: str | None) -> tuple[float, ...] | None:
    """The head's direct-channel frames and the batches it made of them (:data:`DIRECT`); ``None`` without a
    metrics endpoint."""
    return head_counters(url, *DIRECT) if url else None


def account_jobs(submitted: list[tuple[str, float]], seen: list[dict[str, Any]], asked: int) -> dict[str, Any]:
    sent = dict(submitted)
    by_id: dict[str, int] = {}
    for j in seen:
        by_id[j["job_id"]] = by_id.get(j["job_id"], 0) + 1
    views = {j["job_id"]: j for j in seen}
    lost = asked - len(sent) + sum(1 for jid in sent if jid not in views or views[jid]["state"] != "succeeded")
    duplicated = (sum(n - 1 for n in by_id.values()) + sum(1 for j in seen if j["attempt"] != 1)
                  + sum(1 for jid in by_id if jid not in sent))
    admitted, legs = [], []
    for jid, t0 in sent.items():
        history = views.get(jid, {}).get("history", [])
        queued = next((h["at"] for h in history if h["state"] == "queued"), None)
        at = next((h["at"] for h in history if h["state"] == "admitted"), None)
        if at is not None:
            admitted.append((t0, at))
            if queued is not None:
                legs.append(((queued - t0) * 1000, (at - queued) * 1000))
    lat = [(at - t0) * 1000 for t0, at in admitted]
    span = (max(at for _, at in admitted) - min(t0 for t0, _ in admitted)) if admitted else 0.0
    return {"lost": lost, "duplicated": duplicated, "admitted": len(admitted),
            "grants_per_s": round(len(admitted) / span, 1) if span > 0 else None,
            "grant_p50_ms": rounded_quantile(lat, 0.5), "grant_p99_ms": rounded_quantile(lat, 0.99),
            # the grant in two legs: to the head's record of the job (the client's queue, Ray, the head's
            # mailbox, the checks), then to its admission (the head's queue and plan)
            "call_to_queued_p50_ms": rounded_quantile([way_in for way_in, _ in legs], 0.5),
            "queued_to_admitted_p50_ms": rounded_quantile([planned for _, planned in legs], 0.5)}


def account_leases(took: list[tuple[str, float, float]], head: Any, asked: int) -> dict[str, Any]:
    ids = [lid for lid, _, _ in took]
    lost = asked - len(set(ids))
    duplicated = len(ids) - len(set(ids))
    for lid in set(ids):
        d = head.get_lease(lid)
        if d["state"] != "released":
            lost += 1
        duplicated += max(0, sum(1 for h in d["history"] if h["state"] == "granted") - 1)
    lat = [s * 1000 for _, s, _ in took]
    span = (max(at + s for _, s, at in took) - min(at for _, _, at in took)) if took else 0.0
    return {"leases": asked, "lost": lost, "duplicated": duplicated,
            "grants_per_s": round(len(took) / span, 1) if span > 0 else None,
            "grant_p50_ms": rounded_quantile(lat, 0.5), "grant_p99_ms": rounded_quantile(lat, 0.99)}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--leases", type=int, default=0, help="SDK leases to take as well (0: none)")
    p.add_argument("--clients", type=int, default=8, help="client processes")
    p.add_argument("--threads", type=int, default=16, help="threads per client")
    p.add_argument("--rate", type=float, default=None,
                   help="jobs a second the clients submit together, on a schedule (open loop); "
                        "default: as fast as their threads can")
    p.add_argument("--share", type=float, default=None,
                   help="time-slice fraction each job and lease asks for (default: see share_for)")
    p.add_argument("--actor-calls", action="store_true",
                   help="clients call the head's actor only, not its direct channel (the path before it)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.actor_calls:
        os.environ[DIRECT_CALLS] = "0"  # the clients are spawned with this environment
    if a.rate is not None and a.rate <= 0:
        p.error(f"--rate must be above 0 (jobs a second), not {a.rate:g}")
    from orchestrator.deploy.local import scratch_cluster

    say = lambda m: print(f"[load] {m}", file=sys.stderr)  # noqa: E731
    cfg = config()
    # The head's /metrics on a free loopback port: the direct channel's batches are counted there.
    cfg = cfg.model_copy(update={"settings": cfg.settings.model_copy(
        update={"metrics_port": free_port(), "metrics_host": "127.0.0.1"})})
    share = a.share if a.share is not None else share_for(cfg, max(a.jobs, a.leases))
    with stdout_to_stderr(), scratch_cluster(cfg, "rgo-load-", progress=say) as state:  # stdout: the figures'
        out = run(state.address, a.jobs, a.leases, a.clients, a.threads, share, a.rate)
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 0 if out["lost"] == 0 and out["duplicated"] == 0 and (
        not a.leases or (out["leases"]["lost"] == 0 and out["leases"]["duplicated"] == 0)) else 1


if __name__ == "__main__":
    sys.exit(main())
