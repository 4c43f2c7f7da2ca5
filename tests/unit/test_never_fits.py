"""Refusing the impossible: a request no card of the cluster could ever hold is refused at submission,
naming the field and the largest there is; one that is only busy waits; explain tells the two apart.

The property test holds :func:`~orchestrator.scheduling.admission.never_fits` to the engine itself:
on random clusters and requests, it refuses exactly when ``place`` finds no slot on the same cluster
emptied and healed (nothing held, every GPU healthy).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from headless import InProcessHead
from hypothesis import given, settings
from hypothesis import strategies as st
from test_snapshot_properties import PROPERTY, clusters, requests

from orchestrator.core.config import DEMO_CONFIG, load_config
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.request import GpuRequest
from orchestrator.scheduling.admission import never_fits
from orchestrator.scheduling.engine import Unschedulable, place
from orchestrator.scheduling.policies import get_policy
from orchestrator.scheduling.snapshot import ClusterSnapshot, NodeSpec

DEMO = ClusterSnapshot.build([n.inventory() for n in load_config(DEMO_CONFIG).nodes])


@pytest.mark.parametrize("gpu, text", [
    ("mps:50%,999TiB", ("invalid gpu.memory_mib=1047527424: no GPU in the cluster has 999 TiB of memory; the largest "
                        "has 80 GiB (A100-80GB) (allowed: at most 81920 MiB)")),
    ("mem=200GiB,isolation=hard", ("invalid gpu.memory_mib=204800: no GPU in the cluster has 200 GiB of memory; the "
                                   "largest has 80 GiB (A100-80GB) (allowed: at most 81920 MiB)")),
    ("5", "invalid gpu.count=5: no node in the cluster has 5 whole cards; the largest has 4 (allowed: 1 to 4)"),
])
def test_the_issues_requests_are_refused_naming_the_field_and_the_largest(gpu: str, text: str) -> None:
    err = never_fits(GpuRequest.parse(gpu), DEMO)
    assert isinstance(err, InvalidRequestError) and str(err) == text


@pytest.mark.parametrize("gpu", ["4", "mps:50%,80GiB", "mem=60GiB,isolation=hard", "mig:1g.20gb", "timeslice:1"])
def test_what_fits_the_idle_cluster_is_not_refused(gpu: str) -> None:
    assert never_fits(GpuRequest.parse(gpu), DEMO) is None


def test_other_fields_name_themselves() -> None:
    cases = {"gpu.node": GpuRequest.whole(1, node="nowhere"), "gpu.models": GpuRequest.whole(1, models="T4"),
             "gpu.cpu_milli": GpuRequest.whole(1, cpu_milli=64_000),
             "gpu.host_memory_mib": GpuRequest.whole(1, host_memory_mib=1 << 20),
             "gpu.profile": GpuRequest.mig("7g.80gb")}
    for field, req in cases.items():
        err = never_fits(req, DEMO)
        assert err is not None and err.field == field and err.allowed, (field, err)
    pairs = ClusterSnapshot.build([NodeSpec("n", "A100-80GB", 4, nvlink_islands=((0, 1), (2, 3)))])
    err = never_fits(GpuRequest.whole(3, nvlink=True), pairs)
    assert err is not None and err.field == "gpu.nvlink" and "the largest has 2" in err.detail
    assert never_fits(GpuRequest.whole(3), pairs) is None
    # a node pin narrows "the largest" to that node
    err = never_fits(GpuRequest.whole(3, node="h100-0"), DEMO)
    assert err is not None and err.field == "gpu.count" and err.allowed == "1 to 2"


def _empty_and_healthy(specs: list, ts_cap: int) -> ClusterSnapshot:
    return ClusterSnapshot.build([replace(s, unhealthy=()) for s in specs], timeslice_capacity_milli=ts_cap)


BIG = st.builds(lambda m, i, **kw: GpuRequest(memory_mib=m, isolation=i, **kw),
                st.sampled_from([16000, 40000, 50000, 90000]), st.sampled_from(["hard", "soft", "none"]),
                models=st.sampled_from([(), ("T4", "P100")])) | st.builds(
    lambda n, nv: GpuRequest.whole(n, nvlink=nv and n > 1), st.integers(1, 6), st.booleans())


@settings(PROPERTY, max_examples=300)
@given(clusters(), st.one_of(requests(), BIG))
def test_refused_exactly_when_the_engine_finds_no_slot_on_the_idle_cluster(cluster: tuple, req: GpuRequest) -> None:
    specs, ts_cap = cluster
    live = ClusterSnapshot.build(specs, timeslice_capacity_milli=ts_cap)  # unhealthy GPUs may heal
    oracle = place(_empty_and_healthy(specs, ts_cap), req, get_policy("packing"))
    err = never_fits(req, live)
    assert (err is not None) == isinstance(oracle, Unschedulable), (req, err, oracle)


def test_explain_tells_never_from_not_now(head: InProcessHead) -> None:
    """A queued request the cluster can never hold (the edge refuses it; the controller queues what a
    shrunk cluster no longer has) is explained as such; one that waits for busy cards is not."""
    with pytest.raises(InvalidRequestError) as e:
        head.request_lease({"lease_id": "huge", "request": "mem=200GiB,isolation=hard"})
    assert e.value.field == "gpu.memory_mib" and "the largest has 80 GiB" in str(e.value)
    with head.lock:
        head.service.ctl.request_lease({"lease_id": "huge", "request": "mem=200GiB,isolation=hard"})
    head.request_lease({"lease_id": "hog", "request": "4"})
    assert head.wait_lease("hog", 10)["state"] == "granted"
    head.request_lease({"lease_id": "busy", "request": "4"})
    head.wait_for(lambda: head.explain_lease("busy").get("pending") and head.explain_lease("huge").get("pending"),
                  10, "both considered")
    never, busy = head.explain_lease("huge")["pending"], head.explain_lease("busy")["pending"]
    assert never["cause"] == "wait.never_fits" and busy["cause"] == "wait.no_fit"
    assert never["reason"].startswith("no GPU in the cluster has 200 GiB of memory; the largest has 80 GiB")
    assert busy["reason"].startswith("no node fits") and "no GPU in the cluster has" not in busy["reason"]
