"""The suite's own scheduling (tests/conftest.py): under ``make test``'s ``--dist loadfile`` the longest modules are
handed out first, so a renamed or split module must not drop out of that list unnoticed, and pytest-xdist must
not put its own order (most tests first) over it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def conftest(pytestconfig: pytest.Config) -> Any:
    """The suite's root conftest module as pytest loaded it (``import conftest`` finds whichever ``conftest`` a
    worker imported first -- tests/runtime's or tests/integration's under ``-n 2``)."""
    module = pytestconfig.pluginmanager.get_plugin(str(REPO / "tests" / "conftest.py"))
    assert module is not None, "pytest did not load tests/conftest.py"
    return module


def test_every_long_first_module_exists(conftest: Any) -> None:
    missing = [m for m in conftest._LONG_FIRST if not (REPO / m).is_file()]
    assert not missing, f"tests/conftest.py _LONG_FIRST names modules that are not there: {missing}"
    assert len(set(conftest._LONG_FIRST)) == len(conftest._LONG_FIRST)


def test_xdist_keeps_the_suites_order(pytestconfig: pytest.Config) -> None:
    pytest.importorskip("xdist")
    assert pytestconfig.option.loadscopereorder is False


def test_the_long_first_modules_come_first_in_their_order(conftest: Any) -> None:
    class Item:
        def __init__(self, nodeid: str) -> None:
            self.nodeid = nodeid

    items = [Item("tests/unit/test_a.py::t"), *(Item(f"{m}::t") for m in reversed(conftest._LONG_FIRST)),
             Item("tests/unit/test_b.py::t")]
    conftest.pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [i.nodeid.split("::")[0] for i in items] == [*conftest._LONG_FIRST, "tests/unit/test_a.py",
                                                         "tests/unit/test_b.py"]
