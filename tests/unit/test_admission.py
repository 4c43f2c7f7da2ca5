"""Every refusal before queueing names the field and what is allowed."""

from __future__ import annotations

import pytest

from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.job import JobSpec
from orchestrator.core.priorities import SchedulerConfig
from orchestrator.core.request import GpuRequest
from orchestrator.scheduling.admission import check_submission
from orchestrator.scheduling.snapshot import ClusterSnapshot, NodeSpec

CFG = SchedulerConfig()
SNAP = ClusterSnapshot.build([
    NodeSpec("a0", "A100-80GB", 4, mig_enabled=(2, 3)),
    NodeSpec("h0", "H100-80GB", 2),
])


def refused(fn, field: str) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as e:
        fn()
    assert e.value.field == field, e.value
    assert e.value.allowed, "the error must say what is allowed"
    return e.value


def test_mig_profile_no_gpu_offers() -> None:
    # 1g.5gb exists (A100-40GB) but no MIG card here offers it.
    e = refused(lambda: check_submission(GpuRequest.mig("1g.5gb"), None, None, CFG, SNAP), "gpu.profile")
    assert "1g.10gb" in e.allowed
    # and a profile no model at all has is refused when the request is built
    refused(lambda: GpuRequest.mig("5g.50gb"), "profile")


def test_sm_share_over_100() -> None:
    refused(lambda: GpuRequest.parse("mps:130%"), "gpu.sm_percent")
    refused(lambda: GpuRequest.mps(101), "gpu.sm_percent")


def test_negative_or_unparsable_memory() -> None:
    refused(lambda: GpuRequest.parse("mps:30%,-20GiB"), "gpu.memory")
    refused(lambda: GpuRequest.parse("mem=twenty,compute=0.3,isolation=hard"), "gpu.memory")
    refused(lambda: GpuRequest.mps(30, -1), "gpu.memory_mib")


def test_unknown_priority_class_and_queue() -> None:
    e = refused(lambda: check_submission(GpuRequest.whole(1), "urgent", None, CFG, SNAP), "priority")
    assert "inference" in e.allowed and "training" in e.allowed
    refused(lambda: check_submission(GpuRequest.whole(1), "training", "nope", CFG, SNAP), "queue")


def test_empty_command() -> None:
    refused(lambda: JobSpec(name="x", entrypoint=""), "entrypoint")
    refused(lambda: JobSpec(name="x", entrypoint="   "), "entrypoint")


def test_models_and_counts_the_cluster_lacks() -> None:
    refused(lambda: check_submission(GpuRequest.whole(1, models="T4"), None, None, CFG, SNAP), "gpu.models")
    refused(lambda: check_submission(GpuRequest.whole(8), None, None, CFG, SNAP), "gpu.count")


def test_a_good_submission_resolves_its_class() -> None:
    name, cls = check_submission(GpuRequest.mig("1g.10gb"), "training", None, CFG, SNAP)
    assert name == "training" and cls.priority == 100
    assert check_submission(GpuRequest.whole(1), None, None, CFG, SNAP)[0] == CFG.default_class


def test_mig_profile_missing_from_every_fixed_layout() -> None:
    # The only MIG card has a fixed layout of 3g.40gb + 2g.20gb + 1g.10gb x2: a 7g slice never fits it,
    # though the model offers the profile; a profile of the layout is accepted.
    fixed = ClusterSnapshot.build([NodeSpec("a0", "A100-80GB", 2, mig_enabled=(1,), mig_layout=(
        (1, "3g.40gb", 4, "M-4"), (1, "2g.20gb", 0, "M-0"), (1, "1g.10gb", 2, "M-2"), (1, "1g.10gb", 3, "M-3")))])
    e = refused(lambda: check_submission(GpuRequest.mig("7g.80gb"), None, None, CFG, fixed), "gpu.profile")
    assert "fixed layouts" in e.detail
    assert check_submission(GpuRequest.mig("2g.20gb"), None, None, CFG, fixed)[0] == CFG.default_class
