"""Test tiers (see docs/testing.md):

* unit and property tests: pure, fast; Ray must not start (an autouse fixture
  makes ``ray.init`` fail, as Ray Serve's unit tests do);
* ``@pytest.mark.ray`` tests start a real local Ray cluster on 127.0.0.1,
  shared per module;
* ``@pytest.mark.gpu`` / ``@pytest.mark.k8s`` need real hardware or a real
  cluster and skip with the reason when it is absent.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest
from headless import InProcessHead

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist (3.x) hands out a --dist loadfile run's modules most-tests-first unless told not to: that put the
    # longest modules, which have one or two tests each, last, and a worker ran one of them alone at the end.
    # The order is this file's (pytest_collection_modifyitems).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # The suite's own driver is the administrator of the heads it starts (start_head takes the starter's key), as
    # the process that ran `up` is -- in memory, as `up` does it, so the commands the tests run as subprocesses
    # find their own administrator key the way a user's would; the tests of who may call what use clients with
    # other credentials of their own. One user key for the suite and its subprocesses: they own the same jobs.
    import secrets

    from orchestrator.core.credentials import use_admin_key

    use_admin_key(secrets.token_urlsafe(32))
    os.environ.setdefault("ORCHESTRATOR_USER_KEY", secrets.token_urlsafe(32))


#: The modules that take longest, longest first (each one to three minutes on 2 cores): `make test` runs two workers
#: that each take a whole module at a time, and a long module started last would leave one worker running it alone
#: at the end; handed out longest first, the last modules are the short ones, which even the two workers out. By
#: time measured one module at a time (issue #35 item 7); the others keep their order.
_LONG_FIRST = ("tests/integration/test_elastic_train.py", "tests/integration/test_gang_train.py", "tests/integration/test_native.py",
               "tests/integration/test_signals.py", "tests/integration/test_up_down.py",
               "tests/integration/test_chaos.py", "tests/integration/test_wheel_demo.py",
               "tests/integration/test_revocation.py", "tests/integration/test_load.py",
               "tests/integration/test_dashboard.py", "tests/integration/test_preemption_scenario.py",
               "tests/runtime/test_colocation_sim_days.py", "tests/integration/test_submission.py",
               "tests/integration/test_fuzz_head.py", "tests/integration/test_connect.py",
               "tests/integration/test_runtime.py", "tests/integration/test_fairness.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {m: i for i, m in enumerate(_LONG_FIRST)}
    items.sort(key=lambda it: rank.get(it.nodeid.split("::")[0], len(rank)))  # stable


@pytest.fixture(autouse=True)
def _forbid_ray_in_unit_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("ray") is not None:
        return
    try:
        import ray
    except ImportError:  # pragma: no cover
        return

    def _fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("unit tests must not start Ray: mark the test @pytest.mark.ray to use a real cluster")

    monkeypatch.setattr(ray, "init", _fail)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared`` beside the checkout; tests that need it skip when a fresh clone has none."""
    if not SHARED.is_dir():
        pytest.skip(f"needs ../shared (not present beside {REPO}): a fresh clone has no shared/ folder")
    return SHARED


@pytest.fixture
def head(tmp_path: Path) -> Iterator[InProcessHead]:
    """The real head in-process on the demo cluster (``tests/headless.py``); modules with a Ray cluster
    define their own ``head``."""
    h = InProcessHead(workdir=tmp_path / "head")
    yield h
    h.close()
