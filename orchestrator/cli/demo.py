"""``orchestrator demo``: the main scenario on a local cluster with simulated GPUs (``make demo``).

Starts the demo cluster (``configs/cluster.demo.yaml``) in a temporary state
folder, serves the live page (:mod:`orchestrator.dashboard`, ``--port``, default
8090, any free port when that one is taken) and prints its URL, runs
:mod:`orchestrator.scenarios.preemption` -- training fills the GPUs, inference
arrives, training checkpoints and yields, inference finishes, training resumes
and completes -- printing every decision with its reason under a progress line,
then writes the static report (``report.html`` and a PNG per chart, into
``--out``, default ``out/``) and a summary of the figures. It stops everything
it started -- raylets, the page, the comparison's child process -- also on
Ctrl-C, SIGTERM and SIGHUP.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from orchestrator.cli.options import Output, emit, output_format
from orchestrator.core.jsonout import stdout_to_stderr

app = typer.Typer()


def run_scenario(rounds: int, mode: str, steps: int, step_delay: float, say: Any, *,
                 state_dir: Path | None = None, keep: bool = False, progress: Any = None,
                 dashboard_port: int | None = None, out_dir: Path | None = None,
                 status_line: Any = None, holder: str = "job", victim: str = "cooperative",
                 grace_s: float | None = None) -> dict[str, Any]:
    """Up, page, scenario, report, down (always). Returns the figures.

    ``dashboard_port`` None: no page; ``out_dir`` None: no report; ``status_line``
    receives a one-line summary of the pipeline about once a second. ``holder="actor"`` runs
    :mod:`orchestrator.scenarios.actors` (training as lease-holding actors; ``victim`` cooperative or
    rogue) instead of the job scenario; ``grace_s`` overrides the training class's grace period.
    """
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
        "training": cfg.scheduler.classes["training"].model_copy(update={
            "min_runtime_s": 1.0, **({"grace_period_s": grace_s} if grace_s is not None else {})})}})
    settings = cfg.settings.model_copy(update={"metrics_port": launcher.free_port()}) if dashboard_port is not None \
        else cfg.settings
    cfg = cfg.model_copy(update={"scheduler": sched, "settings": settings})
    sd = state_dir or Path(tempfile.mkdtemp(prefix="rgo-demo-"))
    work = sd / "work"
    started = False
    page = None
    interrupted = False
    try:
        state = launcher.up_local(cfg, sd, progress=progress or say)
        started = True
        work.mkdir(parents=True, exist_ok=True)
        ray_api.connect(state.address, state.namespace)
        head = HeadClient(state.namespace, state.head_name)
        if dashboard_port is not None:
            page = _Page(head, dashboard_port, say, status_line).start()
        if holder == "gang":
            from orchestrator.scenarios.gang import GangScenario, GangScenarioConfig

            gcfg = GangScenarioConfig(rounds=rounds, steps=steps, step_sleep_s=step_delay)
            out = GangScenario(head, state.namespace, work, gcfg, say=say).run()
            out["up_s"] = state.up_seconds
            return out
        if holder == "actor":
            from orchestrator.scenarios.actors import ActorScenario, ActorScenarioConfig

            acfg = ActorScenarioConfig(rounds=rounds, steps=steps, step_delay_s=step_delay, victim=victim)  # type: ignore[arg-type]
            out = ActorScenario(head, state.namespace, work, acfg, say=say).run()
            out["up_s"] = state.up_seconds
            return out
        sc = Scenario(head, work, ScenarioConfig(rounds=rounds, mode=mode, steps=steps,  # type: ignore[arg-type]
                                                                  step_delay_s=step_delay,
                                                                  report_inference=page is not None,
                                                                  inference_s=6.0 if page else 2.0), say=say)
        res = sc.run()
        out = res.figures()
        out["up_s"] = state.up_seconds
        return out
    except (KeyboardInterrupt, SystemExit):
        interrupted = True
        raise
    finally:
        if page is not None:
            # Interrupted: stop now, without waiting (up to 90 s) for the comparison the report would show.
            page.stop(None if interrupted else out_dir)
        ray_api.disconnect()
        if started or (sd / "state.json").exists():
            launcher.down(sd, progress=progress or say, keep_logs=keep)
        if not keep and state_dir is None:
            shutil.rmtree(sd, ignore_errors=True)


class _Page:
    """The live page beside the scenario, its comparison, the progress line, and the report at the end."""

    def __init__(self, head: Any, port: int, say: Any, status_line: Any) -> None:
        from orchestrator.dashboard.app import Comparison
        from orchestrator.dashboard.compare import ComparisonJob
        from orchestrator.dashboard.server import DashboardServer
        from orchestrator.core.errors import InvalidRequestError

        self.comparison = Comparison()
        try:
            self.server = DashboardServer(head, port=port, poll_s=0.5, comparison=self.comparison)
        except InvalidRequestError:  # the port is taken: any free one, and say which
            self.server = DashboardServer(head, port=0, poll_s=0.5, comparison=self.comparison)
        self.job = ComparisonJob(self.comparison)
        self.say, self.status_line = say, status_line
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="demo-progress", daemon=True)

    def start(self) -> "_Page":
        self.job.start()
        self.server.start()
        self.say(f"live dashboard: {self.server.url}")
        self._ticker.start()
        return self

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            frame = self.server.feed.latest()
            if frame is not None and self.status_line is not None:
                p = frame["pipeline"]
                self.status_line(f"{self.server.url}  queue {p['queue']['now']}  running {p['running']['now']}  "
                                 f"preempting {p['preempt']['now']}  preemptions {p['preempt']['total']}  "
                                 f"resumes {p['resume']['total']}  frame {frame['version']}")

    def stop(self, out_dir: Path | None) -> None:
        from orchestrator.dashboard.report import write_report

        self._stop.set()
        try:
            if out_dir is not None and self.comparison.data is None and self.comparison.error is None:
                self.say("waiting (up to 90 s) for the schemes' comparison to finish, for the report")
                deadline = time.monotonic() + 90
                while self.comparison.data is None and self.comparison.error is None and time.monotonic() < deadline:
                    time.sleep(0.5)
            if out_dir is not None and self.server.feed.latest() is not None:
                files = write_report(out_dir, self.server.feed.history(), self.server.feed.latest(),
                                     self.comparison.to_dict() if self.comparison.data else None)
                self.say(f"report: {files[0]} (+ {len(files) - 2} PNGs)")
        finally:
            self.job.stop()
            self.server.stop()


def _colocation(load_curve: Optional[Path], day_seconds: float, schemes: str, config: Optional[Path], fmt: str,
                headless: bool, out: Path, state_dir: Optional[Path]) -> None:
    from orchestrator.cli.colocation import run_command

    console = Console(stderr=True)
    t0 = time.monotonic()

    def say(line: str) -> None:
        console.print(f"[dim]{time.monotonic() - t0:6.1f}s[/dim] {line}", highlight=False)

    from orchestrator.deploy.local import interrupt_on_stop_signals

    interrupt_on_stop_signals()  # every `finally` below runs on SIGTERM and SIGHUP too
    try:
        run_command(load_curve=load_curve, day_seconds=day_seconds, schemes=schemes, config=config, fmt=fmt,
                    headless=headless, out=out, state_dir=state_dir, say=say, console=Console())
    except KeyboardInterrupt:
        console.print("interrupted: everything the scenario started has been stopped")
        raise typer.Exit(130) from None


@app.command()
def demo(
    rounds: int = typer.Option(1, min=1, help="How many times inference arrives"),
    mode: str = typer.Option("orchestrator", help="orchestrator (checkpoint and yield) or kubernetes (kill, restart from a periodic checkpoint)"),
    steps: int = typer.Option(300, min=10, help="Training steps per job (--holder actor: steps after the last round)"),
    step_delay: float = typer.Option(0.03, min=0.0, help="Seconds per training step"),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as one JSON object (as -o json)"),
    output: Output = None,
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="Keep the cluster's files here (default: a temp folder, removed)"),
    port: int = typer.Option(8090, "--port", help="Port of the live page (a free one when taken)"),
    headless: bool = typer.Option(False, "--headless", help="No live page and no report"),
    out: Path = typer.Option(Path("out"), "--out", help="Folder for the static report"),
    holder: str = typer.Option("job", "--holder", help="job (training as Ray jobs), actor (as lease-holding Ray actors) or gang (a Ray Train TorchTrainer on a 2x2 gang lease)"),
    victim: str = typer.Option("cooperative", "--victim", help="cooperative (checkpoints when asked) or rogue (ignores it; actor only)"),
    grace: Optional[float] = typer.Option(None, "--grace", min=0.0, help="Training's grace period in seconds (default: the config's)"),
    scenario: str = typer.Option("preemption", "--scenario", help="preemption (training yields to an inference "
                                 "arrival) or colocation (a compressed day of load-driven inference and training, "
                                 "against the usual sharing schemes)"),
    load_curve: Optional[Path] = typer.Option(None, "--load-curve", help="colocation: a CSV of "
                                              "seconds,requests_per_s over the day (default: the built-in day)"),
    day_seconds: float = typer.Option(90.0, "--day-seconds", min=20.0, help="colocation: real seconds per day"),
    schemes: str = typer.Option("ours,whole_card,static_mig,timeslice", "--schemes",
                                help="colocation: the schemes to replay, comma-separated (ours first)"),
    colocation_config: Optional[Path] = typer.Option(None, "--colocation-config",
                                                     help="colocation: the service and autoscaler file "
                                                          "(default configs/colocation.yaml)"),
) -> None:
    """Run a scenario (preemption by default) on a local cluster with simulated GPUs, then stop it."""
    try:
        fmt = output_format(output, as_json)
    except ValueError as e:  # an InvalidRequestError naming `output`
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    as_json = fmt != "table"  # json or yaml: the figures alone on stdout
    if scenario not in ("preemption", "colocation"):
        typer.echo(f"error: invalid scenario={scenario!r} (allowed: preemption, colocation)", err=True)
        raise typer.Exit(2)
    if scenario == "colocation":
        _colocation(load_curve, day_seconds, schemes, colocation_config, fmt, headless, out, state_dir)
        return
    for name, value, allowed in (("mode", mode, ("orchestrator", "kubernetes")), ("holder", holder, ("job", "actor", "gang")),
                                 ("victim", victim, ("cooperative", "rogue"))):
        if value not in allowed:
            typer.echo(f"error: invalid {name}={value!r} (allowed: {', '.join(allowed)})", err=True)
            raise typer.Exit(2)
    if (victim == "rogue" and holder != "actor") or (holder != "job" and mode != "orchestrator"):
        typer.echo(f"error: --victim rogue needs --holder actor, and --holder {holder} needs --mode orchestrator",
                   err=True)
        raise typer.Exit(2)
    headless = headless or holder != "job"  # the page follows jobs; the actor and gang scenarios have none
    console = Console(stderr=as_json)
    t0 = time.monotonic()

    def say(line: str) -> None:
        console.print(f"[dim]{time.monotonic() - t0:6.1f}s[/dim] {line}", highlight=False)

    from orchestrator.deploy.local import interrupt_on_stop_signals

    interrupt_on_stop_signals()  # every `finally` below runs on SIGTERM and SIGHUP too
    try:
        # With --json stdout is the figures' alone: Ray prints what its threads and processes hear there.
        with stdout_to_stderr(as_json), \
                console.status("running the scenario (Ctrl-C stops everything it started)") as line:
            figures = run_scenario(rounds, mode, steps, step_delay, say, state_dir=state_dir,
                                   keep=state_dir is not None, dashboard_port=None if headless else port,
                                   out_dir=None if headless else out,
                                   status_line=lambda text: line.update(text), holder=holder, victim=victim,
                                   grace_s=grace)
    except KeyboardInterrupt:
        console.print("interrupted: everything the demo started has been stopped")
        raise typer.Exit(130) from None
    # The scenario exists to show a preemption: inference arrives while every card trains. None means the
    # story did not happen (a regression, or training ended before the arrival) -- say so, exit 1.
    failed = figures.get("resumed_bit_identical") is False or figures.get("preemptions") != rounds
    if as_json:
        emit(figures, fmt, sort_keys=False)
        if failed:
            raise typer.Exit(1)
        return
    t = Table(title=f"preemption scenario ({mode})")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for k, v in figures.items():
        t.add_row(k, str(v))
    console.print(t)
    if figures.get("preemptions") != rounds:
        console.print(f"[bold red]expected {rounds} preemption(s), saw {figures.get('preemptions')}[/bold red]")
    if failed:
        raise typer.Exit(1)
