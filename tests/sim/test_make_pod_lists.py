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


def test_multi_gpu_share_reached_with_copies_of_the_lists_own_multi_gpu_pods() -> None:
    def rows() -> list[dict[str, str]]:
        out = [{"name": f"openb-pod-{i:04d}", "cpu_milli": "4000", "num_gpu": "1", "gpu_milli": "1000"} for i in range(40)]
        out += [{"name": "openb-pod-0040", "cpu_milli": "90000", "num_gpu": "8", "gpu_milli": "1000"},
                {"name": "openb-pod-0041", "cpu_milli": "30000", "num_gpu": "2", "gpu_milli": "1000"}]
        return out
    out = mpl.with_multi_gpu(rows(), 0.5, np.random.default_rng(0))
    demand = lambda rs: sum(int(r["num_gpu"]) * int(r["gpu_milli"]) for r in rs)  # noqa: E731
    multi = [r for r in out if int(r["num_gpu"]) > 1]
    assert demand(multi) >= 0.5 * demand(out)
    assert demand(multi[:-1]) < 0.5 * (demand(out) - demand(multi[-1:]))  # stops at the first draw that reaches it
    assert out[:42] == rows()  # the source list, unchanged, first
    assert {(r["cpu_milli"], r["num_gpu"]) for r in out[42:]} <= {("90000", "8"), ("30000", "2")}
    assert len({r["name"] for r in out}) == len(out) and out[42]["name"] == "openb-pod-0042"
    assert out == mpl.with_multi_gpu(rows(), 0.5, np.random.default_rng(0))
