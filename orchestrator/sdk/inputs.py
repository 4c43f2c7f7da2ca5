"""Turning what a user typed or passed into the validated models, before any call to the head.

The SDK validates once, here, at its edge: a :class:`~orchestrator.core.request.GpuRequest`
from a ``--gpu`` string, a number of cards or a dict; a
:class:`~orchestrator.core.job.JobSpec` from a dict whose ``gpu`` may be such a
string, or a gang ``NxSPEC`` (``2x4``: two workers of four whole cards, granted all or nothing). Every refusal is an :class:`~orchestrator.core.errors.InvalidRequestError`
naming the field; the CLI builds its models through these functions too.
"""

from __future__ import annotations

import secrets
from typing import Any, Mapping

from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.ids import job_slug
from orchestrator.core.job import JobSpec
from orchestrator.core.request import GpuRequest
from orchestrator.core.gang_request import GangRequest, is_gang_text


def as_request(gpu: GpuRequest | str | int | Mapping[str, Any]) -> GpuRequest:
    """A :class:`GpuRequest` from itself, a ``--gpu`` string, a number of cards or a dict. Raises on bad input."""
    if isinstance(gpu, GpuRequest):
        return gpu
    if isinstance(gpu, bool):
        raise InvalidRequestError("gpu", gpu, "a GpuRequest, a --gpu string or a number of cards")
    if isinstance(gpu, int):
        return GpuRequest.parse(str(gpu))
    if isinstance(gpu, str):
        return GpuRequest.parse(gpu)
    if isinstance(gpu, Mapping):
        return GpuRequest(**dict(gpu))
    raise InvalidRequestError("gpu", gpu, "a GpuRequest, a --gpu string or a number of cards")


def as_spec(spec: JobSpec | Mapping[str, Any]) -> JobSpec:
    """A :class:`JobSpec` from itself or a dict whose ``gpu`` may be a ``--gpu`` string. Raises on bad input."""
    if isinstance(spec, JobSpec):
        return spec
    d = dict(spec)
    if is_gang_text(d.get("gpu")):  # "2x4": a gang of two workers of four whole cards each
        if d.get("workers", 1) != 1:
            raise InvalidRequestError("workers", d["workers"], "unset when gpu names the gang (NxSPEC)")
        gang = GangRequest.parse(d["gpu"])  # "1-4x1": an elastic gang of one to four workers
        if d.get("min_workers") is not None and gang.min_workers is not None:
            raise InvalidRequestError("min_workers", d["min_workers"], "unset when gpu names it (MIN-MAXxSPEC)")
        d["gpu"], d["workers"] = gang.worker, gang.workers
        if gang.min_workers is not None:
            d["min_workers"] = gang.min_workers
    elif "gpu" in d and not isinstance(d["gpu"], GpuRequest):
        d["gpu"] = as_request(d["gpu"])
    return JobSpec(**d)


def new_job_id(name: str) -> str:
    """A client-chosen job id, ``<name>-<6 hex>``: a submission the head's actor retries finds the same job."""
    return f"{job_slug(name)}-{secrets.token_hex(3)}"


def new_lease_id() -> str:
    """A client-chosen lease id: a retried ``request_lease`` with it returns the same lease."""
    return f"lease-{secrets.token_hex(4)}"
