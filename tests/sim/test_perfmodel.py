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


def test_the_share_is_read_from_the_hand_out_environment():
    assert ShareSpeed.of_env({E.SHARE_KIND: "mig", E.MIG_PROFILE: "2g.20gb"}).speed == pytest.approx(2 / 7)
    assert ShareSpeed.of_env({E.SHARE_KIND: "mps", E.MPS_ACTIVE_THREAD_PERCENTAGE: "40"}).speed == pytest.approx(0.4)
    assert ShareSpeed.of_env({E.SHARE_KIND: "timeslice", E.TIMESLICE_MILLI: "250"}).card_share == 0.25
    assert ShareSpeed.of_env({E.SHARE_KIND: "whole", E.CUDA_VISIBLE_DEVICES: "GPU-a,GPU-b"}).speed == 2.0
    assert ShareSpeed.of_env({}).speed == 1.0


def test_training_saturates_its_share_and_is_worth_the_same_work_on_any():
    t = TrainingModel(step_s=0.02)
    assert t.step_time_s(ShareSpeed.mps(50)) == pytest.approx(0.04)
    assert t.step_time_s(ShareSpeed.timeslice(500)) == pytest.approx(0.04 / (1 - TIMESLICE_SWITCH_COST))
    assert t.useful_gpu_s(100) == pytest.approx(2.0)


def test_a_small_batch_runs_at_full_speed_on_a_slice_that_holds_its_sms_but_not_on_a_time_slice():
    m = InferenceModel(base_ms=30, per_item_ms=10, sm_per_item=0.04)
    one_g = ShareSpeed.mig("1g.10gb")  # 1/7 = 0.143 of the SMs
    assert m.batch_s(1, ShareSpeed.whole()) == pytest.approx(0.040)
    assert m.batch_s(1, one_g) == pytest.approx(0.040)  # needs 4 % of the SMs: the slice has them
    assert m.batch_s(3, one_g) == pytest.approx(0.060)  # 12 %: still fits
    assert m.batch_s(7, one_g) == pytest.approx(0.100 * 0.28 / (1 / 7))  # 28 %: stretched
    ts = ShareSpeed.timeslice(143)
    assert m.batch_s(1, ts) == pytest.approx(0.040 / ts.speed)  # a seventh of the time, however small
    assert m.batch_s(1, ts) > 7 * m.batch_s(1, one_g)


def test_useful_work_is_what_the_batch_keeps_busy_not_the_card_it_holds():
    m = InferenceModel(base_ms=30, per_item_ms=10, sm_per_item=0.04)
    assert m.useful_gpu_s(1) == pytest.approx(0.040 * 0.04)
    assert m.useful_gpu_s(50) == pytest.approx(0.530 * 1.0)  # demand is capped at the whole card


@pytest.mark.parametrize("bad", [lambda: ShareSpeed.mig("8g.80gb"), lambda: ShareSpeed.mig("big"),
                                 lambda: ShareSpeed.mps(0), lambda: ShareSpeed.timeslice(2000)])
def test_impossible_shares_are_refused(bad):
    with pytest.raises(ValueError):
        bad()
