"""What each replay of the co-location day shares and how: the schemes, the default day, the training
backlog, ``ours``' time windows and MIG layouts.

The data is ``configs/colocation.schemes.yaml`` (the package ``orchestrator.resources.configs``, read
through :func:`orchestrator.core.datafiles.config_file`), read once when this module is imported; its
comments say why each value is what it is. Names:

* a *scheme* (:class:`Scheme`) is one way of sharing the cards, replayed once per invocation;
* the *day* (:data:`DEFAULT_DAY`) is ``(hour, requests per second)`` points, stretched into a
  ``jobs/loadgen.py`` ``RateCurve`` (:func:`default_curve`);
* the *backlog* (:data:`DEFAULT_TRAINING`) is the training runs that hold leases all day;
* :data:`WINDOWS` are scheduler time windows (the ``windows:`` of ``configs/priorities.yaml``) and
  :data:`MIG_TARGETS` the head's ``repartition_mig`` targets, one per window.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from orchestrator.core import datafiles
from orchestrator.core.errors import ConfigError
from orchestrator.core.request import GpuRequest
from orchestrator.core.yamlfile import read_yaml
from orchestrator.scenarios.actors import load_example

LOADGEN = datafiles.job_script("loadgen.py")
#: The scheme data the package ships (``configs/colocation.schemes.yaml``).
SCHEMES_FILE = datafiles.config_file("colocation.schemes.yaml")
DAY_S = 86_400.0
OPEN_ENDED = 10**9

Say = Callable[[str], None]


def load_loadgen() -> Any:
    """``jobs/loadgen.py`` as a module (an example, not part of the package)."""
    return load_example(LOADGEN, "rgo_example_loadgen")


@dataclass(frozen=True)
class TrainingJob:
    """One training run of the backlog: its seed (data and weights) and its request (a ``--gpu`` string)."""

    seed: int
    request: str


@dataclass(frozen=True)
class Scheme:
    """How one replay shares the cards; see :mod:`orchestrator.scenarios.colocation`."""

    name: str
    label: str
    inference_request: str
    load_driven: bool
    mig: str  # "live" (repartitioned by window), "static" (the config's layout), "off"
    windows: bool


@dataclass(frozen=True)
class SchemeData:
    """A whole ``colocation.schemes.yaml``."""

    schemes: dict[str, Scheme]
    day: tuple[tuple[float, float], ...]
    training: tuple[TrainingJob, ...]
    windows: tuple[dict[str, Any], ...]
    mig_targets: dict[str, dict[str, Any]]


def load_scheme_data(path: str | Path) -> SchemeData:
    """Read a scheme file; a missing key or a malformed entry is a :class:`ConfigError` naming it."""
    data = read_yaml(path, "colocation schemes")
    key = "schemes"
    try:
        schemes = {name: Scheme(name=name, **fields) for name, fields in data["schemes"].items()}
        key = "day"
        day = tuple((float(h), float(rps)) for h, rps in data["day"])
        key = "training"
        training = tuple(TrainingJob(int(t["seed"]), str(t["request"])) for t in data["training"])
        key = "windows"
        windows = tuple(dict(w) for w in data["windows"])
        key = "mig_targets"
        targets = {name: dict(t) for name, t in data["mig_targets"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ConfigError(key, str(path), f"the {key} of a colocation.schemes.yaml",
                          detail=f"{type(e).__name__}: {e}") from None
    for name, s in schemes.items():
        if s.mig not in ("live", "static", "off"):
            raise ConfigError(f"schemes.{name}.mig", s.mig, ("live", "static", "off"))
    return SchemeData(schemes, day, training, windows, targets)


_DATA = load_scheme_data(SCHEMES_FILE)
SCHEMES: dict[str, Scheme] = _DATA.schemes
#: The default day (requests per second at hours of the day). ``--load-curve`` replaces it.
DEFAULT_DAY = _DATA.day
#: The training backlog every replay runs.
DEFAULT_TRAINING = _DATA.training
#: ``ours``' time windows (queue quotas by time of day).
WINDOWS = _DATA.windows
#: ``ours``' MIG layout for each window, applied live when the window starts.
MIG_TARGETS = _DATA.mig_targets


def baseline_replicas(scheme: Scheme, peak: int, cfg: Any) -> int | None:
    """A baseline's service size all day: the peak ``ours`` needed (None for ``ours``, which follows the
    load). Static MIG gets no more than its fixed layout has slices of the replica's profile: asking for more
    would wait out the lease timeout for slices that cannot exist."""
    if scheme.load_driven:
        return None
    if scheme.mig == "static":
        return min(peak, static_slices(cfg, scheme.inference_request))
    return peak


def static_slices(cfg: Any, request: str) -> int:
    """How many MIG instances of ``request``'s profile (``mig:<profile>``) the cluster file's layout holds."""
    profile = GpuRequest.parse(request).profile  # None unless a MIG slice is asked for
    return sum(1 for n in cfg.nodes for slices in n.mig.values() for m in slices if m.profile == profile)


def default_curve() -> Any:
    lg = load_loadgen()
    return lg.RateCurve(tuple((h * 3600.0, float(r)) for h, r in DEFAULT_DAY), "day")
