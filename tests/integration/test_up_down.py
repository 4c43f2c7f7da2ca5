"""The CLI's up/status/down cycle on a cluster of its own: `orchestrator up` starts the demo's three raylets (without
``ray stop``), the head and its agents; `status`, a job, `env` and a user's driver use it; `down` leaves no process
and no file. Apart from tests/integration/test_runtime.py (a head on the worker's shared cluster) so that the two
can run side by side under ``--dist loadfile``: this one needs no shared cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from orchestrator.core.statefile import State
from orchestrator.deploy.local import session_members

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.cluster", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_up_status_down_leaves_nothing_behind() -> None:
    """`orchestrator up`, `status --json`, `down`: 3 nodes, 10 GPUs, the MIG slots; then no process, no file. The
    state folder is nested deep enough that Ray's socket paths under it would pass the 107-byte limit (issue #39:
    a longer TMPDIR made every raylet exit at startup): `up` puts Ray's temp dirs in a short folder of its own."""
    from orchestrator.deploy.local import RAY_SESSION_TAIL, UNIX_SOCKET_MAX, ray_root

    base = Path(tempfile.mkdtemp(prefix="rgo-cli-", dir="/tmp"))
    state_dir = base / "a-state-folder-nested-deep-enough-that-rays-socket-paths-would-not-fit"
    short = ray_root(state_dir)
    assert short != state_dir and len(str(short / "r99")) + RAY_SESSION_TAIL <= UNIX_SOCKET_MAX
    home_ray_before = (Path.home() / ".ray").exists()
    tmp_ray_before = Path("/tmp/ray").exists()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(ORCHESTRATOR_STATE_DIR=str(state_dir), RAY_USAGE_STATS_ENABLED="0")
    t0 = time.monotonic()
    up = _cli("up", "--json", env=env)
    up_s = time.monotonic() - t0
    state = State.load(state_dir)
    try:
        assert up.returncode == 0, up.stderr
        got = json.loads(up.stdout)  # one JSON object on stdout; progress on stderr
        assert got["address"].startswith("127.0.0.1:") and got["nodes"] == ["a100-0", "a100-1", "h100-0"], got
        assert got["state_dir"] == str(state_dir) and got["job_api"].startswith("http://127.0.0.1:"), got
        assert "agents registered 3/3" in up.stderr
        assert any(p.name.startswith("session_") for p in (short / "ray").iterdir())  # Ray's session: the short root
        status = _cli("status", "--json", env=env, timeout=60)
        assert status.returncode == 0, status.stderr
        d = json.loads(status.stdout)  # exactly one JSON object
        assert [n["name"] for n in d["nodes"]] == ["a100-0", "a100-1", "h100-0"]
        gpus = [g for n in d["nodes"] for g in n["gpus"]]
        assert len(gpus) == 10 and {"index", "uuid", "model", "memory_mib", "mig"} <= set(gpus[0])
        assert sorted(len(g["mig"]) for g in gpus if g["mig"]) == [3, 4]
        assert d["leases"] == [] and d["queue"] == []
        # The head's /metrics on a loopback port of its own, though the config names none.
        assert d["metrics_url"].startswith("http://127.0.0.1:") and d["metrics_url"].endswith("/metrics"), d
        scraped = urllib.request.urlopen(d["metrics_url"], timeout=10).read().decode()
        assert "\norchestrator_gpus 10.0\n" in scraped
        print(f"\nup took {up_s:.1f}s")
        # A job on a node that is not Ray's head node (the MIG slice is on a100-1): its driver log is read
        # back. Each raylet here has a session folder of its own, where Ray's job API looks for it in vain.
        job = subprocess.run([sys.executable, "-m", "orchestrator.cli.jobs", "submit", "--gpu", "mig:1g.10gb",
                              "--wait", "--json", "--", sys.executable, "-c", "print('hello from', 'a100-1')"],
                             env=env, cwd=REPO, capture_output=True, text=True, timeout=240)
        assert job.returncode == 0, job.stderr
        done = json.loads(job.stdout)
        assert done["state"] == "succeeded" and done["lease"]["allocation"]["node"] == "a100-1", done
        logs = subprocess.run([sys.executable, "-m", "orchestrator.cli.jobs", "logs", done["job_id"]],
                              env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert logs.returncode == 0 and "hello from a100-1" in logs.stdout, (logs.stdout, logs.stderr)
        # A user's own driver, given nothing but `orchestrator env`'s exports: its plain num_gpus task gets a lease
        # of its own and sees its card (without the hook it would wait: every unit of Ray's GPU is held).
        exported = _cli("env", "--json", env=env)
        assert exported.returncode == 0, exported.stderr
        assert _cli("env", env=env).stdout.startswith("export ")
        script = ("import json, os, ray\nray.init()\n@ray.remote(num_gpus=1)\ndef f():\n"
                  "    return [str(i) for i in ray.get_gpu_ids()], os.environ.get('CUDA_VISIBLE_DEVICES')\n"
                  "print('SEEN', json.dumps(ray.get(f.remote(), timeout=60)))\n")
        user = subprocess.run([sys.executable, "-c", script], env={**env, **json.loads(exported.stdout)},
                              cwd=state_dir, capture_output=True, text=True, timeout=180)
        assert user.returncode == 0, user.stderr[-3000:]
        ids, visible = json.loads(next(x for x in user.stdout.splitlines() if x.startswith("SEEN ")).split(" ", 1)[1])
        assert len(ids) == 1 and ids[0].startswith("GPU-") and visible == ids[0], (ids, visible)
    finally:
        t1 = time.monotonic()
        down = _cli("down", "--json", env=env, timeout=120)
        print(f"down took {time.monotonic() - t1:.1f}s")
    assert down.returncode == 0, down.stderr
    stopped = json.loads(down.stdout)  # one JSON object: the workers first, the Ray head node (the GCS) last
    assert sorted(stopped["stopped"]) == ["a100-0", "a100-1", "h100-0"] and stopped["stopped"][-1] == "a100-0", stopped
    assert stopped["removed"] == str(state_dir), stopped
    assert state is not None and len(state.processes) == 3
    time.sleep(0.5)
    assert all(session_members(p.sid) == [] for p in state.processes), "a process of ours survived down"
    assert not state_dir.exists() and not short.exists(), "down left the state folder or Ray's short temp root"
    base.rmdir()
    assert (Path.home() / ".ray").exists() == home_ray_before, "up wrote ~/.ray"
    assert Path("/tmp/ray").exists() == tmp_ray_before, "up wrote /tmp/ray"
