"""``python -m orchestrator.deploy.kuberay head`` (what a KubeRay head container runs): exit codes without a cluster."""

from __future__ import annotations

from pathlib import Path

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


def test_the_head_pod_serves_the_dashboard_on_the_rendered_port(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """After the head is up, it serves `orchestrator dashboard` on the port the manifests open."""
    from orchestrator.deploy.k8s.config import load_config
    from orchestrator.deploy.k8s.render import render_objects

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "k8s.yaml")[0]
    head_env = {}
    for obj in render_objects(cfg):
        if obj["kind"] == "RayCluster":
            for c in obj["spec"]["headGroupSpec"]["template"]["spec"]["containers"]:
                head_env.update({e["name"]: e.get("value") for e in c.get("env", [])})
    assert head_env["ORCHESTRATOR_DASHBOARD_PORT"] == str(cfg.dashboard_port) == "8090"
    monkeypatch.setenv("ORCHESTRATOR_DASHBOARD_PORT", head_env["ORCHESTRATOR_DASHBOARD_PORT"])
    monkeypatch.setattr(launch.launcher, "attach", lambda *a, **k: type("S", (), {"address": "x:1", "up_seconds": 1})())
    started: list[list[str]] = []

    class Child:  # the dashboard process, as Popen returns it: here it exits at once
        def __init__(self, argv: list[str]) -> None:
            started.append(argv)

        def poll(self) -> int:
            return 0

    monkeypatch.setattr(launch.subprocess, "Popen", Child)
    assert launch.main(["head"]) == 0
    argv = started[0]
    assert argv[1:4] == ["-m", "orchestrator.cli.main", "dashboard"]
    assert argv[argv.index("--port") + 1] == "8090" and argv[argv.index("--host") + 1] == "0.0.0.0"
