"""Keep loopback loopback in every Python process of a local orchestrator cluster.

Ray 2.60 rewrites ``127.0.0.1`` given as a bootstrap address to the host's
outward IP (``ray._private.services.resolve_ip_for_localhost``;
ray-project/ray#59110). Our own drivers undo that
(:func:`orchestrator.rayport.ray_api.keep_loopback`), but Ray starts Python
processes of its own -- the dashboard agent's job module, workers, job
drivers -- that call ``ray.init("127.0.0.1:PORT")`` and then try the outward
IP, where nothing listens: a job submitted through the job API hangs.

The launcher puts this folder first on ``PYTHONPATH`` of every raylet it
starts, so each Python process of the cluster imports this module at start-up
(Python's ``site`` imports ``sitecustomize``). It patches Ray's function when
``ray._private.services`` is first imported, and does nothing else. Only a
process with ``ORCHESTRATOR_KEEP_LOOPBACK=1`` in its environment is affected.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

_TARGET = "ray._private.services"
_LOOPBACK = {"127.0.0.1", "::1"}


def patch_services(services: object) -> None:
    """Make ``services.resolve_ip_for_localhost`` leave loopback addresses alone (idempotent)."""
    original = services.resolve_ip_for_localhost  # type: ignore[attr-defined]
    if getattr(original, "_rgo_keeps_loopback", False):
        return

    def resolve(host: str) -> str:
        if host in _LOOPBACK:
            return host
        if host == "localhost":
            return "127.0.0.1"
        return original(host)

    resolve._rgo_keeps_loopback = True  # type: ignore[attr-defined]
    services.resolve_ip_for_localhost = resolve  # type: ignore[attr-defined]


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds ``ray._private.services`` with the other finders, then patches it once it has run."""

    def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201 - the importlib protocol
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module):  # noqa: ANN001, ANN202
            exec_module(module)
            patch_services(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


if os.environ.get("ORCHESTRATOR_KEEP_LOOPBACK") == "1":
    if _TARGET in sys.modules:
        patch_services(sys.modules[_TARGET])
    else:
        sys.meta_path.insert(0, _PatchAfterImport())
