"""jobs/train_gang.py's data and loss do not depend on the world size: an elastic gang job resized between attempts
(a grow or a shrink through a checkpoint) trains on the same global batches with the same gradients, so it resumes
with no step lost and ends where an undisturbed run ends, to rounding. DDP is emulated here (per-rank gradients,
averaged, as its all-reduce does); no Ray."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the training example needs torch")

REPO = Path(__file__).resolve().parents[2]


def _train_gang() -> Any:
    spec = importlib.util.spec_from_file_location("rgo_train_gang_unit", REPO / "jobs" / "train_gang.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TG = _train_gang()


def _loss(model: Any, x: Any, y: Any, world: int) -> Any:
    """The loss train_loop computes on one rank (kept in step with it: the test below reads its source)."""
    return ((model(x) - y) ** 2).sum() * (world / TG.GLOBAL_BATCH)


def _steps(model: Any, opt: Any, start: int, stop: int, world: int, seed: int = 0) -> None:
    """Steps ``start..stop-1`` at ``world`` ranks: each rank's gradient of its loss, averaged (DDP), one SGD step."""
    for step in range(start, stop):
        grads = []
        for rank in range(world):
            model.zero_grad()
            x, y = TG._batch(seed, step, rank, world)
            _loss(model, x, y, world).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            p.grad = sum(g[i] for g in grads) / world
        opt.step()


def _fresh(seed: int = 0) -> tuple[Any, Any]:
    model = TG._model(seed)
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def test_the_loss_is_the_one_train_loop_computes() -> None:
    assert "((model(x) - y) ** 2).sum() * (world / GLOBAL_BATCH)" in (REPO / "jobs" / "train_gang.py").read_text()


def test_a_steps_parts_make_its_global_batch_at_any_world_size() -> None:
    whole_x, whole_y = TG._batch(0, 7, 0, 1)
    assert len(whole_x) == TG.GLOBAL_BATCH
    for world in (2, 3, 5, 64):  # uneven parts, and more ranks than samples (empty parts)
        parts = [TG._batch(0, 7, r, world) for r in range(world)]
        assert torch.equal(torch.cat([x for x, _ in parts]), whole_x)
        assert torch.equal(torch.cat([y for _, y in parts]), whole_y)


def test_resized_runs_lose_no_step_and_end_where_an_undisturbed_one_does() -> None:
    torch.set_num_threads(1)
    ref, ref_opt = _fresh()
    _steps(ref, ref_opt, 0, 40, world=1)
    # 2 workers, a grow to 5 (checkpoint: model, optimiser, step), then a shrink to 3: the same 40 steps
    model, opt = _fresh()
    _steps(model, opt, 0, 15, world=2)
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": 15}
    model, opt = _fresh(seed=123)  # a new attempt: fresh processes, then the checkpoint
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    _steps(model, opt, state["step"], 30, world=5)
    _steps(model, opt, 30, 40, world=3)
    for a, b in zip(ref.parameters(), model.parameters()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a - b).abs().max()
    again, again_opt = _fresh()
    _steps(again, again_opt, 0, 40, world=1)
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), again.parameters())), "same size: bit-identical"
