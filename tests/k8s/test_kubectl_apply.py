"""``kubectl apply --dry-run=client -k`` of each committed overlay, through a kubeconfig that points at the
fake API server (``fake_apiserver.py``; no cluster): kubectl discovers every kind the overlay uses -- the
KubeRay CRDs, the PodMonitor, the built-in kinds -- asks the server for each object, gets 404, and reports
every object "created (dry run)". Schemas are checked by the repository's own validation
(``test_validate.py``), so kubectl runs with ``--validate=false``; the fake validates nothing.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import K8S_DIR, write_kubeconfig
from fake_apiserver import FakeApiServer

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl on PATH")


def _expected(objs: list[dict]) -> set[str]:
    """What kubectl prints for each object: ``<kind>[.<group>]/<name> created (dry run)``."""
    out = set()
    for o in objs:
        group = o["apiVersion"].rpartition("/")[0]
        out.add(f"{o['kind'].lower()}{'.' + group if group else ''}/{o['metadata']['name']} created (dry run)")
    return out


@pytest.mark.parametrize("overlay", ["dev", "mig", "prod"])
def test_kubectl_apply_dry_run_creates_every_object_of_the_overlay(overlay: str, api_server: FakeApiServer,
                                                                    tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api_server.url)
    directory = K8S_DIR / "overlays" / overlay
    built = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    objs = [d for d in yaml.safe_load_all(built.stdout) if d]
    r = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "--cache-dir", str(tmp_path / "cache"),
                        "apply", "--dry-run=client", "--validate=false", "-k", str(directory)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = {line.strip() for line in r.stdout.splitlines() if line.strip()}
    assert lines == _expected(objs), (sorted(lines ^ _expected(objs)), r.stderr)
    # kubectl really asked the server: one GET per object, each answered 404 (nothing stored).
    gets = {req.path.rsplit("/", 1)[-1] for req in api_server.calls("GET")}
    assert {o["metadata"]["name"] for o in objs} <= gets
    assert not api_server.store and not api_server.calls("PATCH")  # a client-side dry run writes nothing


def test_an_unknown_kind_is_refused_by_discovery(api_server: FakeApiServer, tmp_path: Path) -> None:
    """The control: a kind the fake does not serve fails as on a cluster without its CRD (so the test above
    passes only because discovery found every kind)."""
    api_server.kinds = tuple(k for k in api_server.kinds if k.group != "ray.io")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api_server.url)
    r = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "--cache-dir", str(tmp_path / "cache"),
                        "apply", "--dry-run=client", "--validate=false", "-k", str(K8S_DIR / "overlays" / "dev")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "RayCluster" in r.stderr, r.stderr
