"""Live MIG repartitioning on a real local Ray cluster: the head actor plans it, the agent actors apply it.

The demo's a100-1 has MIG on GPUs 2 and 3 (simulated backend). Asking the head for the ``training`` preset
must give both cards one ``7g.80gb`` slice through the real heartbeat path (reply -> agent actor ->
``reconfigure_mig`` -> ``update_inventory``), and a lease for that slice is then granted with its new UUID.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest

from orchestrator.core.config import RuntimeSettings

from tests.integration.heads import running_head

pytestmark = pytest.mark.ray

SETTINGS = RuntimeSettings(namespace="rgo-rp", heartbeat_interval_s=0.5, agent_ttl_s=6.0, reconcile_interval_s=0.1)


@pytest.fixture(scope="module")
def head(ray_cluster: Any) -> Iterator[Any]:
    from orchestrator.rayport.client import HeadClient

    with running_head(SETTINGS, ray_cluster.config) as handle:
        yield HeadClient(handle=handle)


def test_the_training_preset_relayouts_both_mig_cards_and_the_new_slice_is_granted(head: Any) -> None:
    answer = head.repartition_mig("training")
    assert sorted(c["gpu_index"] for c in answer["plan"]["changes"]) == [2, 3] and len(answer["started"]) == 2
    deadline = time.monotonic() + 60
    while True:
        states = [r["state"] for r in head.status()["repartitions"]]
        if states == ["done", "done"]:
            break
        assert time.monotonic() < deadline and "failed" not in states, states
        time.sleep(0.2)
    inv = next(n for n in head.agent_inventories() if n["name"] == "a100-1")
    assert [[(m["profile"], m["start"]) for m in g["mig_devices"]] for g in inv["gpus"][2:]] == [[("7g.80gb", 0)]] * 2
    head.request_lease({"lease_id": "big", "request": "mig:7g.80gb"})
    got = head.wait_lease("big", 30)
    assert got["state"] == "granted" and got["allocation"]["mig_uuid"] in {
        g["mig_devices"][0]["uuid"] for g in inv["gpus"][2:]}
    samples = head.metric_samples()["samples"]
    assert ["orchestrator_mig_reconfigurations_total", {"result": "done"}, 2.0] in samples
