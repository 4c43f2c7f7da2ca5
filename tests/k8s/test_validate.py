"""Every manifest we ship or render validates against the schemas the API server enforces.

Two layers (see conftest.py): the Kubernetes built-in schemas through
kubernetes-validate (strict; needs nothing outside the repo), and the KubeRay
CRDs from ../shared (skips with the reason when absent). The kustomize
overlays are built with a small in-test kustomize (always) and with
`kubectl kustomize` (when kubectl is installed); both must equal the
overlay's own render.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import pytest

from orchestrator.deploy.k8s.config import K8sConfig, load_config
from orchestrator.deploy.k8s.render import object_key, render_objects

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
CONFIG = REPO / "configs" / "k8s.yaml"

Validate = Callable[..., list[str]]


def _configs() -> list[tuple[str, K8sConfig]]:
    base, overlays = load_config(CONFIG)
    return [("base", base), *sorted(overlays.items())]


def _committed(kustomize: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(str(p.relative_to(REPO)), obj) for p in sorted((K8S / "base").glob("*.yaml"))
            if p.name != "kustomization.yaml" for obj in kustomize.load(p)] + [
        (str(p.relative_to(REPO)), obj) for p in sorted((K8S / "overlays").glob("*/*.yaml"))
        if p.name != "kustomization.yaml" for obj in kustomize.load(p)]


@pytest.mark.parametrize(("name", "cfg"), _configs(), ids=lambda v: v if isinstance(v, str) else "")
def test_render_output_validates_against_builtin_schemas(name: str, cfg: K8sConfig, validate: Validate) -> None:
    problems = [p for obj in render_objects(cfg) for p in validate(obj, None)]
    assert problems == []


@pytest.mark.parametrize(("name", "cfg"), _configs(), ids=lambda v: v if isinstance(v, str) else "")
def test_render_output_validates_against_the_kuberay_crds(name: str, cfg: K8sConfig, validate: Validate,
                                                          crds: dict[str, Any]) -> None:
    ray = [o for o in render_objects(cfg) if o["apiVersion"] == "ray.io/v1"]
    assert ray, "every config renders at least the RayCluster"
    assert [p for obj in ray for p in validate(obj, crds)] == []


def test_committed_manifests_validate_against_builtin_schemas(validate: Validate, kustomize: Any) -> None:
    files = _committed(kustomize)
    assert len(files) >= 15
    assert [f"{path}: {p}" for path, obj in files for p in validate(obj, None)] == []


def test_committed_manifests_validate_against_the_kuberay_crds(validate: Validate, kustomize: Any,
                                                               crds: dict[str, Any]) -> None:
    ray = [(path, obj) for path, obj in _committed(kustomize) if obj.get("apiVersion") == "ray.io/v1"]
    assert {obj["kind"] for _, obj in ray} == {"RayCluster", "RayJob", "RayService"}
    assert [f"{path}: {p}" for path, obj in ray for p in validate(obj, crds)] == []


def _keyed(objs: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    return {object_key(o): o for o in objs}


@pytest.mark.parametrize("overlay", sorted(load_config(CONFIG)[1]))
def test_kustomize_build_of_each_overlay_equals_its_render(overlay: str, kustomize: Any, validate: Validate) -> None:
    expected = _keyed(render_objects(load_config(CONFIG)[1][overlay]))
    built = kustomize.lite(K8S / "overlays" / overlay)
    assert _keyed(built) == expected
    assert [p for obj in built for p in validate(obj, None)] == []


@pytest.mark.parametrize("overlay", sorted(load_config(CONFIG)[1]))
def test_kubectl_kustomize_of_each_overlay_equals_its_render(overlay: str, kustomize: Any) -> None:
    built = kustomize.kubectl(K8S / "overlays" / overlay)
    if built is None:
        pytest.skip("kubectl is not installed; the in-test kustomize covers the same build")
    assert _keyed(built) == _keyed(render_objects(load_config(CONFIG)[1][overlay]))


def test_the_validators_catch_what_the_api_server_would_refuse(validate: Validate) -> None:
    """Guards the guards: a typo, a wrong type and an unknown pod field are each reported."""
    base = load_config(CONFIG)[0]
    objs = {o["kind"]: o for o in render_objects(base)}
    np = copy.deepcopy(objs["NetworkPolicy"])
    np["spec"]["ingres"] = np["spec"].pop("ingress")
    assert validate(np, None)
    rc = copy.deepcopy(objs["RayCluster"])
    rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    assert any("imagePullPolcy" in p for p in validate(rc, None))
    pm = copy.deepcopy(objs["PodMonitor"])
    pm["spec"]["podMetricsEndpoints"][0]["interval"] = "soon"
    assert validate(pm, None)


def test_the_crd_validator_catches_unknown_and_mistyped_fields(validate: Validate, crds: dict[str, Any]) -> None:
    rc = copy.deepcopy(next(o for o in render_objects(load_config(CONFIG)[0]) if o["kind"] == "RayCluster"))
    rc["spec"]["workerGroupSpecs"][0]["minReplicas"] = "1"
    rc["spec"]["workerGroupSpec"] = []
    problems = validate(rc, crds)
    assert any("minReplicas" in p or "'1' is not of type" in p for p in problems)
    assert any("workerGroupSpec" in p and "unknown field" in p for p in problems)
