"""ray-gpu-orchestrator: a GPU workload orchestrator inside Ray.

The public API, imported on first use (PEP 562) so that ``import orchestrator``
stays light and never imports Ray:

* :class:`Client` -- submit jobs, list jobs, nodes, leases and the queue;
* :func:`lease` -- ``with orchestrator.lease(GpuRequest.mig("1g.10gb"), priority="training") as l:``
  takes devices from inside any Ray driver;
* :class:`JobSpec`, :class:`GpuRequest` -- what is asked for;
* :func:`job_context` -- the job side: checkpoint when asked.

``orchestrator.lease`` is also the name of a submodule (the lease state
machine). Importing a submodule binds it on its package, which would hide
the function; the package's ``lease`` attribute is therefore a property that
always answers the SDK's function, wrapped so that attribute access still
reaches the submodule (``orchestrator.lease.LeaseState``). ``from
orchestrator.lease import ...`` is unaffected.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

_LAZY = {
    "Client": "orchestrator.sdk",
    "JobHandle": "orchestrator.sdk",
    "Lease": "orchestrator.sdk",
    "JobSpec": "orchestrator.job",
    "GpuRequest": "orchestrator.model.request",
    "job_context": "orchestrator.context",
}

__all__ = sorted([*_LAZY, "lease"])


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _LeaseEntry:
    """``orchestrator.lease``: calls :func:`orchestrator.sdk.lease`; other attributes come from the submodule."""

    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from orchestrator.sdk import lease

        return lease(*args, **kwargs)

    @property
    def __doc__(self) -> str | None:  # type: ignore[override]  # help(orchestrator.lease) shows the SDK's
        from orchestrator.sdk import lease

        return lease.__doc__

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module("orchestrator.lease"), name)

    def __repr__(self) -> str:
        return "<function orchestrator.lease (orchestrator.sdk.lease)>"


class _Package(types.ModuleType):
    @property
    def lease(self) -> _LeaseEntry:
        return _LEASE

    @lease.setter
    def lease(self, submodule: Any) -> None:
        pass  # the import system binding orchestrator.lease (the submodule); it stays in sys.modules


_LEASE = _LeaseEntry()
sys.modules[__name__].__class__ = _Package
