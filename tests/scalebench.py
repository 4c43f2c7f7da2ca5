"""``bench/scale.py`` as a module, loaded once for every test that drives the head the way the bench does
(a bench is a script, not part of the package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "bench" / "scale.py"
_spec = importlib.util.spec_from_file_location("scale_bench", _PATH)
assert _spec is not None and _spec.loader is not None
scale = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = scale  # its dataclasses look their module up
_spec.loader.exec_module(scale)
