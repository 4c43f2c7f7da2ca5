"""`orchestrator k8s` through typer's CliRunner; the cluster is the stand-in API server of conftest.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli.k8s import app

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "k8s.yaml"
runner = CliRunner()


def test_render_writes_the_tree_and_check_detects_drift(tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    r = runner.invoke(app, ["render", "--config", str(CONFIG), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert (out / "base" / "raycluster-gpu-orchestrator.yaml").exists()
    assert (out / "overlays" / "mig" / "kustomization.yaml").exists()
    assert runner.invoke(app, ["render", "--config", str(CONFIG), "--out", str(out), "--check"]).exit_code == 0
    (out / "base" / "raycluster-gpu-orchestrator.yaml").write_text("# edited by hand\n")
    r = runner.invoke(app, ["render", "--config", str(CONFIG), "--out", str(out), "--check"])
    assert r.exit_code == 1 and "base/raycluster-gpu-orchestrator.yaml" in r.output


def test_json_gives_one_object_on_stdout_for_render_apply_status_and_delete(tmp_path: Path, kubeconfig: Path,
                                                                          api_server) -> None:
    import json

    out = tmp_path / "k8s"
    r = runner.invoke(app, ["render", "--config", str(CONFIG), "--out", str(out), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["overlays"] == ["dev", "mig", "prod"], r.output
    r = runner.invoke(app, ["render", "--config", str(CONFIG), "--out", str(out), "--check", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["matches"] is True, r.output
    (out / "base" / "raycluster-gpu-orchestrator.yaml").write_text("# edited by hand\n")
    r = runner.invoke(app, ["render", "--config", str(CONFIG), "--out", str(out), "--check", "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["stale"] == ["base/raycluster-gpu-orchestrator.yaml"]
    api_server.raycluster_states = ["", "ready"]
    common = ["--config", str(CONFIG), "--overlay", "dev", "--kubeconfig", str(kubeconfig), "--json"]
    r = runner.invoke(app, ["apply", *common, "--poll", "0", "--timeout", "30"])
    applied = json.loads(r.stdout)  # the table and the wait went to stderr
    assert r.exit_code == 0 and applied["raycluster"]["ready"] and applied["raycluster"]["head_pod_ip"] == "10.0.0.7"
    assert {a["kind"] for a in applied["applied"]} >= {"RayCluster", "Namespace"}, applied
    r = runner.invoke(app, ["status", *common])
    assert r.exit_code == 0 and json.loads(r.stdout)["raycluster"]["state"] == "ready", r.stdout
    r = runner.invoke(app, ["delete", *common])
    assert r.exit_code == 0 and json.loads(r.stdout)["deleted"], r.stdout
    r = runner.invoke(app, ["status", "--config", str(CONFIG), "--overlay", "staging", "--kubeconfig", str(kubeconfig),
                            "--json"])
    assert r.exit_code == 2 and json.loads(r.stdout)["field"] == "--overlay"  # the error, as JSON (as status --json)


def test_the_committed_tree_passes_render_check() -> None:
    r = runner.invoke(app, ["render", "--config", str(CONFIG), "--out", str(REPO / "k8s"), "--check"])
    assert r.exit_code == 0, r.output


def test_bad_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "k8s.yaml"
    bad.write_text("pools:\n  - {name: a, sharing: mig, gpu_model: A100-80GB, mig_layout: [9g.90gb]}\n")
    r = runner.invoke(app, ["render", "--config", str(bad), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2
    assert "pools.0.mig_layout" in r.output and "allowed: 1g.10gb" in r.output
    assert not (tmp_path / "out").exists()


def test_unknown_overlay_exits_2(kubeconfig: Path) -> None:
    r = runner.invoke(app, ["status", "--config", str(CONFIG), "--overlay", "staging", "--kubeconfig", str(kubeconfig)])
    assert r.exit_code == 2 and "--overlay" in r.output and "dev, mig, prod" in r.output


def test_apply_waits_for_ready_then_status_and_delete(kubeconfig: Path, api_server) -> None:
    api_server.raycluster_states = ["", "ready"]
    r = runner.invoke(app, ["apply", "--config", str(CONFIG), "--overlay", "dev", "--kubeconfig", str(kubeconfig),
                            "--poll", "0", "--timeout", "30"])
    assert r.exit_code == 0, r.output
    assert "RayCluster gpu-orchestrator: state=pending" in r.output
    assert "is ready: head 10.0.0.7, 2/2 workers" in r.output
    r = runner.invoke(app, ["status", "--config", str(CONFIG), "--overlay", "dev", "--kubeconfig", str(kubeconfig)])
    assert r.exit_code == 0 and "present" in r.output and "state=ready" in r.output
    r = runner.invoke(app, ["delete", "--config", str(CONFIG), "--overlay", "dev", "--kubeconfig", str(kubeconfig)])
    assert r.exit_code == 0 and "kept" in r.output
    assert list(api_server.store) == ["/api/v1/namespaces/gpu-orchestrator"]


def test_apply_timeout_exits_1_with_the_last_state(kubeconfig: Path, api_server) -> None:
    api_server.raycluster_states = [""]
    r = runner.invoke(app, ["apply", "--config", str(CONFIG), "--overlay", "dev", "--kubeconfig", str(kubeconfig),
                            "--poll", "0.01", "--timeout", "1"])
    assert r.exit_code == 1 and "not ready after 1s" in r.output


def test_status_nodes_shows_the_gpu_labels(kubeconfig: Path, api_server) -> None:
    api_server.nodes = [
        {"metadata": {"name": "a100-1", "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                                                   "nvidia.com/gpu.count": "1", "nvidia.com/mig.config": "all-1g.10gb",
                                                   "nvidia.com/mig.strategy": "mixed"}},
         "status": {"allocatable": {"nvidia.com/mig-1g.10gb": "7"}}},
        {"metadata": {"name": "odd", "labels": {"nvidia.com/gpu.product": "Mystery-GPU"}}},
    ]
    r = runner.invoke(app, ["status", "--config", str(CONFIG), "--kubeconfig", str(kubeconfig), "--nodes"],
                      env={"COLUMNS": "240"})
    assert r.exit_code == 0, r.output
    assert "7x 1g.10gb" in r.output and "all-1g.10gb" in r.output and "Mystery-GPU" in r.output


def test_unreachable_api_server_exits_3(kubeconfig_for, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = runner.invoke(app, ["status", "--config", str(CONFIG), "--kubeconfig", str(kubeconfig_for(f"http://127.0.0.1:{port}"))])
    assert r.exit_code == 3 and "not reachable" in r.output


def test_render_needs_no_kubernetes_client_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "does-not-exist"))
    shutil.rmtree(tmp_path, ignore_errors=True)
    r = runner.invoke(app, ["render", "--config", str(CONFIG), "--out", str(tmp_path / "k8s")])
    assert r.exit_code == 0, r.output


def test_the_guide_exists_and_its_commands_parse() -> None:
    """docs/kubernetes.md is the admin's guide: its `orchestrator k8s ...` lines must stay valid commands."""
    import re
    import shlex

    guide = (REPO / "docs" / "kubernetes.md").read_text()
    assert guide.startswith("# Deploy on Kubernetes")
    lines = [m.group(1) for m in re.finditer(r"^orchestrator k8s (.+?)(?:\s+#.*)?$", guide, re.MULTILINE)]
    assert len(lines) >= 6
    for line in lines:
        args = [a for a in shlex.split(line.replace("[", "").replace("]", "")) if a != "|"]
        r = runner.invoke(app, [*args, "--help"])
        assert r.exit_code == 0, f"{line}: {r.output}"


def test_overlay_has_no_short_form(kubeconfig: Path) -> None:
    # -o is --output (the output format) on every command; the overlay is only --overlay.
    r = runner.invoke(app, ["status", "--config", str(CONFIG), "-o", "dev", "--kubeconfig", str(kubeconfig)])
    assert r.exit_code == 2 and "output='dev'" in r.output and "table, json, yaml" in r.output  # a format, not an overlay


def test_a_missing_kubernetes_client_names_the_k8s_extra(kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    for name in [m for m in sys.modules if m == "kubernetes" or m.startswith("kubernetes.")]:
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed: importing it raises ImportError
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    r = runner.invoke(app, ["status", "--config", str(CONFIG), "--kubeconfig", str(kubeconfig), "--json"])
    assert r.exit_code == 1, r.output
    err = json.loads(r.stdout)
    assert err["extra"] == "k8s" and "ray-gpu-orchestrator[k8s]" in err["message"], err
