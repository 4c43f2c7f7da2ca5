"""The leased service's in-process parts (no Ray started): a replica's modelled service time on its share,
its counters, and the ingress's least-loaded routing, drain and smoothed load signal."""

from __future__ import annotations

import asyncio
import time

import pytest

from orchestrator.core import env as E
from orchestrator.serve.leased import INPUT_WIDTH, LoadMeter, ReplicaCore
from orchestrator.sim.perfmodel import InferenceModel, ShareSpeed

ROW = [[0.01 * i for i in range(INPUT_WIDTH)]]
MIG_1G = {E.SHARE_KIND: "mig", E.MIG_PROFILE: "1g.10gb", E.CUDA_VISIBLE_DEVICES: "MIG-abc"}
WHOLE = {E.CUDA_VISIBLE_DEVICES: "GPU-abc"}


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, s: float) -> None:
        self.calls.append(s)


def test_a_batch_on_a_simulated_share_takes_the_modelled_time_and_counts_useful_gpu_time() -> None:
    sleeps = Sleeps()
    model = InferenceModel(base_ms=1000, per_item_ms=10)  # long enough that a busy CPU's real compute fits inside
    core = ReplicaCore("svc-r1", environ=MIG_1G, simulated=True, sleep=sleeps, model=model)
    out = asyncio.run(core.run_batch([ROW, ROW, ROW, ROW]))
    want = model.batch_s(4, ShareSpeed.mig("1g.10gb"))
    assert want == pytest.approx(1.040 * 0.16 * 7)  # 4 items need 16 % of the SMs: stretched on a 1g slice
    assert len(out) == 4 and out[0] == out[3] and isinstance(out[0][0], float)
    assert len(sleeps.calls) == 1 and want - 0.5 < sleeps.calls[0] <= want  # the rest of the modelled time
    st = core.stats()
    assert (st["kind"], st["requests"], st["batches"]) == ("mig", 4, 1)
    assert st["busy_s"] == pytest.approx(want) and st["useful_gpu_s"] == pytest.approx(model.useful_gpu_s(4))


def test_a_1g_slice_serves_a_small_batch_as_fast_as_a_whole_card_and_a_big_one_slower() -> None:
    def modelled(environ: dict[str, str], n: int) -> float:
        core = ReplicaCore("r", environ=environ, simulated=True, sleep=Sleeps())
        asyncio.run(core.run_batch([ROW] * n))
        return core.busy_s

    assert modelled(MIG_1G, 2) == pytest.approx(modelled(WHOLE, 2))  # 8 % of the SMs: the slice has them
    assert modelled(MIG_1G, 8) == pytest.approx(0.32 * 7 * modelled(WHOLE, 8))  # 32 %: stretched


def test_the_modelled_time_really_passes_and_a_bad_request_does_not_fail_its_batch() -> None:
    core = ReplicaCore("r", environ=MIG_1G, simulated=True)
    t0 = time.perf_counter()
    out = asyncio.run(core.run_batch([ROW, [[1.0, 2.0]]]))
    assert time.perf_counter() - t0 >= InferenceModel().batch_s(2, ShareSpeed.mig("1g.10gb")) * 0.99
    assert isinstance(out[0], list) and isinstance(out[1], str) and "rows of 32" in out[1]


class Tick:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_load_signal_is_the_time_average_of_ongoing_since_the_last_read() -> None:
    clock = Tick()
    m = LoadMeter(clock=clock)
    m.load()
    m.begin()
    m.begin()              # 2 ongoing for 1 s
    clock.t = 1.0
    m.end(1.0)             # 1 ongoing for 3 s
    clock.t = 4.0
    assert m.load(reset=False)["mean_ongoing"] == pytest.approx((2 * 1 + 1 * 3) / 4)  # a peek starts no window
    ld = m.load()
    assert ld["mean_ongoing"] == pytest.approx((2 * 1 + 1 * 3) / 4) and ld["ongoing"] == 1
    clock.t = 6.0          # a new window: 1 ongoing throughout
    assert m.load()["mean_ongoing"] == pytest.approx(1.0)
    m.end(0.5, ok=False)
    assert m.load()["ongoing"] == 0 and m.load()["errors"] == 1


def test_p99_covers_only_the_recent_window() -> None:
    clock = Tick()
    m = LoadMeter(clock=clock, window_s=5.0)
    for i in range(100):
        m.begin()
        m.end(1.0 if i == 99 else 0.01)
    # linear between ranks 98 and 99 of 100 (core/stats): 10 ms + 1% of the way to the slow one
    assert m.load()["p99_ms"] == pytest.approx(19.9) and m.load()["window_requests"] == 100
    m.begin()
    m.end(2.0)
    assert m.load()["p99_ms"] == pytest.approx(1000.0)
    clock.t = 10.0
    m.begin()
    m.end(0.05)
    ld = m.load()
    assert ld["window_requests"] == 1 and ld["p99_ms"] == pytest.approx(50.0) and ld["served"] == 102


# ---- the replica count told to Serve: the decision, the warm spares, the start cap -------------------------
from hypothesis import given, strategies as st  # noqa: E402

from orchestrator.serve.manager import replica_target  # noqa: E402


def test_the_count_is_the_decision_plus_the_warm_spares_and_a_fall_is_at_once() -> None:
    assert replica_target(want=3, warm=1, current=2, running=2, max_starting=None) == 4
    assert replica_target(want=1, warm=1, current=5, running=5, max_starting=1) == 2


def test_a_rise_is_capped_above_what_runs_so_starts_come_as_replicas_come_up() -> None:
    assert replica_target(want=6, warm=0, current=2, running=2, max_starting=1) == 3
    assert replica_target(want=6, warm=0, current=3, running=2, max_starting=1) == 3  # the one starting counts
    assert replica_target(want=6, warm=0, current=3, running=3, max_starting=2) == 5


@given(st.integers(0, 8), st.integers(0, 3), st.integers(0, 10), st.integers(0, 10), st.none() | st.integers(1, 4))
def test_the_count_never_exceeds_what_is_wanted_and_never_drops_what_starts(want, warm, current, running, cap):
    t = replica_target(want, warm, current, running, cap)
    assert 0 <= t <= want + warm
    if want + warm > current:
        assert t >= current and (cap is None or t <= max(current, running + cap))
    else:
        assert t == want + warm
