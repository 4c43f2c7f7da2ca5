"""bench/make_pod_lists.py: exact constrained share, servable specs only, capped CPU scaling, seeded."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

_PATH = Path(__file__).resolve().parents[2] / "bench" / "make_pod_lists.py"
_spec = importlib.util.spec_from_file_location("make_pod_lists", _PATH)
assert _spec is not None and _spec.loader is not None
mpl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mpl)


def _pods() -> list[dict[str, str]]:
    rows = [{"name": f"p{i}", "cpu_milli": "4000", "num_gpu": "1", "gpu_spec": ""} for i in range(40)]
    rows += [{"name": "big", "cpu_milli": "90000", "num_gpu": "8", "gpu_spec": ""},
             {"name": "cpu", "cpu_milli": "2000", "num_gpu": "0", "gpu_spec": ""}]
    return rows


def test_specs_exact_share_servable_and_seeded() -> None:
    mix = [("T4", 10), ("G2", 5)]
    biggest = {"T4": 2, "G2": 8}  # no T4 node holds 8 GPUs
    for seed in range(5):
        out = mpl.with_specs(_pods(), 0.5, mix, biggest, np.random.default_rng(seed))
        named = [r for r in out if r["gpu_spec"]]
        assert len(named) == round(0.5 * 41)
        assert all(r["gpu_spec"] != "T4" for r in out if r["num_gpu"] == "8")
        assert out[-1]["gpu_spec"] == ""  # CPU-only pods are left alone
        again = mpl.with_specs(_pods(), 0.5, mix, biggest, np.random.default_rng(seed))
        assert out == again


def test_cpu_scale_is_capped_at_the_largest_node() -> None:
    out = mpl.with_cpu_scale(_pods(), 3, cap=128000)
    assert out[0]["cpu_milli"] == "12000" and out[40]["cpu_milli"] == "128000" and out[41]["cpu_milli"] == "6000"
