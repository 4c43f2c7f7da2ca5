"""The queue reaches Ray's autoscaler (issue #37 item 7) on a real local Ray cluster: a lease that fits nowhere
makes the head call ``ray.autoscaler.sdk.request_resources``, and the bundles are read back from the GCS where
Ray keeps them; withdrawn, the request is cleared; and stopping the orchestrator for good (what ``down`` runs)
withdraws the head's request, but never another caller's.

The shared cluster runs no autoscaler, so Ray takes the v1 path (``is_autoscaler_v2()`` is false): the bundles
are the JSON under the GCS KV key ``autoscaler_resource_request`` (``ray._private.ray_constants``), what the
v1 monitor -- Ray's own, or KubeRay's sidecar -- reads each round. This test reads that key itself, in this
driver: the head wrote it from its own process. One head, its three agents.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest

from orchestrator.core.config import RuntimeSettings, Tuning
from orchestrator.core.lease import key_digest

from tests.integration.heads import running_head, until

pytestmark = pytest.mark.ray

SETTINGS = RuntimeSettings(namespace="rgo-as", heartbeat_interval_s=0.5, agent_ttl_s=6.0, reconcile_interval_s=0.1,
                           tuning=Tuning(autoscaler_demand_every_s=0.3))
KEY = "it-key"


@pytest.fixture(scope="module")
def head(ray_cluster: Any) -> Iterator[Any]:
    from orchestrator.rayport.client import HeadClient

    with running_head(SETTINGS, ray_cluster.config) as handle:
        yield HeadClient(handle=handle)


def _requested() -> list[dict[str, float]] | None:
    """The bundles the cluster's autoscaler request holds now (None: no request was ever made)."""
    from ray._private.ray_constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
    return None if raw is None else json.loads(raw)


def _ask(head: Any, lease_id: str, priority_class: str) -> None:
    head.request_lease({"lease_id": lease_id, "request": {"kind": "whole", "count": 4}, "owner": "it",
                        "priority_class": priority_class, "requester_digest": key_digest(KEY)})


def test_a_lease_that_fits_nowhere_is_asked_of_the_autoscaler_and_withdrawn_clears_it(head: Any) -> None:
    from ray.autoscaler.v2.utils import is_autoscaler_v2

    assert not is_autoscaler_v2()  # no autoscaler here: Ray keeps the request in the KV key read below
    # a started head sends its first demand, empty: it replaces whatever was asked before
    until("the head's first, empty demand in the GCS", lambda: _requested() == [], 30)

    # four whole cards: only a100-0 has them; an inference lease takes them (never preempted), so a second
    # one waits with nothing to preempt -- wait.no_fit -- and only a new node could hold it
    _ask(head, "held", "inference")
    assert head.wait_lease("held", 60, KEY)["state"] == "granted"
    _ask(head, "waits", "batch")
    until("the second lease waiting for room", lambda: head.explain_lease("waits").get("pending", {}).get("cause")
          == "wait.no_fit", 30)

    # in the GCS: a100-0's held cards (the autoscaler fits the request as if every node were idle), then the
    # waiting lease's own four cards
    until("the demand in the GCS", lambda: _requested() == [{"GPU": 4}, {"GPU": 4}], 30)
    shown = head.status()["autoscaler_demand"]
    assert [(b["for"], b["resources"], b["leases"], b["cause"]) for b in shown] == [
        ("held", {"GPU": 4}, ["held"], "placed"), ("pending", {"GPU": 4}, ["waits"], "wait.no_fit")]
    assert "node a100-0" in shown[0]["reason"] and "lease waits" in shown[1]["reason"]

    # withdrawn: nothing waits, the demand is empty, and so is the request Ray keeps
    head.release("waits", key=KEY)
    until("the request cleared", lambda: _requested() == [], 30)
    assert head.status()["autoscaler_demand"] == []
    head.release("held", key=KEY, token=head.get_lease("held", KEY)["fencing_token"])


def test_stopping_the_orchestrator_withdraws_its_request_and_only_its_own(head: Any, ray_cluster: Any) -> None:
    """Ray keeps a request until the next one: a head stopped while it asked for nodes would leave an autoscaling
    cluster growing for a queue that is gone. Runs last in the module: it stops the module's head."""
    from orchestrator.rayport.actors import stop_orchestrator
    from orchestrator.rayport.ray_api import request_resources, withdraw_request
    from orchestrator.rayport.store import gcs_table

    nodes = [n.name for n in ray_cluster.config.nodes]
    _ask(head, "held-2", "inference")  # new ids: a lease id is the request's idempotency key
    assert head.wait_lease("held-2", 60, KEY)["state"] == "granted"
    _ask(head, "waits-2", "batch")
    until("the demand in the GCS", lambda: _requested() == [{"GPU": 4}, {"GPU": 4}], 30)
    stopped = stop_orchestrator(SETTINGS.namespace, SETTINGS.head_name, nodes)
    assert "autoscaler request" in stopped
    assert _requested() == []  # cleared: the autoscaler would otherwise keep growing for the dead head's queue
    assert withdraw_request(gcs_table(SETTINGS.namespace)) == "nothing asked"  # the record went with it

    # another caller asked after the head's last request: a stop leaves that one alone
    table = gcs_table(SETTINGS.namespace)
    request_resources([{"GPU": 2}], record_in=table)  # as the head records its own
    request_resources([{"CPU": 8}])  # then someone else's, which replaces it in Ray
    assert withdraw_request(table) == "not ours"
    assert _requested() == [{"CPU": 8}]
    request_resources([])
