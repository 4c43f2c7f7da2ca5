"""``orchestrator k8s``: render, apply, status and delete of the KubeRay deployment.

Thin: each command loads the config (``config.py``), renders (``render.py``)
and hands the objects to the client (``client.py``); this module only prints.
Exit codes as the main CLI: 0 ok; 1 the operation failed or timed out; 2 bad
input (the message names the field and what is allowed); 3 the API server is
not reachable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from orchestrator.cli.options import Output, output_format, render as render_doc
from orchestrator.core.errors import InvalidRequestError, OrchestratorError, exit_code
from orchestrator.deploy.k8s.config import K8sConfig, load_config

app = typer.Typer(
    help="Deploy on Kubernetes through KubeRay: render the manifests from one config, apply, watch, delete.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

T = TypeVar("T")

CONFIG_OPT = typer.Option(Path("configs/k8s.yaml"), "--config", "-c", help="The deployment config (pydantic, see docs/kubernetes.md)")
# No short form: -o is --output, the output format, on every command.
OVERLAY_OPT = typer.Option(None, "--overlay", help="Use this overlay of the config instead of the base")
KUBECONFIG_OPT = typer.Option(None, "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
CONTEXT_OPT = typer.Option(None, "--context", help="kubeconfig context")
JSON_OPT = typer.Option(False, "--json", help="Print one JSON object on stdout (progress on stderr)")


def _console(as_json: bool = False) -> Console:
    """Where a command's human output goes: stdout, or stderr when stdout is the JSON object's."""
    return Console(highlight=False, soft_wrap=True, stderr=as_json)


def _run(fn: Callable[[], T], fmt: str = "table") -> T:
    """Run a command body, mapping typed errors to exit codes and one readable line (and, with ``-o json|yaml``
    or ``--json``, the error as the one document on stdout)."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        return fn()
    except OrchestratorError as e:
        if fmt != "table":
            _out(fmt, e.to_dict())
        err.print(f"error: {e}")
        raise typer.Exit(exit_code(e)) from None


def _format(output: Optional[str], as_json: bool) -> str:
    """``-o/--output`` and ``--json`` as one format (cli/options.py's grammar); bad input exits 2 before anything."""
    return _run(lambda: output_format(output, as_json), "json" if as_json or output == "json" else "table")


def _out(fmt: str, value: Any) -> None:
    """The command's one document on stdout, as ``fmt`` (json or yaml)."""
    typer.echo(render_doc(value, fmt))


def _results_json(results: Any) -> list[dict[str, Any]]:
    return [{"kind": r.kind, "name": r.name, "namespace": r.namespace, "action": r.action, "reason": r.reason}
            for r in results]


def _status_json(st: Any) -> dict[str, Any]:
    import dataclasses

    return {**dataclasses.asdict(st), "ready": st.ready}


def _pick(config: Path, overlay: Optional[str]) -> K8sConfig:
    base, overlays = load_config(config)
    if overlay is None:
        return base
    if overlay not in overlays:
        raise InvalidRequestError("--overlay", overlay, sorted(overlays) or ["(none declared)"],
                                  detail=f"no such overlay in {config}")
    return overlays[overlay]


def _client(kubeconfig: Optional[Path], context: Optional[str]):  # -> KubeRayClient
    from orchestrator.deploy.k8s.client import KubeRayClient

    return KubeRayClient.from_kubeconfig(str(kubeconfig) if kubeconfig else None, context)


def _results_table(title: str, results) -> Table:
    t = Table(title=title, show_lines=False)
    for col in ("kind", "name", "namespace", "action", "reason"):
        t.add_column(col, overflow="fold")
    for r in results:
        t.add_row(r.kind, r.name, r.namespace or "-", r.action, r.reason)
    return t


def _prerequisites(base: K8sConfig, overlays: dict[str, K8sConfig], overlay: Optional[str],
                   kubeconfig: Optional[Path], context: Optional[str]) -> list:  # -> list[prereqs.Finding]
    """Each render's prerequisites, checked against the cluster the kubeconfig names (``--kubeconfig`` or
    ``$KUBECONFIG``; never a default file: a check offline must not reach for some cluster), else unchecked."""
    import os

    from orchestrator.deploy.k8s.prereqs import check_all
    from orchestrator.deploy.k8s.render import render_objects

    if overlay is not None and overlay not in overlays:
        raise InvalidRequestError("--overlay", overlay, sorted(overlays) or ["(none declared)"])
    picked = {overlay: overlays[overlay]} if overlay else {"base": base, **overlays}
    renders = {label: (cfg, render_objects(cfg)) for label, cfg in picked.items()}
    source = str(kubeconfig) if kubeconfig else os.environ.get("KUBECONFIG")
    if not source:
        return check_all(renders, None, "offline: no cluster to ask (set KUBECONFIG or pass --kubeconfig)")
    try:
        cluster = _client(Path(source), context)
    except OrchestratorError as e:  # unreachable, bad kubeconfig, or the k8s extra not installed
        return check_all(renders, None, f"not checked: {e}")
    return check_all(renders, cluster)


def _prerequisites_table(findings: list) -> Table:
    t = Table(title="prerequisites (docs/kubernetes.md, section 1)")
    for col in ("prerequisite", "needed by", "status", "detail", "how"):
        t.add_column(col, overflow="fold")
    for f in findings:
        t.add_row(f.what, ", ".join(f.needed_by), f.status, f.detail, "" if f.status == "ok" else f.how)
    return t


@app.command()
def render(
    config: Path = CONFIG_OPT,
    out: Path = typer.Option(..., "--out", help="Directory to write base/ and overlays/<name>/ into"),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 when DIR differs from a fresh render "
                               "or the cluster lacks a prerequisite (checked when KUBECONFIG names a cluster)"),
    overlay: Optional[str] = typer.Option(None, "--overlay", help="With --check: only this overlay's prerequisites"),
    kubeconfig: Optional[Path] = KUBECONFIG_OPT,
    context: Optional[str] = CONTEXT_OPT,
    as_json: bool = JSON_OPT,
    output: Output = None,
) -> None:
    """Write the kustomize tree (base plus one overlay per config overlay) from the config."""
    from orchestrator.deploy.k8s.render import render_tree, stale_files, write_tree

    fmt = _format(output, as_json)
    as_json = fmt != "table"

    def body() -> None:
        base, overlays = load_config(config)
        tree = render_tree(base, overlays)
        con = _console(as_json)
        if check:
            stale = stale_files(tree, out)
            findings = _prerequisites(base, overlays, overlay, kubeconfig, context)
            missing = [f for f in findings if f.status == "missing"]
            if as_json:
                _out(fmt, {"out": str(out), "files": len(tree), "matches": not stale, "stale": stale,
                                       "prerequisites": [f.to_dict() for f in findings]})
            con.print(_prerequisites_table(findings))
            if stale:
                con.print(f"{out} differs from a render of {config} in {len(stale)} file(s):")
                for rel in stale:
                    con.print(f"  {rel}")
                con.print(f"run: orchestrator k8s render --config {config} --out {out}")
            else:
                con.print(f"{out} matches {config} ({len(tree)} files)")
            if missing:
                con.print(f"the cluster lacks {len(missing)} prerequisite(s): {', '.join(f.key for f in missing)}")
            if stale or missing:
                raise typer.Exit(1)
            return
        written = write_tree(tree, out)
        con.print(f"wrote {len(written)} files under {out}: base/ and overlays/{{{','.join(sorted(overlays))}}}")
        con.print(f"apply with: kubectl apply --server-side -k {out}/overlays/<name>  (or: orchestrator k8s apply)")
        if as_json:
            _out(fmt, {"out": str(out), "written": [str(w) for w in written],
                                   "overlays": sorted(overlays)})

    _run(body, fmt)


@app.command()
def apply(
    config: Path = CONFIG_OPT,
    overlay: Optional[str] = OVERLAY_OPT,
    kubeconfig: Optional[Path] = KUBECONFIG_OPT,
    context: Optional[str] = CONTEXT_OPT,
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait for the RayCluster's status.state == ready"),
    timeout: float = typer.Option(900.0, "--timeout", min=1, help="Seconds to wait for ready"),
    poll: float = typer.Option(2.0, "--poll", min=0.0, help="Seconds between status polls"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Server-side dry run: validated by the server, nothing stored"),
    as_json: bool = JSON_OPT,
    output: Output = None,
) -> None:
    """Server-side apply of every rendered object, then wait for the RayCluster to be ready."""
    from orchestrator.deploy.k8s.client import ClusterStatus
    from orchestrator.deploy.k8s.render import render_checked

    fmt = _format(output, as_json)
    as_json = fmt != "table"

    def body() -> None:
        cfg = _pick(config, overlay)
        objs = render_checked(cfg, overlay or "the base")  # before connecting: a bad render never half-applies
        client = _client(kubeconfig, context)
        con = _console(as_json)
        results = client.apply(objs, dry_run=dry_run)
        con.print(_results_table(f"applied to {cfg.namespace} (field manager ray-gpu-orchestrator)", results))
        if not wait or dry_run:
            if as_json:
                _out(fmt, {"applied": _results_json(results), "dry_run": dry_run, "raycluster": None})
            return
        last: list[str] = []
        with con.status(f"waiting for RayCluster {cfg.name} to be ready") as spinner:
            def on_poll(st: ClusterStatus) -> None:
                line = st.summary()
                spinner.update(f"RayCluster {cfg.name}: {line}")
                if not last or last[-1] != line:  # print transitions only, not every poll
                    con.print(f"RayCluster {cfg.name}: {line}")
                    last.append(line)

            st = client.wait_ready(cfg.name, cfg.namespace, timeout_s=timeout, poll_s=poll, on_poll=on_poll)
        con.print(f"RayCluster {cfg.name} is ready: head {st.head_pod_ip or '?'}, "
                  f"{st.ready_workers}/{st.desired_workers} workers")
        if as_json:
            _out(fmt, {"applied": _results_json(results), "dry_run": False,
                                   "raycluster": _status_json(st)})

    _run(body, fmt)


@app.command()
def status(
    config: Path = CONFIG_OPT,
    overlay: Optional[str] = OVERLAY_OPT,
    kubeconfig: Optional[Path] = KUBECONFIG_OPT,
    context: Optional[str] = CONTEXT_OPT,
    nodes: bool = typer.Option(False, "--nodes", help="Also show each node's GPUs as its labels describe them"),
    as_json: bool = JSON_OPT,
    output: Output = None,
) -> None:
    """Which rendered objects exist, the RayCluster's state, and (``--nodes``) the GPU nodes' labels."""
    from orchestrator.deploy.k8s.render import render_objects

    fmt = _format(output, as_json)
    as_json = fmt != "table"

    def body() -> None:
        cfg = _pick(config, overlay)
        client = _client(kubeconfig, context)
        con = _console(as_json)
        objects = client.objects_status(render_objects(cfg))
        con.print(_results_table(f"objects of {cfg.name} in {cfg.namespace}", objects))
        st = client.cluster_status(cfg.name, cfg.namespace)
        con.print(f"RayCluster {cfg.name}: {st.summary()}")
        node_objs = client.list_nodes() if nodes else []
        if nodes:
            _print_nodes(con, node_objs)
        if as_json:
            _out(fmt, {"objects": _results_json(objects), "raycluster": _status_json(st),
                                   "nodes": [n["metadata"]["name"] for n in node_objs] if nodes else None})

    _run(body, fmt)


def _print_nodes(con: Console, node_objs: list[dict]) -> None:
    from orchestrator.deploy.k8s.inventory import MIG_CONFIG, SHARING, node_inventory

    t = Table(title="GPU nodes (from GPU feature discovery labels)")
    for col in ("node", "model", "GPUs", "MIG devices", "mig.config", "sharing", "problem"):
        t.add_column(col, overflow="fold")
    for n in node_objs:
        name = n["metadata"]["name"]
        try:
            inv = node_inventory(n)
        except InvalidRequestError as e:
            t.add_row(name, "?", "?", "?", "?", "?", str(e))
            continue
        if not inv.gpus:
            continue
        mig: dict[str, int] = {}
        for g in inv.gpus:
            for d in g.mig_devices:
                mig[d.profile] = mig.get(d.profile, 0) + 1
        t.add_row(name, inv.model or "-", str(len(inv.gpus)),
                  ", ".join(f"{v}x {k}" for k, v in sorted(mig.items())) or "-",
                  inv.labels.get(MIG_CONFIG, "-"), inv.labels.get(SHARING, "-"), "")
    con.print(t)


@app.command()
def delete(
    config: Path = CONFIG_OPT,
    overlay: Optional[str] = OVERLAY_OPT,
    kubeconfig: Optional[Path] = KUBECONFIG_OPT,
    context: Optional[str] = CONTEXT_OPT,
    include_namespace: bool = typer.Option(False, "--include-namespace", help="Delete the namespace too"),
    as_json: bool = JSON_OPT,
    output: Output = None,
) -> None:
    """Delete every rendered object (reverse order); objects already gone are fine."""
    from orchestrator.deploy.k8s.render import render_objects

    fmt = _format(output, as_json)
    as_json = fmt != "table"

    def body() -> None:
        cfg = _pick(config, overlay)
        client = _client(kubeconfig, context)
        results = client.delete(render_objects(cfg), include_namespace=include_namespace)
        _console(as_json).print(_results_table(f"deleted from {cfg.namespace}", results))
        if as_json:
            _out(fmt, {"deleted": _results_json(results)})

    _run(body, fmt)
