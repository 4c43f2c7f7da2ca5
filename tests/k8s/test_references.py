"""Every rendered object's references resolve inside the render (orchestrator/deploy/k8s/references.py).

The schema tests (test_validate.py) prove each object is well formed; these
prove the objects fit together as a cluster would need them to: Services and
NetworkPolicies select pods that exist, every claim, Secret, ServiceAccount
and PriorityClass a pod names is rendered (or declared as the operator's),
and every port a NetworkPolicy opens is one a container listens on. Each
guard test breaks one reference and expects exactly that one to be reported.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import pytest
from typer.testing import CliRunner

from orchestrator.cli.k8s import app
from orchestrator.deploy.k8s.config import K8sConfig, load_config, parse_config
from orchestrator.deploy.k8s.references import DanglingReferenceError, Dangling, dangling_references
from orchestrator.deploy.k8s.render import render_checked, render_objects

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "k8s.yaml"
POOL = {"name": "g", "sharing": "whole", "gpu_model": "T4"}


def _configs() -> list[tuple[str, K8sConfig]]:
    base, overlays = load_config(CONFIG)
    return [("base", base), *sorted(overlays.items())]


def _one(objs: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    (o,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    return o


@pytest.mark.parametrize(("name", "cfg"), _configs(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_reference_of_every_render_resolves(name: str, cfg: K8sConfig) -> None:
    objs = render_objects(cfg)
    assert [d.message for d in dangling_references(objs, cfg.external_refs())] == []
    kinds = {o["kind"] for o in objs}
    # The walk has something to check in every render: claims, the GCS store, policies.
    assert {"PersistentVolumeClaim", "NetworkPolicy", "Service", "Secret", "RayCluster"} <= kinds


@pytest.mark.parametrize("overlay", sorted(load_config(CONFIG)[1]))
def test_the_committed_overlays_resolve_as_kustomize_builds_them(overlay: str, kustomize: Any) -> None:
    cfg = load_config(CONFIG)[1][overlay]
    built = kustomize.lite(REPO / "k8s" / "overlays" / overlay)
    assert [d.message for d in dangling_references(built, cfg.external_refs())] == []


def _broken(mutate: Callable[[list[dict[str, Any]]], None]) -> list[Dangling]:
    cfg = load_config(CONFIG)[0]
    objs = copy.deepcopy(render_objects(cfg))
    mutate(objs)
    return dangling_references(objs, cfg.external_refs())


def _head(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return _one(objs, "RayCluster")["spec"]["headGroupSpec"]["template"]["spec"]


def _set(path: list[Any], value: Any) -> Callable[[list[dict[str, Any]]], None]:
    """A mutation that sets ``value`` at ``path`` below the object picked by ``path[0]`` (kind, name suffix)."""

    def mutate(objs: list[dict[str, Any]]) -> None:
        kind, suffix = path[0]
        node = _one(objs, kind, suffix)
        for p in path[1:-1]:
            node = node[p]
        node[path[-1]] = value

    return mutate


GUARDS = {
    "service selects no pod": (_set([("Service", "-redis"), "spec", "selector", "app.kubernetes.io/name"], "redis-typo"),
                               "Service/gpu-orchestrator-redis", "selects no pod template"),
    "service port no container has": (_set([("Service", "-redis"), "spec", "ports", 0, "targetPort"], "rediss"),
                                      "Service/gpu-orchestrator-redis", "no selected container has it"),
    "policy opens a port nobody serves": (
        lambda objs: _one(objs, "NetworkPolicy", "gpu-orchestrator-ingress")["spec"]["ingress"][1]["ports"].append(
            {"protocol": "TCP", "port": 9999}),
        "NetworkPolicy/gpu-orchestrator-ingress", "no container of the selected pods listens on it"),
    "policy admits from no pod": (
        _set([("NetworkPolicy", "-redis-ingress"), "spec", "ingress", 0, "from", 0, "podSelector", "matchLabels",
              "app.kubernetes.io/component"], "ray-haed"),
        "NetworkPolicy/gpu-orchestrator-redis-ingress", "admits traffic from no pod template"),
    "policy selects no pod": (_set([("NetworkPolicy", "-redis-ingress"), "spec", "podSelector", "matchLabels",
                                    "app.kubernetes.io/instance"], "nobody"),
                              "NetworkPolicy/gpu-orchestrator-redis-ingress", "selects no pod template"),
    "checkpoint claim missing": (lambda objs: objs.remove(_one(objs, "PersistentVolumeClaim", "-checkpoints")),
                                 "RayCluster/gpu-orchestrator", "PersistentVolumeClaim 'gpu-orchestrator-checkpoints'"),
    "redis password secret missing": (lambda objs: objs.remove(_one(objs, "Secret")),
                                      "RayCluster/gpu-orchestrator", ".spec.gcsFaultToleranceOptions.redisPassword"),
    "service account missing": (lambda objs: objs.remove(_one(objs, "ServiceAccount", "-head")),
                                "RayCluster/gpu-orchestrator", "ServiceAccount 'gpu-orchestrator-head'"),
    "priority class missing": (lambda objs: objs.remove(_one(objs, "PriorityClass", "-workers")),
                               "RayCluster/gpu-orchestrator", "PriorityClass 'gpu-orchestrator-workers'"),
    "config map volume missing": (
        lambda objs: _head(objs)["volumes"].append({"name": "x", "configMap": {"name": "settings"}}),
        "RayCluster/gpu-orchestrator", "ConfigMap 'settings'"),
    "binding to a missing role": (_set([("ClusterRoleBinding", "node-reader"), "roleRef", "name"], "no-such-role"),
                                  "ClusterRoleBinding/", "ClusterRole 'no-such-role'"),
    "pod monitor port of no container": (_set([("PodMonitor", ""), "spec", "podMetricsEndpoints", 0, "port"], "orch-metrix"),
                                         "PodMonitor/gpu-orchestrator", "no selected container has a port of that name"),
    "namespace missing": (lambda objs: objs.remove(_one(objs, "Namespace")),
                          "ServiceAccount/gpu-orchestrator-head", "Namespace 'gpu-orchestrator'"),
}


@pytest.mark.parametrize("case", sorted(GUARDS))
def test_each_kind_of_broken_reference_is_reported(case: str) -> None:
    """Guards the guard: one broken reference, and the walk names its source and what is missing."""
    mutate, source, words = GUARDS[case]
    found = _broken(mutate)
    assert found, f"{case}: not reported"
    assert any(d.source.startswith(source) and words in d.message for d in found), [d.message for d in found]


def test_objects_the_operator_creates_are_declared_not_rendered() -> None:
    cfg = parse_config({"pools": [POOL], "auth": {"mode": "secret", "secret_name": "ray-auth"},
                        "checkpoints": {"claim_name": "team-checkpoints"},
                        "gcs_fault_tolerance": {"redis": {"deploy": False, "address": "redis.example.internal:6379",
                                                          "password_secret": "managed-redis"}}})[0]
    objs = render_objects(cfg)
    assert cfg.external_refs() == {("Secret", "ray-auth"), ("Secret", "managed-redis"),
                                   ("PersistentVolumeClaim", "team-checkpoints"), ("Secret", cfg.head_secret_name)}
    assert dangling_references(objs, cfg.external_refs()) == []
    undeclared = {d.name for d in dangling_references(objs)}
    # each one really is referenced (the head's credentials: admin key and token secret)
    assert undeclared == {"ray-auth", "managed-redis", "team-checkpoints", cfg.head_secret_name}


def test_render_and_apply_refuse_a_render_with_dangling_references(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import orchestrator.deploy.k8s.render as render

    real = render.render_objects

    def without_secret(cfg: K8sConfig) -> list[dict[str, Any]]:
        return [o for o in real(cfg) if o["kind"] != "Secret"]

    monkeypatch.setattr(render, "render_objects", without_secret)
    with pytest.raises(DanglingReferenceError) as e:
        render_checked(load_config(CONFIG)[0])
    assert "Secret 'gpu-orchestrator-redis'" in str(e.value)
    r = CliRunner().invoke(app, ["render", "--config", str(CONFIG), "--out", str(tmp_path)])
    assert r.exit_code == 1 and "refers to what it does not contain" in r.output
    assert not any(tmp_path.iterdir()), "nothing is written from a refused render"
    r = CliRunner().invoke(app, ["apply", "--config", str(CONFIG), "--kubeconfig", str(tmp_path / "none")])
    assert r.exit_code == 1 and "gpu-orchestrator-redis" in r.output  # refused before connecting
