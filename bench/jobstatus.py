"""The head's batched job status read as Ray's job history grows: one multi-get against ``list_jobs``.

The job layer reads the Ray status of every job it started once per ``status_poll_s`` (0.5 s), on the
head's loop. It did so with ``JobSubmissionClient.list_jobs()``: an HTTP call to the dashboard, which
lists Ray's whole job table in the GCS and reads every record in it, every job the cluster ever ran.
:meth:`orchestrator.rayport.ray_api.RayJobRunner.status_many` now reads the records of the jobs asked
about, and only those, in one GCS multi-get.

Starts the demo cluster (:func:`orchestrator.deploy.local.up_local`, namespace ``rgo-jobstatus``, its own
state directory; stopped on exit, SIGINT, SIGTERM and SIGHUP), submits one real job through Ray's job API,
then grows the history: for each size in ``--history``, that many finished jobs' records are written to
Ray's job table the way Ray's job manager writes them (``JobInfoStorageClient``'s key, ``JobInfo``'s JSON;
synthetic, named ``rgo-jobstatus-h<i>``) beside ``--active`` running ones. At each size both reads are
timed (``--reads`` times each) for the active jobs plus the real one, and must agree.

Prints, per history size: ``history``, ``list_jobs_p50_ms``, ``status_many_p50_ms``, ``speedup`` (the
first over the second, measured in the same run).

    .venv/bin/python bench/jobstatus.py --history 0 1000 5000 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from orchestrator.core.config import DEMO_CONFIG, load_config
from orchestrator.core.jsonout import stdout_to_stderr

NAMESPACE = "rgo-jobstatus"


def write_records(start: int, stop: int, status: str, prefix: str) -> list[str]:
    """Records of finished (or running) jobs in Ray's job table, as Ray's job manager writes them."""
    from ray._private import ray_constants
    from ray.dashboard.modules.job.common import JobInfo, JobInfoStorageClient, JobStatus

    from orchestrator.rayport.ray_api import GcsKv

    table = GcsKv(ray_constants.KV_NAMESPACE_JOB.decode())
    ids = []
    now = int(time.time() * 1000)
    for i in range(start, stop):
        sid = f"{prefix}{i}"
        info = JobInfo(status=JobStatus(status), entrypoint="python train.py", start_time=now, end_time=now,
                       metadata={"orchestrator": NAMESPACE}, message="synthetic history (bench/jobstatus.py)")
        table.put(JobInfoStorageClient.JOB_DATA_KEY.format(job_id=sid), json.dumps(info.to_json()).encode())
        ids.append(sid)
    return ids


def run(address: str, sizes: list[int], active: int, reads: int) -> list[dict[str, Any]]:
    from orchestrator.rayport import ray_api

    ray_api.connect(address, NAMESPACE)
    runner = ray_api.RayJobRunner()
    real = runner.client.submit_job(entrypoint="true", submission_id="rgo-jobstatus-real.a1")
    deadline = time.monotonic() + 120
    while str(runner.client.get_job_status(real).value) not in ("SUCCEEDED", "FAILED"):
        if time.monotonic() > deadline:
            raise RuntimeError("the real job did not end within 120 s")
        time.sleep(0.5)
    asked = [real, *write_records(0, active, "RUNNING", "rgo-jobstatus-a")]
    out, written = [], 0
    for size in sizes:
        write_records(written, size, "SUCCEEDED", "rgo-jobstatus-h")
        written = max(written, size)
        old, new = [], []
        for _ in range(reads):
            t0 = time.perf_counter()
            known = {j.submission_id: str(j.status.value) for j in runner.client.list_jobs() if j.submission_id}
            by_list = {s: known.get(s) for s in asked}
            t1 = time.perf_counter()
            by_get = runner.status_many(asked)
            t2 = time.perf_counter()
            if by_list != by_get:
                raise AssertionError(f"the two reads disagree: {by_list} != {by_get}")
            old.append((t1 - t0) * 1000)
            new.append((t2 - t1) * 1000)
        p50_old, p50_new = statistics.median(old), statistics.median(new)
        row = {"history": written + active + 1, "asked": len(asked), "list_jobs_p50_ms": round(p50_old, 3),
               "status_many_p50_ms": round(p50_new, 3), "speedup": round(p50_old / max(p50_new, 1e-6), 1)}
        print(f"[jobstatus] {row}", file=sys.stderr)
        out.append(row)
    ray_api.disconnect()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--history", type=int, nargs="+", default=[0, 1000, 5000],
                   help="finished jobs in Ray's job table at each measurement (ascending)")
    p.add_argument("--active", type=int, default=50, help="running jobs asked about")
    p.add_argument("--reads", type=int, default=9, help="timed reads of each kind per size")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    from orchestrator.deploy.local import scratch_cluster

    say = lambda m: print(f"[jobstatus] {m}", file=sys.stderr)  # noqa: E731
    cfg = load_config(DEMO_CONFIG)
    cfg = cfg.model_copy(update={"settings": cfg.settings.model_copy(update={"namespace": NAMESPACE})})
    with stdout_to_stderr(), scratch_cluster(cfg, "rgo-jobstatus-", progress=say) as state:  # stdout: the rows
        rows = run(state.address, sorted(a.history), a.active, a.reads)
    if a.json:
        print(json.dumps(rows))
    else:
        for r in rows:
            print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
