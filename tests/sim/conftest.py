from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core import datafiles

TINY = datafiles.openb_sample()[0].parent


@pytest.fixture
def tiny() -> tuple[Path, Path]:
    """The hand-made trace the package ships, orchestrator/resources/openb_tiny (its README derives the right answers)."""
    return TINY / "nodes.csv", TINY / "pods.csv"


@pytest.fixture
def openb(shared_dir: Path) -> Path:
    d = shared_dir / "traces" / "openb"
    if not d.is_dir():
        pytest.skip(f"needs the openb trace in {d}")
    return d
