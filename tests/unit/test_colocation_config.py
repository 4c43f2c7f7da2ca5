"""The injected clocks and the co-location config: readings, wrap-around, typed errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.clock import (
    DAY_S,
    Clock,
    CompressedClock,
    DayClock,
    ManualClock,
    SystemClock,
    format_hhmm,
    parse_hhmm,
)
from orchestrator.core.colocation import DEFAULT_COLOCATION, ColocationConfig, load_colocation
from orchestrator.core.config import RuntimeSettings, parse_config
from orchestrator.core.errors import ConfigError, InvalidRequestError
from orchestrator.core.request import Isolation


def test_parse_and_format_hhmm() -> None:
    assert parse_hhmm("08:00") == 8 * 3600 and parse_hhmm("7:05") == 7 * 3600 + 300
    assert parse_hhmm("24:00") == DAY_S and parse_hhmm("00:00") == 0
    assert format_hhmm(22 * 3600 + 59 * 60 + 59) == "22:59" and format_hhmm(DAY_S) == "00:00"
    for bad in ["8", "08:60", "25:00", "24:01", "08:5", "-1:00", "8h00", "", "０８:00"]:
        with pytest.raises(InvalidRequestError) as e:
            parse_hhmm(bad, "windows.0.start")
        assert e.value.field == "windows.0.start" and "HH:MM" in e.value.allowed


def test_manual_clock_moves_only_when_told_and_wraps_the_day() -> None:
    c = ManualClock(t=10.0, time_of_day_s=parse_hhmm("21:59"))
    assert isinstance(c, Clock)
    assert (c.monotonic(), c.time_of_day_s()) == (10.0, parse_hhmm("21:59"))
    c.advance(120.0)
    assert (c.monotonic(), format_hhmm(c.time_of_day_s())) == (130.0, "22:01")
    c.advance(DAY_S)
    assert format_hhmm(c.time_of_day_s()) == "22:01" and c.monotonic() == 130.0 + DAY_S
    c.set_time_of_day(parse_hhmm("07:59"))
    assert c.monotonic() == 130.0 + DAY_S  # the day jumped alone
    with pytest.raises(InvalidRequestError) as e:
        c.advance(-1.0)
    assert e.value.field == "seconds"
    with pytest.raises(InvalidRequestError) as e:
        c.set_time_of_day(DAY_S)
    assert e.value.field == "time_of_day_s"


def test_compressed_clock_runs_the_day_fast_and_real_seconds_for_delays() -> None:
    base = ManualClock(t=1000.0)
    c = CompressedClock(speedup=720.0, start_time_of_day_s=parse_hhmm("06:00"), base=base.monotonic)
    assert c.time_of_day_s() == parse_hhmm("06:00") and c.monotonic() == 1000.0
    base.advance(10.0)  # 10 real seconds = 2 simulated hours
    assert format_hhmm(c.time_of_day_s()) == "08:00" and c.monotonic() == 1010.0
    base.advance(110.0)  # a whole day since the start: back to 06:00
    assert c.time_of_day_s() == pytest.approx(parse_hhmm("06:00"))
    with pytest.raises(InvalidRequestError) as e:
        CompressedClock(speedup=0.0)
    assert e.value.field == "speedup"


def test_system_clock_reads_a_time_of_day() -> None:
    c = SystemClock()
    a = c.monotonic()
    assert 0 <= c.time_of_day_s() < DAY_S and c.monotonic() >= a


def test_day_clock_settings_build_a_compressed_clock() -> None:
    base = ManualClock()
    c = DayClock(speedup=360, start="22:00").build(base.monotonic)
    base.advance(20.0)
    assert format_hhmm(c.time_of_day_s()) == "00:00"
    s = RuntimeSettings.model_validate({"day_clock": {"speedup": 720, "start": "06:00"}})
    assert s.day_clock == DayClock(speedup=720, start="06:00") and RuntimeSettings().day_clock is None
    with pytest.raises(ConfigError) as e:
        parse_config({"settings": {"day_clock": {"start": "26:00"}}})
    assert e.value.field.endswith("start") and e.value.value == "26:00"
    with pytest.raises(ConfigError) as e:
        parse_config({"settings": {"day_clock": {"speedup": -2}}})
    assert e.value.field == "settings.day_clock.speedup"


def test_the_shipped_colocation_file_loads() -> None:
    cfg = load_colocation(DEFAULT_COLOCATION)
    svc = cfg.service
    assert svc.gpu_request().isolation is Isolation.HARD and svc.priority_class == "inference"
    assert svc.autoscale.min_replicas <= svc.autoscale.max_replicas and svc.autoscale.slo_p99_ms == svc.slo_p99_ms
    assert ColocationConfig.parse(None) == ColocationConfig()


@pytest.mark.parametrize("data, field, shown", [
    ({"service": {"autoscale": {"min_replicas": 5, "max_replicas": 2}}}, "service.autoscale.max_replicas", 2),
    ({"service": {"autoscale": {"target_ongoing_per_replica": 0}}}, "service.autoscale.target_ongoing_per_replica", 0),
    ({"service": {"autoscale": {"tolerance": 1.0}}}, "service.autoscale.tolerance", 1.0),
    ({"service": {"autoscale": {"upscale_delay_s": -1}}}, "service.autoscale.upscale_delay_s", -1),
    ({"service": {"autoscale": {"max_step_down": 0}}}, "service.autoscale.max_step_down", 0),
    ({"service": {"autoscale": {"slo_p99_ms": 0}}}, "service.autoscale.slo_p99_ms", 0),
    ({"service": {"autoscale": {"upscale_factor": 0.5}}}, "service.autoscale.upscale_factor", 0.5),
    ({"service": {"autoscale": {"warm_window_s": -1}}}, "service.autoscale.warm_window_s", -1),
    ({"service": {"autoscale": {"max_warm_spares": -1}}}, "service.autoscale.max_warm_spares", -1),
    ({"service": {"autoscale": {"peak_hold_fraction": 1.5}}}, "service.autoscale.peak_hold_fraction", 1.5),
    ({"service": {"request": "mem=10GiB,compute=3"}}, "service.request.gpu.compute", "3"),
    ({"service": {"request": "mig:9g.99gb,x"}}, "service.request", None),
    ({"service": {"name": "Bad Name"}}, "service.name", "Bad Name"),
    ({"service": {"max_batch_size": 0}}, "service.max_batch_size", 0),
    ({"service": {"slo_ms": 100}}, "service.slo_ms", 100),
    ({"control_interval_s": 0}, "control_interval_s", 0),
])
def test_bad_colocation_config_is_a_config_error_naming_the_field(data: dict, field: str, shown: object) -> None:
    with pytest.raises(ConfigError) as e:
        ColocationConfig.parse(data, source="c.yaml")
    assert e.value.field.startswith(f"c.yaml:{field}"), e.value.field
    if shown is not None:
        assert e.value.value == shown
    assert e.value.allowed


def test_a_missing_colocation_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_colocation(tmp_path / "nope.yaml")
    assert e.value.field == "colocation"
    bad = tmp_path / "bad.yaml"
    bad.write_text("service: [1, 2]\n")
    with pytest.raises(ConfigError) as e:
        load_colocation(bad)
    assert e.value.field == f"{bad}:service"
