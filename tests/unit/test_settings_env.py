"""One name per knob, one precedence rule (#35 item 4, its part here): ``ORCHESTRATOR_<FIELD>`` over the cluster
file's ``settings.<field>``, applied where the file is loaded (core.config.with_environment). No Ray."""

from __future__ import annotations

import pytest

from orchestrator.core.config import DEMO_CONFIG, RuntimeSettings, load_config, settings_env_name
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
