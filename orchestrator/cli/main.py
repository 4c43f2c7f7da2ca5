"""The ``orchestrator`` command line.

Exit codes (also in ``--help``): 0 success; 1 the operation failed (a job
failed, a wait timed out); 2 bad input (the message names the field and what
is allowed); 3 the orchestrator is not reachable.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="orchestrator",
    help="GPU workload orchestrator inside Ray.\n\nExit codes: 0 ok; 1 operation failed or timed out; "
    "2 bad input (names the field and what is allowed); 3 orchestrator not reachable.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

def _version(value: bool) -> None:
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    def of(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    typer.echo(f"orchestrator {of('ray-gpu-orchestrator')} (ray {of('ray')})")
    raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                          help="Print the version (and Ray's) and exit")) -> None:
    pass


def _register() -> None:
    # Sub-command groups live next to the code they drive; each module exposes `app`.
    from orchestrator.cli.bench import app as bench_app
    from orchestrator.cli import cluster as _cluster
    from orchestrator.cli.k8s import app as k8s_app
    from orchestrator.cli.sim import app as sim_app

    app.add_typer(bench_app, name="bench")
    app.add_typer(sim_app, name="sim", help="Replay GPU traces (Alibaba openb) through the placement policies.")

    app.add_typer(_cluster.app)  # up, down, status at top level
    from orchestrator.cli import demo as _demo
    from orchestrator.cli import jobs as _jobs

    app.add_typer(_jobs.app)  # submit, jobs, logs, cancel, explain, nodes, leases, queue at top level

    app.add_typer(_demo.app)  # demo at top level
    from orchestrator.cli import dashboard as _dashboard

    app.add_typer(_dashboard.app)  # dashboard at top level

    app.add_typer(k8s_app, name="k8s", help="Deploy on Kubernetes through KubeRay (render, apply, status, delete).")


_register()

if __name__ == "__main__":  # pragma: no cover
    app()
