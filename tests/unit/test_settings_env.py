"""One name per knob, one precedence rule (#35 item 4, its part here): ``ORCHESTRATOR_<FIELD>`` over the cluster
file's ``settings.<field>`` (``ORCHESTRATOR_TUNING_<FIELD>`` over ``settings.tuning.<field>``), applied where the
file is loaded (core.config.with_environment). No Ray."""

from __future__ import annotations

import pytest

from orchestrator.core.config import (DEMO_CONFIG, RuntimeSettings, Tuning, load_config, parse_config, settings_env_name,
                                      settings_knobs)
from orchestrator.core.errors import ConfigError


def test_the_environment_overrides_the_file_knob_by_knob() -> None:
    plain = load_config(DEMO_CONFIG, {})
    got = load_config(DEMO_CONFIG, {"ORCHESTRATOR_METRICS_PORT": "9300", "ORCHESTRATOR_METRICS_HOST": "0.0.0.0",
                                    "ORCHESTRATOR_DIRECT_CALLS": "false", "ORCHESTRATOR_AGENT_TTL_S": "20",
                                    "ORCHESTRATOR_INFERENCE_SERVICES": "[chat, embed]", "ORCHESTRATOR_OTHER": "x"})
    s = got.settings
    assert (s.metrics_port, s.metrics_host, s.direct_calls, s.agent_ttl_s) == (9300, "0.0.0.0", False, 20.0)
    assert s.inference_services == ("chat", "embed")
    assert s.namespace == plain.settings.namespace and s.heartbeat_interval_s == plain.settings.heartbeat_interval_s
    assert got.nodes == plain.nodes  # only settings change
    assert load_config(DEMO_CONFIG, {"ORCHESTRATOR_METRICS_PORT": ""}).settings == plain.settings  # empty: unset


def test_every_knob_has_exactly_one_environment_name() -> None:
    names = [settings_env_name(f) for f in RuntimeSettings.model_fields]
    assert len(set(names)) == len(names) and all(n == "ORCHESTRATOR_" + n[13:].upper() for n in names)
    assert settings_env_name("metrics_port") == "ORCHESTRATOR_METRICS_PORT"
    assert settings_env_name("direct_calls") == "ORCHESTRATOR_DIRECT_CALLS"


def test_a_value_the_knob_refuses_names_the_variable() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(DEMO_CONFIG, {"ORCHESTRATOR_METRICS_PORT": "99999"})
    assert e.value.field == "ORCHESTRATOR_METRICS_PORT" and "65535" in e.value.allowed
    with pytest.raises(ConfigError) as e:
        load_config(DEMO_CONFIG, {"ORCHESTRATOR_HEARTBEAT_INTERVAL_S": "30", "ORCHESTRATOR_AGENT_TTL_S": "10"})
    assert e.value.field == "ORCHESTRATOR_AGENT_TTL_S"  # a rule across knobs names the variable it checks


# ---- the tuning constants: settings.tuning, each knob ORCHESTRATOR_TUNING_<FIELD> ---------------------------------

def test_a_tuning_knob_is_set_by_its_variable_over_the_file(tmp_path) -> None:
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text("settings:\n  tuning:\n    urgent_beat_s: 0.3\n    lend_timeout_s: 45\n")
    from_file = load_config(cfg, {}).settings.tuning
    assert (from_file.urgent_beat_s, from_file.lend_timeout_s) == (0.3, 45.0)
    assert from_file.holder_check_every_s == Tuning().holder_check_every_s  # the rest keep their defaults
    got = load_config(cfg, {"ORCHESTRATOR_TUNING_URGENT_BEAT_S": "0.2", "ORCHESTRATOR_TUNING_JOB_STATUS_POLL_S": "2",
                            "ORCHESTRATOR_AGENT_TTL_S": "20"}).settings
    assert got.tuning.urgent_beat_s == 0.2  # the environment over the file
    assert got.tuning.job_status_poll_s == 2.0  # over the default
    assert got.tuning.lend_timeout_s == 45.0  # the file's, where the environment says nothing
    assert got.agent_ttl_s == 20.0  # a tuning variable and a plain one together
    assert load_config(cfg, {"ORCHESTRATOR_TUNING_URGENT_BEAT_S": ""}).settings.tuning == from_file  # empty: unset
    assert load_config(cfg, {"ORCHESTRATOR_TUNING": "{urgent_beat_s: 9}"}).settings.tuning == from_file  # no such name


def test_the_defaults_are_the_module_constants_they_replace() -> None:
    """Default settings change nothing: each knob's default is what its module read before (kept importable)."""
    from orchestrator.control import controller, curves, demand, heap, service
    from orchestrator.control.jobs import executor, manager
    from orchestrator.rayport import agent, channel, holds, store
    from orchestrator.rayport.ray_api import job_api

    t = RuntimeSettings().tuning
    assert t == Tuning()
    # (the module constant, the value it had before the knob, the knob's default)
    pairs = [(controller.HOLDER_CHECK_EVERY_S, 1.0, t.holder_check_every_s),
             (service.TABLES_EVERY_S, 1.0, t.tables_every_s), (service.JOB_STATUS_POLL_S, 0.5, t.job_status_poll_s),
             (heap.FREEZE_EVERY_S, 2.5, t.heap_freeze_every_s), (heap.FULL_EVERY_S, 3600.0, t.heap_full_every_s),
             (curves.EVERY_S, 1.0, t.curves_every_s), (curves.RATE_S, 5.0, t.curves_rate_s),
             (curves.WINDOW_S, 30.0, t.curves_window_s), (manager.RESTOP_SLACK_S, 60.0, t.restop_slack_s),
             (executor.SUBMIT_BACKOFF_FIRST_S, 1.0, t.submit_backoff_first_s),
             (executor.SUBMIT_BACKOFF_MAX_S, 30.0, t.submit_backoff_max_s),
             (channel.CALL_GRACE_S, 60.0, t.channel_call_grace_s), (channel.WINDOW_S, 0.001, t.channel_window_s),
             (channel.MAX_WAIT_S, 0.005, t.channel_max_wait_s), (store.RETRY_FIRST_S, 0.05, t.commit_retry_first_s),
             (store.RETRY_MAX_S, 2.0, t.commit_retry_max_s), (agent.URGENT_BEAT_S, 0.1, t.urgent_beat_s),
             (holds.PLACE_TIMEOUT_S, 10.0, t.hold_place_timeout_s), (holds.RETURN_WAIT_S, 2.0, t.hold_return_wait_s),
             (holds.LEND_TIMEOUT_S, 30.0, t.lend_timeout_s), (job_api.JOB_API_TIMEOUT_S, 30.0, t.job_api_timeout_s),
             (job_api.ID_REUSE_QUIET_S, 10.0, t.id_reuse_quiet_s),
             (job_api.STATUS_READ_TIMEOUT_S, 5.0, t.status_read_timeout_s),
             (demand.EVERY_S, 5.0, t.autoscaler_demand_every_s),  # new knobs: their constants are their defaults
             (demand.MAX_BUNDLES, 100, t.autoscaler_demand_max_bundles)]
    assert all(const == before == now for const, before, now in pairs)
    assert len(pairs) == len(Tuning.model_fields)


def test_every_tuning_knob_has_one_variable_and_bounds() -> None:
    knobs = settings_knobs()
    names = [settings_env_name(k) for k in knobs]
    assert len(set(names)) == len(names) and "tuning" not in knobs
    assert {k for k in knobs if k.startswith("tuning.")} == {f"tuning.{f}" for f in Tuning.model_fields}
    assert settings_env_name("tuning.urgent_beat_s") == "ORCHESTRATOR_TUNING_URGENT_BEAT_S"
    for name, info in Tuning.model_fields.items():
        assert info.description, name
        assert any(getattr(m, "gt", None) == 0 for m in info.metadata), f"{name}: a wait of 0 or less means nothing"


@pytest.mark.parametrize("env, named, allowed", [
    ({"ORCHESTRATOR_TUNING_URGENT_BEAT_S": "0"}, "ORCHESTRATOR_TUNING_URGENT_BEAT_S", "above 0"),
    ({"ORCHESTRATOR_TUNING_HOLDER_CHECK_EVERY_S": "soon"}, "ORCHESTRATOR_TUNING_HOLDER_CHECK_EVERY_S", "a number"),
    ({"ORCHESTRATOR_TUNING_SUBMIT_BACKOFF_MAX_S": "0.5"}, "ORCHESTRATOR_TUNING_SUBMIT_BACKOFF_MAX_S",
     "submit_backoff_first_s"),  # a rule across knobs names the variable it checks
    ({"ORCHESTRATOR_TUNING_CHANNEL_WINDOW_S": "0.01"}, "settings.tuning.channel_max_wait_s", "channel_window_s"),
])
def test_a_value_the_tuning_knob_refuses_names_the_variable(env: dict[str, str], named: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(DEMO_CONFIG, env)
    assert e.value.field == named and allowed in e.value.allowed


def test_a_bad_tuning_knob_in_the_file_is_named_by_its_path() -> None:
    with pytest.raises(ConfigError) as e:
        parse_config({"settings": {"tuning": {"lend_timeout_s": -1}}})
    assert e.value.field == "settings.tuning.lend_timeout_s"
    with pytest.raises(ConfigError) as e:
        parse_config({"settings": {"tuning": {"urgent_beat": 0.1}}})
    assert e.value.field == "settings.tuning.urgent_beat" and "urgent_beat_s" in e.value.allowed
