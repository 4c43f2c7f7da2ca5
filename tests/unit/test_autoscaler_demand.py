"""The queue as autoscaler demand (issue #37 item 7), pure: the bundles each pending lease asks for, which wait
causes count, the held cards beside them, gangs, the cap and its order, the empty demand that clears, and when
the head sends it (:class:`DemandPacer`). No Ray."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.control.demand import GROWS, MAX_BUNDLES, DemandPacer, autoscaler_demand
from orchestrator.control.ledger import LedgerEntry
from orchestrator.core.allocation import Allocation
from orchestrator.core.config import Tuning
from orchestrator.core.gang_request import GangMember
from orchestrator.core.lease import Lease, LeaseRequest, LeaseState
from orchestrator.core.reasons import Cause, Reason
from orchestrator.core.request import GpuRequest, ShareKind
from orchestrator.scheduling.plan import Waiting

GiB = 1024 ** 3
_seq = iter(range(1, 10_000))


def pending(lid: str, gpu: GpuRequest | str = "1", cause: Cause = Cause.WAIT_NO_FIT, position: int = 0, *,
            gang: GangMember | None = None, waiting: bool = True) -> LedgerEntry:
    request = GpuRequest.parse(gpu) if isinstance(gpu, str) else gpu
    spec = LeaseRequest(lease_id=lid, request=request, gang=gang)
    w = Waiting(lid, position, 0.0, Reason(cause, "the scheduler's words")) if waiting else None
    return LedgerEntry(Lease.new(lid, request, now=0.0), spec, next(_seq), 0.0, waiting=w)


def held(lid: str, node: str, cards: tuple[int, ...], kind: ShareKind = ShareKind.WHOLE, *, cpu_milli: int = 0,
         host_memory_mib: int = 0) -> LedgerEntry:
    request = GpuRequest(kind="whole", count=len(cards)) if kind is ShareKind.WHOLE else GpuRequest.parse("mps:30%")
    alloc = Allocation(-1, node, kind, "A100-80GB", (), cards, tuple(f"GPU-{node}-{c}" for c in cards),
                       1000 * len(cards) if kind is ShareKind.WHOLE else 300, 0, cpu_milli=cpu_milli,
                       host_memory_mib=host_memory_mib)
    lease = Lease(lid, request, state=LeaseState.ACTIVE, allocation=alloc)
    return LedgerEntry(lease, LeaseRequest(lease_id=lid, request=request), next(_seq), 0.0)


def shapes(*pend: LedgerEntry, occupying: tuple[LedgerEntry, ...] = (), **kw: Any) -> list[dict[str, float]]:
    return [dict(s) for s in autoscaler_demand(pend, occupying, **kw).shapes()]


def test_each_kind_of_request_asks_for_what_one_node_needs_to_host_it() -> None:
    assert shapes(pending("w", GpuRequest(kind="whole", count=4, cpu_milli=2500, host_memory_mib=16384))) == [
        {"CPU": 2.5, "GPU": 4, "memory": 16 * GiB}]
    # a fractional share: a node with one card hosts it
    for gpu in ("mig:1g.10gb", "mps:30%", "timeslice:0.25", "mem=20GiB,compute=0.5,isolation=soft"):
        assert shapes(pending("f", gpu)) == [{"GPU": 1}], gpu
    # no GPU: host CPU alone; a request with fallbacks asks for its first choice
    assert shapes(pending("c", GpuRequest(kind="whole", count=0, cpu_milli=1000))) == [{"CPU": 1.0}]
    assert shapes(pending("fb", "4|mps:30%")) == [{"GPU": 4}]
    d = autoscaler_demand([pending("m", GpuRequest(kind="whole", count=2, models=("H100-80GB",)))], [])
    (b,) = d.bundles
    assert b.kind == "pending" and b.leases == ("m",) and b.reason.cause is Cause.WAIT_NO_FIT
    assert "GPU=2" in b.reason.text and "models H100-80GB not expressed" in b.reason.text
    assert b.to_json() == {"resources": {"GPU": 2}, "for": "pending", "leases": ["m"], "reason": b.reason.text,
                           "cause": "wait.no_fit"}


@pytest.mark.parametrize("cause", [c for c in Cause if c.group == "wait"], ids=lambda c: c.value)
def test_only_waits_more_capacity_would_cure_ask_for_nodes(cause: Cause) -> None:
    grows = cause in {Cause.WAIT_NO_FIT, Cause.WAIT_NEVER_FITS, Cause.WAIT_RESERVED, Cause.WAIT_RESERVATION}
    assert (cause in GROWS) is grows
    assert shapes(pending("x", "2", cause)) == ([{"GPU": 2}] if grows else [])


def test_not_yet_scheduled_and_pinned_requests_ask_for_nothing() -> None:
    assert shapes(pending("new", "2", waiting=False)) == []
    assert shapes(pending("pin", GpuRequest(kind="whole", count=2, node="h100-0"))) == []


def test_held_cards_come_first_one_bundle_per_node_and_only_beside_a_pending_bundle() -> None:
    occ = (held("b1", "b-node", (0, 1), cpu_milli=4000, host_memory_mib=1024),
           held("a1", "a-node", (3,)), held("a2", "a-node", (3,), ShareKind.MPS), held("a3", "a-node", (0,)))
    assert shapes(occupying=occ) == []  # nothing pending: empty, which clears an earlier request
    assert shapes(pending("q", "mps:30%", Cause.WAIT_QUOTA), occupying=occ) == []
    d = autoscaler_demand([pending("p", "4")], occ)
    assert [dict(s) for s in d.shapes()] == [{"GPU": 2}, {"CPU": 4.0, "GPU": 2, "memory": 1024 ** 3}, {"GPU": 4}]
    a, b, p = d.bundles
    assert (a.kind, a.leases, a.reason.cause) == ("held", ("a1", "a2", "a3"), Cause.PLACED)  # card 3 counted once
    assert b.leases == ("b1",) and "node b-node" in b.reason.text and p.kind == "pending"


def test_a_gang_asks_one_bundle_per_worker_or_one_for_a_same_node_gang() -> None:
    spread = [pending(f"g-{i}", "2", gang=GangMember(gang_id="g", index=i, size=3)) for i in range(3)]
    d = autoscaler_demand(spread, [])
    assert [dict(s) for s in d.shapes()] == [{"GPU": 2}] * 3
    assert [b.leases for b in d.bundles] == [("g-0",), ("g-1",), ("g-2",)]
    assert "worker 2 of 3 of gang g" in d.bundles[1].reason.text
    one = [pending(f"s-{i}", GpuRequest(kind="whole", count=2, cpu_milli=1500), gang=GangMember(
        gang_id="s", index=i, size=2, same_node=True)) for i in range(2)]
    (b,) = autoscaler_demand(one, []).bundles
    assert dict(b.resources) == {"CPU": 3.0, "GPU": 4} and b.leases == ("s-0", "s-1")


def test_the_cap_takes_the_scheduler_order_and_leaves_a_gang_out_whole() -> None:
    gang = [pending(f"g-{i}", "1", position=1, gang=GangMember(gang_id="g", index=i, size=3)) for i in range(3)]
    later, first, last = pending("later", "2", position=2), pending("first", "8", position=0), pending("z", "3", position=3)
    d = autoscaler_demand([last, later, *gang, first], [], max_bundles=3)
    # first (1 bundle), the gang (3: over the cap, left out whole), later (fits), z (fits)
    assert [b.leases for b in d.bundles] == [("first",), ("later",), ("z",)] and d.left_out == 3
    assert autoscaler_demand([last, later, *gang, first], [], max_bundles=4).left_out == 2  # the gang fits; 2 do not
    same = [pending("b", "1"), pending("a", "1")]  # same position: queue position (seq) decides
    assert [b.leases for b in autoscaler_demand(same, []).bundles] == [("b",), ("a",)]
    assert autoscaler_demand(list(reversed(same)), []) == autoscaler_demand(same, [])  # deterministic
    assert MAX_BUNDLES == Tuning().autoscaler_demand_max_bundles == 100
    with pytest.raises(ValueError, match="max_bundles"):
        autoscaler_demand(same, [], max_bundles=0)


def test_all_bundles_over_the_cap_leave_an_empty_demand_without_held_bundles() -> None:
    d = autoscaler_demand([pending(f"g-{i}", "1", gang=GangMember(gang_id="g", index=i, size=3)) for i in range(3)],
                          [held("h", "n", (0,))], max_bundles=2)
    assert d.bundles == () and d.left_out == 3


def test_the_pacer_sends_a_changed_demand_at_most_every_period_and_retries_a_failure() -> None:
    p = DemandPacer(every_s=5.0)
    assert p.due(0.0) and p.look((), 0.0)  # a new head sends its first demand, empty too: it clears the last one
    assert not p.due(10.0)  # in flight
    p.done(0.5)
    assert p.taken == () and p.sends == 1
    one = ((("GPU", 4),),)
    assert not p.due(4.0) and p.due(5.0)
    assert not p.look((), 5.0)  # unchanged: nothing sent, next look a period later
    assert not p.due(9.0) and p.due(10.0)
    assert p.look(one, 10.0)
    p.done(10.1, "GcsError: unavailable")  # failed: the same demand goes again at the next look
    assert p.taken == () and p.last_error == "GcsError: unavailable" and not p.due(14.0)
    assert p.due(15.0) and p.look(one, 15.0)
    p.done(15.1)
    assert p.taken == one and p.last_error == "" and p.sends == 2 and not p.look(one, 20.0)


def test_the_head_actor_sends_off_its_loop_logs_a_failure_and_sends_again(monkeypatch: pytest.MonkeyPatch,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """The actor's glue (rayport.head) without Ray: its loop's step hands the demand to a thread, a send Ray
    refused is logged and made again at the next look, an unchanged demand is not sent twice."""
    import asyncio
    import logging
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator.rayport import head as head_mod

    sent: list[list[dict[str, float]]] = []
    table = object()  # the head's own KV table, where each request is recorded (rayport.ray_api.autoscaler)

    def request_resources(bundles: list[dict[str, float]], record_in: object = None) -> None:
        assert record_in is table  # recorded where a stop for good looks for it
        sent.append(bundles)
        if len(sent) == 1:
            raise ConnectionError("the GCS is away")

    monkeypatch.setattr(head_mod.ray_api, "request_resources", request_resources)
    demand = autoscaler_demand([pending("w", "2")], [held("h", "n", (0,))])

    class Service:
        def autoscaler_demand(self) -> Any:
            return demand

    async def run() -> DemandPacer:
        actor = object.__new__(head_mod.HeadActor)
        actor.service = Service()  # type: ignore[assignment]
        actor._demand = pacer = DemandPacer(every_s=0.01)  # noqa: SLF001
        actor._autoscaler = ThreadPoolExecutor(1)  # noqa: SLF001
        actor._home = asyncio.get_running_loop()  # noqa: SLF001
        actor._table = table  # type: ignore[assignment]  # noqa: SLF001
        for _ in range(40):  # the loop's steps, 10 ms apart
            actor._tell_autoscaler()  # noqa: SLF001
            await asyncio.sleep(0.01)
        return pacer

    with caplog.at_level(logging.WARNING, logger=head_mod.__name__):
        pacer = asyncio.run(run())
    assert sent == [[{"GPU": 1}, {"GPU": 2}]] * 2  # refused once, sent again, then unchanged: not again
    assert pacer.taken == demand.shapes() and pacer.sends == 1
    assert "did not take the demand" in caplog.text and "the GCS is away" in caplog.text
