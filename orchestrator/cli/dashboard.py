"""``orchestrator dashboard``: serve the live page for a running cluster until Ctrl-C, SIGTERM or SIGHUP.

Finds the head as every command does (``--address``, the state file, ``auto``;
``--ray-namespace``),
serves on 127.0.0.1 (``--host`` elsewhere needs the cluster's token: the page is
then opened with ``?token=``), prints the URL, and on a signal stops the server,
the poller, the comparison's child process and its Ray connection -- everything
it started. Exit codes: 0 stopped by a signal; 2 bad input (names the field);
3 the orchestrator is not reachable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from orchestrator.cli.options import ConnectTimeout, OldNamespace, RayNamespace, ray_namespace
from orchestrator.core.errors import OrchestratorError, exit_code

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def dashboard(
    port: int = typer.Option(8090, "--port", "-p", help="Port to serve on (0: any free one)"),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; anything but loopback needs the cluster's token"),
    token: Optional[str] = typer.Option(None, "--token", help="Token the page requires (default: none on loopback, the cluster's Ray token elsewhere)"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray address (default: the one `up` recorded, else auto)"),
    namespace: RayNamespace = None, old_namespace: OldNamespace = None,
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="Folder `up` wrote its state to"),
    poll_s: float = typer.Option(1.0, "--poll", help="Seconds between two reads of the head"),
    compare: bool = typer.Option(True, "--compare/--no-compare", help="Compute the sharing schemes' comparison (openb replay)"),
    connect_timeout_s: ConnectTimeout = None,
) -> None:
    """Serve the live dashboard of a running cluster (pipeline, curves, schemes, cluster map)."""
    from orchestrator.dashboard.app import Comparison
    from orchestrator.dashboard.compare import ComparisonJob
    from orchestrator.dashboard.server import DashboardServer, resolve_token, wait_for_signal
    from orchestrator.sdk.connect import open_connection

    conn = server = job = None
    try:
        resolve_token(host, token)  # bad input is refused before anything starts
        namespace = ray_namespace(namespace, old_namespace)
        conn = open_connection(address, namespace=namespace, state_dir=state_dir, connect_timeout_s=connect_timeout_s)
        comparison = Comparison()
        server = DashboardServer(conn.head, host=host, port=port, token=token, poll_s=poll_s, comparison=comparison)
        if compare:
            job = ComparisonJob(comparison).start()
        server.start()
        typer.echo(server.url + (f"?token={server.token}" if server.token and token else ""))
        if server.token and not token:
            typer.echo("the page needs the cluster's Ray token: open it with ?token=<token>", err=True)
        typer.echo("serving; Ctrl-C stops it", err=True)
        wait_for_signal()
    except OrchestratorError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(exit_code(e)) from None
    finally:
        if job is not None:
            job.stop()
        if server is not None:
            server.stop()
        if conn is not None:
            conn.close()
