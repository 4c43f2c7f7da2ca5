"""``orchestrator bench ...``: benchmarks that print figures."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from orchestrator.cli.options import Output, emit, output_format
from orchestrator.core.errors import InvalidRequestError

#: ``orchestrator bench``: the main app mounts it (``cli/main.py``).
app = typer.Typer(help="Benchmarks that print figures (not tests).", no_args_is_help=True)


@app.command("placement")
def placement(
    nodes: int = typer.Option(5000, min=1, help="Nodes of 8 GPUs each"),
    policy: str = typer.Option("default", help="Placement policy"),
    seed: int = typer.Option(0, help="Seed of the cluster mix and the request stream"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (as -o json)"),
    output: Output = None,
    reference: str = typer.Option("random", help="Policy run after it in the same process; its speed is the "
                                                 "yardstick (ratio_to_reference) that the machine does not move"),
) -> None:
    """Fill a synthetic cluster with an openb-like request stream and time every decision."""
    from orchestrator.bench.placement import run_with_reference

    try:
        fmt = output_format(output, as_json)
    except InvalidRequestError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    res = run_with_reference(nodes, policy, seed, reference)
    if fmt != "table":
        emit(res, fmt, sort_keys=False)
        return
    t = Table(title=f"placement benchmark: {res['nodes']} nodes, {res['gpus']} GPUs, policy {res['policy']} "
                    f"(reference: {res['reference_policy']})")
    for k, v in res.items():
        t.add_row(k, str(v))
    Console().print(t)
