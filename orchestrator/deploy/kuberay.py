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

With ``--supervise S`` it is the head's supervisor, the process a Kubernetes container runs (the rendered
head pod runs it as a restartable native sidecar, ``docs/kubernetes.md``): it stays in the foreground,
printing to its own stdout and stderr (the container's logs), and every ``S`` seconds looks the detached
head actor up by name. When the GCS answers "no such actor" :data:`LOST_AFTER` looks in a row (killed for
good, its restarts spent, its node lost) it exits with :data:`EXIT_HEAD_LOST`, so the kubelet restarts the container
and the next run starts the head again (which restores its ledger from the GCS) or reattaches to it.
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
from orchestrator.core.config import ClusterConfig, RuntimeSettings, load_config, with_environment
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


#: Consecutive "no such actor" answers before the supervisor calls the head lost (one could race a restart).
LOST_AFTER = 3
#: The supervisor's exit status when the head actor is lost (any non-zero restarts the container).
EXIT_HEAD_LOST = 4


def supervise_head(head_alive: Callable[[], bool], every_s: float, stop: threading.Event,
                   lost_after: int = LOST_AFTER) -> bool:
    """Look at the head every ``every_s`` until ``stop``; True as soon as ``lost_after`` looks in a row were
    answered "no such actor", False when stopped.

    A look that raises (the GCS restarting, this driver reconnecting) is no answer: it is logged and counts
    neither way, so a GCS restart under fault tolerance never restarts the sidecar; only the GCS saying the
    head is gone does. A GCS gone for good takes the Ray container, and so the pod, with it."""
    misses = 0
    while not stop.wait(every_s):
        try:
            alive = head_alive()
        except Exception as e:  # no answer: say why, decide nothing
            print(f"head check got no answer: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            continue
        misses = 0 if alive else misses + 1
        if misses >= lost_after:
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.deploy.kuberay", description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["head"], help="what to start")
    p.add_argument("--address", default="auto", help="Ray address (default: this node's cluster)")
    p.add_argument("--config", type=Path, default=None, help="cluster file (settings, scheduler)")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--k8s-inventory-every", type=float, default=0.0, metavar="S",
                   help="stay running and cross-check node labels with the agents every S seconds (0: exit)")
    p.add_argument("--supervise", type=float, default=0.0, metavar="S",
                   help="stay running as the head's supervisor: look the head actor up every S seconds and exit "
                   f"{EXIT_HEAD_LOST} when it is lost, so the container's restart starts it again (0: no)")
    a = p.parse_args(argv)
    try:
        cfg = load_config(a.config) if a.config else with_environment(ClusterConfig(settings=RuntimeSettings(
            discovery="auto", metrics_host="0.0.0.0")))
        state = launcher.attach(cfg, a.address, default_state_dir(), progress=lambda m: print(m, flush=True),
                                timeout_s=a.timeout)
    except OrchestratorError as e:
        print(f"error: {e}", file=sys.stderr)
        return exit_code(e)
    print(f"orchestrator head up on {state.address} in {state.up_seconds}s", flush=True)
    port = os.environ.get(env.DASHBOARD_PORT)
    if not port and a.k8s_inventory_every <= 0 and a.supervise <= 0:
        return 0
    stop = threading.Event()
    old = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    dash = None
    try:
        if port:
            argv = dashboard_argv(port, a.address, cfg.settings.namespace)
            print(f"serving the dashboard: {' '.join(argv[1:])}", flush=True)
            dash = subprocess.Popen(argv)
        inventory = None
        if a.k8s_inventory_every > 0:
            from orchestrator.deploy.k8s.client import KubeRayClient
            from orchestrator.sdk.connect import connect_head

            head = connect_head(a.address, namespace=cfg.settings.namespace, head_name=cfg.settings.head_name)
            list_nodes = KubeRayClient.from_kubeconfig().list_nodes
            if a.supervise <= 0:
                watch_inventory(head, list_nodes, a.k8s_inventory_every, stop)
            else:
                inventory = threading.Thread(target=watch_inventory, args=(head, list_nodes, a.k8s_inventory_every,
                                                                           stop), name="inventory", daemon=True)
                inventory.start()
        if a.supervise > 0:
            from orchestrator.rayport import ray_api

            s = cfg.settings

            def head_alive() -> bool:
                if dash is not None and dash.poll() is not None:
                    stop.set()  # the dashboard died: end, and let the restart bring both back
                ray_api.connect(a.address, s.namespace)  # a no-op once connected; raises while the GCS is away
                return ray_api.named_actor_alive(s.head_name, s.namespace)

            print(f"supervising head {s.head_name!r} in namespace {s.namespace!r} every {a.supervise:g}s",
                  flush=True)
            if supervise_head(head_alive, a.supervise, stop):
                print(f"error: head {s.head_name!r} lost ({LOST_AFTER} looks in a row); exiting "
                      f"{EXIT_HEAD_LOST} so the container restarts and starts it again", file=sys.stderr, flush=True)
                return EXIT_HEAD_LOST
            if dash is not None and dash.poll() is not None:
                print(f"error: the dashboard exited with status {dash.returncode}", file=sys.stderr, flush=True)
                return 1
        elif a.k8s_inventory_every <= 0:
            while dash is not None and dash.poll() is None and not stop.wait(1.0):
                pass
    except OrchestratorError as e:
        print(f"error: {e}", file=sys.stderr)
        return exit_code(e)
    finally:
        stop.set()  # ends the inventory thread, if any
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
            "--address", address, "--ray-namespace", namespace, "--no-compare"]


if __name__ == "__main__":
    sys.exit(main())
