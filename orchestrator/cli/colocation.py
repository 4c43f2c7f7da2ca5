"""``orchestrator demo --scenario colocation``: the co-location day, ours against the usual schemes.

Runs :mod:`orchestrator.scenarios.colocation` on the demo cluster (started in a
temporary state folder, stopped at the end, also on Ctrl-C, SIGTERM and
SIGHUP), progress on stderr, and prints one JSON object last (``-o json``,
``--json``; ``-o yaml`` the same as YAML) or a table of every scheme's figures. ``--load-curve FILE`` replays a CSV of
``seconds,requests_per_s`` (curve seconds, 0 to 86400) instead of the
default day; ``--day-seconds`` sets how long the compressed day takes.
Exit codes: 0 done; 1 a replay failed; 2 bad input (names the field).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import typer

from orchestrator.cli.options import emit
from orchestrator.core.jsonout import stdout_to_stderr


def run_command(*, load_curve: Path | None, day_seconds: float, schemes: str, config: Path | None,
                fmt: str, headless: bool, out: Path, state_dir: Path | None, say: Callable[[str], None],
                console: Any) -> None:
    from orchestrator.core.colocation import DEFAULT_COLOCATION, load_colocation
    from orchestrator.core.errors import OrchestratorError
    from orchestrator.scenarios import colocation as sc

    try:
        cc = load_colocation(config or DEFAULT_COLOCATION)
        names = tuple(s.strip() for s in schemes.split(",") if s.strip())
        bad = [n for n in names if n not in sc.SCHEMES]
        if bad or not names:
            raise OrchestratorError(f"invalid schemes={schemes!r} (allowed: {', '.join(sc.SCHEMES)}, comma-separated)")
        curve = sc.load_loadgen().read_csv(load_curve) if load_curve is not None else None
    except OrchestratorError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    day = sc.DayConfig(day_s=day_seconds, curve=curve)
    with stdout_to_stderr(fmt != "table"):
        figures = sc.run_colocation(day, cc.service, say, schemes=names, state_dir=state_dir,
                                    keep=state_dir is not None, out_dir=None if headless else out)
    if fmt != "table":
        emit(figures, fmt, sort_keys=False)
        return
    from rich.table import Table

    rows = {"ours": figures, **figures.get("baselines", {})}
    t = Table(title="co-location day")
    t.add_column("figure")
    for name in rows:
        t.add_column(name, justify="right")
    keys = [k for k in figures if k not in ("baselines", "scheme")]
    for k in keys:
        t.add_row(k, *(str(rows[n].get(k)) for n in rows))
    console.print(t)
