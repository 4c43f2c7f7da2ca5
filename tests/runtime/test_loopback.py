"""The sitecustomize every Ray process of a local cluster loads keeps loopback loopback (a real interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys

from orchestrator.rayport.loopback import LOOPBACK_SITE

PROBE = "import ray._private.services as s; print(s.resolve_ip_for_localhost('127.0.0.1'))"


def _probe(keep: bool) -> str:
    env = dict(os.environ, PYTHONPATH=LOOPBACK_SITE)
    env.pop("ORCHESTRATOR_KEEP_LOOPBACK", None)
    if keep:
        env["ORCHESTRATOR_KEEP_LOOPBACK"] = "1"
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_cluster_process_keeps_127_0_0_1() -> None:
    assert _probe(keep=True) == "127.0.0.1"


def test_without_the_switch_ray_is_left_alone() -> None:
    # Ray's own behaviour (ray#59110): loopback becomes this host's outward address, or stays
    # loopback on a host without one; either way our module changed nothing.
    assert _probe(keep=False)
