"""The head's metrics, from a controller driven by fake agents (no Ray), and a real HTTP scrape of them."""

from __future__ import annotations

import re
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.control.metrics import HeadMetrics
from orchestrator.deploy.k8s.dashboard import METRICS


def samples(m: HeadMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every exported sample, parsed by prometheus_client's own text parser."""
    out = {}
    for fam in text_string_to_metric_families(m.text().decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(m: HeadMetrics, name: str, **labels: str) -> float:
    got = samples(m)
    key = (name, frozenset(labels.items()))
    if key not in got:
        have = sorted(str(dict(sorted(k[1]))) for k in got if k[0] == name) or "none"
        raise AssertionError(f"{name}{labels} not exported; series of that name: {have}")
    return got[key]


def card(ctl, node: str, gpu: str) -> dict[str, str]:
    """The per-GPU labels of one card: node, device index and the card's UUID (DCGM's ``UUID``)."""
    (g,) = [g for g in ctl.nodes.get(node).inventory.gpus if str(g.index) == gpu]
    return {"node": node, "gpu": gpu, "gpu_uuid": g.uuid}


def test_metrics_follow_the_ledger_and_serve_over_http(ctl, agents, clock) -> None:
    m = HeadMetrics()
    ctl.request_lease({"lease_id": "a", "request": "2", "owner": "t", "priority_class": "training"})
    ctl.request_lease({"lease_id": "b", "request": "mig:1g.10gb", "owner": "t", "priority_class": "batch"})
    ctl.request_lease({"lease_id": "c", "request": "8", "owner": "t", "priority_class": "batch"})  # never fits
    clock.advance(0.3)
    report = ctl.reconcile()
    m.update(ctl, report)
    assert value(m, "orchestrator_gpus") == 10
    assert abs(value(m, "orchestrator_gpus_allocated") - (2 + 1 / 7)) < 1e-3  # a 1g slice: 1/7 of a card
    assert value(m, "orchestrator_leases_active", kind="whole") == 1
    assert value(m, "orchestrator_leases_active", kind="mig") == 1
    assert value(m, "orchestrator_leases", kind="whole", state="granted") == 1
    assert value(m, "orchestrator_leases", kind="whole", state="pending") == 1  # "8" names its kind
    assert value(m, "orchestrator_queue_length", priority_class="batch", queue="default") == 1
    assert value(m, "orchestrator_lease_wait_seconds_count", priority_class="training", queue="default") == 1
    assert value(m, "orchestrator_lease_wait_seconds_count", priority_class="batch", queue="default") == 1
    assert value(m, "orchestrator_leases_granted_total", kind="whole", priority_class="training", queue="default") == 1
    assert value(m, "orchestrator_placement_seconds_count") == 1  # one scheduling pass had work
    # Capacity per GPU, in base units: the 1g.10gb slice commits 1/7 of a card and 10 GiB of it.
    a = ctl.get_lease("a")["allocation"]
    b = ctl.get_lease("b")["allocation"]
    node_b, gpu_b = b["node"], str(b["gpu_indices"][0])
    card_b = card(ctl, node_b, gpu_b)
    assert card_b["gpu_uuid"].startswith("GPU-") and card_b["gpu_uuid"] == b["gpu_uuids"][0]
    assert value(m, "orchestrator_gpu_compute_capacity", **card_b) == 1
    assert abs(value(m, "orchestrator_gpu_compute_committed", **card_b) - 1 / 7) < 1e-9
    assert value(m, "orchestrator_gpu_memory_committed_bytes", **card_b) == 10 * 1024**3
    assert value(m, "orchestrator_gpu_memory_capacity_bytes", **card_b) == 80 * 1024**3
    gpu_a = str(a["gpu_indices"][0])
    card_a = card(ctl, a["node"], gpu_a)
    assert value(m, "orchestrator_gpu_compute_committed", **card_a) == 1
    # Utilisation in the workload model: granted but not started is idle; active keeps its share busy.
    assert value(m, "orchestrator_gpu_utilization_ratio", **card_a, source="model") == 0
    mig = {"node": node_b, "kind": "mig", "priority_class": "batch", "queue": "default"}
    assert value(m, "orchestrator_leases_gpu_compute_committed", **mig) == pytest.approx(1 / 7)
    assert value(m, "orchestrator_leases_gpu_compute_busy", **mig, source="model") == 0
    ctl.activate("a", ctl.ledger.get("a").lease.fencing_token, "holder-a")
    ctl.activate("b", ctl.ledger.get("b").lease.fencing_token, "holder-b")
    m.update(ctl)
    assert value(m, "orchestrator_gpu_utilization_ratio", **card_a, source="model") == 1
    assert value(m, "orchestrator_leases_gpu_compute_busy", **mig, source="model") == pytest.approx(1 / 7)
    whole = {"node": a["node"], "kind": "whole", "priority_class": "training", "queue": "default"}
    assert value(m, "orchestrator_leases_gpu_compute_committed", **whole) == 2  # two whole cards
    assert value(m, "orchestrator_leases_gpu_compute_busy", **whole, source="model") == 2
    # Heartbeat age follows the clock.
    clock.advance(2.0)
    m.update(ctl)
    assert value(m, "orchestrator_agent_heartbeat_age_seconds", node="h100-0") == pytest.approx(2.3)
    # Inventory disagreements: a zero baseline per severity until a cross-check reports some; one that
    # went away reads 0.
    assert value(m, "orchestrator_inventory_disagreements", node="", field="", severity="error") == 0
    m.set_inventory_disagreements({("a100-0", "gpu.model", "error"): 1, ("a100-1", "gpu.count", "warning"): 2})
    assert value(m, "orchestrator_inventory_disagreements", node="a100-1", field="gpu.count", severity="warning") == 2
    m.set_inventory_disagreements({})
    assert value(m, "orchestrator_inventory_disagreements", node="a100-0", field="gpu.model", severity="error") == 0
    # Every metric the Grafana dashboard queries is declared (labelled counters have no sample before
    # their first event: tests/integration/test_dashboard.py checks every panel has data in a real run).
    families = {f.name for f in text_string_to_metric_families(m.text().decode())}
    for name in METRICS:
        assert name in families or re.sub(r"_(total|bucket)$", "", name) in families, name
    # Released leases leave the gauges; the series of a kind and class no lease holds on a node go.
    ctl.release("a", ctl.ledger.get("a").lease.fencing_token)
    m.update(ctl)
    assert value(m, "orchestrator_leases_active", kind="whole") == 0
    assert not [k for k in samples(m) if k[0].startswith("orchestrator_leases_gpu_compute_")
                and ("kind", "whole") in k[1]]
    assert not m._counts[1].entered  # noqa: SLF001 - each lease observed once when it began holding, then forgotten
    m.update(ctl)
    assert value(m, "orchestrator_lease_wait_seconds_count", priority_class="training", queue="default") == 1  # once
    port = m.serve(0, "127.0.0.1")
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        m.close()
    assert "orchestrator_gpus 10.0" in body


def test_preemption_counts_its_cause_the_checkpoint_and_the_decision_to_grant(ctl, agents, clock) -> None:
    m = HeadMetrics()
    for lease_id, cards in (("t1", "4"), ("t2", "2"), ("t3", "2")):
        ctl.request_lease({"lease_id": lease_id, "request": cards, "owner": lease_id, "priority_class": "training"})
    m.update(ctl, ctl.reconcile())
    for lease_id in ("t1", "t2", "t3"):
        ctl.activate(lease_id, ctl.ledger.get(lease_id).lease.fencing_token, f"holder-{lease_id}")
    clock.advance(31)  # past training's minimum runtime
    for agent in agents.values():
        agent.beat()
    ctl.request_lease({"lease_id": "inf", "request": "1", "owner": "serve", "priority_class": "inference"})
    m.update(ctl, ctl.reconcile())
    victims = [x for x in ("t1", "t2", "t3") if ctl.get_lease(x)["state"] == "checkpointing"]
    assert len(victims) == 1
    assert value(m, "orchestrator_preemptions_total", reason="checkpoint", cause="victim.priority",
                 priority_class="training", queue="default") == 1
    clock.advance(1.5)  # the victim takes 1.5 s to checkpoint and yield
    ctl.ack_preemption(victims[0], "/ck/step-10")
    clock.advance(0.5)
    for _ in range(2):  # the victim's agent stops its holder and confirms: only then do its cards move
        for agent in agents.values():
            agent.beat()
    m.update(ctl, ctl.reconcile())
    assert ctl.get_lease("inf")["state"] == "granted"
    assert value(m, "orchestrator_checkpoint_seconds_count") == 1
    assert value(m, "orchestrator_checkpoint_seconds_sum") == pytest.approx(1.5)
    assert value(m, "orchestrator_decision_to_grant_seconds_sum") == pytest.approx(2.0)
    m.update(ctl, ctl.reconcile())  # nothing is counted twice
    assert value(m, "orchestrator_checkpoint_seconds_count") == 1
    assert value(m, "orchestrator_decision_to_grant_seconds_count") == 1


def test_waits_grants_and_preemptions_carry_the_lease_s_priority_class_and_queue(settings, store, clock, demo) -> None:
    """The demo's classes and queues (configs/priorities.yaml): batch leases of the research queue fill the cards,
    an inference lease of the default queue takes one; each series names the class and queue it counts."""
    from orchestrator.control.controller import HeadController

    from .conftest import SimAgent

    ctl = HeadController(settings, store, clock=clock, sched_config=demo.scheduler)
    agents = {n.name: SimAgent(ctl, demo, n.name) for n in demo.nodes}
    for a in agents.values():
        a.register()
    m = HeadMetrics(priority_classes=demo.scheduler.classes, queues=demo.scheduler.queues)
    # Known classes and queues read 0 before the first preemption.
    assert value(m, "orchestrator_preemptions_total", reason="checkpoint", cause="victim.priority",
                 priority_class="training", queue="research") == 0
    for i in range(8):  # every card that takes a whole lease (two are MIG-partitioned)
        ctl.request_lease({"lease_id": f"b{i}", "request": "1", "owner": "r", "priority_class": "batch",
                           "queue": "research"})
    m.update(ctl, ctl.reconcile())
    assert value(m, "orchestrator_leases_granted_total", kind="whole", priority_class="batch", queue="research") == 8
    assert value(m, "orchestrator_lease_wait_seconds_count", priority_class="batch", queue="research") == 8
    for i in range(8):
        ctl.activate(f"b{i}", ctl.ledger.get(f"b{i}").lease.fencing_token, f"holder-b{i}")
    ctl.request_lease({"lease_id": "inf", "request": "1", "owner": "s", "priority_class": "inference"})
    for _ in range(3):  # the victim is stopped at once (batch has no checkpoint); its agent confirms
        m.update(ctl, ctl.reconcile())
        for agent in agents.values():
            agent.beat()
    m.update(ctl, ctl.reconcile())
    assert ctl.get_lease("inf")["state"] == "granted"
    stopped = {dict(k[1])["cause"]: v for k, v in samples(m).items() if k[0] == "orchestrator_preemptions_total"
               and {("reason", "stopped"), ("priority_class", "batch"), ("queue", "research")} <= k[1] and v}
    assert sum(stopped.values()) == 1, stopped
    assert value(m, "orchestrator_leases_granted_total", kind="whole", priority_class="inference", queue="default") == 1


def test_measured_utilisation_replaces_the_model_and_is_shared_by_leases(ctl, agents, clock) -> None:
    m = HeadMetrics()
    ctl.request_lease({"lease_id": "x", "request": "timeslice:0.5", "owner": "o", "priority_class": "batch"})
    m.update(ctl, ctl.reconcile())
    ctl.activate("x", ctl.ledger.get("x").lease.fencing_token, "hx")
    a = ctl.get_lease("x")["allocation"]
    gpu = str(a["gpu_indices"][0])
    agents[a["node"]].beat(utilization={gpu: 0.8})
    m.update(ctl, measured=ctl.measured)
    assert value(m, "orchestrator_gpu_utilization_ratio", **card(ctl, a["node"], gpu), source="nvml") == 0.8
    ts = {"node": a["node"], "kind": "timeslice", "priority_class": "batch", "queue": "default"}
    # The only active lease on the card: the card's whole measured busy time is its, in GPUs.
    assert value(m, "orchestrator_leases_gpu_compute_busy", **ts, source="nvml") == pytest.approx(0.8)
    assert value(m, "orchestrator_leases_gpu_compute_committed", **ts) == pytest.approx(0.5)
    agents[a["node"]].beat()  # no measurement any more: back to the model, and the nvml series goes
    m.update(ctl, measured=ctl.measured)
    assert value(m, "orchestrator_gpu_utilization_ratio", **card(ctl, a["node"], gpu), source="model") == 0.5
    assert value(m, "orchestrator_leases_gpu_compute_busy", **ts, source="model") == pytest.approx(0.5)
    assert not [k for k in samples(m) if k[0].startswith("orchestrator_") and ("source", "nvml") in k[1]]


def test_inference_reports_count_requests_latency_and_slo_misses() -> None:
    m = HeadMetrics(inference_services=["svc"])
    assert value(m, "orchestrator_inference_requests_total", service="svc") == 0  # registered: 0, not "no data"
    assert m.record_inference("svc", [0.01, 0.02, 0.3], slo_s=0.1) == 1
    assert value(m, "orchestrator_inference_requests_total", service="svc") == 3
    assert value(m, "orchestrator_inference_slo_misses_total", service="svc") == 1
    assert value(m, "orchestrator_inference_latency_seconds_count", service="svc") == 3
    got = {s[0] for s in m.samples()}
    assert "orchestrator_inference_requests_total" in got


def test_inference_reports_from_unregistered_services_add_no_series() -> None:
    """A caller chooses the service name: a thousand names (a job id each, or a fuzzer's) are one ``other``."""
    m = HeadMetrics(inference_services=["svc"])
    for i in range(1000):
        m.record_inference(f"job-{i}", [0.2], slo_s=0.1)
    assert value(m, "orchestrator_inference_requests_total", service="other") == 1000
    assert value(m, "orchestrator_inference_slo_misses_total", service="other") == 1000
    assert {dict(k[1])["service"] for k in samples(m) if k[0] == "orchestrator_inference_requests_total"} == \
        {"svc", "other"}
    m.register_inference_service("job-7")  # registered later: its own label from then on
    m.record_inference("job-7", [0.01])
    assert value(m, "orchestrator_inference_requests_total", service="job-7") == 1
    with pytest.raises(ValueError, match="other"):
        m.register_inference_service("other")


def test_heartbeat_ages_are_computed_when_scraped_from_the_heads_clock(ctl, agents, clock) -> None:
    """Every node's age changes all the time: it is read at the scrape, not kept up by the cycles. A node that
    leaves (lost) has no age series."""
    m = HeadMetrics()
    assert not [k for k in samples(m) if k[0] == "orchestrator_agent_heartbeat_age_seconds"]  # no registry yet
    m.update(ctl)
    first = value(m, "orchestrator_agent_heartbeat_age_seconds", node="h100-0")
    clock.advance(0.6)
    assert value(m, "orchestrator_agent_heartbeat_age_seconds", node="h100-0") == pytest.approx(first + 0.6)
    agents["h100-0"].beat()
    assert value(m, "orchestrator_agent_heartbeat_age_seconds", node="h100-0") == pytest.approx(0.0)
    assert value(m, "orchestrator_agent_heartbeat_age_seconds", node="a100-0") == pytest.approx(first + 0.6)
    for _ in range(3):  # a100-0 falls silent past its TTL (5 s) and is lost; the others beat
        clock.advance(2.0)
        for name, a in agents.items():
            if name != "a100-0":
                a.beat()
        ctl.reconcile()
    assert ctl.nodes.get("a100-0").state.value != "registered"
    nodes = {dict(k[1])["node"] for k in samples(m) if k[0] == "orchestrator_agent_heartbeat_age_seconds"}
    assert nodes == set(agents) - {"a100-0"}


def test_gpu_gauges_refresh_at_most_every_gauges_every_s_and_the_lease_counts_every_update(ctl, agents, clock) -> None:
    m = HeadMetrics(gauges_every_s=1.0)
    ctl.request_lease({"lease_id": "a", "request": "2", "owner": "t", "priority_class": "training"})
    m.update(ctl, ctl.reconcile())
    assert value(m, "orchestrator_gpus_allocated") == 2
    clock.advance(0.5)
    ctl.request_lease({"lease_id": "b", "request": "1", "owner": "t", "priority_class": "training"})
    m.update(ctl, ctl.reconcile())
    assert value(m, "orchestrator_leases_active", kind="whole") == 2  # counted every update
    assert value(m, "orchestrator_gpus_allocated") == 2  # the GPU gauges wait out their interval
    b = ctl.get_lease("b")["allocation"]
    card_b = card(ctl, b["node"], str(b["gpu_indices"][0]))
    if b["node"] != ctl.get_lease("a")["allocation"]["node"]:
        assert not [k for k in samples(m) if k[0] == "orchestrator_leases_gpu_compute_committed"
                    and ("node", b["node"]) in k[1]]
    assert value(m, "orchestrator_gpu_compute_committed", **card_b) == 0
    clock.advance(0.5)
    m.update(ctl, ctl.reconcile())
    assert value(m, "orchestrator_gpus_allocated") == 3
    assert value(m, "orchestrator_gpu_compute_committed", **card_b) == 1


_NODE_SERIES = ("orchestrator_gpu_compute_capacity", "orchestrator_gpu_compute_committed",
                "orchestrator_gpu_memory_capacity_bytes", "orchestrator_gpu_memory_committed_bytes",
                "orchestrator_gpu_utilization_ratio", "orchestrator_leases_gpu_compute_committed",
                "orchestrator_leases_gpu_compute_busy")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_gpu_gauges_kept_from_change_feeds_equal_gauges_built_afresh(ctl, agents, clock, seed) -> None:
    """The per-GPU and per-lease series, refreshed only for the nodes the ledger's and the registry's change feeds
    name (and the measured ones), equal those a new :class:`HeadMetrics` builds from every node, after each step
    of a random walk: leases requested, granted, activated and released; agents measuring and not; a node lost
    (silent past its TTL, its leases lost) and registered again as a new incarnation."""
    import random

    rng = random.Random(seed)
    kept = HeadMetrics()
    live: list[str] = []
    silent: set[str] = set()
    measuring: dict[str, list[str]] = {}  # node -> the GPUs its agent reports a measured utilisation for
    seen: dict[str, set[str]] = {"lost": set(), "measured": set(), "holding": set()}
    gpus = ["1", "2", "timeslice:0.5", "mps:30%", "mig:1g.10gb", "mig:3g.40gb"]
    for step in range(80):
        for k in range(rng.randint(1, 4)):  # several changes a step: a cycle sees more than one node change
            op = rng.random()
            if op < 0.35:
                lid = f"l{step}-{k}"
                ctl.request_lease({"lease_id": lid, "request": rng.choice(gpus), "owner": "t", "priority_class": "batch"})
                live.append(lid)
            elif op < 0.55 and live:
                e = ctl.ledger.get(rng.choice(live))
                if e.lease.state.value == "granted":
                    ctl.activate(e.lease_id, e.lease.fencing_token, f"holder-{e.lease_id}")
            elif op < 0.75 and live:
                e = ctl.ledger.get(live.pop(rng.randrange(len(live))))
                if not e.lease.terminal:
                    ctl.release(e.lease_id, e.lease.fencing_token if e.lease.state.value != "pending" else None)
            elif op < 0.85:  # an agent starts measuring two of its GPUs (NVML), or stops
                name = rng.choice(sorted(agents))
                if measuring.pop(name, None) is None:
                    measuring[name] = rng.sample([str(g.index) for g in agents[name].inventory.gpus], 2)
            elif op < 0.92 and not silent:
                silent.add(rng.choice(sorted(agents)))  # stops beating: lost once its TTL passes
            elif silent and ctl.nodes.get(next(iter(silent))).state.value != "registered":
                name = silent.pop()  # lost, and now back as a new incarnation
                agents[name].core.incarnation = agents[name].incarnation = f"inc-{step}"
                agents[name].register()
        clock.advance(rng.choice([0.2, 1.0, 2.0]))  # under agent_ttl_s / 2: a longer gap is the head's own stall
        for name, a in agents.items():
            if name not in silent:
                a.beat(utilization={g: round(rng.random(), 2) for g in measuring.get(name, ())} or None)
        kept.update(ctl, ctl.reconcile(), measured=ctl.measured)
        seen["lost"] |= {r.name for r in ctl.nodes.records.values() if r.state.value != "registered"}
        seen["measured"] |= set(ctl.measured)
        seen["holding"] |= {e.lease_id for e in ctl.ledger.holding()}
        fresh = HeadMetrics()
        fresh.update(ctl, measured=ctl.measured)
        got, want = samples(kept), samples(fresh)
        for name in _NODE_SERIES:
            assert {k: v for k, v in got.items() if k[0] == name} == {k: v for k, v in want.items() if k[0] == name}, \
                (step, name)
    assert seen["lost"] and seen["measured"] and len(seen["holding"]) >= 5, seen  # the walk went where it should
