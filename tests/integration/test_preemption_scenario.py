"""Preemption on a real Ray cluster, with real training jobs and real checkpoint files.

The scenario of the mission: training fills every whole card of the demo
cluster (three jobs of 4, 2 and 2 cards), an inference job arrives that needs
one card; the minimal victim set -- one training job, the one that loses least
work -- is asked to checkpoint, acknowledges, is stopped and requeued; the
inference job runs; when it leaves, the victim resumes from its checkpoint.
Every training job must end with weights bit-identical to an undisturbed run
of the same seed, and the victim's history must say who preempted it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from heads import remove_head

from orchestrator.core.job import JobSpec
from orchestrator.core.request import GpuRequest
from orchestrator.core.config import RuntimeSettings
from orchestrator.deploy.local import free_port

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
STEPS = 300
SETTINGS = RuntimeSettings(namespace="rgo-preempt", head_name="rgo-head-preempt", heartbeat_interval_s=0.5,
                           agent_ttl_s=5.0, reconcile_interval_s=0.2)
#: The head's /metrics port, chosen when its fixture starts it, not at collection (by then another module's Ray
#: processes may have taken it).
METRICS: dict[str, int] = {}


@pytest.fixture(scope="module")
def head(ray_cluster: Any) -> Iterator[Any]:
    import ray

    from orchestrator.rayport import ray_api
    from orchestrator.rayport.actors import start_head
    from orchestrator.rayport.client import HeadClient

    cfg = ray_cluster.config
    sched = cfg.scheduler.model_copy(update={"policy": "bestfit", "classes": {
        **cfg.scheduler.classes,
        "training": cfg.scheduler.classes["training"].model_copy(update={"min_runtime_s": 1.0, "grace_period_s": 60.0}),
        # for the head-kill test: a checkpointing class whose victims get only 8 s to yield
        "training-short": cfg.scheduler.classes["training"].model_copy(update={"min_runtime_s": 1.0, "grace_period_s": 8.0}),
    }})
    METRICS["port"] = free_port()
    settings = SETTINGS.model_copy(update={"metrics_port": METRICS["port"]})
    handle = start_head(settings, cfg.model_copy(update={"scheduler": sched}), node_id=ray_api.head_node_id())
    client = HeadClient(handle=handle)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if len(ray_api.unwrap(ray.get(handle.ping.remote()))["registered_nodes"]) == 3:
            break
        time.sleep(0.25)
    yield client
    remove_head(SETTINGS, cfg)


def wait(head: Any, job_id: str, states: set[str], timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        j = head.get_job(job_id)
        if j["state"] in states:
            return j
        if time.monotonic() > deadline:
            raise AssertionError(f"{job_id} stuck in {j['state']}: {j['message']} {head.explain_job(job_id)}")
        time.sleep(0.3)


def test_the_demo_from_an_installed_wheel_preempts_one_training_job_which_resumes_bit_identical(tmp_path: Path) -> None:
    """``orchestrator demo --headless`` as a user runs it after ``pip install ray-gpu-orchestrator``: the wheel
    built from this checkout, installed into a fresh venv outside it, run from a folder outside it, with the
    extras (torch, kubernetes, plotly, matplotlib) made unimportable -- the plain install must be enough. The
    scenario is this module's story: training fills every whole card, inference arrives, the minimal victim
    (one 2-card job) checkpoints and yields, inference runs, the victim resumes, and every training job ends
    bit-identical to an undisturbed run with no step lost.

    Cheap on purpose (the suite's budget): the venv gets the wheel alone (``pip --python ... --no-deps``) and
    sees this .venv's site-packages through a ``.pth`` line -- a plain folder entry, so the editable install's
    finder of this checkout (a ``.pth`` *inside* that folder) is never run."""
    venv = installed_wheel(tmp_path)
    py = venv / "bin" / "python"
    outside = Path(tempfile.mkdtemp(prefix="rgo-whl-", dir="/tmp"))  # short: Ray's socket paths
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "ORCHESTRATOR_")) and k != "PYTHONPATH"}
    env.update(TMPDIR=str(outside), RAY_USAGE_STATS_ENABLED="0", COLUMNS="400", PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    try:
        probe = subprocess.run(
            [str(py), "-c", "import json, orchestrator\n"
             "from orchestrator.core.config import DEMO_CONFIG\n"
             "from orchestrator.core.datafiles import job_script\n"
             "try:\n    import torch\n    blocked = False\nexcept ImportError:\n    blocked = True\n"
             "print(json.dumps([orchestrator.__file__, str(DEMO_CONFIG), str(job_script('train.py')), blocked]))"],
            cwd=outside, env=env, capture_output=True, text=True, timeout=60)
        assert probe.returncode == 0, probe.stderr[-3000:]
        where = json.loads(probe.stdout)
        # The package, its cluster config and its job scripts all come from the fresh venv, not the checkout.
        for path in where[:3]:
            assert Path(path).resolve().is_relative_to(venv.resolve()), (path, venv)
        assert where[3], "torch is importable in the wheel's venv: the test would not show the plain install suffices"
        sd = outside / "sd"
        proc = subprocess.run([str(venv / "bin" / "orchestrator"), "demo", "--headless", "--json", "--state-dir", str(sd)],
                              cwd=outside, env=env, capture_output=True, text=True, timeout=420)
        assert proc.returncode == 0, proc.stderr[-6000:]
        figures = json.loads(proc.stdout.strip().splitlines()[-1])
        assert figures["preemptions"] == 1 and figures["resumed_bit_identical"] is True, figures
        assert figures["work_lost_steps"] == 0, figures
        # The minimal victim set: one of the two 2-card jobs (the 4-card one would lose more work).
        cards = dict(re.findall(r"submitted (\S+): (\d) card", proc.stderr))
        victims = set(re.findall(r"(\S+) +-> preempting ", proc.stderr))
        assert len(victims) == 1 and cards[victims.pop()] == "2", proc.stderr[-6000:]
        # Each training job ran the wheel's jobs/train.py to its end, on NumPy: torch was not there.
        results = [json.loads(p.read_text()) for p in sorted((sd / "work").glob("*/result.json"))]
        assert [(r["step"], r["status"], r["backend"]) for r in results] == [(STEPS, "completed", "numpy")] * 3
    finally:
        shutil.rmtree(outside, ignore_errors=True)


def installed_wheel(tmp_path: Path) -> Path:
    """A fresh venv holding the wheel of this checkout (built from a copy of what the wheel takes), whose
    dependencies are this .venv's site-packages and whose extras are unimportable; returns the venv."""
    src = tmp_path / "src"
    for name in ("pyproject.toml", "README.md"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, src / name)
    for name in ("orchestrator", "configs", "jobs"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(src)], check=True, capture_output=True, timeout=300)
    wheel, = dist.glob("ray_gpu_orchestrator-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", str(wheel)], check=True, capture_output=True, timeout=300)
    site_dir, = (venv / "lib").glob("python3.*/site-packages")
    ours = Path(sysconfig.get_paths()["purelib"])
    (site_dir / "_rgo_block_extras.py").write_text(BLOCK_EXTRAS)
    (site_dir / "zz_rgo_test.pth").write_text(f"{ours}\nimport _rgo_block_extras\n")
    return venv


#: What the wheel's venv runs first in every process (raylets, workers, jobs): the extras do not exist.
BLOCK_EXTRAS = """
import sys

EXTRAS = {"torch", "kubernetes", "plotly", "matplotlib"}


class _NoExtras:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in EXTRAS:
            raise ModuleNotFoundError(f"No module named {name!r} (an extra, not installed here)", name=name)
        return None


sys.meta_path.insert(0, _NoExtras)
"""


def test_a_sigkilled_head_brings_every_job_to_its_end_exactly_once(head: Any, tmp_path: Path) -> None:
    """SIGKILL the head's worker with jobs queued, running and preempting; Ray restarts the actor, which
    restores from the GCS store. Every job ends as it would have, and no attempt is submitted to Ray twice."""
    import os
    import signal

    import ray

    from orchestrator.rayport import ray_api

    def submit(name: str, entrypoint: str, gpu: GpuRequest, priority: str) -> str:
        spec = JobSpec(name=name, entrypoint=entrypoint, gpu=gpu, priority=priority, checkpoint_dir=str(tmp_path / name))
        return head.submit_job(spec.model_dump(mode="json"))["job_id"]

    on_h100 = {"kind": "whole", "count": 2, "node": "h100-0"}
    stubborn = submit("stubborn", "sleep 300", GpuRequest(**on_h100), "training-short")  # never checkpoints
    short = submit("short", f"{sys.executable} -c 'import time; time.sleep(40)'", GpuRequest.mig("1g.10gb"), "batch")
    wait(head, stubborn, {"running"})
    wait(head, short, {"running"})
    behind = submit("behind", "true", GpuRequest(**on_h100), "batch")  # queued behind stubborn
    inf = submit("urgent", f"{sys.executable} -c 'import time; time.sleep(2)'",
                 GpuRequest(kind="whole", count=1, node="h100-0"), "inference")
    wait(head, stubborn, {"preempting"}, timeout=60)
    assert head.get_job(behind)["state"] == "queued" and head.get_job(short)["state"] == "running"
    before = ray_api.unwrap(ray.get(head.handle.ping.remote()))
    os.kill(before["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 120
    while True:  # Ray restarts the actor; it answers again from a new process
        try:
            after = head.ping()
            if after["pid"] != before["pid"]:
                break
        except Exception:
            pass
        assert time.monotonic() < deadline, "the head did not come back"
        time.sleep(0.5)
    assert after["restored_leases"] >= 4
    # stubborn's grace runs out (the deadline was stored): stopped, requeued behind the inference job
    assert wait(head, inf, {"succeeded"}, timeout=120)["attempt"] == 1
    assert wait(head, short, {"succeeded"}, timeout=120)["attempt"] == 1
    st = wait(head, stubborn, {"running"}, timeout=120)
    assert st["attempt"] == 2 and st["preemptions"][0]["by"] == inf and st["preemptions"][0]["checkpoint_path"] is None
    head.cancel_job(stubborn)
    assert wait(head, behind, {"succeeded"}, timeout=120)["attempt"] == 1
    assert head.get_job(stubborn)["state"] == "cancelled"
    # exactly once: Ray knows each attempt's submission id once, and no others of these jobs
    jobs = ray_api.job_submission_client(ray_api.api_server_url()).list_jobs()
    ours = sorted(j.submission_id for j in jobs if j.submission_id and j.submission_id.split(".a")[0]
                  in {stubborn, short, behind, inf})
    assert ours == sorted([f"{behind}.a1", f"{inf}.a1", f"{short}.a1", f"{stubborn}.a1", f"{stubborn}.a2"])
