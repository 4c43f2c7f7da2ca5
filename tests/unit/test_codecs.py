"""The records' JSON derived from their types (:mod:`orchestrator.core.codec`): every record whose codec is derived
goes to JSON and back unchanged, and a malformed input is refused with a typed error naming the field. Pure.

:func:`samples` builds one of every record that has a ``to_json``, every field set; ``test_codecs_compat`` checks
their JSON against what the hand-written codecs wrote before the codecs were derived.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest

from orchestrator.control import preempting
from orchestrator.control.handout import Handout
from orchestrator.control.invariants import Violation
from orchestrator.control.ledger import LedgerEntry
from orchestrator.control.nodes import NodeRecord, NodeState
from orchestrator.control.repartition import GpuRepartition, RepartitionState
from orchestrator.core import codec
from orchestrator.core.allocation import Allocation
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.inventory import GpuDevice, MigDevice, NodeInventory
from orchestrator.core.lease import Lease, LeaseRequest, LeaseState, make_token
from orchestrator.core.priorities import DEFAULT_CLASSES
from orchestrator.core.reasons import Cause, Reason
from orchestrator.core.request import Alternative, GpuRequest, ShareKind
from orchestrator.core.gang_request import GangRequest
from orchestrator.core.statemachine import Transition
from orchestrator.rayport.channel import Endpoint
from orchestrator.scheduling.autoscale import ScaleDecision, ScalerState
from orchestrator.scheduling.cycle import Grant, Plan, Preemption, Waiting
from orchestrator.scheduling.engine import Placement, Unschedulable
from orchestrator.scheduling.gang import GangPlacement, GangUnschedulable
from orchestrator.scheduling.preemption import NoPreemption, PreemptionPlan, Victim
from orchestrator.scheduling.repartition import GpuChange, GpuSkipped, MigSlot, RepartitionPlan
from orchestrator.scheduling.snapshot import ClusterSnapshot, NodeSpec
from orchestrator.scheduling.windows import WindowStatus
from orchestrator.core.priorities import Window

R = Reason


def _alloc(node_name: str = "n1", **kw: Any) -> Allocation:
    base: dict[str, Any] = dict(node=2, node_name=node_name, kind=ShareKind.MPS, gpus=(1,), gpu_indices=(1,),
                                gpu_uuids=("GPU-1",), model="A100-80GB", milli=300, memory_mib=20480, sm_percent=30,
                                client_priority=2, cpu_milli=1000, host_memory_mib=4096)
    return Allocation(**{**base, **kw})


MIG_ALLOC = Allocation(node=0, node_name="n0", kind=ShareKind.MIG, gpus=(0,), gpu_indices=(0,), gpu_uuids=("GPU-0",),
                       model="A100-80GB", milli=0, memory_mib=9728, mig_profile="1g.10gb", mig_start=6,
                       mig_uuid="MIG-abc")
SPEC = LeaseRequest(lease_id="job-1.a1", request=GpuRequest.mps(30, 20480), owner="job:job-1", priority_class="training",
                    queue="research", requeue_on_loss=False, enqueued_at=5.0)
SECRET = b"s" * 32


def ledger_entry() -> LedgerEntry:
    """A checkpointing preemption victim with every field of the stored form set (the journal's richest entry)."""
    lease = Lease.new(SPEC.lease_id, SPEC.request, now=10.0, owner=SPEC.owner, priority=100,
                      priority_class="training", queue="research")
    token = make_token(7, SPEC.lease_id, SECRET)
    lease = lease.grant(_alloc(), token, now=20.0, reason="placed: best fit").transition(
        LeaseState.ACTIVE, now=30.0, reason="activated by a1")
    e = LedgerEntry(lease, SPEC, seq=3, enqueued_at=5.0,
                    handout=Handout("ab" * 28, "n1", 0.3, 1.0, {"A": "1", "ORCH_FENCING_TOKEN": str(token)},
                                    {"GPU": 0.3}),
                    holder="actor-1", attempt_of="job-1.a0", requeued_as="job-1.a2", workload="job:job-1.a1")
    e = preempting.ask_or_stop(e, DEFAULT_CLASSES["training"], for_item="inf-1.a1", why="preempted for inf-1",
                               now=100.0, cause="victim.reclaim")
    return preempting.checkpoint_reported(e, "/ck/old.pt", 90.0)


def _reason(cause: Cause = Cause.PLACED, text: str = "placed: best fit on n1") -> Reason:
    return Reason(cause, text)


def _placement(alloc: Allocation | None = None) -> Placement:
    return Placement(alloc or _alloc(), Alternative(ShareKind.MPS, 1, 300, 20480, sm_percent=30), "bestfit", 0.25, 3,
                     _reason())


def _victim() -> Victim:
    return Victim("t0.a1", "alice", 100, "training", "research", 1.0, 120.5, 3.0, 40.0,
                  R(Cause.VICTIM_PRIORITY, "lower priority (100 < 1000)"))


def _unschedulable() -> Unschedulable:
    return Unschedulable(GpuRequest.whole(2), (("whole", R(Cause.FIT_WHOLE, "fewer than 2 free cards"), 2),
                                               ("whole", R(Cause.FIT_MODEL, "not an H100"), 1)), 3)


GANG = GangRequest(workers=2, worker=GpuRequest.whole(1))
CHANGE = GpuChange("n0", 0, "A100-80GB", (MigSlot(0, "7g.80gb"),), (MigSlot(0, "3g.40gb"), MigSlot(4, "3g.40gb")),
                   ("t0.a1",), R(Cause.REPARTITION_CHOSEN, "7g.80gb@0 -> 3g.40gb@0 + 3g.40gb@4"))


def _snapshot() -> ClusterSnapshot:
    return ClusterSnapshot.build([NodeSpec("n0", "A100-80GB", 2)])


def _gang_placement() -> GangPlacement:
    return GangPlacement(GANG, (_placement(), _placement(_alloc("n2"))), R(Cause.PLACED_GANG, "2 workers on n1, n2"))


def _waiting() -> Waiting:
    return Waiting("c", 2, 101.5, R(Cause.WAIT_NO_FIT, "no node fits"), _unschedulable(), ("t0.a1", "t1.a1"),
                   R(Cause.NO_PREEMPTION_NONE_ELIGIBLE, "nothing to preempt"))


def samples() -> dict[str, Any]:
    """One of every record with a ``to_json``, every field set (named ``Class`` or ``Class.variant``)."""
    window = Window(name="night", start="20:00", end="06:00")
    inv = NodeInventory(name="n0", gpus=(GpuDevice(index=0, uuid="GPU-0", model="A100-80GB", memory_mib=81920, mig_enabled=True,
                                                   mig_devices=(MigDevice(uuid="MIG-abc", profile="1g.10gb", start=6),)),),
                        labels={"zone": "a"}, generation=4)
    hist = (Transition(1.0, RepartitionState.PLANNED, "planned"), Transition(2.0, RepartitionState.CORDONED, "cordoned"))
    return {
        "Reason": _reason(),
        "Allocation": _alloc(),
        "Allocation.mig": MIG_ALLOC,
        "LedgerEntry": ledger_entry(),
        "NodeRecord": NodeRecord("n0", "ray-1", "inc-1", inv, NodeState.REGISTERED, 5.0, 1.5, "heartbeat", ("l1",)),
        "GpuRepartition": GpuRepartition("inference-n0-0-3", "inference", CHANGE, RepartitionState.CORDONED, hist,
                                         900.0, "not yet"),
        "MigSlot": MigSlot(4, "3g.40gb"),
        "GpuChange": CHANGE,
        "GpuSkipped": GpuSkipped("n0", 1, R(Cause.REPARTITION_BUSY, "under way")),
        "RepartitionPlan": RepartitionPlan("inference", (CHANGE,), (GpuSkipped("n0", 1, R(Cause.REPARTITION_BUSY, "x")),),
                                           R(Cause.REPARTITION_SHORT, "1 of 2 GPUs")),
        "Endpoint": Endpoint("10.0.0.1", 6380, "tok-" + "x" * 20, "-----BEGIN CERTIFICATE-----\nMII\n"),
        "Endpoint.plain": Endpoint("127.0.0.1", 6380, "tok"),
        "Violation": Violation("fencing", "token 3 given twice", "l1", "n0"),
        "ScaleDecision": ScaleDecision(3, R(Cause.SCALE_UP, "load over target"), ScalerState(3, 0, None, 9.0), 4, 2),
        "Placement": _placement(),
        "Placement.mig": _placement(MIG_ALLOC),
        "Unschedulable": _unschedulable(),
        "Victim": _victim(),
        "Grant": Grant("a", _placement(), R(Cause.PLACED_BORROWING, "borrowing 1 GPU")),
        "Preemption": Preemption(_victim(), "inf", R(Cause.VICTIM_PRIORITY, "lower priority")),
        "Waiting": _waiting(),
        "Waiting.bare": Waiting("d", 0, 10.0, R(Cause.WAIT_QUOTA, "over quota")),
        "Plan": Plan((Grant("a", _placement(), _reason()),), (Preemption(_victim(), "inf", _reason()),),
                     (_waiting(),), after=_snapshot()),
        "GangPlacement": _gang_placement(),
        "GangUnschedulable": GangUnschedulable(GANG, 1, ((1, R(Cause.FIT_WHOLE, "no card")),),
                                               R(Cause.FIT_GANG, "1 of 2 workers fit"), _unschedulable()),
        "PreemptionPlan": PreemptionPlan((_victim(),), _placement(), 4, R(Cause.VICTIM_PRIORITY, "1 victim")),
        "PreemptionPlan.gang": PreemptionPlan((_victim(),), _gang_placement(), 4, R(Cause.VICTIM_PRIORITY, "1 victim")),
        "NoPreemption": NoPreemption(R(Cause.NO_PREEMPTION_NONE_ELIGIBLE, "none"),
                                     (("t0.a1", R(Cause.INELIGIBLE_MIN_RUNTIME, "ran 3s of 60s")),)),
        "WindowStatus": WindowStatus(window, 3600.0, 7200.5, None, {"research": (2.0, False), "default": (None, True)},
                                     R(Cause.WINDOW_ACTIVE, "night window")),
        "WindowStatus.none": WindowStatus(None, 30.0, None, None, {}, R(Cause.WINDOW_NONE, "no window")),
    }


def dumped(name: str, value: Any) -> str:
    """What the record's ``to_json`` writes, as the JSON text that is stored or sent."""
    return json.dumps(value.to_json())


# ---- round trips: every record with a from_json -------------------------------------------------------------
#: record name -> how it is read back (what its callers use).
READERS: dict[str, Callable[[Any], Any]] = {
    "Allocation": Allocation.from_json,
    "Allocation.mig": Allocation.from_json,
    "LedgerEntry": LedgerEntry.from_json,
    "NodeRecord": lambda d: NodeRecord.from_json(d, seen_at=5.0),
    "GpuRepartition": GpuRepartition.from_json,
    "MigSlot": MigSlot.from_json,
    "GpuChange": GpuChange.from_json,
    "Endpoint": Endpoint.from_json,
    "Endpoint.plain": Endpoint.from_json,
}


def _unlocated(v: Any) -> Any:
    """What a read-back gives for ``v``: an allocation loses its snapshot locations, a node record its soft state."""
    if isinstance(v, Allocation):
        return v.at(-1, ())
    if isinstance(v, NodeRecord):
        from dataclasses import replace
        return replace(v, allocated=())
    if isinstance(v, LedgerEntry) and v.lease.allocation is not None:
        from dataclasses import replace
        return replace(v, lease=replace(v.lease, allocation=v.lease.allocation.at(-1, ())))
    return v


@pytest.mark.parametrize("name", sorted(READERS))
def test_a_record_survives_its_json(name: str) -> None:
    v = samples()[name]
    back = READERS[name](json.loads(json.dumps(v.to_json())))
    assert back == _unlocated(v)
    assert back.to_json() == v.to_json()


#: Records whose JSON is derived and that read back through the codec itself (no ``from_json`` of their own).
DERIVED_READABLE = {"Reason": Reason, "Victim": Victim, "GpuSkipped": GpuSkipped, "RepartitionPlan": RepartitionPlan}


@pytest.mark.parametrize("name", sorted(DERIVED_READABLE))
def test_a_derived_record_reads_back_through_the_codec(name: str) -> None:
    v = samples()[name]
    assert codec.load(DERIVED_READABLE[name], json.loads(json.dumps(v.to_json())), name.lower()) == v


def test_write_only_records_leave_out_what_cannot_come_back() -> None:
    """A placement's alternative and a plan's snapshot are no part of their JSON (the allocation, the grants
    say what was decided); everything else is there."""
    s = samples()
    assert "alternative" not in s["Placement"].to_json() and "after" not in s["Plan"].to_json()
    assert s["Grant"].to_json()["placement"] == s["Placement"].to_json() | {"reason": "placed: best fit on n1",
                                                                             "cause": "placed"}
    assert s["PreemptionPlan.gang"].to_json()["placement"] == s["GangPlacement"].to_json()  # a by-hand record nests


# ---- malformed input: a typed error that names the key --------------------------------------------------------
def _good(name: str) -> dict[str, Any]:
    return json.loads(json.dumps(samples()[name].to_json()))


BAD: list[tuple[str, Callable[[dict[str, Any]], Any], Callable[[dict[str, Any]], Any], str]] = [
    ("Allocation", Allocation.from_json, lambda d: d | {"kind": "tpu"}, "allocation.kind"),
    ("Allocation", Allocation.from_json, lambda d: {k: v for k, v in d.items() if k != "milli"}, "allocation.milli"),
    ("Allocation", Allocation.from_json, lambda d: d | {"gpu_indices": ["one"]}, "allocation.gpu_indices.0"),
    ("Allocation", Allocation.from_json, lambda d: d | {"node": 3}, "allocation.node"),
    ("NodeRecord", lambda d: NodeRecord.from_json(d, seen_at=1.0), lambda d: d | {"state": "gone"}, "node.state"),
    ("NodeRecord", lambda d: NodeRecord.from_json(d, seen_at=1.0),
     lambda d: d | {"inventory": d["inventory"] | {"cpu_milli": -1}}, "node.inventory.cpu_milli"),
    ("GpuRepartition", GpuRepartition.from_json,
     lambda d: d | {"history": [d["history"][0] | {"state": "half-done"}]}, "repartition.history.0.state"),
    ("GpuRepartition", GpuRepartition.from_json, lambda d: d | {"deadline": "soon"}, "repartition.deadline"),
    ("GpuChange", GpuChange.from_json, lambda d: d | {"cause": "because"}, "change.reason.cause"),
    ("GpuChange", GpuChange.from_json, lambda d: d | {"new_layout": [{"profile": "1g.10gb"}]}, "change.new_layout.0.start"),
    ("MigSlot", MigSlot.from_json, lambda d: d | {"start": "first"}, "slot.start"),
    ("Endpoint", Endpoint.from_json, lambda d: d | {"port": "6380"}, "direct_endpoint.port"),
    ("Endpoint", Endpoint.from_json, lambda d: {k: v for k, v in d.items() if k != "token"}, "direct_endpoint.token"),
    ("Endpoint", Endpoint.from_json, lambda d: [d["token"]], "direct_endpoint"),
    ("LedgerEntry", LedgerEntry.from_json, lambda d: d | {"allocation": d["allocation"] | {"milli": "lots"}},
     "allocation.milli"),
]


@pytest.mark.parametrize(("name", "read", "spoil", "field"), BAD, ids=[f"{b[0]}:{b[3]}" for b in BAD])
def test_a_malformed_record_is_refused_naming_the_field(name: str, read: Callable[[Any], Any],
                                                       spoil: Callable[[dict[str, Any]], Any], field: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        read(spoil(_good(name)))
    assert info.value.field == field


def test_a_refused_endpoint_never_shows_what_came() -> None:
    """What came may hold the channel's token: the error shows the offending value's type only."""
    with pytest.raises(InvalidRequestError) as info:
        Endpoint.from_json(["tok-" + "x" * 20])
    assert "tok-" not in str(info.value) and info.value.value == "list"


def test_one_adapter_per_type() -> None:
    assert codec.adapter(Allocation) is codec.adapter(Allocation)
