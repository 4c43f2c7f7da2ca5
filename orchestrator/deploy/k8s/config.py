"""One declared config for a KubeRay deployment of the orchestrator.

The parts: :mod:`.fields` (the shared checks and the frozen base), :mod:`.pools`
(node pools and their MIG layouts), :mod:`.specs` (the other sections: head, auth,
Redis, checkpoints, quotas, jobs), :mod:`.model` (:class:`K8sConfig`, whose
cross-field validators need the whole tree at once). This module loads a file:
overlays deep-merged over the base, pydantic's errors turned into ours; every
name of the config is still importable from here.

``orchestrator k8s render`` turns a :class:`K8sConfig` into every manifest
(``render.py``); nobody hand-edits the YAML. The config is frozen pydantic:
each field says what it means, each validator names the offending value and
what would have been accepted, and :func:`load_config` turns pydantic's
errors into :class:`~orchestrator.core.errors.ConfigError` (exit code 2 in the CLI).

Nomenclature:

* a **node pool** is a set of Kubernetes GPU nodes that look alike; each pool
  becomes one KubeRay worker group whose pods take a whole node's GPUs
  (``whole``), all its MIG devices under the device plugin's *mixed* strategy
  (``mig``), or shares of GPUs the GPU operator set up for MPS or
  time-slicing (``mps``, ``time-slicing``). A ``cpu`` pool has no GPUs (a kind
  cluster for a smoke test);
* a **MIG layout** is the list of instances on *each* GPU of a MIG node, as
  the GPU operator's MIG manager makes them (``nvidia.com/mig.config``);
* an **overlay** is a named partial config deep-merged over the base; the
  renderer writes it as a kustomize overlay of the base.

Invariants (checked here, so the renderer never sees a bad config):

* names are DNS-1123 labels and unique within their kind;
* every MIG layout fits one card of its model (valid NVML placements, at most
  7 compute slices) and uses only that model's profiles;
* every priority class a pool or the head names is declared;
* the minimum cluster (head plus ``min_replicas`` of every pool) fits the
  namespace quota, so the RayCluster can become ready at all;
* the ports the head listens on are distinct;
* the image is named with an explicit tag or digest (never an implied
  ``latest``), so every pod of a cluster runs the same build;
* the training job's checkpoint directory lies on the checkpoint volume,
  which every Ray pod of the training cluster mounts at the same path: every
  attempt of a job, on whichever node, finds the previous attempt's checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from pydantic import ValidationError

from orchestrator.core.errors import ConfigError, InvalidRequestError
from orchestrator.core.priorities import SchedulerConfig
from orchestrator.core.validation import typed_error
from orchestrator.deploy.k8s.fields import Resources, _dns_label
from orchestrator.deploy.k8s.model import K8sConfig
from orchestrator.deploy.k8s.pools import (
    GPU_PRODUCT_LABEL, MIG_CONFIG_LABEL, SHARING_STRATEGY_LABEL, NodePool, Sharing, SimulatedGpus,
)
from orchestrator.deploy.k8s.specs import (
    HEAD_CONFIG_DIR, HEAD_CONFIG_FILE, AuthSpec, CheckpointSpec, GcsFaultToleranceSpec, HeadSpec, InferenceSpec,
    MonitoringSpec, NetworkSpec, PriorityClassSpec, QuotaSpec, RedisSpec, SchedulerSpec, TrainingJobSpec,
)

__all__ = ["AuthSpec", "CheckpointSpec", "GPU_PRODUCT_LABEL", "GcsFaultToleranceSpec", "HEAD_CONFIG_DIR",
    "HEAD_CONFIG_FILE", "HeadSpec", "InferenceSpec", "K8sConfig", "MIG_CONFIG_LABEL", "MonitoringSpec", "NetworkSpec",
    "NodePool", "PriorityClassSpec", "QuotaSpec", "RedisSpec", "Resources", "SHARING_STRATEGY_LABEL", "SchedulerSpec",
    "Sharing", "SimulatedGpus", "TrainingJobSpec", "deep_merge", "load_config", "parse_config"]


def deep_merge(base: Any, over: Any) -> Any:
    """``over`` merged into ``base``: mappings merge key by key, ``null`` resets a key to its
    default (drops it), anything else (lists too) replaces."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = deep_merge(base[k], v) if k in base else v
        return out
    return over


def _config_error(e: ValidationError, prefix: str = "") -> ConfigError:
    """Pydantic's first error as a :class:`ConfigError` naming the field (``prefix`` + its location).

    Pydantic's own errors are worded by :func:`~orchestrator.core.validation.typed_error`, as every model's
    are. Our own checks' errors are placed by this module's convention: a :class:`ConfigError` names its
    field relative to the model that checks it (so it is put after the location), and any other typed
    error (an unknown GPU model, from the catalogue) is named by the location alone."""
    err = e.errors(include_url=False)[0]
    inner = (err.get("ctx") or {}).get("error")
    if not isinstance(inner, InvalidRequestError):
        return cast(ConfigError, typed_error(e, prefix.rstrip("."), K8sConfig, ConfigError))
    loc = ".".join(str(p) for p in err["loc"])
    parts = [x for x in (prefix.rstrip("."), loc) if x]
    if isinstance(inner, ConfigError):
        if inner.field != loc.rsplit(".", 1)[-1]:
            parts.append(inner.field)
        return ConfigError(".".join(parts), inner.value, inner.allowed, detail=inner.detail)
    return ConfigError(".".join(parts) or "(config)", inner.value, inner.allowed,
                       detail=inner.detail or f"unknown {inner.field}")


def parse_config(data: dict[str, Any]) -> tuple[K8sConfig, dict[str, K8sConfig]]:
    """The base config and each overlay's full config from one mapping.

    Overlays may not change ``name`` or ``namespace``: kustomize patches
    target objects by those, and a renamed object would be a second cluster.
    """
    if not isinstance(data, dict):
        raise ConfigError("(config)", type(data).__name__, "a mapping of fields", detail="the config must be a mapping")
    data = dict(data)
    overlays_raw = data.pop("overlays", {}) or {}
    if not isinstance(overlays_raw, dict):
        raise ConfigError("overlays", overlays_raw, "a mapping of overlay name -> partial config")
    try:
        base = K8sConfig.model_validate(data)
    except ValidationError as e:
        raise _config_error(e) from None
    overlays: dict[str, K8sConfig] = {}
    for name, partial in overlays_raw.items():
        try:
            _dns_label("overlay name", str(name))
        except ValueError as e:
            raise ConfigError("overlays", name, "DNS-1123 labels", detail=str(e)) from None
        if not isinstance(partial, dict):
            raise ConfigError(f"overlays.{name}", partial, "a partial config mapping")
        for fixed in ("name", "namespace"):
            if fixed in partial and partial[fixed] != data.get(fixed, K8sConfig.model_fields[fixed].default):
                raise ConfigError(
                    f"overlays.{name}.{fixed}", partial[fixed], f"the base's {fixed}",
                    detail="kustomize patches target objects by name and namespace",
                )
        try:
            overlays[name] = K8sConfig.model_validate(deep_merge(data, partial))
        except ValidationError as e:
            raise _config_error(e, prefix=f"overlays.{name}.") from None
    return base, overlays


def load_config(path: str | Path) -> tuple[K8sConfig, dict[str, K8sConfig]]:
    """Read ``configs/k8s.yaml``: the base config and its overlays, validated."""
    from orchestrator.core.yamlfile import read_yaml

    data = read_yaml(path, "--config") or {}
    if isinstance(data, dict):
        base_dir = Path(path).parent
        data = _read_scheduler_file(data, base_dir, "head")
        if isinstance(data.get("overlays"), dict):
            data["overlays"] = {k: _read_scheduler_file(v, base_dir, f"overlays.{k}.head") if isinstance(v, dict)
                                else v for k, v in data["overlays"].items()}
    return parse_config(data)


def _read_scheduler_file(data: dict[str, Any], base_dir: Path, field: str) -> dict[str, Any]:
    """``head.scheduler_file: <path>`` (relative to the config) read into ``head.scheduler``."""
    head = data.get("head")
    if not isinstance(head, dict) or "scheduler_file" not in head:
        return data
    head = dict(head)
    ref = base_dir / str(head.pop("scheduler_file"))
    if not ref.is_file():
        raise ConfigError(f"{field}.scheduler_file", str(ref), "a policy file (see configs/priorities.yaml)",
                          detail="no such file")
    head["scheduler"] = SchedulerConfig.load(ref).model_dump(mode="json")
    return {**data, "head": head}
