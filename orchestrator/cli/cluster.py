"""``orchestrator up | down | status``: start, stop and look at the orchestrator on Ray.

Exit codes: 0 ok; 1 the operation failed; 2 bad input (the message names the
field) or an unknown object; 3 the orchestrator (or Ray) is not reachable, with
one line saying why: no cluster, a refused token, or no head (see
``--connect-timeout``). ``-o json`` (``--json``) prints exactly one JSON object
on stdout, ``-o yaml`` the same as YAML; progress and errors go to stderr.
``status`` finds the head in ``--ray-namespace`` (``--namespace`` is its
deprecated alias here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from orchestrator.cli.options import ConnectTimeout, OldNamespace, Output, RayNamespace, emit, output_format, ray_namespace
from orchestrator.core.errors import OrchestratorError, exit_code
from orchestrator.core.jsonout import stdout_to_stderr

app = typer.Typer(help="Start, stop and inspect the orchestrator on a Ray cluster.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)

_STATE_HELP = "Folder for everything `up` writes (state, logs, Ray session); default $ORCHESTRATOR_STATE_DIR or $TMPDIR/rgo-<uid>"


def _progress(msg: str) -> None:
    typer.echo(f"[orchestrator] {msg}", err=True)


def _fail(e: Exception, fmt: str = "table") -> "typer.Exit":
    """``e`` said on stderr (and, with ``-o json|yaml``, as that on stdout); the exit its kind maps to."""
    code = exit_code(e)
    if fmt != "table" and isinstance(e, OrchestratorError):
        emit(e.to_dict(), fmt)
    typer.echo(f"error: {e}", err=True)
    return typer.Exit(code)


def _format(output: Optional[str], as_json: bool) -> str:
    """``-o``/``--json``, checked: a bad one exits 2 naming ``output``."""
    try:
        return output_format(output, as_json)
    except OrchestratorError as e:
        raise _fail(e, "json" if as_json or output == "json" else "table") from None


def _state_dir(state_dir: Optional[Path]) -> Path:
    from orchestrator.core.statefile import default_state_dir

    return state_dir or default_state_dir()


@app.command()
def up(
    config: Path = typer.Option(None, "--config", "-c", help="Cluster file (default configs/cluster.demo.yaml)"),
    address: Optional[str] = typer.Option(None, "--address", help="Attach to a running Ray cluster ('auto' or host:port) instead of starting one"),
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help=_STATE_HELP),
    timeout: float = typer.Option(180.0, "--timeout", help="Seconds to wait for raylets and agents"),
    dashboard: bool = typer.Option(True, "--dashboard/--no-dashboard", help="Start Ray's dashboard and job API (on 127.0.0.1); jobs need it"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (progress stays on stderr; as -o json)"),
    output: Output = None,
) -> None:
    """Start a local Ray cluster from the cluster file (or attach to one), the head and the agents."""
    from orchestrator.core.config import DEMO_CONFIG, load_config
    from orchestrator.deploy import local as launcher

    fmt = _format(output, as_json)
    # SIGTERM and SIGHUP stop a bring-up as Ctrl-C does (up_local stops what it started); if `up` dies
    # anyway, its watchdog does (orchestrator/deploy/watchdog.py).
    launcher.interrupt_on_stop_signals()
    try:
        cfg = load_config(config or DEMO_CONFIG)
        sd = _state_dir(state_dir)
        if address:
            state = launcher.attach(cfg, address, sd, progress=_progress, timeout_s=timeout)
        else:
            state = launcher.up_local(cfg, sd, progress=_progress, timeout_s=timeout, dashboard=dashboard,
                                         outlive=True)  # until `down`; a watchdog stops it if `up` dies first
    except OrchestratorError as e:
        raise _fail(e, fmt) from None
    except KeyboardInterrupt:
        _progress("interrupted: stopped what up had started")
        raise typer.Exit(130) from None
    _progress(f"up in {state.up_seconds}s; state in {sd}")
    if fmt != "table":
        emit({"address": state.address, "namespace": state.namespace, "head_name": state.head_name,
              "state_dir": str(sd), "job_api": state.dashboard or None,
              "nodes": [p.node for p in state.processes], "attached": state.attached, "up_s": state.up_seconds}, fmt)
    else:
        typer.echo(state.address)


@app.command("env")
def env_(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of shell exports (as -o json)"),
    output: Output = None,
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help=_STATE_HELP),
) -> None:
    """Shell exports that make `python script.py` a driver of the cluster `up` started, its `num_gpus` work on
    leases: eval "$(orchestrator env)"."""
    import shlex

    from orchestrator.core.errors import NotConnectedError
    from orchestrator.core.statefile import State
    from orchestrator.deploy import local as launcher

    fmt = _format(output, as_json)  # table: shell exports
    sd = _state_dir(state_dir)
    state = State.load(sd)
    if state is None:
        raise _fail(NotConnectedError(f"no cluster started by `orchestrator up` in {sd}: run `orchestrator up` "
                                      "(or pass --state-dir)"), fmt) from None
    out = launcher.driver_env(state)
    if fmt != "table":
        emit(out, fmt)
    else:
        typer.echo("\n".join(f"export {k}={shlex.quote(v)}" for k, v in sorted(out.items())))


@app.command()
def down(
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help=_STATE_HELP),
    keep_logs: bool = typer.Option(False, "--keep-logs", help="Keep the state folder's logs"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (progress stays on stderr; as -o json)"),
    output: Output = None,
) -> None:
    """Stop exactly what `up` started (never `ray stop`)."""
    from orchestrator.deploy import local as launcher

    fmt = _format(output, as_json)
    try:
        report = launcher.down(_state_dir(state_dir), progress=_progress, keep_logs=keep_logs)
    except OrchestratorError as e:
        raise _fail(e, fmt) from None
    _progress(f"stopped raylets {report.terminated}; removed {report.removed}")
    if fmt != "table":
        emit({"stopped": report.terminated, "killed": report.killed, "actors": report.actors,
              "removed": report.removed}, fmt)


@app.command()
def status(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (as -o json)"),
    output: Output = None,
    address: Optional[str] = typer.Option(None, "--address", help="Ray address (default: the one `up` recorded, else auto)"),
    namespace: RayNamespace = None, old_namespace: OldNamespace = None,
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help=_STATE_HELP),
    connect_timeout_s: ConnectTimeout = None,
) -> None:
    """Nodes, GPUs (MIG slots included), health, leases and queue."""
    from orchestrator.deploy import local as launcher
    from orchestrator.sdk.connect import open_connection  # Ray loads only for commands that reach a cluster

    fmt = _format(output, as_json)
    try:
        namespace = ray_namespace(namespace, old_namespace)
    except OrchestratorError as e:
        raise _fail(e, fmt) from None
    sd = _state_dir(state_dir)
    state = launcher.load_state(sd)
    try:
        with stdout_to_stderr(fmt != "table"):  # stdout is the JSON's: what Ray's driver prints while connected is not
            conn = open_connection(address, namespace=namespace, state_dir=sd, connect_timeout_s=connect_timeout_s)
            try:
                data = conn.head.status()
            finally:
                conn.close()
    except OrchestratorError as e:
        raise _fail(e, fmt) from None
    if state is not None:
        data["cluster"] = launcher.describe(state)
    endpoints = data.get("endpoints") or {}
    data["metrics_url"] = endpoints.get("metrics_url")  # where Prometheus scrapes the head (None: not served)
    data["dashboard_url"] = endpoints.get("dashboard_url")  # a live `orchestrator dashboard`, if one runs
    if fmt != "table":
        emit(data, fmt)
    else:
        typer.echo(render_status(data))


def render_status(d: dict[str, Any]) -> str:
    """A short human view of ``status``. Pure."""
    lines = []
    for n in d["nodes"]:
        lines.append(f"node {n['name']}: {n['state']}  model={n['model']}  heartbeat {n['heartbeat_age_s']:.1f}s ago"
                     + (f"  ({n['reason']})" if n["state"] != "registered" else ""))
        for g in n["gpus"]:
            health = "ok" if g["healthy"] else f"UNHEALTHY ({g['health_reason']})"
            held = f"  leases: {', '.join(g['leases'])}" if g["leases"] else ""
            lines.append(f"  gpu {g['index']} {g['uuid']} {g['model']} {g['memory_mib']}MiB {health}{held}")
            for m in g["mig"]:
                lines.append(f"    mig {m['profile']}@{m['start']} {m['uuid']}" + (f"  lease: {m['lease']}" if m.get("lease") else ""))
    lines.append(f"leases ({len(d['leases'])}):")
    for le in d["leases"]:
        a = le.get("allocation") or {}
        where = f"{a.get('node')} gpu {a.get('gpu_indices')}" if a else "-"
        lines.append(f"  {le['lease_id']}: {le['state']}  {le['request']}  on {where}")
    lines.append(f"queue ({len(d['queue'])}):")
    for key in ("metrics_url", "dashboard_url"):
        if d.get(key):
            lines.insert(0, f"{key.replace('_url', '')}: {d[key]}")
    for q in d["queue"]:
        lines.append(f"  {q['lease_id']}: {q['request']} priority {q['priority']}" + (f"  -- {q['why_pending']}" if q.get("why_pending") else ""))
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    app()
