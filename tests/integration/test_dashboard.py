"""The live page and the metrics during a real-cluster scenario: Chromium, Prometheus, the head's /metrics.

One scenario on the real 3-node Ray cluster (training fills the whole cards,
an inference job that reports its request latencies arrives, one training job
checkpoints, yields and resumes), watched three ways at once:

* **a real browser** -- Debian's Chromium, driven headless by Playwright, opens the
  page: no console errors, the curves gain points, the pipeline counts change,
  clicking the victim shows its explain; a screenshot is saved as an artefact
  (``$RGO_ARTIFACTS`` or ``out/test-artifacts/dashboard.png``);
* **the head's /metrics** -- scraped before and after: the preemption counter goes
  from nothing to 1, grants and checkpoints are counted;
* **Prometheus** -- Debian's ``prometheus`` scrapes the head every second (adding
  the ``namespace`` label, as the PodMonitor's target does), and every panel of
  the Grafana dashboard (:mod:`orchestrator.deploy.k8s.dashboard`) is queried
  through its HTTP API and must return data.

``.ci/run`` installs ``chromium`` and ``prometheus``; without them this module fails
and says which is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from heads import remove_head

from orchestrator.core.config import RuntimeSettings
from orchestrator.core.job import JobSpec
from orchestrator.core.request import GpuRequest
from orchestrator.deploy.k8s.dashboard import panels
from orchestrator.deploy.local import free_port

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "jobs" / "train.py"
INFERENCE = REPO / "jobs" / "inference.py"
ARTIFACTS = Path(os.environ.get("RGO_ARTIFACTS", REPO / "out" / "test-artifacts"))
NAMESPACE_LABEL = "rgo-dash"
SETTINGS = RuntimeSettings(namespace="rgo-dash", head_name="rgo-head-dash", heartbeat_interval_s=0.5,
                           agent_ttl_s=5.0, reconcile_interval_s=0.2, inference_services=("serve",))
#: The head's /metrics port, chosen when its fixture starts it: one chosen at collection, minutes earlier, was
#: once taken by a Ray process of another module's cluster by then (the scrape read a gRPC server's bytes).
METRICS: dict[str, int] = {}


def until(cond: Callable[[], Any], timeout: float, what: str, every: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: .ci/run installs it (apt-get install -y {name})")
    return path


@pytest.fixture(scope="module")
def head(ray_cluster: Any) -> Iterator[Any]:
    import ray

    from orchestrator.rayport import ray_api
    from orchestrator.rayport.actors import start_head
    from orchestrator.rayport.client import HeadClient

    cfg = ray_cluster.config
    sched = cfg.scheduler.model_copy(update={"classes": {
        **cfg.scheduler.classes,
        "training": cfg.scheduler.classes["training"].model_copy(update={"min_runtime_s": 1.0, "grace_period_s": 60.0}),
    }})
    METRICS["port"] = free_port()
    settings = SETTINGS.model_copy(update={"metrics_port": METRICS["port"]})
    handle = start_head(settings, cfg.model_copy(update={"scheduler": sched}), node_id=ray_api.head_node_id())
    until(lambda: len(ray_api.unwrap(ray.get(handle.ping.remote()))["registered_nodes"]) == 3, 120, "3 agents")
    yield HeadClient(handle=handle)
    remove_head(SETTINGS, cfg)


@pytest.fixture(scope="module")
def prometheus(head: Any) -> Iterator[str]:
    exe = binary("prometheus")
    tmp = Path(tempfile.mkdtemp(prefix="rgo-prom-"))
    port = free_port()
    (tmp / "prometheus.yml").write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "orchestrator", "static_configs": [{
            "targets": [f"127.0.0.1:{METRICS['port']}"], "labels": {"namespace": NAMESPACE_LABEL}}]}],
    }))
    log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([exe, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        until(lambda: _ready(url) or proc.poll() is not None, 60, "prometheus ready")
        assert proc.poll() is None, (tmp / "prometheus.log").read_text()[-2000:]
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _ready(url: str) -> bool:
    try:
        return urllib.request.urlopen(f"{url}/-/ready", timeout=2).status == 200
    except OSError:
        return False


def promql(url: str, expr: str) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": expr})
    body = json.loads(urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=10).read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def scrape() -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{METRICS['port']}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + "".join(f"|{k}={v}" for k, v in sorted(s.labels.items()))
            out[key] = s.value
    return out


def summed(samples: dict[str, float], name: str, **labels: str) -> float:
    want = [f"{k}={v}" for k, v in labels.items()]
    return sum(v for k, v in samples.items() if k.split("|")[0] == name and all(w in k.split("|") for w in want))


@pytest.fixture(scope="module")
def dashboard(head: Any) -> Iterator[Any]:
    from orchestrator.dashboard.app import Comparison
    from orchestrator.core.datafiles import openb_sample
    from orchestrator.dashboard.compare import ComparisonJob
    from orchestrator.dashboard.server import DashboardServer

    comparison = Comparison()
    compare = ComparisonJob(comparison, trace=openb_sample(), target_pct=130).start()
    try:
        with DashboardServer(head, port=0, poll_s=1.0, comparison=comparison) as server:
            yield server
    finally:
        compare.stop()


def job(head: Any, spec: JobSpec) -> str:
    return head.submit_job(spec.model_dump(mode="json"))["job_id"]


def wait_job(head: Any, job_id: str, states: set[str], timeout: float = 180) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        j = head.get_job(job_id)
        if j["state"] in ("failed", "cancelled") and j["state"] not in states:
            raise AssertionError(f"{job_id} ended {j['state']}: {j['message']}\n{head.job_logs(job_id)[-2000:]}")
        return j if j["state"] in states else None

    return until(check, timeout, f"{job_id} in {states}")


def test_page_and_metrics_follow_a_preemption_scenario(head: Any, dashboard: Any, prometheus: str,
                                                       tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    chromium = binary("chromium")
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1700})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.set_default_timeout(90_000)  # a starved 2-core machine: the renderer may lag the scenario
            page.goto(dashboard.url)
            page.wait_for_selector("#conn.live", timeout=30_000)

            def stage(key: str, part: str = "now") -> str:
                return page.inner_text(f"#stage-{key} .{part}")

            def points() -> int:
                return int(page.evaluate("document.getElementById('chart-queue').data[0].x.length"))

            assert stage("running") == "0"
            before = scrape()
            assert summed(before, "orchestrator_preemptions_total") == 0
            # Training fills every whole card.
            trainings = []
            for seed, cards in ((1, 4), (2, 2), (3, 2)):
                spec = JobSpec(name=f"train-{seed}", gpu=GpuRequest.whole(cards), priority="training",
                               checkpoint_dir=str(tmp_path / f"train-{seed}"),
                               entrypoint=f"{sys.executable} {TRAIN} --steps 400 --seed {seed} --step-delay 0.03",
                               runtime_env={"env_vars": {"ORCHESTRATOR_POLL_S": "0.1"}})
                trainings.append(job(head, spec))
            for j in trainings:
                wait_job(head, j, {"running"})
            until(lambda: stage("running") == "3", 30, "the page showing 3 running")
            n0 = points()
            time.sleep(3)  # training passes its minimum runtime (1 s) and makes progress
            # Inference arrives: real requests, latencies reported to the head.
            serve = JobSpec(name="serve", gpu=GpuRequest.whole(1), priority="inference",
                            entrypoint=f"{sys.executable} {INFERENCE} --duration 6 --report-every 0.5 --width 128 "
                                       f"--slo-ms 50 --service serve",
                            runtime_env={"env_vars": {"ORCHESTRATOR_POLL_S": "0.1"}})
            inf = job(head, serve)
            until(lambda: stage("preempt", "total") == "(1)", 60, "the page counting the preemption")
            victims = until(lambda: [j for j in trainings if head.get_job(j)["preemptions"]], 30, "a victim")
            assert len(victims) == 1
            mid = scrape()
            assert summed(mid, "orchestrator_preemptions_total", reason="checkpoint", cause="victim.priority") == 1
            wait_job(head, inf, {"succeeded"})
            until(lambda: head.get_job(victims[0])["attempt"] == 2 and head.get_job(victims[0])["state"] == "running",
                  120, "the victim resumed")
            until(lambda: stage("resume", "total") == "(1)", 30, "the page counting the resume")
            assert points() > n0 + 5, "the curves gained no points"
            until(lambda: page.evaluate(
                "Math.max(...document.getElementById('chart-throughput').data[1].y.map(v => v || 0))") > 0,
                  30, "the inference throughput curve rising")
            # Click the victim: its explain says who preempted it.
            page.click(f"#decisions a.job[data-job='{victims[0]}']")
            page.wait_for_selector(f"#explain[data-job='{victims[0]}']", timeout=15_000)
            assert f"preempted by {inf}" in page.inner_text("#explain")
            # The schemes' comparison (the tiny trace's replay) arrived over the stream and is drawn.
            until(lambda: page.evaluate("(document.getElementById('chart-comparison').data || []).length") == 3,
                  60, "the schemes' comparison chart")
            assert page.evaluate("document.getElementById('chart-comparison').data[0].x.length") == 5
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
            assert not errors, errors

            # The head's /metrics moved as the scenario says.
            after = scrape()
            assert summed(after, "orchestrator_leases_granted_total") >= 5  # 3 trainings, inference, the resume
            assert summed(after, "orchestrator_checkpoint_seconds_count") == 1
            assert summed(after, "orchestrator_decision_to_grant_seconds_count") == 1
            assert summed(after, "orchestrator_inference_requests_total", service="serve") > 0  # registered
            assert summed(after, "orchestrator_inference_latency_seconds_count", service="serve") == \
                summed(after, "orchestrator_inference_requests_total", service="serve")

            # Every Grafana panel's query returns data from Prometheus' scrapes of the head.
            def empty_panels() -> list[str]:
                out = []
                for title, expr, _unit in panels():
                    res = promql(prometheus, expr.replace("$namespace", NAMESPACE_LABEL))
                    if not res or all(r["value"][1] in ("NaN", "+Inf", "-Inf") for r in res):
                        out.append(title)
                return out

            last: list[list[str]] = [[]]

            def every_panel_has_data() -> bool:
                last[0] = empty_panels()
                return not last[0]
            try:
                until(every_panel_has_data, 60, "data in every Grafana panel", every=1.0)
            except AssertionError as e:
                raise AssertionError(f"{e}; still empty: {last[0]}") from None
        finally:
            browser.close()
    for j in trainings:
        wait_job(head, j, {"succeeded"}, timeout=240)
