"""The package installs anywhere: every package is in the wheel, data files come from the package itself.

The end-to-end proof -- the wheel built, installed into a fresh venv outside the checkout, and
``orchestrator demo --headless`` run from there without the extras -- is
tests/integration/test_wheel_demo.py; these are the quick checks of the parts.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from setuptools import find_namespace_packages

from orchestrator.core import datafiles
from orchestrator.core.config import DEMO_CONFIG, load_config
from orchestrator.core.errors import InvalidRequestError
from orchestrator.dashboard.compare import OPENB_FILES, default_trace, openb_trace

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_package_under_orchestrator_is_listed_for_the_wheel() -> None:
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = set(find_namespace_packages(str(REPO), include=["orchestrator*"], exclude=["orchestrator.resources.*"]))
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    mapped = PYPROJECT["tool"]["setuptools"]["package-dir"]
    assert mapped == {"orchestrator.resources.configs": "configs", "orchestrator.resources.jobs": "jobs"}
    assert set(mapped) <= listed


def test_no_module_finds_its_data_by_walking_up_from_its_own_file() -> None:
    offenders = [f"{p.relative_to(REPO)}:{i}" for p in sorted((REPO / "orchestrator").rglob("*.py"))
                 for i, line in enumerate(p.read_text().splitlines(), 1) if "parents[" in line]
    assert offenders == []


def test_the_shipped_data_files_are_real_paths_that_load() -> None:
    assert DEMO_CONFIG == datafiles.config_file("cluster.demo.yaml") and DEMO_CONFIG.is_file()
    assert load_config(DEMO_CONFIG).gpu_count == 10  # its scheduler_file resolves beside it
    assert datafiles.job_script("train.py").read_text().startswith('"""A real, deterministic')
    nodes, pods = datafiles.openb_sample()
    assert nodes.read_text().splitlines()[0].startswith("sn,") and len(pods.read_text().splitlines()) == 8


@pytest.mark.parametrize("name", ["nope.yaml", "../pyproject.toml", "__init__.py/x"])
def test_an_unknown_data_file_is_a_typed_error_listing_what_is_shipped(name: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        datafiles.config_file(name)
    assert e.value.field == "config" and e.value.value == name
    assert "cluster.demo.yaml" in e.value.allowed and "__init__.py" not in e.value.allowed


def test_the_comparison_reads_the_packaged_sample_unless_the_user_names_an_openb_folder(tmp_path: Path) -> None:
    assert default_trace({}) == datafiles.openb_sample()
    with pytest.raises(InvalidRequestError) as e:
        default_trace({"ORCHESTRATOR_OPENB_DIR": str(tmp_path)})
    assert e.value.field == "ORCHESTRATOR_OPENB_DIR" and OPENB_FILES[1] in str(e.value)
    for name in OPENB_FILES:
        (tmp_path / name).write_text("")
    assert openb_trace(tmp_path) == default_trace({"ORCHESTRATOR_OPENB_DIR": str(tmp_path)}) == \
        (tmp_path / OPENB_FILES[0], tmp_path / OPENB_FILES[1])
