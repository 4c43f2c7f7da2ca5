"""Optional dependencies, and the one error that names the extra to install.

The package's runtime needs Ray, pydantic and a few small libraries; what only one surface uses is an
*extra* of ``pyproject.toml`` (``k8s``: the Kubernetes client; ``dashboard``: plotly; ``train``: torch and
Ray Train; ``serve``: Ray Serve; ``sim``: matplotlib). A module that needs one imports it through
:func:`require`, so a user without it reads which extra to install instead of a bare ``ImportError``.

Invariant: :func:`require` imports nothing but the module it is asked for.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from orchestrator.core.errors import MissingExtraError

#: extra -> what it adds (the message's hint); keep in step with ``[project.optional-dependencies]``.
EXTRAS: dict[str, str] = {
    "k8s": "the Kubernetes client (orchestrator k8s ...)",
    "dashboard": "plotly and matplotlib, for the dashboard's page and its report's charts",
    "train": "torch and Ray Train, for the training jobs and the gang scenario",
    "serve": "Ray Serve, for the co-location service",
    "sim": "matplotlib, for the simulator's charts",
}


def require(module: str, extra: str) -> ModuleType:
    """Import ``module``; when it is not installed raise :class:`MissingExtraError` naming ``extra``."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; known: {', '.join(EXTRAS)}")
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        if e.name is not None and e.name.split(".")[0] != top:
            raise  # the module is there but one of its own imports failed: not a missing extra
        raise MissingExtraError(module, extra, EXTRAS[extra]) from e
