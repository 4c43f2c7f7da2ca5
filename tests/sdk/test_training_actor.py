"""jobs/train.py's TrainingActor as a plain object (no Ray): it yields at a step boundary, resumes from its
checkpoint, and its weights match an undisturbed run of the same number of steps, whatever the target was."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.scenarios.actors import load_train


@pytest.fixture(scope="module", autouse=True)
def _needs_torch() -> None:
    """Skips the module where torch is missing -- when it runs, not at collection: importing torch takes seconds
    of every xdist worker's collection, the worker that runs no test here too."""
    pytest.importorskip("torch", reason="the example trainer needs torch (the train extra)")


def _until(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_checkpoint_stops_it_at_a_step_boundary_and_a_resumed_one_ends_bit_identical(tmp_path: Path) -> None:
    train = load_train()
    first = train.TrainingActor(10**9, seed=3, step_delay_s=0.001)  # open-ended, as the scenario starts it
    _until(lambda: first.status()["step"] >= 20)
    path = first.checkpoint(str(tmp_path))
    stopped = first.status()["step"]
    time.sleep(0.05)
    assert first.status()["step"] == stopped and first.status()["checkpointed"] == path  # never stepped again
    meta = (Path(path + ".meta.json")).read_text()
    assert f'"step": {stopped}' in meta
    second = train.TrainingActor(10**9, seed=3, resume_from=path)
    assert second.status()["resumed_at"] == stopped
    assert second.set_steps(stopped + 30) == stopped + 30  # the rounds are over: finish 30 steps on
    _until(lambda: second.status()["done"])
    st = second.status()
    assert st["step"] == stopped + 30
    assert st["digest"] == train.run(stopped + 30, seed=3, log=lambda s: None)["digest"]
    assert second.set_steps(0) == stopped + 30  # never below the step reached


def test_a_rogue_one_never_answers(tmp_path: Path) -> None:
    import threading

    rogue = load_train().TrainingActor(300, seed=1, rogue=True, step_delay_s=0.001)
    answered = threading.Event()
    threading.Thread(target=lambda: (rogue.checkpoint(str(tmp_path)), answered.set()), daemon=True).start()
    assert not answered.wait(0.3) and not list(tmp_path.iterdir())
    _until(rogue.done)  # it trains on regardless (and its thread ends before the interpreter does)
    assert not answered.is_set()


def test_a_paced_actor_trains_at_the_modelled_step_time_whatever_its_compute_takes(monkeypatch) -> None:
    """``paced``: step_delay_s is the whole step (the workload model's time on the share), not a pause after it."""
    train = load_train()
    real_step = train.Trainer.train_step

    def slow_step(self):  # a step whose own compute takes 30 ms
        time.sleep(0.03)
        return real_step(self)

    monkeypatch.setattr(train.Trainer, "train_step", slow_step)
    warm = train.TrainingActor(1, seed=1)  # the first actor pays torch's start-up, not a step
    _until(lambda: warm.status()["done"])
    timings = {}
    for paced in (True, False):
        t0 = time.monotonic()  # before construction: the actor starts training in its constructor
        actor = train.TrainingActor(10, seed=1, step_delay_s=0.04, paced=paced)
        _until(lambda: actor.status()["done"])
        timings[paced] = time.monotonic() - t0
    assert timings[True] >= 10 * 0.04 * 0.95  # never faster than the model
    assert timings[True] < 10 * 0.055  # the compute is inside the step time ...
    assert timings[False] > 10 * 0.066  # ... and after it when unpaced
