"""A gang lease on a real local Ray cluster: a 2-node ``TorchTrainer`` run on its placement group,
preempted by inference, resumed from its Ray Train checkpoint, ending bit-identical to an undisturbed run.

The cluster (conftest): a100-0 (4 whole cards), a100-1 (2 whole cards, 2 MIG), h100-0 (2 whole).
Inference leases hold h100-0 and two cards of a100-0, so a ``2x2`` gang must span a100-0 and a100-1;
then the cluster has no whole card free, and a 1-card inference lease can only come by preempting the
gang -- all of it.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from orchestrator.core.config import RuntimeSettings
from orchestrator.core.request import GpuRequest
from orchestrator.sdk.leases import gang_lease, lease

from tests.integration.heads import running_head

pytestmark = pytest.mark.ray


def _ray_train_missing() -> str | None:
    try:
        importlib.import_module("ray.train.torch")  # ray[train] needs pandas and pyarrow besides torch
    except ImportError as e:
        return f"Ray Train is not importable here ({e}); install the train extra: pip install -e '.[train]'"
    return None


@pytest.fixture(scope="module", autouse=True)
def _needs_ray_train() -> None:
    """Skips the module, naming the reason, where Ray Train is missing -- when the module runs, not at collection:
    the import takes torch, seconds of every xdist worker's collection, the worker that runs no test here too."""
    if (why := _ray_train_missing()) is not None:
        pytest.skip(why)


SETTINGS = RuntimeSettings(namespace="rgo-gang", heartbeat_interval_s=0.5, agent_ttl_s=10.0, reconcile_interval_s=0.1)
REPO = Path(__file__).resolve().parents[2]
STEPS = 200


def _train_gang() -> Any:
    """``jobs/train_gang.py`` as a module Ray ships to its workers by value (an example, not a package)."""
    from ray import cloudpickle

    spec = importlib.util.spec_from_file_location("rgo_train_gang", REPO / "jobs" / "train_gang.py")
    assert spec and spec.loader
    mod = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(mod)
    cloudpickle.register_pickle_by_value(mod)
    return mod


def _until(what: str, cond: Callable[[], Any], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def _job_until(head: Any, jid: str, state: str, timeout: float) -> dict[str, Any]:
    """Wait for the job to reach ``state``; an ended job, or a timeout, fails at once with the head's
    explanation of the job and its history (what a CI log needs to say why)."""
    ended = {"succeeded", "failed", "cancelled"} - {state}
    deadline = time.monotonic() + timeout
    while True:
        d = head.get_job(jid)
        if d["state"] == state:
            return d
        if d["state"] in ended or time.monotonic() > deadline:
            raise AssertionError(f"job {jid} is {d['state']}, not {state} (waited up to {timeout:g}s): "
                                 f"{head.explain_job(jid)['summary']}; message: {d['message']!r}; "
                                 f"history: {[(h['state'], h['reason']) for h in d['history']]}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def head(ray_cluster: Any) -> Iterator[Any]:
    from orchestrator.rayport.client import HeadClient

    cfg = ray_cluster.config
    training = cfg.scheduler.classes["training"].model_copy(update={"min_runtime_s": 0.0, "grace_period_s": 120.0})
    cfg = cfg.model_copy(update={"scheduler": cfg.scheduler.model_copy(
        update={"classes": {**cfg.scheduler.classes, "training": training}})})
    with running_head(SETTINGS, cfg) as handle:
        yield HeadClient(handle=handle)


def _workers(log: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(log.glob("worker-*.json"))]


@pytest.fixture(scope="module")
def reference(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The weights of an undisturbed 2-worker run of ``STEPS`` steps (Train workers anywhere, no lease)."""
    tg = _train_gang()
    tmp = tmp_path_factory.mktemp("reference")
    started = time.monotonic()
    ref = tg.fit(None, steps=STEPS, storage=str(tmp / "storage"), name="reference", log_dir=str(tmp / "ref-log"))
    assert ref.metrics["finished"] and ref.metrics["step"] == STEPS
    print(f"\nreference run: {time.monotonic() - started:.1f}s")
    return tg.load_weights(ref.checkpoint.path)


def test_gang_trains_is_preempted_by_inference_and_resumes_bit_identical(head: Any, ray_cluster: Any,
                                                                          reference: dict[str, Any],
                                                                          tmp_path: Path) -> None:
    import torch

    tg = _train_gang()
    ns = SETTINGS.namespace
    started = time.monotonic()

    stop = tmp_path / "stop"
    with ExitStack() as blockers:
        blockers.enter_context(lease(GpuRequest.whole(2, node="h100-0"), priority="inference", head=head, namespace=ns))
        blockers.enter_context(lease(GpuRequest.whole(2, node="a100-0"), priority="inference", head=head, namespace=ns))
        with gang_lease("2x2", priority="training", head=head, namespace=ns, requeue=True, gang_id="g1") as gang:
            assert sorted(gang.nodes) == ["a100-0", "a100-1"], gang.nodes  # no node holds both workers
            for i, lid in enumerate(gang.lease_ids):
                grant = next(h["reason"] for h in head.get_lease(lid)["history"] if h["state"] == "granted")
                assert grant.startswith(f"worker {i} of gang g1:") and "2 nodes: the fewest nodes that hold it" in grant
            log1 = tmp_path / "run1"
            out: list[Any] = []
            run = threading.Thread(target=lambda: out.append(tg.fit(
                gang, steps=STEPS, storage=str(tmp_path / "storage"), name="gang-1", log_dir=str(log1),
                stop_file=str(stop), step_sleep_s=0.05)))
            run.start()
            _until("training progress", lambda: (log1 / "progress").exists() and int((log1 / "progress").read_text()) >= 20)

            # Each Train worker runs on its own lease's node with its own lease's cards.
            workers = _workers(log1)
            assert len(workers) == 2
            by_lease = {m.lease_id: m for m in gang.members}
            for w in workers:
                member = by_lease[w["lease_id"]]
                assert w["node_id"] == member.handout["node_id"]
                assert w["cuda_visible_devices"] == member.cuda_visible_devices != ""
            assert len({w["cuda_visible_devices"] for w in workers}) == 2
            taken = {(m.node, i) for m in gang.members for i in m.allocation["gpu_indices"]}

            # Inference arrives: the only whole card it can get is one of the gang's.
            granted: list[Any] = []
            done = threading.Event()

            def infer() -> None:
                with lease(GpuRequest.whole(1), priority="inference", head=head, namespace=ns, timeout=180) as le:
                    granted.append((le.node, le.allocation["gpu_indices"][0]))
                    done.wait(120)

            preemptor = threading.Thread(target=infer)
            preemptor.start()
            _until("the gang asked to checkpoint", gang.preemption_requested, timeout=60)
            states = [head.get_lease(lid)["state"] for lid in gang.lease_ids]
            assert states == ["checkpointing", "checkpointing"], "the gang is one victim: every worker at once"
            stop.write_text("checkpoint now")
            run.join(180)
            assert out, "the preempted run did not return"
            first = out[0]
            assert not first.metrics["finished"] and 0 < first.metrics["step"] < STEPS
            gang.ack_preempted(first.checkpoint.path)
            _until("inference granted", lambda: granted, timeout=60)
            assert granted[0] in taken, f"inference got {granted[0]}, not one of the gang's cards {taken}"
            assert all(head.get_lease(lid)["state"] == "preempted" for lid in gang.lease_ids)
            stop.unlink()
            done.set()
            preemptor.join(60)

            resumed = gang.wait_resumed(180)
            try:
                assert resumed.resume_from == first.checkpoint.path
                assert resumed.lease_ids != gang.lease_ids and len(set(resumed.nodes)) >= 1
                second = tg.fit(resumed, steps=STEPS, storage=str(tmp_path / "storage"), name="gang-2",
                                log_dir=str(tmp_path / "run2"), resume_from=resumed.resume_from)
                assert second.metrics["finished"] and second.metrics["step"] == STEPS
                final = tg.load_weights(second.checkpoint.path)
                assert final.keys() == reference.keys()
                for k in reference:
                    assert torch.equal(final[k], reference[k]), f"{k} differs from the undisturbed run"
                for w in _workers(tmp_path / "run2"):
                    assert w["lease_id"] in resumed.lease_ids
            finally:
                resumed.release("test over")
    print(f"gang test: {time.monotonic() - started:.1f}s; preempted at step {first.metrics['step']}")


def test_a_gang_job_as_the_cli_submits_it_yields_as_one_and_resumes_bit_identical(
        head: Any, ray_cluster: Any, reference: dict[str, Any], tmp_path: Path) -> None:
    """``orchestrator submit --gpu 2x2 --checkpoint-dir D -- python jobs/train_gang.py``, through the same
    SDK call the CLI makes: the head runs one driver for the gang, which holds the cards with the gang's
    placement group, is preempted as one victim, acknowledges its Ray Train checkpoint, and resumes."""
    import torch

    from orchestrator import Client
    from orchestrator.sdk.inputs import as_spec

    tg = _train_gang()
    ns = SETTINGS.namespace
    ckpt = tmp_path / "ckpt"
    client = Client(namespace=ns)
    entry = f"python {REPO / 'jobs' / 'train_gang.py'} --steps {STEPS} --step-sleep 0.05"
    with ExitStack() as blockers:
        blockers.enter_context(lease(GpuRequest.whole(2, node="h100-0"), priority="inference", head=head, namespace=ns))
        blockers.enter_context(lease(GpuRequest.whole(2, node="a100-0"), priority="inference", head=head, namespace=ns))
        job = client.submit(as_spec({"name": "gang-job", "entrypoint": entry, "gpu": "2x2", "priority": "training",
                                     "checkpoint_dir": str(ckpt)}))
        jid = job.job_id
        info = _job_until(head, jid, "running", timeout=120)
        leases = [w["lease_id"] for w in info["worker_leases"]]
        assert sorted(w["allocation"]["node"] for w in info["worker_leases"]) == ["a100-0", "a100-1"]
        log1 = ckpt / "logs" / f"{jid}-a1"
        try:
            _until("training progress", lambda: (log1 / "progress").exists() and int((log1 / "progress").read_text()) >= 20,
                   timeout=180)
        except AssertionError as e:
            raise AssertionError(f"{e}; the driver's log:\n{head.job_logs(jid)[-4000:]}") from None
        workers = _workers(log1)
        assert sorted(w["lease_id"] for w in workers) == sorted(leases)  # each Train worker on its own lease
        assert len({w["cuda_visible_devices"] for w in workers}) == 2 and all(w["cuda_visible_devices"] for w in workers)

        granted: list[Any] = []
        done = threading.Event()

        def infer() -> None:
            with lease(GpuRequest.whole(1), priority="inference", head=head, namespace=ns, timeout=180) as le:
                granted.append(le.node)
                done.wait(120)

        preemptor = threading.Thread(target=infer)
        preemptor.start()
        _until("the gang job preempted as one", lambda: [head.get_lease(x)["state"] for x in leases] ==
               ["checkpointing", "checkpointing"] or head.get_job(jid)["attempt"] > 1, timeout=60)
        _until("inference granted", lambda: granted, timeout=120)  # the driver acknowledged its checkpoint
        assert all(head.get_lease(x)["state"] == "preempted" for x in leases)
        d = head.get_job(jid)
        assert d["attempt"] == 2 and d["preemptions"] and d["resume_from"]
        done.set()
        preemptor.join(60)
    # Inference gone: the gang is granted again and the job resumes from its Ray Train checkpoint.
    final = _until("the gang job finished", lambda: (d := head.get_job(jid))["state"] in
                   ("succeeded", "failed", "cancelled") and d, timeout=300)
    logs = job.logs()
    assert final["state"] == "succeeded", logs[-3000:]
    result = json.loads(next(line for line in logs.splitlines() if line.startswith("RESULT "))[7:])
    assert result["finished"] and result["attempt"] == 2 and result["resumed_from"] == final["resume_from"]
    weights = tg.load_weights(result["checkpoint"])
    for k in reference:
        assert torch.equal(weights[k], reference[k]), f"{k} differs from the undisturbed run"
