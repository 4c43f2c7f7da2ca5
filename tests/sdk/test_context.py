"""The job side: the context from the environment, a rate-limited preemption poll, checkpoint acks. No Ray."""

from __future__ import annotations

import pytest

from pathlib import Path
from typing import Iterator

from headless import InProcessHead

from orchestrator.core.config import DEMO_CONFIG, load_config
from orchestrator.core.errors import StaleFencingTokenError
from orchestrator.sdk.context import apply_limits, job_context

from .fakes import FakeClock

ENV = {"ORCHESTRATOR_JOB_ID": "train-1", "ORCHESTRATOR_NAMESPACE": "ns", "ORCHESTRATOR_HEAD_NAME": "h",
       "ORCHESTRATOR_CHECKPOINT_DIR": "/ck", "ORCHESTRATOR_RESUME_FROM": "/ck/checkpoint.pt",
       "ORCHESTRATOR_LEASE_ID": "train-1.a2", "ORCHESTRATOR_ATTEMPT": "2", "ORCHESTRATOR_POLL_S": "2"}


@pytest.fixture
def head(tmp_path: Path) -> Iterator[InProcessHead]:
    """The real head in-process, training preemptible at once, with one training job running on h100-0."""
    cfg = load_config(DEMO_CONFIG)
    training = cfg.scheduler.classes["training"].model_copy(update={"min_runtime_s": 0.0})
    cfg = cfg.model_copy(update={"scheduler": cfg.scheduler.model_copy(
        update={"classes": {**cfg.scheduler.classes, "training": training}})})
    h = InProcessHead(cfg, workdir=tmp_path)
    h.submit_job({"name": "train", "entrypoint": "sleep 600", "priority": "training", "checkpoint_dir": str(tmp_path),
                  "gpu": {"kind": "whole", "count": 2, "node": "h100-0"}}, "train-1")
    h.wait_for(lambda: h.service.get_job("train-1")["state"] == "running", 10, "train-1 running")
    h.calls.clear()
    yield h
    h.close()


def test_the_context_reads_what_the_head_put_in_the_environment() -> None:
    ctx = job_context(ENV)
    assert (ctx.job_id, ctx.namespace, ctx.head_name, ctx.checkpoint_dir, ctx.resume_from, ctx.lease_id, ctx.attempt,
            ctx.min_interval_s) == ("train-1", "ns", "h", "/ck", "/ck/checkpoint.pt", "train-1.a2", 2, 2.0)
    assert ctx.managed


def test_unmanaged_runs_are_never_asked_and_acks_do_nothing() -> None:
    ctx = job_context({})
    assert not ctx.managed and ctx.preemption_requested() is False and ctx.acknowledge_checkpoint("/x", 1) is None
    assert ctx.head is None  # never connected


def test_preemption_requested_asks_at_most_once_per_interval_and_stays_true(head: InProcessHead) -> None:
    clock = FakeClock(50.0)
    ctx = job_context(ENV, head=head, clock=clock)
    assert [ctx.preemption_requested() for _ in range(100)] == [False] * 100
    assert head.calls == [("job_preemption_requested", ("train-1",))]
    head.submit_job({"name": "serve", "entrypoint": "sleep 600", "priority": "inference",
                     "gpu": {"kind": "whole", "count": 1, "node": "h100-0"}}, "serve-1")
    head.wait_for(lambda: head.service.get_job("train-1")["state"] == "preempting", 10, "train-1 asked to checkpoint")
    assert ctx.preemption_requested() is False  # still within the interval: not asked again
    clock.t += 2.0
    assert ctx.preemption_requested() is True
    clock.t += 100
    assert ctx.preemption_requested() is True and head.methods().count("job_preemption_requested") == 2


def test_a_head_that_does_not_answer_is_no_reason_to_stop(head: InProcessHead, capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    ctx = job_context(ENV, head=head, clock=clock)
    head.unreachable = True
    for _ in range(3):
        assert ctx.preemption_requested() is False
        clock.t += 5
    assert capsys.readouterr().err.count("head not reachable") == 1


def _job_token(head: InProcessHead, job_id: str) -> int:
    """The fencing token the head put in the job's environment (it reads it in-process; no view shows it)."""
    lease_id = head.service.get_job(job_id)["lease"]["lease_id"]
    assert head.service.get_job(job_id)["lease"]["fencing_token"] is None  # the job view redacts it
    return head.service.ctl.ledger.get(lease_id).lease.fencing_token


def test_acknowledge_checkpoint_tells_the_head_path_and_step(head: InProcessHead) -> None:
    token = _job_token(head, "train-1")
    ctx = job_context({**ENV, "ORCHESTRATOR_FENCING_TOKEN": str(token)}, head=head)
    d = ctx.acknowledge_checkpoint("/ck/checkpoint.pt", 120)
    assert head.calls == [("job_ack_checkpoint", ("train-1", "/ck/checkpoint.pt", 120, token))]
    assert d["job_id"] == "train-1"
    # while running, an ack is a periodic checkpoint: the lease records it, the job keeps running
    assert d["state"] == "running" and d["lease"]["checkpoint_path"] == "/ck/checkpoint.pt"


def test_an_acknowledgement_without_the_lease_token_is_refused(head: InProcessHead) -> None:
    token = _job_token(head, "train-1")
    for env in (ENV, {**ENV, "ORCHESTRATOR_FENCING_TOKEN": str(token + 1)}):
        with pytest.raises(StaleFencingTokenError):
            job_context(env, head=head).acknowledge_checkpoint("/elsewhere/ck.pt", 1)
    assert head.service.get_job("train-1")["lease"]["checkpoint_path"] is None


class FakeTorch:
    """``torch`` at its boundary: the calls apply_limits makes, on an 80 GiB card."""

    def __init__(self, cuda: bool = True) -> None:
        self.fractions: list[tuple[float, int]] = []
        outer = self

        class cuda_:  # noqa: N801 - torch's spelling
            @staticmethod
            def is_available() -> bool:
                return cuda

            @staticmethod
            def get_device_properties(i: int) -> object:
                return type("P", (), {"total_memory": 80 * 1024**3})()

            @staticmethod
            def set_per_process_memory_fraction(f: float, device: int) -> None:
                outer.fractions.append((f, device))

        self.cuda = cuda_


@pytest.mark.parametrize("kind,limit,expected", [("mps", "20480", 0.25), ("timeslice", "8192", 0.1),
                                                 ("whole", "8192", None), ("mig", "8192", None), ("mps", "", None)])
def test_limits_are_applied_in_process_for_shares_without_hardware_isolation(kind, limit, expected) -> None:
    torch = FakeTorch()
    env = {"ORCHESTRATOR_SHARE_KIND": kind, "ORCHESTRATOR_MEMORY_LIMIT_MIB": limit}
    assert apply_limits(env, torch=torch) == expected
    assert torch.fractions == ([] if expected is None else [(expected, 0)])
    assert apply_limits(env, torch=FakeTorch(cuda=False)) is None


@pytest.mark.gpu
def test_an_allocation_past_the_limit_fails_on_a_real_gpu() -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: needs a real GPU")
    env = {"ORCHESTRATOR_SHARE_KIND": "timeslice", "ORCHESTRATOR_MEMORY_LIMIT_MIB": "1024"}
    assert apply_limits(env) is not None
    small = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # 256 MiB: within the limit
    with pytest.raises(torch.cuda.OutOfMemoryError):
        torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")  # 2 GiB: past it
    del small
