"""The package as a user installs it: ``orchestrator demo --headless`` from the wheel of this checkout, installed into
a fresh venv outside it -- the preemption scenario of tests/integration/test_preemption_scenario.py, run by the demo
on a cluster of its own. Apart from that module (a head on the worker's shared cluster) so that the two can run
side by side under ``--dist loadfile``; ``tests/unit/test_packaging.py`` checks the parts.
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
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
STEPS = 300


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
