"""The kustomize side of a render: an overlay as JSON 6902 patches against the base (:func:`overlay_ops`, a
structural diff, and :func:`apply_json_patch`, which checks it), a ``kustomization.yaml``, and writing the
tree to disk or listing where a folder differs from it. Only files that start with
:data:`~orchestrator.deploy.k8s.manifest.HEADER` are ever removed or counted as left over.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterable

from orchestrator.deploy.k8s.manifest import HEADER, Obj, object_key, to_yaml


def _pointer(parts: Iterable[str | int]) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def overlay_ops(base: Any, over: Any, path: tuple[str | int, ...] = ()) -> list[Obj]:
    """A JSON 6902 patch taking ``base`` to ``over``.

    Mappings are diffed key by key, lists of equal length item by item
    (``/spec/workerGroupSpecs/0/replicas``); anything else is replaced whole.
    """
    if base == over:
        return []
    if isinstance(base, dict) and isinstance(over, dict):
        ops: list[Obj] = []
        for k in base:
            if k not in over:
                ops.append({"op": "remove", "path": _pointer((*path, k))})
        for k, v in over.items():
            if k not in base:
                ops.append({"op": "add", "path": _pointer((*path, k)), "value": copy.deepcopy(v)})
            else:
                ops.extend(overlay_ops(base[k], v, (*path, k)))
        return ops
    if isinstance(base, list) and isinstance(over, list) and len(base) == len(over):
        return [op for i, (a, b) in enumerate(zip(base, over)) for op in overlay_ops(a, b, (*path, i))]
    return [{"op": "replace", "path": _pointer(path), "value": copy.deepcopy(over)}]


def apply_json_patch(doc: Any, ops: Iterable[Obj]) -> Any:
    """Apply the add/remove/replace subset of JSON 6902 that :func:`overlay_ops` writes."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        if not parts:
            doc = copy.deepcopy(op["value"])
            continue
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last: str | int = int(parts[-1]) if isinstance(parent, list) else parts[-1]
        if op["op"] == "remove":
            del parent[last]
        elif op["op"] in ("add", "replace"):
            if op["op"] == "replace" and (last not in parent if isinstance(parent, dict) else False):
                raise KeyError(f"replace of a missing path {op['path']}")
            parent[last] = copy.deepcopy(op["value"])
        else:
            raise ValueError(f"unsupported patch op {op['op']!r}")
    return doc


def _target(obj: Obj) -> Obj:
    api_version, kind, namespace, name = object_key(obj)
    group, _, version = api_version.rpartition("/")
    target: Obj = {"group": group, "version": version, "kind": kind, "name": name}
    if namespace:
        target["namespace"] = namespace
    return target


def _kustomization(resources: list[str], patches: list[Obj] | None = None) -> str:
    k: Obj = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": resources}
    if patches:
        k["patches"] = patches
    return HEADER + to_yaml(k)


def write_tree(tree: dict[str, str], out: Path) -> list[Path]:
    """Write the tree under ``out``; remove files a previous render wrote that this one does not.

    Only files that start with :data:`HEADER` are ever removed, so hand-made
    files beside the generated ones are safe. Returns the paths written.
    """
    out = Path(out)
    written = []
    for rel, text in sorted(tree.items()):
        p = out / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if not p.exists() or p.read_text() != text:
            p.write_text(text)
        written.append(p)
    keep = {out / rel for rel in tree}
    for sub in ("base", "overlays"):
        for p in sorted((out / sub).rglob("*.yaml")) if (out / sub).exists() else []:
            if p not in keep and p.read_text().startswith(HEADER):
                p.unlink()
    return written


def stale_files(tree: dict[str, str], out: Path) -> list[str]:
    """Relative paths where ``out`` differs from ``tree`` (missing, changed or left over)."""
    out = Path(out)
    diff = [rel for rel, text in sorted(tree.items())
            if not (out / rel).exists() or (out / rel).read_text() != text]
    for sub in ("base", "overlays"):
        if (out / sub).exists():
            for p in sorted((out / sub).rglob("*.yaml")):
                rel = p.relative_to(out).as_posix()
                if rel not in tree and p.read_text().startswith(HEADER):
                    diff.append(rel)
    return diff
