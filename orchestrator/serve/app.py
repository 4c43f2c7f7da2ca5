"""The inference service the KubeRay RayService runs: ``orchestrator.serve.app:app``.

A small, deterministic model (a two-layer MLP in numpy, weights from a fixed
seed) behind Ray Serve's HTTP proxy. ``POST /`` with ``{"inputs": [[...32
floats...], ...]}`` answers ``{"outputs": [...], "devices": "<CUDA_VISIBLE_DEVICES>"}``,
so a deployment shows which GPU or MIG slice its replica was given. It stands
for the latency-sensitive work that the ``inference`` priority class protects;
swap in a real model by pointing the RayService's ``import_path`` elsewhere.

Importing this module builds the Serve application graph only (``bind``);
it starts nothing and needs no running Ray.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from ray import serve

INPUT_WIDTH = 32


class Model:
    """The model itself, plain Python (testable without Serve)."""

    def __init__(self, width: int = 256, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.w1 = rng.standard_normal((INPUT_WIDTH, width)).astype(np.float32) / np.sqrt(INPUT_WIDTH)
        self.w2 = rng.standard_normal((width, 1)).astype(np.float32) / np.sqrt(width)

    def predict(self, inputs: Any) -> list[float]:
        x = np.asarray(inputs, dtype=np.float32)
        if x.ndim == 1:
            x = x[None, :]
        if x.ndim != 2 or x.shape[1] != INPUT_WIDTH:
            raise ValueError(f"inputs must be rows of {INPUT_WIDTH} numbers, got shape {list(x.shape)}")
        return (np.tanh(x @ self.w1) @ self.w2)[:, 0].tolist()


@serve.deployment(ray_actor_options={"num_cpus": 0.5})
class InferenceService:
    def __init__(self, width: int = 256, seed: int = 0) -> None:
        self.model = Model(width, seed)

    async def __call__(self, request: Any) -> dict[str, Any]:
        body = await request.json()
        try:
            outputs = self.model.predict(body.get("inputs"))
        except (ValueError, TypeError) as e:
            return {"error": str(e)}
        return {"outputs": outputs, "devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}


app = InferenceService.bind()
