"""``orchestrator demo``: the main scenario on a local cluster with simulated GPUs (``make demo``).

Starts the demo cluster (``configs/cluster.demo.yaml``) in a temporary state
folder, runs :mod:`orchestrator.scenarios.preemption` -- training fills the GPUs,
inference arrives, training checkpoints and yields, inference finishes,
training resumes and completes -- printing every decision with its reason,
then a summary of the figures. It stops everything it started, also on
Ctrl-C.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer()


def run_scenario(rounds: int, mode: str, steps: int, step_delay: float, say: Any, *,
                 state_dir: Path | None = None, keep: bool = False, progress: Any = None) -> dict[str, Any]:
    """Up, scenario, down (always). Returns the figures."""
    # Ray and the cluster code load only when the demo runs (`orchestrator --help` stays quick).
    from orchestrator.core.config import DEMO_CONFIG, load_config
    from orchestrator.deploy import local as launcher
    from orchestrator.rayport import ray_api
    from orchestrator.rayport.client import HeadClient
    from orchestrator.scenarios.preemption import Scenario, ScenarioConfig

    cfg = load_config(DEMO_CONFIG)
    # The demo shortens training's minimum runtime (30 s in configs/priorities.yaml) so it is brief.
    sched = cfg.scheduler.model_copy(update={"classes": {
        **cfg.scheduler.classes,
        "training": cfg.scheduler.classes["training"].model_copy(update={"min_runtime_s": 1.0})}})
    cfg = cfg.model_copy(update={"scheduler": sched})
    sd = state_dir or Path(tempfile.mkdtemp(prefix="rgo-demo-"))
    work = sd / "work"
    started = False
    try:
        state = launcher.up_local(cfg, sd, progress=progress or say)
        started = True
        work.mkdir(parents=True, exist_ok=True)
        ray_api.connect(state.address, state.namespace)
        head = HeadClient(state.namespace, state.head_name)
        sc = Scenario(head, state.dashboard, work, ScenarioConfig(rounds=rounds, mode=mode, steps=steps,  # type: ignore[arg-type]
                                                                  step_delay_s=step_delay), say=say)
        res = sc.run()
        out = res.figures()
        out["up_s"] = state.up_seconds
        return out
    finally:
        ray_api.disconnect()
        if started or (sd / "state.json").exists():
            launcher.down(sd, progress=progress or say, keep_logs=keep)
        if not keep and state_dir is None:
            shutil.rmtree(sd, ignore_errors=True)


@app.command()
def demo(
    rounds: int = typer.Option(1, min=1, help="How many times inference arrives"),
    mode: str = typer.Option("orchestrator", help="orchestrator (checkpoint and yield) or kubernetes (kill, restart from a periodic checkpoint)"),
    steps: int = typer.Option(300, min=10, help="Training steps per job"),
    step_delay: float = typer.Option(0.03, min=0.0, help="Seconds per training step"),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as one JSON object"),
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="Keep the cluster's files here (default: a temp folder, removed)"),
) -> None:
    """Run the preemption scenario on a local cluster with simulated GPUs, then stop it."""
    if mode not in ("orchestrator", "kubernetes"):
        typer.echo(f"error: invalid mode={mode!r} (allowed: orchestrator, kubernetes)", err=True)
        raise typer.Exit(2)
    console = Console(stderr=as_json)
    t0 = time.monotonic()

    def say(line: str) -> None:
        console.print(f"[dim]{time.monotonic() - t0:6.1f}s[/dim] {line}", highlight=False)

    try:
        with console.status("running the scenario (Ctrl-C stops everything it started)"):
            figures = run_scenario(rounds, mode, steps, step_delay, say, state_dir=state_dir,
                                   keep=state_dir is not None)
    except KeyboardInterrupt:
        console.print("interrupted: everything the demo started has been stopped")
        raise typer.Exit(130) from None
    if as_json:
        typer.echo(json.dumps(figures))
        return
    t = Table(title=f"preemption scenario ({mode})")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for k, v in figures.items():
        t.add_row(k, str(v))
    console.print(t)
    if figures.get("resumed_bit_identical") is False:
        raise typer.Exit(1)
