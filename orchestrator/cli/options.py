"""Options every command that reaches a cluster shares.

``--connect-timeout SECONDS`` bounds finding the cluster (default
``$ORCHESTRATOR_CONNECT_TIMEOUT_S``, else 10 s): the option stands for that
variable, so it reaches the SDK's connect through the one place it reads
(:func:`orchestrator.rayport.ray_api.connect_timeout_s`), and it is set only
while the command runs.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Annotated, Iterator, Optional

import typer

from orchestrator.core import env as E

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
