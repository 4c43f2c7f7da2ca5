"""Ray's autoscaler SDK: the head's demand for nodes, as ``ray.autoscaler.sdk.request_resources``.

One call, one cluster-wide request that replaces the previous one (whoever made it). What is in it is decided
in :mod:`orchestrator.control.demand`; when it is sent, in the head actor (:mod:`orchestrator.rayport.head`,
off its event loop). What Ray does with it (installed Ray 2.60, ``ray/autoscaler/_private/commands.py``):

* autoscaler v1 (Ray's own, and KubeRay's sidecar unless v2 is enabled): the bundles are written as JSON to the
  GCS KV key ``autoscaler_resource_request`` (default KV namespace), which the autoscaler's monitor reads each
  round;
* autoscaler v2 (the GCS says ``__autoscaler_v2_enabled``, or ``RAY_enable_autoscaler_v2=1``): the bundles go
  to the GCS as a cluster resource constraint, which the v2 autoscaler reads;

either way the autoscaler fits them on every node as if idle and launches nodes for the rest. Where no
autoscaler runs, the request is only recorded there: nothing reads it.

Invariant: a blocking GCS call (seconds when the GCS is away): call it off any event loop.
"""

from __future__ import annotations

from typing import Mapping, Sequence


def request_resources(bundles: Sequence[Mapping[str, float]]) -> None:
    """Ask the autoscaler for a cluster that fits ``bundles`` (an empty list clears an earlier request).
    Raises what Ray raises (a ``TypeError`` for a malformed bundle, a GCS error when it cannot be written)."""
    from ray.autoscaler.sdk import request_resources as ray_request_resources

    ray_request_resources(bundles=[dict(b) for b in bundles])
