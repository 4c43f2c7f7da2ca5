"""The head's ``/metrics`` by Prometheus' book, scraped over HTTP from the real head (in-process, no Ray) after
representative work: ``promtool check metrics`` (Prometheus' own lint, from Debian's ``prometheus`` package that
``.ci/run`` installs), the same naming rules in Python, labels that stay bounded whoever calls the head, and a
Grafana panel for every family the head registers."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from headless import InProcessHead
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.core.config import RuntimeSettings
from orchestrator.deploy.k8s.dashboard import panels

#: In every id and owner the test hands the head: no label value may carry it.
MARK = "zq7mark"
#: Labels whose values are unbounded (a series per lease attempt, driver or secret).
DENIED_LABELS = {"lease", "lease_id", "owner", "holder", "driver", "pid", "token", "fencing_token", "job", "job_id"}
NAME = re.compile(r"^orchestrator_[a-z][a-z0-9]*(_[a-z0-9]+)*$")
LABEL = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
#: Units that are not base units (Prometheus: seconds, bytes, ratios; never ms, MiB or percent).
NOT_BASE_UNIT = re.compile(r"_(milliseconds|microseconds|nanoseconds|ms|us|ns|minutes|hours|days|"
                           r"kib|mib|gib|kb|mb|gb|bits|percent|pct)(_|$)")
BASE_UNITS = ("seconds", "bytes", "ratio")


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessHead]:
    """The head after representative work: leases of every share kind (held, started, pending), inference
    reports from a registered service and from an unregistered one, an inventory cross-check, commits."""
    settings = RuntimeSettings(heartbeat_interval_s=0.1, agent_ttl_s=5.0, reconcile_interval_s=0.02,
                               inference_services=("chat",))
    h = InProcessHead(settings=settings, workdir=tmp_path_factory.mktemp("head"))
    try:
        owner = f"driver-{os.getpid()}-{MARK}"  # what the SDK sends: a driver's pid in the owner
        for i, (request, cls) in enumerate((("1", "training"), ("mig:1g.10gb", "batch"), ("mps:30%", "inference"),
                                            ("timeslice:0.5", "batch"))):
            h.acquire_lease({"lease_id": f"{MARK}-{i}", "request": request, "owner": owner, "priority_class": cls},
                            30, holder=f"actor:{MARK}-{i}")
        for i in range(3):  # two nodes have four cards, and some are taken: one at least stays pending
            h.request_lease({"lease_id": f"{MARK}-four-{i}", "request": "4", "owner": owner, "priority_class": "batch",
                             "queue": "research"})
        h.record_inference("chat", [0.01, 0.2], 0.1)
        h.record_inference(f"job-{MARK}", [0.05], 0.1)
        with h.lock:
            h.service.metrics.set_inventory_disagreements({("a100-0", "gpu.model", "error"): 1})
            h.service.metrics.committed(3, 0.002)
            h.service.metrics.commit_failed()
        h.wait_for(lambda: h.service.metrics.leases_busy.values and any(
            n == "orchestrator_queue_length" and v for n, _, v in h.service.metrics.samples()), 10,
                   "the leases' GPU series and a queued lease")
        yield h
    finally:
        h.close()


@pytest.fixture(scope="module")
def scraped(head: InProcessHead) -> str:
    port = head.service.metrics.serve(0, "127.0.0.1")
    try:
        with head.lock:  # between two cycles: a scrape of one state
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        head.service.metrics.close()


def test_promtool_finds_nothing_to_lint(scraped: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("needs promtool (Debian's prometheus package; .ci/run installs it)")
    out = subprocess.run([promtool, "check", "metrics"], input=scraped, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_grafana_query_parses(tmp_path: Path) -> None:
    """Each panel's PromQL, as a recording rule for ``promtool check rules`` (Prometheus' own parser); the
    real-cluster test (tests/integration/test_dashboard.py) also runs them."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("needs promtool (Debian's prometheus package; .ci/run installs it)")
    rules = [{"record": f"panel:query{i}", "expr": expr.replace("$namespace", "ns")}
             for i, (_, expr, _) in enumerate(panels())]
    (tmp_path / "rules.yml").write_text(json.dumps({"groups": [{"name": "panels", "rules": rules}]}))  # JSON is YAML
    out = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_family_follows_the_naming_rules(head: InProcessHead, scraped: str) -> None:
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", scraped, re.M))
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", scraped, re.M))
    assert len(types) > 20, scraped[:2000]
    problems = []
    for name, kind in types.items():
        if not NAME.match(name):
            problems.append(f"{name}: not orchestrator_ and snake_case")
        if (kind == "counter") != name.endswith("_total"):
            problems.append(f"{name}: a {kind} {'without' if kind == 'counter' else 'with'} the _total suffix")
        if NOT_BASE_UNIT.search(name):
            problems.append(f"{name}: not in base units")
        if not helps.get(name, "").strip():
            problems.append(f"{name}: no HELP")
    for family in head.service.metrics.registry.collect():  # the unit a family declares (OpenMetrics' UNIT) is a
        suffix = next((u for u in BASE_UNITS if family.name.endswith(f"_{u}")), "")  # base unit and its suffix
        if family.unit != suffix:
            problems.append(f"{family.name}: declares unit {family.unit!r}, its name's suffix says {suffix!r}")
    for family in text_string_to_metric_families(scraped):
        for label in {k for s in family.samples for k in s.labels} - {"le"}:
            if not LABEL.match(label):
                problems.append(f"{family.name}: label {label!r} is not snake_case")
            if label in DENIED_LABELS:
                problems.append(f"{family.name}: label {label!r} is unbounded")
    assert not problems, "\n".join(problems)


def test_no_lease_driver_or_unregistered_service_becomes_a_label_value(scraped: str) -> None:
    """The head was handed lease ids, holders, an owner with a pid and a service name, each with ``MARK``: none is
    in a series. The registered service is, and the unregistered one counts as ``other``."""
    lines = [line for line in scraped.splitlines() if not line.startswith("#")]
    assert not [line for line in lines if MARK in line]
    assert not [line for line in lines if f'"{os.getpid()}"' in line or f"-{os.getpid()}-" in line]
    assert 'orchestrator_inference_requests_total{service="chat"} 2.0' in lines
    assert 'orchestrator_inference_requests_total{service="other"} 1.0' in lines
    # The series that replaced the per-lease utilisation: by node, kind, class and queue.
    busy = [line for line in lines if line.startswith("orchestrator_leases_gpu_compute_busy{")]
    assert any('kind="mig"' in line and 'priority_class="batch"' in line for line in busy), busy
    assert any('gpu_uuid="GPU-' in line for line in lines if line.startswith("orchestrator_gpu_utilization_ratio{"))


def test_every_family_the_head_registers_has_a_grafana_panel(head: InProcessHead) -> None:
    queried = "\n".join(expr for _, expr, _ in panels())
    missing = []
    for family in head.service.metrics.registry.collect():
        names = {"counter": (f"{family.name}_total",),
                 "histogram": tuple(f"{family.name}_{s}" for s in ("bucket", "count", "sum"))}
        if not any(re.search(rf"\b{n}\{{", queried) for n in names.get(family.type, (family.name,))):
            missing.append(family.name)
    assert not missing, f"families without a Grafana panel (orchestrator/deploy/k8s/dashboard.py): {missing}"
