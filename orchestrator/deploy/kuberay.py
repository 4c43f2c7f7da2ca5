"""Start the orchestrator on the Ray cluster this process belongs to: ``python -m orchestrator.deploy.kuberay head``.

What a KubeRay head container runs once Ray is healthy: it attaches to the
local Ray cluster (``--address auto``), starts the detached head actor and
an agent per node (discovery ``auto``: NVML where a driver is present), and
exits; the actors live on in the cluster. ``--config`` takes a cluster file
(its ``settings`` and ``scheduler``; its simulated ``nodes`` are ignored when
NVML is found). The head's metrics port comes from
``ORCHESTRATOR_METRICS_PORT`` (the rendered manifests set it).

With ``--k8s-inventory-every S`` it stays running after the head is up and,
every ``S`` seconds, compares the agents' inventories with the GPU feature
discovery labels of the Kubernetes Node objects
(:func:`orchestrator.deploy.k8s.inventory.compare_nodes`) and hands the
result to the head (``report_inventory_check``), which exports it as
``orchestrator_inventory_disagreements`` and in ``orchestrator nodes``. A
failed round is logged and retried; SIGTERM ends the loop.

When ``ORCHESTRATOR_DASHBOARD_PORT`` is set (the rendered head pod sets it from
``dashboard_port``, the port its container and NetworkPolicy open) it also
serves the live dashboard there: ``orchestrator dashboard --host 0.0.0.0``, a
child process (the dashboard sits above this layer), which requires the
cluster's Ray token (``RAY_AUTH_TOKEN`` in the pod). It then stays running until
SIGTERM, SIGINT or SIGHUP (or the dashboard exits), and stops the child on its way out.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

from orchestrator.core import env
from orchestrator.core.api import HeadApi
from orchestrator.core.config import ClusterConfig, RuntimeSettings, load_config
from orchestrator.core.errors import OrchestratorError, exit_code
from orchestrator.core.inventory import NodeInventory
from orchestrator.core.statefile import default_state_dir
from orchestrator.deploy import local as launcher
from orchestrator.deploy.k8s.inventory import compare_nodes


def inventory_round(head: HeadApi, list_nodes: Callable[[], list]) -> dict:
    """One cross-check: the Node objects against every agent's inventory, reported to the head."""
    agents = [NodeInventory.model_validate(x) for x in head.agent_inventories()]
    return head.report_inventory_check(compare_nodes(list_nodes(), agents).to_dict())


def watch_inventory(head: HeadApi, list_nodes: Callable[[], list], every_s: float, stop: threading.Event) -> int:
    """Run :func:`inventory_round` every ``every_s`` until ``stop``; returns the rounds that succeeded."""
    ok = 0
    while not stop.is_set():
        try:
            got = inventory_round(head, list_nodes)
            ok += 1
            print(f"inventory check: {got['disagreements']} disagreement(s), {got['errors']} error(s)", flush=True)
        except Exception as e:  # the API server or the head briefly away: say so, try next round
            print(f"inventory check failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        stop.wait(every_s)
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.deploy.kuberay", description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["head"], help="what to start")
    p.add_argument("--address", default="auto", help="Ray address (default: this node's cluster)")
    p.add_argument("--config", type=Path, default=None, help="cluster file (settings, scheduler)")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--k8s-inventory-every", type=float, default=0.0, metavar="S",
                   help="stay running and cross-check node labels with the agents every S seconds (0: exit)")
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
    port = os.environ.get(env.DASHBOARD_PORT)
    if not port and a.k8s_inventory_every <= 0:
        return 0
    stop = threading.Event()
    old = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    dash = None
    try:
        if port:
            argv = dashboard_argv(port, a.address, cfg.settings.namespace)
            print(f"serving the dashboard: {' '.join(argv[1:])}", flush=True)
            dash = subprocess.Popen(argv)
        if a.k8s_inventory_every > 0:
            from orchestrator.deploy.k8s.client import KubeRayClient
            from orchestrator.sdk.connect import connect_head

            head = connect_head(a.address, namespace=cfg.settings.namespace, head_name=cfg.settings.head_name)
            watch_inventory(head, KubeRayClient.from_kubeconfig().list_nodes, a.k8s_inventory_every, stop)
        else:
            while dash is not None and dash.poll() is None and not stop.wait(1.0):
                pass
    except OrchestratorError as e:
        print(f"error: {e}", file=sys.stderr)
        return exit_code(e)
    finally:
        if dash is not None and dash.poll() is None:
            dash.terminate()
            try:
                dash.wait(timeout=10)
            except subprocess.TimeoutExpired:
                dash.kill()
                dash.wait()
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return 0


def dashboard_argv(port: str, address: str, namespace: str) -> list[str]:
    """The command that serves the live page in the head pod (on every address: the pod's IP is what others reach)."""
    return [sys.executable, "-m", "orchestrator.cli.main", "dashboard", "--host", "0.0.0.0", "--port", str(port),
            "--address", address, "--namespace", namespace, "--no-compare"]


if __name__ == "__main__":
    sys.exit(main())
