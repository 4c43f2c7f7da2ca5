"""Agents hold their node's leases: revocation, agent-driven checkpoints, requeue-and-resume, stale tokens, MPS.

The head is the real controller; every agent is the real :class:`AgentCore` (``SimAgent``) with a
:class:`FakeWorkloads` at its workload boundary (the Ray port's ``RayWorkloads`` stands there on a cluster)
and a :class:`RecordingPort` at its process boundary (``nvidia-cuda-mps-control``). No Ray, an injected clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from orchestrator.control import revocation
from orchestrator.control.agent import CheckpointPoll
from orchestrator.control.controller import HeadController
from orchestrator.control.mps import MpsDaemons, RecordingPort
from orchestrator.control.store import MemoryStore
from orchestrator.core.config import ClusterConfig, RuntimeSettings
from orchestrator.core.errors import InvalidRequestError, StaleFencingTokenError
from orchestrator.core.lease import key_digest

from .conftest import FakeClock, SimAgent

KEY = "k"
ROGUE = "actor:rgo/rgo-lease-t"


@dataclass
class FakeWorkloads:
    """The agent's workload boundary: what a holder does when stopped or asked to checkpoint is declared."""

    stoppable: bool = True  # False: stop() does not confirm (the process lingers)
    answers_checkpoint: bool = True  # False: a rogue actor that never answers
    stopped: list[str] = field(default_factory=list)
    asked: list[tuple[str, str]] = field(default_factory=list)
    watched: list[str] = field(default_factory=list)

    def stop(self, workload: str, lease_id: str = "") -> bool:
        self.stopped.append(workload)
        return self.stoppable

    def watch(self, workload: str) -> None:
        self.watched.append(workload)

    def checkpoint(self, workload: str, directory: str, lease_id: str = "") -> CheckpointPoll:
        self.asked.append((workload, directory))
        return lambda: f"{directory}/ck.pt" if self.answers_checkpoint else None


@pytest.fixture
def head(settings: RuntimeSettings, store: MemoryStore, clock: FakeClock, demo: ClusterConfig) -> HeadController:
    training = demo.scheduler.classes["training"].model_copy(update={"min_runtime_s": 0.0, "grace_period_s": 10.0})
    sched = demo.scheduler.model_copy(update={"classes": {**demo.scheduler.classes, "training": training}})
    return HeadController(settings, store, clock=clock, sched_config=sched)


@pytest.fixture
def h100(head: HeadController, demo: ClusterConfig) -> SimAgent:
    agent = SimAgent(head, demo, "h100-0")
    agent.core.workloads = FakeWorkloads()
    agent.core.mps = MpsDaemons(head.settings.mps_pipe_root, RecordingPort())
    agent.register()
    return agent


def _ask(head: HeadController, lease_id: str, priority: str, **kw: Any) -> None:
    head.request_lease({"lease_id": lease_id, "request": {"kind": "whole", "count": 2, "node": "h100-0"},
                        "priority_class": priority, "requester_digest": key_digest(KEY), **kw})


def _cycle(head: HeadController, agent: SimAgent, n: int = 1) -> None:
    for _ in range(n):
        agent.beat()
        head.reconcile()


def _running_victim(head: HeadController, agent: SimAgent, **kw: Any) -> int:
    _ask(head, "t", "training", checkpoint_dir="/ck", **kw)
    _cycle(head, agent)
    token = head.get_lease("t", KEY)["fencing_token"]
    head.activate("t", token, None, ROGUE)
    _ask(head, "i", "inference")
    _cycle(head, agent)
    assert head.get_lease("t")["state"] == "checkpointing"
    return token


def test_a_rogue_holder_is_stopped_and_its_cards_go_to_the_preemptor_only_after(
        head: HeadController, h100: SimAgent, clock: FakeClock) -> None:
    fake: FakeWorkloads = h100.core.workloads  # type: ignore[assignment]
    fake.answers_checkpoint, fake.stoppable = False, False
    _running_victim(head, h100)
    _cycle(head, h100, 3)
    assert fake.asked == [(ROGUE, "/ck/t")] and head.get_lease("t")["state"] == "checkpointing"  # asked once
    assert fake.watched == [ROGUE] and h100.core.holders == {"t": ROGUE}  # reached out to once, when registered
    clock.advance(11)  # past the grace period: preempted, but fenced until the agent confirms
    _cycle(head, h100, 5)
    t = head.get_lease("t")
    assert t["state"] == "preempted" and t["revoking"] is True and "grace period over" in t["history"][-1]["reason"]
    assert head.get_lease("i")["state"] == "pending"  # the rogue may still run on the cards
    assert fake.stopped and set(fake.stopped) == {ROGUE}  # the agent keeps trying
    assert head.status()["leases"][0]["lease_id"] == "i"
    fake.stoppable = True  # the holder is gone at last
    _cycle(head, h100, 2)
    assert head.get_lease("t")["revoking"] is False and head.get_lease("i")["state"] == "granted"
    _cycle(head, h100, 3)
    assert sorted(head.ledger.entries) == ["i", "t"]  # no second preemption was planned meanwhile


def test_a_cooperative_actor_checkpoints_through_the_agent_and_is_requeued_to_resume(
        head: HeadController, h100: SimAgent) -> None:
    fake: FakeWorkloads = h100.core.workloads  # type: ignore[assignment]
    _running_victim(head, h100, requeue_on_preempt=True)
    _cycle(head, h100, 4)
    t = head.get_lease("t")
    assert t["state"] == "preempted" and t["checkpoint_path"] == "/ck/t/ck.pt" and t["requeued_as"] == "t.a2"
    assert fake.stopped == [ROGUE]  # even a holder that checkpointed is stopped before the cards move
    assert list(h100.core.stopped_at) == ["t"]  # when the agent confirmed it (what bench/preemption.py reads)
    assert head.get_lease("i")["state"] == "granted"
    retry = head.get_lease("t.a2", KEY)
    assert retry["state"] == "pending" and retry["resume_from"] == "/ck/t/ck.pt"
    head.release("i", head.get_lease("i", KEY)["fencing_token"])
    _cycle(head, h100, 2)
    back = head.get_lease("t.a2", KEY)  # the requester's own key still works on the new attempt
    assert back["state"] == "granted" and back["resume_from"] == "/ck/t/ck.pt" and back["fencing_token"] > 0


def test_the_agent_refuses_a_stale_or_revoked_token(head: HeadController, h100: SimAgent, clock: FakeClock) -> None:
    token = _running_victim(head, h100)
    h100.core.check_holder("t", token)
    with pytest.raises(StaleFencingTokenError):
        h100.core.check_holder("t", token - 1)
    clock.advance(11)
    _cycle(head, h100, 3)
    h100.beat()  # the agent receives the preemptor's grant
    with pytest.raises(StaleFencingTokenError) as e:
        h100.core.check_holder("t", token)  # revoked: the old holder cannot come back
    assert e.value.lease_id == "t"
    i_token = head.get_lease("i", KEY)["fencing_token"]
    assert i_token > token
    h100.core.check_holder("i", i_token)


def test_a_lost_node_frees_what_it_was_revoking(head: HeadController, h100: SimAgent, clock: FakeClock) -> None:
    h100.core.workloads.stoppable = False  # type: ignore[attr-defined]
    _running_victim(head, h100)
    clock.advance(11)
    _cycle(head, h100, 2)
    assert head.get_lease("t")["revoking"] is True
    for _ in range(6):  # silent past the TTL, the head cycling all along
        clock.advance(1.0)
        head.reconcile()
    assert head.get_lease("t")["revoking"] is False and head.status()["nodes"][0]["state"] == "lost"


def test_a_malformed_workload_is_refused_naming_the_field(head: HeadController, h100: SimAgent) -> None:
    _ask(head, "t", "training")
    _cycle(head, h100)
    with pytest.raises(InvalidRequestError) as e:
        head.activate("t", head.get_lease("t", KEY)["fencing_token"], None, "actor:no-namespace")
    assert e.value.field == "workload"


def test_a_serve_replica_may_be_a_lease_s_workload() -> None:
    # Serve's replicas are named actors in Serve's namespace too; they hold leases (docs/ray-native.md).
    assert revocation.protected_workload("actor:serve/SERVE_REPLICA::app#Where#x1", namespace="rgo",
                                         head_name="rgo-head") is None
    assert revocation.protected_workload("actor:serve/SERVE_PROXY_ACTOR-0123", namespace="rgo", head_name="rgo-head")


@pytest.mark.parametrize("workload", ["actor:{ns}/{head}", "actor:{ns}/rgo-agent-a100-0", "actor:serve/SERVE_CONTROLLER_ACTOR",
                                      "actor:_ray_internal_dashboard/x"])
def test_a_holder_cannot_name_the_head_an_agent_or_rays_own_actors_as_its_workload(
        head: HeadController, h100: SimAgent, workload: str) -> None:
    # Issue #38's three-call attack: a lease of one's own, activated with the head as its "workload", then
    # preempted, had the agent ray.kill the head. The head refuses the name at the edge.
    _ask(head, "t", "training")
    _cycle(head, h100)
    token = head.get_lease("t", KEY)["fencing_token"]
    named = workload.format(ns=head.settings.namespace, head=head.settings.head_name)
    with pytest.raises(InvalidRequestError) as e:
        head.activate("t", token, None, named)
    assert e.value.field == "workload" and "never stops" in str(e.value)
    assert head.get_lease("t")["state"] == "granted" and head.ledger.get("t").workload is None


def test_the_agent_never_stops_the_head_even_when_a_lease_names_it(
        head: HeadController, h100: SimAgent, clock: FakeClock) -> None:
    # Defence in depth: a ledger written before the head checked names (restored from its store) still names
    # the head; the agent confirms the revocation without stopping anything, so the preemptor is not held up.
    fake: FakeWorkloads = h100.core.workloads  # type: ignore[assignment]
    fake.answers_checkpoint = False
    _running_victim(head, h100)
    the_head = revocation.actor_workload(head.settings.namespace, head.settings.head_name)
    head.ledger.commit([replace(head.ledger.get("t"), workload=the_head)])
    clock.advance(11)  # past the grace period: revoked, fenced until the agent confirms
    _cycle(head, h100, 4)
    assert head.get_lease("t")["state"] == "preempted"
    assert the_head not in fake.stopped
    assert head.get_lease("t")["revoking"] is False and head.get_lease("i")["state"] == "granted"


def test_a_refused_token_does_not_tell_the_caller_the_lease_s_own(head: HeadController, h100: SimAgent) -> None:
    # Issue #38: the refusal carried the real token, so a second driver released anyone's lease in two calls.
    _ask(head, "t", "training")
    _cycle(head, h100)
    token = head.get_lease("t", KEY)["fencing_token"]
    for wrong in (0, token + 1000):
        with pytest.raises(StaleFencingTokenError) as e:
            head.release("t", wrong)
        assert str(token) not in str(e.value).replace(f"lease t: fencing token {wrong}", "")
        assert token not in vars(e.value).values()
    assert head.get_lease("t")["state"] == "granted"


def test_mps_daemons_run_exactly_on_gpus_with_mps_leases(head: HeadController, h100: SimAgent) -> None:
    port: RecordingPort = h100.core.mps.port  # type: ignore[assignment]
    for lid in ("p1", "p2"):
        head.request_lease({"lease_id": lid, "request": {"kind": "mps", "sm_percent": 30, "node": "h100-0"},
                            "requester_digest": key_digest(KEY)})
    _cycle(head, h100, 2)
    gpu = head.get_lease("p1")["allocation"]["gpu_indices"][0]
    assert head.get_lease("p2")["allocation"]["gpu_indices"] == [gpu]  # the engine packs both on one card
    pipe = head.ledger.get("p1").handout.env_vars["CUDA_MPS_PIPE_DIRECTORY"]  # where the clients look
    assert pipe == f"{head.settings.mps_pipe_root}/gpu-{gpu}"
    starts = [c for c in port.commands if c[0] == ["nvidia-cuda-mps-control", "-d"]]
    assert len(starts) == 1 and starts[0][1]["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    assert starts[0][1]["CUDA_MPS_LOG_DIRECTORY"] == pipe + ".log"
    assert starts[0][1]["CUDA_VISIBLE_DEVICES"] == h100.inventory.gpus[gpu].uuid
    head.release("p1", head.get_lease("p1", KEY)["fencing_token"])
    _cycle(head, h100)
    assert port.running == {pipe}  # one MPS lease left: the daemon stays
    head.release("p2", head.get_lease("p2", KEY)["fencing_token"])
    _cycle(head, h100)
    assert port.running == set() and port.commands[-1][2] == "quit\n"


def test_a_daemon_that_does_not_start_refuses_the_lease(head: HeadController, h100: SimAgent) -> None:
    h100.core.mps.port.fail_start = True  # type: ignore[attr-defined]
    head.request_lease({"lease_id": "p", "request": {"kind": "mps", "sm_percent": 30, "node": "h100-0"}})
    _cycle(head, h100, 3)
    p = head.get_lease("p")
    assert p["state"] == "lost" and "MPS control daemon" in p["history"][-1]["reason"]


def test_the_head_knows_which_agents_have_work_and_the_agent_beats_fast_while_a_checkpoint_is_awaited(
        head: HeadController, h100: SimAgent, clock: FakeClock) -> None:
    """What the head actor wakes agents for (``revocation.agent_work``): an actor to ask for a checkpoint,
    then a lease to revoke; nothing once the cards have moved on."""
    fake: FakeWorkloads = h100.core.workloads  # type: ignore[assignment]
    fake.answers_checkpoint, fake.stoppable = False, False
    assert revocation.agent_work(head.ledger) == {}
    _running_victim(head, h100)
    assert revocation.agent_work(head.ledger) == {"h100-0": {("t", "checkpoint")}}
    h100.beat()
    assert h100.core.urgent  # the checkpoint is awaited: its path must go back at once
    clock.advance(11)
    _cycle(head, h100, 2)
    assert revocation.agent_work(head.ledger) == {"h100-0": {("t", "revoke")}}
    fake.stoppable = True
    _cycle(head, h100, 3)
    # the preemptor's new grant: its agent is woken to make its placement group (control/holds.py)
    assert head.get_lease("i")["state"] == "granted" and revocation.agent_work(head.ledger) == {"h100-0": {("i", "hold")}}
    assert not h100.core.urgent


def test_while_its_victim_is_revoked_a_preemptor_takes_no_second_victim(
        head: HeadController, demo: ClusterConfig, clock: FakeClock) -> None:
    """Two training leases could each make room for the inference request; the one chosen is a rogue still
    being revoked. The request stays nominated on it: the other training keeps running all along."""
    agents = {n: SimAgent(head, demo, n) for n in ("a100-0", "a100-1", "h100-0")}
    for a in agents.values():
        a.core.workloads = FakeWorkloads(answers_checkpoint=False, stoppable=False)
        a.register()

    def cycle(n: int = 1) -> None:
        for _ in range(n):
            for a in agents.values():
                a.beat()
            head.reconcile()

    def ask(lease_id: str, priority: str, request: dict[str, Any]) -> None:
        head.request_lease({"lease_id": lease_id, "request": request, "priority_class": priority,
                            "requester_digest": key_digest(KEY), "checkpoint_dir": "/ck"})

    ask("fill", "inference", {"kind": "whole", "count": 4, "node": "a100-0"})  # no room left there
    for lid, node in (("t1", "h100-0"), ("t2", "a100-1")):
        ask(lid, "training", {"kind": "whole", "count": 2, "node": node})
    cycle()
    for lid in ("t1", "t2"):
        head.activate(lid, head.get_lease(lid, KEY)["fencing_token"], None, f"actor:rgo/rgo-lease-{lid}")
    ask("i", "inference", {"kind": "whole", "count": 2})  # either training's cards would do
    cycle()
    victims = [lid for lid in ("t1", "t2") if head.get_lease(lid)["state"] == "checkpointing"]
    assert len(victims) == 1
    other = "t2" if victims == ["t1"] else "t1"
    clock.advance(11)  # past the grace: the victim is revoked, but its agent cannot stop it yet
    for _ in range(10):
        cycle()
        clock.advance(1.0)
        assert head.get_lease(victims[0])["revoking"] is True
        assert head.get_lease(other)["state"] == "active", "a second victim was taken while the first is revoked"
        assert head.get_lease("i")["state"] == "pending"


def test_a_silent_agent_on_a_live_ray_node_keeps_its_holders_cards_fenced_until_its_successor_stops_them(
        head: HeadController, h100: SimAgent, demo: ClusterConfig, clock: FakeClock) -> None:
    """The agent went quiet but Ray still lists its node: the holder may run on. Its lease is lost (and requeued
    where asked), but the cards stay taken until the node's next agent has stopped the holder."""
    from orchestrator.control.nodes import RayNodeInfo

    head.nodes.observe([RayNodeInfo("ray-h100-0", "h100-0", False)])
    _ask(head, "t", "training")
    _cycle(head, h100)
    head.activate("t", head.get_lease("t", KEY)["fencing_token"], None, ROGUE)
    for _ in range(7):  # the agent is silent past the TTL; the head cycles all along
        clock.advance(1.0)
        head.reconcile()
    t = head.get_lease("t")
    assert t["state"] == "lost" and t["revoking"] is True
    _ask(head, "i", "inference")
    head.reconcile()
    assert head.get_lease("i")["state"] == "pending"  # fenced: the old holder may still run on the cards
    successor = SimAgent(head, demo, "h100-0", incarnation="inc-2")
    successor.core.workloads = FakeWorkloads()
    successor.register()  # its registration lists the revocation: it stops the holder
    assert successor.core.workloads.stopped == [ROGUE]  # type: ignore[attr-defined]
    successor.beat()
    head.reconcile()
    assert head.get_lease("t")["revoking"] is False and head.get_lease("i")["state"] == "granted"


def test_a_node_that_left_ray_frees_its_lost_leases_at_once(head: HeadController, h100: SimAgent,
                                                             clock: FakeClock) -> None:
    from orchestrator.control.nodes import RayNodeInfo

    head.nodes.observe([RayNodeInfo("ray-h100-0", "h100-0", False)])
    _ask(head, "t", "training")
    _cycle(head, h100)
    head.activate("t", head.get_lease("t", KEY)["fencing_token"], None, ROGUE)
    for _ in range(7):
        clock.advance(1.0)
        head.reconcile()
    assert head.get_lease("t")["revoking"] is True
    head.nodes.observe([RayNodeInfo("ray-other", "a100-0", True)])  # h100-0's raylet is gone now
    head.reconcile()
    assert head.get_lease("t")["revoking"] is False


def test_a_process_workload_is_stopped_only_when_it_carries_the_lease() -> None:
    # `pid:<n>` is named by the holder: the agent kills only a process started with the lease's hand-out, never
    # another process of the node (issue #38: a raylet, the GCS or the head named as a lease's workload).
    import os
    import subprocess
    import sys

    from orchestrator.control.agent import LocalWorkloads

    cmd = [sys.executable, "-c", "import time; time.sleep(60)"]
    other = subprocess.Popen(cmd, env={k: v for k, v in os.environ.items() if k != "ORCHESTRATOR_LEASE_ID"})
    holder = subprocess.Popen(cmd, env={**os.environ, "ORCHESTRATOR_LEASE_ID": "t"})
    try:
        port = LocalWorkloads()
        assert port.stop(f"pid:{other.pid}", "t") is True  # nothing of the lease's to stop ...
        assert other.poll() is None  # ... and the process lives
        assert port.stop(f"pid:{holder.pid}", "u") is True and holder.poll() is None  # another lease's name
        assert port.stop(f"pid:{holder.pid}", "t") is False  # the holder: killed, confirmed once gone
        assert holder.wait(timeout=10) == -9
        assert port.stop(f"pid:{holder.pid}", "t") is True
    finally:
        for p in (other, holder):
            p.kill()
            p.wait()
