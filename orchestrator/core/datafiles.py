"""Where the package's data files are, wherever it is installed: a checkout, an editable install, a wheel.

Every data file is found through :mod:`importlib.resources` from the package that ships it
(:mod:`orchestrator.resources`), never by walking up from a module's ``__file__``: an installed package has
no repository around it. Names:

* a *config* is a file of ``orchestrator.resources.configs`` (the repository's ``configs/``);
* a *job script* is a file of ``orchestrator.resources.jobs`` (the repository's ``jobs/``);
* the *openb sample* is ``orchestrator/resources/openb_tiny`` (``nodes.csv``, ``pods.csv``).

Invariant: every function returns a real filesystem path, because what reads it needs one -- Ray runs a job
script by its path, a cluster file names its ``scheduler_file`` relative to its own folder. A package
imported from a zip has no such path, and :class:`NotOnDiskError` says so instead of handing back a path
that does not exist.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from orchestrator.core.errors import InvalidRequestError, OrchestratorError

CONFIGS = "orchestrator.resources.configs"
JOBS = "orchestrator.resources.jobs"
RESOURCES = "orchestrator.resources"


class NotOnDiskError(OrchestratorError):
    """The package ``package`` was imported from somewhere that is not a folder (``where``: a zip, a
    custom loader), so its data files have no path to hand to Ray or to a relative ``scheduler_file``.
    Install the package normally (``pip install ray-gpu-orchestrator``). Not retryable."""

    def __init__(self, package: str, where: str) -> None:
        self.package, self.where = package, where
        super().__init__(f"{package} is not a folder on disk ({where}); its data files need a real path: "
                         "install the package with pip rather than importing it from a zip")


def folder(package: str) -> Path:
    """The folder on disk of ``package`` (one of :data:`CONFIGS`, :data:`JOBS`, :data:`RESOURCES`)."""
    root = resources.files(package)
    if not isinstance(root, Path):
        raise NotOnDiskError(package, repr(root))
    return root


def _file(package: str, field: str, name: str) -> Path:
    base = folder(package)
    p = base / name
    if Path(name).is_absolute() or ".." in Path(name).parts or not p.is_file():
        shipped = sorted(f.name for f in base.iterdir() if f.is_file() and not f.name.startswith(("_", ".")))
        raise InvalidRequestError(field, name, shipped, f"no such file in {package} ({base})")
    return p


def config_file(name: str) -> Path:
    """A config the package ships, e.g. ``config_file("cluster.demo.yaml")``."""
    return _file(CONFIGS, "config", name)


def job_script(name: str) -> Path:
    """An example job script the package ships, e.g. ``job_script("train.py")``: a real path Ray can run."""
    return _file(JOBS, "job", name)


def openb_sample() -> tuple[Path, Path]:
    """(nodes, pods) of the openb sample the package ships (``openb_tiny``: three nodes, seven pods)."""
    base = folder(RESOURCES) / "openb_tiny"
    return base / "nodes.csv", base / "pods.csv"
