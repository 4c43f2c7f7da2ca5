"""``orchestrator dashboard``: serve the live page for a running cluster until Ctrl-C, SIGTERM or SIGHUP.

Finds the head as every command does (``--address``, the state file, ``auto``;
``--ray-namespace``),
serves on 127.0.0.1 (``--host`` elsewhere needs a token: the page's own, made here and written 0600 to
``<state dir>/dashboard.token`` unless ``--token-file`` names one; the page asks for it in a form, never in a
URL), prints the URL, and on a signal stops the server,
the poller, the comparison's child process and its Ray connection -- everything
it started. Exit codes: 0 stopped by a signal; 2 bad input (names the field);
3 the orchestrator is not reachable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from orchestrator.cli.options import ConnectTimeout, OldNamespace, RayNamespace, ray_namespace
from orchestrator.core.errors import InvalidRequestError, OrchestratorError, exit_code
from orchestrator.core.statefile import checked_state_dir, default_state_dir

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def dashboard(
    port: int = typer.Option(8090, "--port", "-p", help="Port to serve on (0: any free one)"),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; anything but loopback needs a token"),
    token_file: Optional[Path] = typer.Option(None, "--token-file", help="File holding the token the page requires "
                                              "(default: none on loopback; elsewhere a new one, written 0600 to "
                                              "<state dir>/dashboard.token)"),
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
        token = _read_token(token_file) if token_file is not None else None
        token = resolve_token(host, token)  # bad input is refused before anything starts
        namespace = ray_namespace(namespace, old_namespace)
        conn = open_connection(address, namespace=namespace, state_dir=state_dir, connect_timeout_s=connect_timeout_s)
        comparison = Comparison()
        server = DashboardServer(conn.head, host=host, port=port, token=token, poll_s=poll_s, comparison=comparison)
        if compare:
            job = ComparisonJob(comparison).start()
        server.start()
        typer.echo(server.url)
        if server.token and token_file is None:
            where = _write_token(state_dir or default_state_dir(), server.token)
            typer.echo(f"the page asks for its token (sign in at {server.url}login): it is in {where}", err=True)
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


def _read_token(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError as e:
        raise InvalidRequestError("token_file", str(path), "a readable file holding the token", detail=str(e)) from None
    if not 16 <= len(text) <= 256:
        raise InvalidRequestError("token_file", str(path), "a file holding a token of 16 to 256 characters")
    return text


def _write_token(state_dir: Path, token: str) -> Path:
    """``token`` in ``<state_dir>/dashboard.token``, 0600, in the user's own 0700 state folder."""
    import os

    checked_state_dir(state_dir, create=True)
    path = state_dir / "dashboard.token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)
    return path
