"""Options every command that reaches a cluster shares.

``--connect-timeout SECONDS`` bounds finding the cluster (default
``$ORCHESTRATOR_CONNECT_TIMEOUT_S``, else 10 s): the option stands for that
variable, so it reaches the SDK's connect through the one place it reads
(:func:`orchestrator.rayport.ray_api.connect_timeout_s`), and it is set only
while the command runs.

``-o/--output FORMAT`` is the output format, as kubectl's, on every command that prints a result:
``table`` (the default: the command's human view, a table or text), ``json`` (``--json`` is ``-o json``: one
JSON value on stdout, progress and errors on stderr) or ``yaml`` (the same value as YAML). ``-o`` means
nothing else on any command.

``--ray-namespace`` is Ray's namespace of the orchestrator's head; ``--namespace`` is Kubernetes' (``orchestrator
k8s``). On the other commands ``--namespace`` is a hidden, deprecated alias of ``--ray-namespace`` that says so on
stderr.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import Annotated, Any, Iterator, Optional

import typer

from orchestrator.core import env as E
from orchestrator.core.errors import InvalidRequestError

ConnectTimeout = Annotated[Optional[float], typer.Option(
    "--connect-timeout", min=0.1, max=3600.0,
    help=f"Seconds finding the cluster may take before saying why not (default ${E.CONNECT_TIMEOUT_S}, else 10)")]


@contextmanager
def connect_timeout(seconds: Optional[float]) -> Iterator[None]:
    """``ORCHESTRATOR_CONNECT_TIMEOUT_S`` set to ``seconds`` (when given) for the duration of the block."""
    if seconds is None:
        yield
        return
    saved = os.environ.get(E.CONNECT_TIMEOUT_S)
    os.environ[E.CONNECT_TIMEOUT_S] = repr(float(seconds))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(E.CONNECT_TIMEOUT_S, None)
        else:
            os.environ[E.CONNECT_TIMEOUT_S] = saved


#: What ``-o/--output`` takes; ``table`` is every command's default.
OUTPUT_FORMATS = ("table", "json", "yaml")

Output = Annotated[Optional[str], typer.Option(
    "--output", "-o", metavar="FORMAT", show_default=False,
    help="Output format: table (the default), json (as --json) or yaml")]


def output_format(output: Optional[str], as_json: bool) -> str:
    """The format ``-o/--output`` and ``--json`` ask for: one of :data:`OUTPUT_FORMATS`. ``--json`` is ``-o json``;
    with another ``-o`` it is a contradiction. Raises ``InvalidRequestError`` naming ``output``."""
    if output is None:
        return "json" if as_json else "table"
    if output not in OUTPUT_FORMATS:
        raise InvalidRequestError("output", output, OUTPUT_FORMATS)
    if as_json and output != "json":
        raise InvalidRequestError("output", output, "json alone with --json (--json is -o json)")
    return output


def render(value: Any, fmt: str, *, indent: Optional[int] = None, sort_keys: bool = True) -> str:
    """``value`` as ``json`` or ``yaml`` (the same data: what JSON cannot hold is written as text in both)."""
    text = json.dumps(value, sort_keys=sort_keys, default=str, indent=indent)
    if fmt == "yaml":
        import yaml

        return yaml.safe_dump(json.loads(text), sort_keys=sort_keys, default_flow_style=False,
                              allow_unicode=True).rstrip("\n")
    return text


def emit(value: Any, fmt: str, *, indent: Optional[int] = None, sort_keys: bool = True) -> None:
    """Print ``value`` on stdout in ``fmt`` (``json`` or ``yaml``)."""
    typer.echo(render(value, fmt, indent=indent, sort_keys=sort_keys))


RayNamespace = Annotated[Optional[str], typer.Option(
    "--ray-namespace", show_default=False,
    help="Ray namespace of the orchestrator's head (default: the one `up` recorded, else rgo)")]
OldNamespace = Annotated[Optional[str], typer.Option(
    "--namespace", hidden=True, show_default=False, help="Deprecated: --ray-namespace")]


def ray_namespace(new: Optional[str], old: Optional[str]) -> Optional[str]:
    """The Ray namespace ``--ray-namespace`` or its deprecated alias ``--namespace`` gave (the alias warns on
    stderr). Both, with different values: ``InvalidRequestError`` naming ``ray_namespace``."""
    if old is None:
        return new
    typer.echo("warning: --namespace is deprecated here: use --ray-namespace (--namespace is Kubernetes' "
               "namespace, on `orchestrator k8s`)", err=True)
    if new is not None and new != old:
        raise InvalidRequestError("ray_namespace", new, f"one Ray namespace: --namespace (deprecated) gave {old!r}")
    return new if new is not None else old
