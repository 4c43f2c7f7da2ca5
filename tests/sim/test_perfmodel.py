"""The workload model: speeds of each kind of share and the utilisation it implies."""

import pytest

from orchestrator.core import env as E
from orchestrator.sim.perfmodel import TIMESLICE_SWITCH_COST, InferenceModel, ShareSpeed, TrainingModel


def test_a_1g_slice_runs_a_seventh_of_the_card_and_a_whole_card_runs_one():
    assert ShareSpeed.mig("1g.10gb").speed == pytest.approx(1 / 7)
    assert ShareSpeed.mig("3g.40gb").speed == pytest.approx(3 / 7)
    assert ShareSpeed.whole(2).speed == 2.0


def test_mps_gets_its_percentage_and_time_slices_pay_for_switching():
    assert ShareSpeed.mps(30).speed == pytest.approx(0.30)
    ts = ShareSpeed.timeslice(500)
    assert ts.card_share == 0.5
    assert ts.speed == pytest.approx(0.5 * (1 - TIMESLICE_SWITCH_COST))
    assert ts.busy_gpu_s(10.0) < 5.0  # the switching is not useful work


def test_the_share_is_read_from_the_hand_out_environment():
    assert ShareSpeed.of_env({E.SHARE_KIND: "mig", E.MIG_PROFILE: "2g.20gb"}).speed == pytest.approx(2 / 7)
    assert ShareSpeed.of_env({E.SHARE_KIND: "mps", E.MPS_ACTIVE_THREAD_PERCENTAGE: "40"}).speed == pytest.approx(0.4)
    assert ShareSpeed.of_env({E.SHARE_KIND: "timeslice", E.TIMESLICE_MILLI: "250"}).card_share == 0.25
    assert ShareSpeed.of_env({E.SHARE_KIND: "whole", E.CUDA_VISIBLE_DEVICES: "GPU-a,GPU-b"}).speed == 2.0
    assert ShareSpeed.of_env({}).speed == 1.0


def test_work_takes_longer_on_a_smaller_share():
    m, t = InferenceModel(base_ms=3, per_item_ms=1), TrainingModel(step_s=0.02)
    assert m.batch_s(4, ShareSpeed.whole()) == pytest.approx(0.007)
    assert m.batch_s(4, ShareSpeed.mig("1g.10gb")) == pytest.approx(0.049)
    assert t.step_time_s(ShareSpeed.mps(50)) == pytest.approx(0.04)


@pytest.mark.parametrize("bad", [lambda: ShareSpeed.mig("8g.80gb"), lambda: ShareSpeed.mig("big"),
                                 lambda: ShareSpeed.mps(0), lambda: ShareSpeed.timeslice(2000)])
def test_impossible_shares_are_refused(bad):
    with pytest.raises(ValueError):
        bad()
