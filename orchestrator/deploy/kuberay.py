"""Start the orchestrator on the Ray cluster this process belongs to: ``python -m orchestrator.deploy.kuberay head``.

What a KubeRay head container runs once Ray is healthy: it attaches to the
local Ray cluster (``--address auto``), starts the detached head actor and
an agent per node (discovery ``auto``: NVML where a driver is present), and
exits; the actors live on in the cluster. ``--config`` takes a cluster file
(its ``settings`` and ``scheduler``; its simulated ``nodes`` are ignored when
NVML is found). The head's metrics port comes from
``ORCHESTRATOR_METRICS_PORT`` (the rendered manifests set it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator.core.config import ClusterConfig, RuntimeSettings, load_config
from orchestrator.core.errors import OrchestratorError, exit_code
from orchestrator.core.statefile import default_state_dir
from orchestrator.deploy import local as launcher


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.deploy.kuberay", description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["head"], help="what to start")
    p.add_argument("--address", default="auto", help="Ray address (default: this node's cluster)")
    p.add_argument("--config", type=Path, default=None, help="cluster file (settings, scheduler)")
    p.add_argument("--timeout", type=float, default=300.0)
    a = p.parse_args(argv)
    try:
        cfg = load_config(a.config) if a.config else ClusterConfig(settings=RuntimeSettings(
            discovery="auto", metrics_host="0.0.0.0"))
        state = launcher.attach(cfg, a.address, default_state_dir(), progress=lambda m: print(m, flush=True),
                                timeout_s=a.timeout)
    except OrchestratorError as e:
        print(f"error: {e}", file=sys.stderr)
        return exit_code(e)
    print(f"orchestrator head up on {state.address} in {state.up_seconds}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
