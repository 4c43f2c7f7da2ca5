"""An elastic gang job on a real local Ray cluster: ``--gpu 1-3x1`` under Ray Train, grown into a card that frees up
and shrunk when inference wants one, each time through a Ray Train checkpoint, resuming with 0 steps lost and ending
where an undisturbed run ends (to rounding: the world size changes, docs/preemption.md "Elastic gangs").

The cluster (conftest): a100-0 (4 whole cards), a100-1 (2 whole cards, 2 MIG), h100-0 (2 whole). Inference holds
h100-0, three cards of a100-0 and one of a100-1, so the gang starts at 2 workers (a100-0, a100-1); the a100-1 lease
ends and the gang grows to 3 once its attempt ran ``grow_after_s``; then a one-card inference lease finds no idle
card and the gang shrinks to 2.
"""

from __future__ import annotations

import json
import secrets
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from orchestrator.core.config import RuntimeSettings
from orchestrator.core.lease import key_digest
from orchestrator.core.request import GpuRequest
from orchestrator.sdk.leases import lease

from tests.integration.heads import running_head
from tests.integration.test_gang_train import _ray_train_missing, _train_gang
from tests.integration.test_gang_train import _until as _wait

pytestmark = pytest.mark.ray

if (_why := _ray_train_missing()) is not None:
    pytestmark = [pytest.mark.ray, pytest.mark.skip(reason=_why)]

SETTINGS = RuntimeSettings(namespace="rgo-elastic", heartbeat_interval_s=0.5, agent_ttl_s=10.0,
                           reconcile_interval_s=0.1)
REPO = Path(__file__).resolve().parents[2]
STEPS = 300
GROW_AFTER_S = 4.0


def _until(what: str, cond: Callable[[], Any], timeout: float, why: Callable[[], str]) -> Any:
    """test_gang_train's wait, its failure saying where the job stands (``why``)."""
    try:
        return _wait(what, cond, timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}; {why()}") from None


@pytest.fixture(scope="module")
def head(ray_cluster: Any) -> Iterator[Any]:
    from orchestrator.rayport.client import HeadClient

    cfg = ray_cluster.config
    sched = cfg.scheduler
    training = sched.classes["training"].model_copy(update={"min_runtime_s": 0.0, "grace_period_s": 120.0})
    sched = sched.model_copy(update={"classes": {**sched.classes, "training": training},
                                     "elastic": sched.elastic.model_copy(update={"grow_after_s": GROW_AFTER_S})})
    with running_head(SETTINGS, cfg.model_copy(update={"scheduler": sched})) as handle:
        yield HeadClient(handle=handle)


def _attempt(ckpt: Path, jid: str, n: int) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((ckpt / "logs" / f"{jid}-a{n}").glob("worker-*.json"))]


def _checkpointed(ckpt: Path, jid: str, n: int) -> int:
    (p,) = (ckpt / "logs" / f"{jid}-a{n}").glob("checkpoint-*.json")
    return int(json.loads(p.read_text())["step"])


def test_an_elastic_gang_job_grows_and_shrinks_through_checkpoints_losing_no_step(
        head: Any, ray_cluster: Any, tmp_path: Path) -> None:
    import torch

    from orchestrator import Client
    from orchestrator.sdk.inputs import as_spec

    ns, ckpt = SETTINGS.namespace, tmp_path / "ckpt"
    spec = as_spec({"name": "elastic", "gpu": "1-3x1", "priority": "training", "checkpoint_dir": str(ckpt),
                    "entrypoint": f"python {REPO / 'jobs' / 'train_gang.py'} --steps {STEPS} --step-sleep 0.05"})
    with ExitStack() as blockers:
        for node, n in (("h100-0", 2), ("a100-0", 3)):
            blockers.enter_context(lease(GpuRequest.whole(n, node=node), priority="inference", head=head, namespace=ns))
        frees = ExitStack()
        frees.enter_context(lease(GpuRequest.whole(1, node="a100-1"), priority="inference", head=head, namespace=ns))
        job = Client(namespace=ns).submit(spec)
        jid = job.job_id

        def why() -> str:
            d = head.get_job(jid)
            return (f"job {d['state']} attempt {d['attempt']}: {head.explain_job(jid)['summary']}; "
                    f"history {[(h['state'], h['reason'][:160]) for h in d['history']]}; "
                    f"driver log tail: {head.job_logs(jid)[-2000:]!r}")

        _until("2 workers training", lambda: len(_attempt(ckpt, jid, 1)) == 2, 240, why)
        assert {w["world_size"] for w in _attempt(ckpt, jid, 1)} == {2}
        # a card frees up: once the attempt ran GROW_AFTER_S, the head asks it to checkpoint and it comes back at 3
        frees.close()
        _until("the gang grown to 3", lambda: len(_attempt(ckpt, jid, 2)) == 3, 240, why)
        first = head.get_job(jid)["preemptions"][0]
        assert "grows from 2 to 3" in first["reason"], first
        assert {w["resumed_at"] for w in _attempt(ckpt, jid, 2)} == {_checkpointed(ckpt, jid, 1)} != {0}
        # inference wants a card and none is idle: the gang shrinks to 2 and the inference lease is granted
        _until("attempt 2 training", lambda: (p := ckpt / "logs" / f"{jid}-a2" / "progress").exists()
               and int(p.read_text()) > _checkpointed(ckpt, jid, 1), 240, why)
        key = secrets.token_hex(16)
        urgent = head.request_lease({"lease_id": f"urgent-{key[:8]}", "request": {"kind": "whole", "count": 1},
                                     "priority_class": "inference", "requeue_on_loss": False,
                                     "requester_digest": key_digest(key)})
        try:
            _until("inference granted", lambda: head.get_lease(urgent)["state"] == "granted", 240, why)
            _until("the gang shrunk to 2", lambda: len(_attempt(ckpt, jid, 3)) == 2, 240, why)
            second = head.get_job(jid)["preemptions"][1]
            assert "shrinks from 3 to 2" in second["reason"], second
            assert {w["resumed_at"] for w in _attempt(ckpt, jid, 3)} == {_checkpointed(ckpt, jid, 2)}
            final = _until("the job finished", lambda: (d := head.get_job(jid))["state"] in
                           ("succeeded", "failed", "cancelled") and d, 300, why)
        finally:
            token = head.get_lease(urgent, key)["fencing_token"]  # the requester's key shows it
            head.release(urgent, token if isinstance(token, int) else None, reason="test over", key=key)
    logs = job.logs()
    assert final["state"] == "succeeded", logs[-3000:]
    result = json.loads(next(line for line in logs.splitlines() if line.startswith("RESULT "))[7:])
    assert result["finished"] and result["attempt"] == 3 and result["workers"] == 2 and result["step"] == STEPS
    # the steps each attempt ran add up to STEPS: 0 lost at each resize
    assert _checkpointed(ckpt, jid, 1) < _checkpointed(ckpt, jid, 2) < STEPS
    print(f"\nelastic job: 2 workers to step {_checkpointed(ckpt, jid, 1)}, 3 to step {_checkpointed(ckpt, jid, 2)}, "
          f"2 to step {STEPS}")
    tg = _train_gang()
    ref = tg.fit(None, steps=STEPS, storage=str(tmp_path / "ref"), name="reference", log_dir=str(tmp_path / "ref-log"),
                 num_workers=1)
    reference = tg.load_weights(ref.checkpoint.path)
    weights = tg.load_weights(result["checkpoint"])
    for k in reference:
        assert torch.allclose(weights[k], reference[k], rtol=1e-4, atol=1e-5), f"{k} drifted from the undisturbed run"
