"""The RayService's import path resolves to a Serve application, and its model answers (no Ray started)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_rayservice_import_path_is_a_serve_application() -> None:
    from ray.serve import Application

    from orchestrator.deploy.k8s.config import load_config

    base, overlays = load_config(REPO / "configs" / "k8s.yaml")
    for cfg in (base, *overlays.values()):
        module, _, attr = cfg.inference.import_path.partition(":")
        assert isinstance(getattr(importlib.import_module(module), attr), Application), cfg.inference.import_path


def test_the_model_is_deterministic_and_refuses_bad_shapes() -> None:
    from orchestrator.serve.app import INPUT_WIDTH, Model

    a, b = Model(seed=3), Model(seed=3)
    x = [[0.1 * i for i in range(INPUT_WIDTH)]] * 2
    assert a.predict(x) == b.predict(x) and len(a.predict(x)) == 2
    with pytest.raises(ValueError, match="rows of 32"):
        a.predict([[1.0, 2.0]])
