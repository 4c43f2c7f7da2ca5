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

A request outlives whoever made it: Ray keeps it until the next one. So the head records what it sends in its own
KV namespace (:data:`SENT_KEY`, written *before* the request, so whatever the cluster holds that equals the record
is ours), and a stop for good (``rayport.actors.stop_orchestrator``, what ``orchestrator down`` runs) withdraws
it through :func:`withdraw_request` -- only while the cluster's request is still the one the head sent: another
caller's later request (Ray Data's or Train's autoscaling coordinator keep one too) is left alone. Autoscaler
v2 keeps the request as a GCS constraint this module does not read back: there the recorded request is cleared
when the record says the head's last one asked for anything (the head replaced any other caller's while it ran).

Invariant: a blocking GCS call (seconds when the GCS is away): call it off any event loop.
"""

from __future__ import annotations

import json
from typing import Literal, Mapping, Protocol, Sequence



class Record(Protocol):
    """Where a request is recorded: the head's own GCS KV table (a ``GcsKv``)."""

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, value: bytes) -> None: ...

    def delete(self, key: str) -> None: ...


#: The key, in the head's own KV namespace, of the bundles it last asked Ray's autoscaler for (JSON).
SENT_KEY = "autoscaler_request_sent"


def request_resources(bundles: Sequence[Mapping[str, float]], record_in: Record | None = None) -> None:
    """Ask the autoscaler for a cluster that fits ``bundles`` (an empty list clears an earlier request).
    ``record_in``: the caller's own KV table, where the bundles are recorded first (:func:`withdraw_request`).
    Raises what Ray raises (a ``TypeError`` for a malformed bundle, a GCS error when it cannot be written)."""
    from ray.autoscaler.sdk import request_resources as ray_request_resources

    asked = [dict(b) for b in bundles]
    if record_in is not None:
        record_in.put(SENT_KEY, json.dumps(asked).encode())
    ray_request_resources(bundles=asked)


def current_request() -> list[dict[str, float]] | None:
    """The bundles of the cluster's request as the v1 autoscaler reads them (None: none was ever made)."""
    from ray._private.ray_constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
    return None if raw is None else json.loads(raw)


Withdrawal = Literal["cleared", "nothing asked", "not ours"]


def withdraw_request(record_in: Record) -> Withdrawal:
    """Clear the cluster's autoscaler request if it is the one recorded in ``record_in`` (the head's table) and
    asks for anything; the record is removed either way. ``"not ours"``: the cluster's request is another
    caller's now, left as it is."""
    from ray.autoscaler.sdk import request_resources as ray_request_resources
    from ray.autoscaler.v2.utils import is_autoscaler_v2

    raw = record_in.get(SENT_KEY)
    ours = json.loads(raw) if raw is not None else []
    outcome: Withdrawal = "nothing asked"
    if ours:
        if is_autoscaler_v2() or current_request() == ours:
            ray_request_resources(bundles=[])
            outcome = "cleared"
        else:
            outcome = "not ours"
    if raw is not None:
        record_in.delete(SENT_KEY)
    return outcome
