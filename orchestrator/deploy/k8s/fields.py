"""The checks every part of the KubeRay config (:mod:`.config`) shares: DNS-1123 labels, Kubernetes
quantities, image references (an explicit tag or digest, never an implied ``latest``), and the frozen
pydantic base every model of the config derives from (``extra="forbid"``: a misspelt field is an error,
not a default). Each check raises a :class:`~orchestrator.core.errors.ConfigError` naming the field, the
offending value and what would have been accepted.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchestrator.core.errors import ConfigError
from orchestrator.core.quantity import is_quantity


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_RAY_IMAGE = re.compile(r"^(docker\.io/)?rayproject/ray(-ml)?:(?P<version>\d+\.\d+\.\d+)")
# name[:tag][@digest] with a tag or a digest: a registry host (with a port), path components, then the reference.
_IMAGE_REF = re.compile(
    r"^(?P<name>[a-z0-9]+([._-][a-z0-9]+)*(\.[a-z0-9]+([._-][a-z0-9]+)*)*(:[0-9]+)?(/[a-z0-9]+([._/-][a-z0-9]+)*)*)"
    r"(:(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(@(?P<digest>sha256:[a-f0-9]{64}))?$"
)
# The Dockerfile's tag scheme: <project version>-ray<Ray version>-py311-<variant>.
_OUR_IMAGE = re.compile(r":[^:/@]*-ray(?P<version>\d+\.\d+\.\d+)-")
_HOST_PORT = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?:[0-9]{1,5}$")


def _dns_label(field: str, v: str, max_len: int = 63) -> str:
    if len(v) > max_len or not _DNS_LABEL.match(v):
        raise ConfigError(
            field, v, f"a DNS-1123 label: lower-case letters, digits and '-', starting and ending with a letter "
            f"or digit, at most {max_len} characters",
        )
    return v


def _quantity(field: str, v: str) -> str:
    if not is_quantity(v):
        raise ConfigError(field, v, "a Kubernetes quantity, e.g. '4', '500m', '16Gi'")
    return v


def _image(field: str, v: str) -> str:
    m = _IMAGE_REF.match(v)
    if not m or not (m.group("tag") or m.group("digest")):
        raise ConfigError(
            field, v, "an image reference with an explicit tag or digest, e.g. "
            "'registry.example.com/ray-gpu-orchestrator:0.1.0-ray2.60.0-py311-gpu'",
            detail="an untagged image means 'latest', which differs from node to node over time",
        )
    if m.group("tag") == "latest":
        raise ConfigError(field, v, "a fixed tag or a digest", detail="'latest' differs from node to node over time")
    return v


def _bad(field: str, value: Any, allowed: str | list[str], detail: str = "") -> ConfigError:
    """A cross-field check failed; ``field`` is relative to the model that checks it."""
    return ConfigError(field, value, allowed, detail=detail)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Resources(_Frozen):
    """CPU and memory of one pod (requests equal limits: Guaranteed QoS, never evicted first)."""

    cpu: str = Field(default="8", description="CPU cores, a Kubernetes quantity ('8', '500m')")
    memory: str = Field(default="32Gi", description="Memory, a Kubernetes quantity ('32Gi')")

    @field_validator("cpu", "memory")
    @classmethod
    def _q(cls, v: str, info: Any) -> str:
        return _quantity(info.field_name, v)
