"""The head's control logic without Ray: ledger, queue, agents, TTL, restore. Injected clock, fake agents."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.core.errors import IllegalTransitionError, InvalidRequestError, StaleFencingTokenError, UnknownObjectError
from orchestrator.core.config import RuntimeSettings
from orchestrator.core.lease import key_digest, token_counter
from orchestrator.control.controller import HOLDER_CHECK_EVERY_S, HeadController
from orchestrator.control.nodes import RayNodeInfo
from orchestrator.control.handout import NOSET_CUDA_VISIBLE_DEVICES
from orchestrator.control.store import MemoryStore

from .conftest import SimAgent, FakeClock


#: The requester's key of every lease these tests ask for: with it, get_lease shows the fencing token.
KEY = "test-requester-key"


def _req(lease_id: str, gpu: str = "1", **kw: Any) -> dict[str, Any]:
    return {"lease_id": lease_id, "request": gpu, "owner": "test", "requester_digest": key_digest(KEY), **kw}


def _granted(ctl: HeadController, lease_id: str) -> dict[str, Any]:
    d = ctl.get_lease(lease_id, KEY)
    assert d["state"] == "granted", d
    return d


def test_agents_register_and_status_lists_every_gpu_and_mig_slot(ctl: HeadController, agents: dict[str, SimAgent]) -> None:
    st = ctl.status()
    assert [n["name"] for n in st["nodes"]] == ["a100-0", "a100-1", "h100-0"]
    assert sum(len(n["gpus"]) for n in st["nodes"]) == 10
    mig = {(n["name"], g["index"]): [m["profile"] for m in g["mig"]] for n in st["nodes"] for g in n["gpus"] if g["mig"]}
    assert mig == {("a100-1", 2): ["3g.40gb", "2g.20gb", "1g.10gb"],
                   ("a100-1", 3): ["4g.40gb", "1g.10gb", "1g.10gb", "1g.20gb"]}
    assert st["leases"] == [] and st["queue"] == []


def test_a_request_is_granted_in_one_cycle_with_a_usable_handout(ctl: HeadController, agents: dict[str, SimAgent]) -> None:
    assert ctl.request_lease(_req("w1", "2")) == "w1"
    assert ctl.get_lease("w1", KEY)["state"] == "pending"
    report = ctl.reconcile()
    assert report.granted == ["w1"]
    d = _granted(ctl, "w1")
    h = d["handout"]
    assert h["node_id"] == f"ray-{d['allocation']['node']}" and h["num_gpus"] == 2.0
    assert h["env_vars"]["CUDA_VISIBLE_DEVICES"] == ",".join(d["allocation"]["gpu_uuids"])
    assert h["env_vars"][NOSET_CUDA_VISIBLE_DEVICES] == "1"
    assert h["env_vars"]["ORCHESTRATOR_FENCING_TOKEN"] == str(d["fencing_token"]) and token_counter(d["fencing_token"]) == 1


def test_request_is_idempotent_by_client_id_and_refuses_a_reused_id(ctl: HeadController, agents: dict[str, SimAgent]) -> None:
    assert ctl.request_lease(_req("a", "mig:1g.10gb")) == "a"
    assert ctl.request_lease(_req("a", "mig:1g.10gb")) == "a"
    assert len(ctl.status()["queue"]) == 1
    with pytest.raises(InvalidRequestError) as e:
        ctl.request_lease(_req("a", "2"))
    assert e.value.field == "lease_request.lease_id"
    with pytest.raises(InvalidRequestError) as e:
        ctl.request_lease(_req("bad id!"))
    assert e.value.field == "lease_request.lease_id"
    with pytest.raises(InvalidRequestError) as e:
        ctl.request_lease(_req("b", "mig:9g.99gb"))
    assert "profile" in e.value.field


def test_activate_and_release_check_the_fencing_token_and_are_idempotent(ctl: HeadController, agents: dict[str, SimAgent]) -> None:
    ctl.request_lease(_req("w", "1"))
    ctl.reconcile()
    token = _granted(ctl, "w")["fencing_token"]
    with pytest.raises(StaleFencingTokenError):
        ctl.activate("w", token + 1)
    assert ctl.activate("w", token, "actor-1")["state"] == "active"
    assert ctl.activate("w", token, "actor-1")["state"] == "active"  # a retry
    with pytest.raises(StaleFencingTokenError):
        ctl.release("w", token - 1)
    assert ctl.release("w", token)["state"] == "released"
    assert ctl.release("w", token)["state"] == "released"  # a retry
    with pytest.raises(IllegalTransitionError):
        ctl.activate("w", token)
    with pytest.raises(UnknownObjectError):
        ctl.get_lease("nope", KEY)


def test_release_frees_capacity_for_the_queue(ctl: HeadController, agents: dict[str, SimAgent]) -> None:
    # Only a100-0 has 4 whole cards without MIG: two requests for 4 cannot both be granted.
    ctl.request_lease(_req("big", "4"))
    ctl.request_lease(_req("big2", "4"))
    ctl.reconcile()
    states = {i: ctl.get_lease(i, KEY)["state"] for i in ("big", "big2")}
    assert sorted(states.values()) == ["granted", "pending"]
    waiting = next(i for i, s in states.items() if s == "pending")
    assert ctl.get_lease(waiting, KEY)["why_pending"]
    assert ctl.status()["queue"][0]["why_pending"]
    assert not ctl.may_schedule()  # planned and nothing changed since: a cycle now would grant nothing
    holder = next(i for i, s in states.items() if s == "granted")
    ctl.release(holder, ctl.get_lease(holder, KEY)["fencing_token"])
    assert ctl.may_schedule()  # freed devices, a request waiting: the head's loop is woken for it
    ctl.reconcile()
    assert ctl.get_lease(waiting, KEY)["state"] == "granted"
    assert not ctl.may_schedule()  # nothing waits


def test_a_cycle_readies_the_next_lone_grant_of_a_request_alike(ctl: HeadController, agents: dict[str, SimAgent],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 8: the cycle brings the placement engine's totals of what was placed since the last cycle up to
    date with the snapshot (engine.warm), so the next lone request alike is placed on the fast grant path
    without computing any node's score again."""
    scored: list[int] = []
    policy_cls = type(ctl.policy)
    node_score = policy_cls.node_score

    def spy(self: Any, snap: Any, nodes: Any, *args: Any) -> Any:
        scored.append(len(nodes))
        return node_score(self, snap, nodes, *args)

    monkeypatch.setattr(policy_cls, "node_score", spy)
    ctl.request_lease(_req("first", "1"))
    assert ctl.schedule_now().granted == ["first"]
    ctl.reconcile()
    scored.clear()
    ctl.request_lease(_req("second", "1"))
    assert ctl.schedule_now().granted == ["second"]
    assert scored == [], "the grant recomputed what the cycle should have readied"
    assert _granted(ctl, "second")["allocation"] != _granted(ctl, "first")["allocation"]


def test_a_cycles_grants_leave_the_snapshot_the_plan_ended_on(ctl: HeadController,
                                                             agents: dict[str, SimAgent]) -> None:
    """The grant loop takes the plan's end state (``Plan.after``) as the cluster's snapshot: a gang's workers
    and a lone request, all granted, and the snapshot is the one before with their allocations applied."""
    before = ctl.snapshot()
    for i in range(2):
        ctl.request_lease(_req(f"g-w{i}", "2", gang={"gang_id": "g", "index": i, "size": 2}))
    ctl.request_lease(_req("solo", "2"))
    report = ctl.reconcile()
    assert sorted(report.granted) == ["g-w0", "g-w1", "solo"]
    expected = before
    for lid in report.granted:
        expected = expected.apply(ctl.ledger.get(lid).lease.allocation)
    assert ctl.snapshot().same_state(expected)


def test_every_kind_of_share_gets_its_env(ctl: HeadController, agents: dict[str, SimAgent]) -> None:
    for lid, gpu in (("w", "1"), ("m", "mig:3g.40gb"), ("p", "mps:30%,20GiB"), ("t", "timeslice:0.25")):
        ctl.request_lease(_req(lid, gpu))
    ctl.reconcile()
    env = {lid: _granted(ctl, lid)["handout"]["env_vars"] for lid in "wmpt"}
    assert env["m"]["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
    assert env["p"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["p"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert env["p"]["CUDA_MPS_PIPE_DIRECTORY"].startswith("/tmp/nvidia-mps/gpu-")
    assert env["t"]["CUDA_VISIBLE_DEVICES"].startswith("GPU-")
    st = ctl.status()
    mig_leases = [m["lease"] for n in st["nodes"] for g in n["gpus"] for m in g["mig"] if m["lease"]]
    assert mig_leases == ["m"]


def test_heartbeat_reply_carries_the_nodes_assignments(ctl: HeadController, agents: dict[str, SimAgent]) -> None:
    ctl.request_lease(_req("w", "1"))
    ctl.reconcile()
    node = _granted(ctl, "w")["allocation"]["node"]
    reply = agents[node].beat()
    assert list(reply["assignments"]) == ["w"]
    assert reply["assignments"]["w"]["env"]["CUDA_VISIBLE_DEVICES"].startswith("GPU-")
    other = next(n for n in agents if n != node)
    assert agents[other].beat()["assignments"] == {}


def test_silent_agent_loses_its_node_and_requeues_its_leases(ctl: HeadController, agents: dict[str, SimAgent],
                                                              clock: FakeClock, demo: Any) -> None:
    ctl.request_lease(_req("w", "1"))
    ctl.reconcile()
    d = _granted(ctl, "w")
    node = d["allocation"]["node"]
    ctl.activate("w", d["fencing_token"], "actor-w")
    for _ in range(4):  # everyone else keeps beating
        clock.advance(1.5)
        for name, a in agents.items():
            if name != node:
                a.beat()
        report = ctl.reconcile()
    assert node in report.lost_nodes
    lost = ctl.get_lease("w", KEY)
    assert lost["state"] == "lost" and "silent" in lost["history"][-1]["reason"]
    assert lost["requeued_as"] == "w.a2" and ctl.current_attempt("w") == "w.a2"
    retry = ctl.get_lease("w.a2", KEY)
    assert retry["state"] == "granted" and retry["allocation"]["node"] != node and retry["attempt_of"] == "w"
    assert [n["state"] for n in ctl.status()["nodes"] if n["name"] == node] == ["lost"]
    # its heartbeats are refused; a new incarnation registers and the node is back
    assert agents[node].beat() == {"ok": False, "reregister": True}
    back = SimAgent(ctl, demo, node, incarnation="inc-2")
    back.register()
    assert [n["state"] for n in ctl.status()["nodes"] if n["name"] == node] == ["registered"]


def test_a_head_that_stalled_does_not_blame_the_agents_it_could_not_hear(
        ctl: HeadController, agents: dict[str, SimAgent], clock: FakeClock) -> None:
    """The head's own loop blocked past the TTL: nobody could be heard, so nobody is lost; an agent that stays
    silent once the head listens again is lost one TTL later."""
    ctl.reconcile()
    clock.advance(ctl.settings.agent_ttl_s + 3)  # no cycle, no heartbeat handled: the head was away
    assert ctl.reconcile().lost_nodes == []
    quiet = "h100-0"
    lost: list[str] = []
    for _ in range(5):  # the head listens again; all but one agent beat
        clock.advance(1.5)
        for name, a in agents.items():
            if name != quiet:
                a.beat()
        lost += ctl.reconcile().lost_nodes
    assert lost == [quiet]


def _with_an_active_lease(settings: RuntimeSettings, store: MemoryStore, clock: FakeClock, demo: Any,
                          dead: set[str]) -> tuple[HeadController, int]:
    """A controller whose holder probe says the holders in ``dead`` are dead, every demo agent registered, and
    lease "w" active under holder "actor-w"; the controller and w's token."""
    ctl = HeadController(settings, store, clock=clock, holder_probe=lambda hs: {h: h not in dead for h in hs})
    for n in demo.nodes:
        SimAgent(ctl, demo, n.name).register()
    ctl.request_lease(_req("w", "1"))
    ctl.reconcile()
    token = ctl.get_lease("w", KEY)["fencing_token"]
    ctl.activate("w", token, "actor-w")
    return ctl, token


def test_a_lease_whose_holder_died_is_lost_and_not_requeued(settings: RuntimeSettings, store: MemoryStore,
                                                            clock: FakeClock, demo: Any) -> None:
    dead: set[str] = set()
    ctl, _ = _with_an_active_lease(settings, store, clock, demo, dead)
    ctl.reconcile()
    assert ctl.get_lease("w", KEY)["state"] == "active"
    dead.add("actor-w")
    clock.advance(HOLDER_CHECK_EVERY_S / 2)
    assert ctl.reconcile().lost_leases == [], "holders are checked at most every HOLDER_CHECK_EVERY_S"
    clock.advance(HOLDER_CHECK_EVERY_S / 2)
    report = ctl.reconcile()
    assert report.lost_leases == ["w"] and report.requeued == []
    d = ctl.get_lease("w", KEY)
    assert d["state"] == "lost" and d["history"][-1]["reason"] == "holder died" and d["requeued_as"] is None


def test_a_lease_released_when_its_holder_is_gone_keeps_its_card_until_then_and_is_released_not_lost(
        settings: RuntimeSettings, store: MemoryStore, clock: FakeClock, demo: Any) -> None:
    # A Serve replica being stopped: its release is asked while it drains, and the head's holder probe, not a
    # watcher of the holder racing it, decides when the card goes on (the race made the lease "lost" under load).
    dead: set[str] = set()
    ctl, token = _with_an_active_lease(settings, store, clock, demo, dead)
    with pytest.raises(StaleFencingTokenError):
        ctl.release("w", token + 1, "its Serve replica stopped", True)
    d = ctl.release("w", token, "its Serve replica stopped", True)
    assert d["state"] == "active" and d["release_when_gone"] == "its Serve replica stopped"
    ctl.release("w", token, "its Serve replica stopped", True)  # idempotent
    clock.advance(HOLDER_CHECK_EVERY_S)
    ctl.reconcile()
    assert ctl.get_lease("w", KEY)["state"] == "active", "the card is the lease's while its holder lives"
    dead.add("actor-w")
    clock.advance(HOLDER_CHECK_EVERY_S)
    report = ctl.reconcile()
    d = ctl.get_lease("w", KEY)
    assert report.lost_leases == [] and d["state"] == "released"
    assert d["history"][-1]["reason"] == "its Serve replica stopped"
    # and the intent survives a head restart: it is in the journal
    ctl.request_lease(_req("v", "1"))
    ctl.reconcile()
    ctl.activate("v", ctl.get_lease("v", KEY)["fencing_token"], "actor-v")
    ctl.release("v", ctl.get_lease("v", KEY)["fencing_token"], "drained", True)
    restarted = HeadController(settings, store, clock=clock, holder_probe=lambda hs: {h: False for h in hs})
    assert restarted.restore() >= 1
    assert restarted.get_lease("v", KEY)["release_when_gone"] == "drained"
    clock.advance(HOLDER_CHECK_EVERY_S)
    restarted.reconcile()
    assert restarted.get_lease("v", KEY)["state"] == "released"
    assert restarted.get_lease("v", KEY)["history"][-1]["reason"] == "drained"


def test_a_grant_never_activated_expires(ctl: HeadController, agents: dict[str, SimAgent], clock: FakeClock) -> None:
    ctl.request_lease(_req("w", "1"))
    ctl.reconcile()
    for _ in range(13):
        clock.advance(5)
        for a in agents.values():
            a.beat()
        report = ctl.reconcile()
        if report.expired_leases:
            break
    assert report.expired_leases == ["w"]
    assert ctl.get_lease("w", KEY)["state"] == "expired"


def test_hard_state_is_written_before_it_is_visible_and_the_counter_first(ctl: HeadController, store: MemoryStore,
                                                                          agents: dict[str, SimAgent]) -> None:
    ctl.request_lease(_req("w", "1"))
    store.writes.clear()
    ctl.reconcile()
    puts = [k for op, k in store.writes if op == "put"]
    assert puts == ["rgo/meta", "rgo/lease/w"]
    assert store.get("rgo/lease/w")["state"] == "granted"
    assert store.get("rgo/meta")["fencing"] == 1


def test_a_restarted_head_resumes_from_the_store(settings: RuntimeSettings, store: MemoryStore, clock: FakeClock,
                                                 ctl: HeadController, agents: dict[str, SimAgent], demo: Any) -> None:
    for lid, gpu in (("w", "4"), ("m", "mig:4g.40gb"), ("p", "mps:50%"), ("q", "4")):
        ctl.request_lease(_req(lid, gpu))
    ctl.reconcile()
    before = {lid: ctl.get_lease(lid, KEY) for lid in "wmpq"}
    ctl.activate("m", before["m"]["fencing_token"], "actor-m")

    again = HeadController(settings, store, clock=clock)
    assert again.restore() == 4
    for lid in "wpq":
        d = again.get_lease(lid, KEY)
        assert (d["state"], d["fencing_token"], d["allocation"]) == (before[lid]["state"], before[lid]["fencing_token"],
                                                                     before[lid]["allocation"])
    assert again.get_lease("m", KEY)["state"] == "active" and again.get_lease("m", KEY)["holder"] == "actor-m"
    # agents keep their incarnation: heartbeats are accepted by the new head
    assert agents["a100-0"].ctl is ctl
    assert again.heartbeat("a100-0", "inc-1")["ok"] is True
    # the restored snapshot holds the same devices: the same requests again do not fit twice
    again.request_lease(_req("w2", "4"))
    again.reconcile()
    assert before["q"]["state"] == "pending"  # only a100-0 has four whole cards, and "w" holds them
    assert again.get_lease("w2", KEY)["state"] == "pending"
    again.release("w", before["w"]["fencing_token"])
    again.reconcile()
    granted = {lid: again.get_lease(lid, KEY) for lid in ("q", "w2")}
    winner = next(d for d in granted.values() if d["state"] == "granted")
    assert winner["fencing_token"] > max(d["fencing_token"] for d in before.values())  # tokens never reissued


def test_nodes_without_an_agent_get_one_once_and_a_vanished_node_is_lost(ctl: HeadController, clock: FakeClock,
                                                                          demo: Any) -> None:
    ctl.observe_ray_nodes([RayNodeInfo("ray-a100-0", "a100-0", True), RayNodeInfo("ray-h100-0", "h100-0")])
    report = ctl.reconcile()
    assert sorted(s.node_name for s in report.start_agents) == ["a100-0", "h100-0"]
    for s in report.start_agents:
        ctl.agent_start_requested(s.node_name)
    assert ctl.reconcile().start_agents == []  # in flight
    a100 = SimAgent(ctl, demo, "a100-0")
    a100.register()
    clock.advance(3)
    a100.beat()
    clock.advance(3)  # the start on h100-0 never registered within a TTL: ask again
    assert [s.node_name for s in ctl.reconcile().start_agents] == ["h100-0"]
    # a registered node whose Ray node leaves is lost at once, without waiting for the TTL
    ctl.observe_ray_nodes([RayNodeInfo("ray-h100-0", "h100-0")])
    a100.beat()
    report = ctl.reconcile()
    assert report.lost_nodes == ["a100-0"]
    assert "left the cluster" in ctl.status()["nodes"][0]["reason"]


def test_an_unhealthy_gpu_takes_no_new_leases(ctl: HeadController, agents: dict[str, SimAgent]) -> None:
    a = agents["h100-0"]
    inv = a.inventory
    sick = inv.model_copy(update={"gpus": (inv.gpus[0].model_copy(update={"healthy": False, "health_reason": "XID 79"}),
                                           inv.gpus[1]), "generation": 1})
    assert ctl.update_inventory("h100-0", a.incarnation, sick.model_dump(mode="json"))["ok"]
    ctl.request_lease({"lease_id": "h", "request": {"kind": "whole", "count": 1, "node": "h100-0"}, "requester_digest": key_digest(KEY)})
    ctl.request_lease({"lease_id": "h2", "request": {"kind": "whole", "count": 1, "node": "h100-0"}, "requester_digest": key_digest(KEY)})
    ctl.reconcile()
    assert _granted(ctl, "h")["allocation"]["gpu_indices"] == [1]
    assert ctl.get_lease("h2", KEY)["state"] == "pending"
    gpu0 = ctl.status()["nodes"][2]["gpus"][0]
    assert (gpu0["healthy"], gpu0["health_reason"]) == (False, "XID 79")
    assert ctl.update_inventory("h100-0", "stale-incarnation", sick.model_dump(mode="json")) == {"ok": False, "reregister": True}


def test_an_agent_that_refuses_devices_loses_the_lease_which_is_requeued(ctl: HeadController, agents: dict[str, SimAgent]) -> None:
    ctl.request_lease(_req("w", "1"))
    ctl.reconcile()
    node = _granted(ctl, "w")["allocation"]["node"]
    agents[node].beat(rejected={"w": "device vanished"})
    d = ctl.get_lease("w", KEY)
    assert d["state"] == "lost" and "refused" in d["history"][-1]["reason"] and d["requeued_as"] == "w.a2"


def test_priority_class_orders_the_queue_and_unknown_classes_are_refused(ctl: HeadController, agents: dict[str, SimAgent]) -> None:
    with pytest.raises(InvalidRequestError) as e:
        ctl.request_lease(_req("x", priority_class="platinum"))
    assert e.value.field == "priority"
    ctl.request_lease(_req("low", "4", priority_class="batch"))
    ctl.request_lease(_req("high", "4", priority_class="inference"))
    ctl.request_lease(_req("mid", "4", priority_class="training"))
    q = ctl.status()["queue"]
    assert [x["lease_id"] for x in q] == ["high", "mid", "low"]
    ctl.reconcile()
    assert ctl.get_lease("high", KEY)["state"] == "granted"


def test_ended_leases_leave_after_the_retention_unless_a_live_attempt_follows(store: MemoryStore, clock: FakeClock,
                                                                              demo: Any) -> None:
    settings = RuntimeSettings(heartbeat_interval_s=1.0, agent_ttl_s=5.0, grant_ttl_s=1e6, ended_retention_s=120)
    ctl = HeadController(settings, store, clock=clock)
    agents = {n.name: SimAgent(ctl, demo, n.name) for n in demo.nodes}
    for a in agents.values():
        a.register()
    pruned: list[str] = []

    def run(seconds: float, silent: str = "") -> None:
        for _ in range(int(seconds / 1.5)):
            clock.advance(1.5)
            for name, a in agents.items():
                if name != silent:
                    a.beat()
            pruned.extend(ctl.reconcile().pruned)

    ctl.request_lease(_req("done", "1"))
    ctl.request_lease(_req("c", "1"))
    ctl.reconcile()
    ctl.release("done", ctl.get_lease("done", KEY)["fencing_token"])
    node = ctl.get_lease("c", KEY)["allocation"]["node"]
    run(9, silent=node)  # c's node goes silent: c is lost and requeued as c#1 elsewhere
    assert ctl.get_lease("c", KEY)["requeued_as"] == "c.a2" and ctl.get_lease("c.a2", KEY)["state"] == "granted"
    run(100, silent=node)
    assert pruned == [] and store.get("rgo/lease/done") is not None  # inside the retention
    run(30, silent=node)
    assert pruned == ["done"] and store.get("rgo/lease/done") is None
    with pytest.raises(UnknownObjectError):
        ctl.get_lease("done", KEY)
    assert ctl.current_attempt("c") == "c.a2"  # c ended long ago, but its attempt c#1 is live: c stays
    # Past the retention an id is new again.
    assert ctl.request_lease(_req("done", "2")) == "done" and ctl.get_lease("done", KEY)["state"] == "pending"
    ctl.release("c.a2", ctl.get_lease("c.a2", KEY)["fencing_token"])
    run(135, silent=node)
    assert sorted(pruned) == ["c", "c.a2", "done"]
    assert not [k for k in store.keys("rgo/lease/") if k.startswith("rgo/lease/c")]



# ---- recovery paths ---------------------------------------------------------------------------------
def test_a_lease_whose_gpu_leaves_the_inventory_is_lost(ctl: HeadController, agents: dict[str, SimAgent]) -> None:
    ctl.request_lease(_req("w", {"kind": "whole", "count": 1, "node": "h100-0"}, requeue_on_loss=False))
    ctl.reconcile()
    held = _granted(ctl, "w")["allocation"]["gpu_indices"][0]
    a = agents["h100-0"]
    inv = a.inventory.model_copy(update={"gpus": tuple(g for g in a.inventory.gpus if g.index != held),
                                         "generation": a.inventory.generation + 1})
    assert ctl.update_inventory("h100-0", a.incarnation, inv.model_dump(mode="json")) == {"ok": True}
    d = ctl.get_lease("w", KEY)
    assert d["state"] == "lost" and "no longer in the node's inventory" in d["history"][-1]["reason"]
    assert ctl.snapshot().allocated_milli() == 0  # nothing of it stays booked


def test_a_granted_victim_that_never_started_is_stopped_at_once(ctl: HeadController, agents: dict[str, SimAgent],
                                                                clock: FakeClock) -> None:
    ctl.request_lease(_req("t", {"kind": "whole", "count": 2, "node": "h100-0"}, priority_class="training"))
    ctl.reconcile()
    _granted(ctl, "t")
    for _ in range(8):  # past training's minimum runtime (30 s), agents alive, never activated
        clock.advance(4)
        for a in agents.values():
            a.beat()
        ctl.reconcile()
    ctl.request_lease(_req("inf", {"kind": "whole", "count": 1, "node": "h100-0"}, priority_class="inference"))
    report = ctl.reconcile()
    t = ctl.get_lease("t", KEY)
    assert t["state"] == "preempted" and "nothing to checkpoint" in t["history"][-1]["reason"]
    assert report.preempted == ["t"] and report.checkpoint_requested == []
    ctl.reconcile()
    assert _granted(ctl, "inf")


def test_on_demand_mig_is_handed_out_after_the_agent_reports_the_instance(settings, store, clock) -> None:
    from orchestrator.core.config import parse_config

    cfg = parse_config({"nodes": [{"name": "d", "model": "A100-80GB", "gpus": 1, "mig": {0: []}}]})
    ctl = HeadController(settings, store, clock=clock)
    agent = SimAgent(ctl, cfg, "d")
    agent.register()
    ctl.request_lease(_req("m", "mig:3g.40gb"))
    ctl.reconcile()
    assert _granted(ctl, "m")["handout"] is None  # no instance yet: nothing to hand out
    agent.beat()  # the agent receives the assignment and makes the instance
    made = agent.core.mig_uuids["m"]
    agent.beat()  # ... and reports its UUID; the head builds the hand-out with it
    d = _granted(ctl, "m")
    assert d["handout"]["env_vars"]["CUDA_VISIBLE_DEVICES"] == made and made.startswith("MIG-")
    agent.beat()
    assert agent.core.allocated["m"] == d["handout"]["env_vars"]  # the agent holds the head's env, not its own
