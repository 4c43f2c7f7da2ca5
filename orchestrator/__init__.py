"""ray-gpu-orchestrator: a GPU workload orchestrator inside Ray.

The public API, imported on first use (PEP 562) so that ``import orchestrator``
stays light and never imports Ray:

* :class:`Client` -- submit jobs, list jobs, nodes, leases and the queue;
* :func:`lease` -- ``with orchestrator.lease(GpuRequest.mig("1g.10gb"), priority="training") as l:``
  takes devices from inside any Ray driver;
* :class:`JobSpec`, :class:`GpuRequest` -- what is asked for;
* :func:`job_context` -- the job side: checkpoint when asked.

The package's layers, each a folder whose ``__init__`` says what it may
import (``make test`` checks the direction with import-linter): ``core``
(vocabulary) < ``scheduling`` (pure decisions) < ``control`` (head and agent
logic, no Ray) < ``rayport`` (every Ray call) < ``sdk`` < ``deploy`` <
``sim``, ``bench``, ``serve``, ``scenarios`` < ``cli``. See docs/design.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Client": "orchestrator.sdk.jobs",
    "JobHandle": "orchestrator.sdk.jobs",
    "LeaseHandle": "orchestrator.sdk.leases",
    "lease": "orchestrator.sdk.leases",
    "JobSpec": "orchestrator.core.job",
    "GpuRequest": "orchestrator.core.request",
    "job_context": "orchestrator.sdk.context",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
