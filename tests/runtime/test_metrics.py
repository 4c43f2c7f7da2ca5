"""The head's metrics, from a controller driven by fake agents (no Ray), and a real HTTP scrape of them."""

from __future__ import annotations

import re

import urllib.request

from orchestrator.deploy.k8s.dashboard import METRICS
from orchestrator.control.metrics import HeadMetrics


def _value(text: str, name: str, labels: str = "") -> float:
    for line in text.splitlines():
        if line.startswith(name + (("{" + labels + "}") if labels else " ")) or (not labels and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{{labels}}} not exported:\n{text}")


def test_metrics_follow_the_ledger_and_serve_over_http(ctl, agents, clock) -> None:
    m = HeadMetrics()
    ctl.request_lease({"lease_id": "a", "request": "2", "owner": "t", "priority_class": "training"})
    ctl.request_lease({"lease_id": "b", "request": "mig:1g.10gb", "owner": "t", "priority_class": "batch"})
    ctl.request_lease({"lease_id": "c", "request": "8", "owner": "t", "priority_class": "batch"})  # never fits
    clock.advance(0.3)
    report = ctl.reconcile()
    m.update(ctl, report)
    text = m.text().decode()
    assert _value(text, "orchestrator_gpus_total") == 10
    assert abs(_value(text, "orchestrator_gpus_allocated") - (2 + 1 / 7)) < 1e-3  # a 1g slice: 1/7 in milli-GPUs
    assert _value(text, "orchestrator_leases_active", 'kind="whole"') == 1
    assert _value(text, "orchestrator_leases_active", 'kind="mig"') == 1
    assert _value(text, "orchestrator_queue_length", 'priority="batch"') == 1
    assert _value(text, "orchestrator_lease_wait_seconds_count") == 2
    # Every metric the Grafana dashboard queries is exported with a sample (Ray's own aside).
    m.set_inventory_disagreements({("a100-0", "gpu.model", "error"): 1})
    text = m.text().decode()
    for name in METRICS:
        if name.startswith("orchestrator_"):
            assert re.search(rf"^{name}(_count|_total)?(\{{.*\}})? ", text, re.M), name
    # Released leases leave the gauges.
    ctl.release("a", ctl.get_lease("a")["fencing_token"])
    m.update(ctl)
    assert _value(m.text().decode(), "orchestrator_leases_active", 'kind="whole"') == 0
    # It was observed once, when it first held; ended, it is forgotten (no set growing forever) ...
    assert "a" not in m._observed and "b" in m._observed  # noqa: SLF001
    m.update(ctl)  # ... and not observed again.
    assert _value(m.text().decode(), "orchestrator_lease_wait_seconds_count") == 2
    port = m.serve(0, "127.0.0.1")
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "orchestrator_gpus_total 10.0" in body
