"""``python -m orchestrator.deploy.kuberay head`` (what a KubeRay head container runs): exit codes without a cluster."""

from __future__ import annotations

import pytest

from orchestrator.deploy import kuberay as launch
from orchestrator.deploy.local import free_port


def test_no_cluster_is_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    assert launch.main(["head", "--address", f"127.0.0.1:{free_port()}", "--timeout", "5"]) == 3
    assert "no Ray cluster" in capsys.readouterr().err


def test_bad_config_is_exit_2(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("settings: {agent_ttl_s: -1}\n")
    assert launch.main(["head", "--config", str(bad)]) == 2
    assert "agent_ttl_s" in capsys.readouterr().err
