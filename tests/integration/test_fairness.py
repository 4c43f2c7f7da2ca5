"""Two teams on a real local Ray cluster converge to their weighted fair shares (issue #37), a training actor
among the leases reclaimed checkpoints through its agent and resumes, bit-identical, when the cards come back.

And, on the same head, issue #36's fallback on a real cluster: replicas asked at once down the chain
`mig:1g.10gb|1` take the slices, then a whole card by preempting the training actor, which resumes.

One cluster for the module (``ray_cluster``); a head with fairness on and two top-level queues of weight 1.
Team a first takes every whole card (plain leases activated by this driver, and the example training actor of
jobs/train.py, started last so that preempting it loses the least work); team b then asks for as many cards at
the same priority. Nothing is of lower priority, so only fair share can move cards: with it, b reclaims until
the two hold the same, and the reclaim rule stops there (one more would only move the unfairness).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from orchestrator.core.config import RuntimeSettings
from orchestrator.core.lease import key_digest
from orchestrator.core.request import GpuRequest

from tests.integration.heads import running_head, until as _until
from tests.integration.test_revocation import _reference_digest, _train_in_thread, _training_stepped

pytestmark = pytest.mark.ray

SETTINGS = RuntimeSettings(namespace="rgo-fair", heartbeat_interval_s=0.5, agent_ttl_s=6.0, reconcile_interval_s=0.1)
KEY = "fair-key"
ONE = GpuRequest.whole(1).model_dump(mode="json")


@pytest.fixture(scope="module")
def head(ray_cluster: Any) -> Iterator[Any]:
    from orchestrator.rayport.client import HeadClient

    cfg = ray_cluster.config
    sched = cfg.scheduler
    training = sched.classes["training"].model_copy(update={"min_runtime_s": 0.0, "grace_period_s": 3.0})
    sched = sched.model_validate({**sched.model_dump(mode="json"),
                                  "classes": {**sched.model_dump(mode="json")["classes"],
                                              "training": training.model_dump(mode="json")},
                                  "queues": {"default": {}, "team-a": {"weight": 1}, "team-b": {"weight": 1}},
                                  "fairness": {"enabled": True, "max_reclaims_per_cycle": 1}})
    with running_head(SETTINGS, cfg.model_copy(update={"scheduler": sched})) as handle:
        yield HeadClient(handle=handle)


def _held(head: Any, queue: str) -> float:
    rows = {q["queue"]: q for q in head.status()["queues"]}
    return rows[queue]["used_gpus"] if queue in rows else 0.0


def _leases(head: Any) -> list[tuple[str, str, str, str]]:
    """Every lease the head shows, live and ended, with its queue and its last reason: what a failure prints."""
    st = head.status()
    return [(le["lease_id"], le["state"], le.get("queue", ""), le["history"][-1]["reason"][:100] if le.get("history")
             else str(le.get("why_pending", ""))[:100]) for le in st["leases"] + st["ended_leases"]]


@pytest.fixture(autouse=True)
def _each_test_gives_every_card_back(head: Any) -> Iterator[None]:
    """A test that fails half way leaves its leases: the next test would start on a cluster with cards held."""
    yield
    _give_back_all(head)


def _give_back(head: Any, lid: str) -> None:
    """Release a lease this driver asked for (withdraw it while pending), with its token once it has one."""
    head.release(lid, head.get_lease(lid, KEY).get("fencing_token"), key=KEY)


def _ask(head: Any, lid: str, queue: str) -> None:
    """One card for ``queue``, queued again when preempted (a team's demand stays while it is reclaimed)."""
    head.request_lease({"lease_id": lid, "request": ONE, "owner": "it", "priority_class": "training",
                        "queue": queue, "requester_digest": key_digest(KEY), "requeue_on_preempt": True})


def _take_whole_cards_but_one(head: Any, config: Any, prefix: str) -> list[str]:
    """Team a asks for every whole card of the cluster but one (counted from its config: a node's cards less its
    MIG-enabled ones), each waited for until granted -- never judged by a fixed sleep, which a busy machine
    outlasts -- then activated by this driver. The lease ids, in order."""
    whole = sum(n.gpus - len(n.mig or {}) for n in config.nodes)
    plain = [f"{prefix}-{i}" for i in range(whole - 1)]
    for lid in plain:
        _ask(head, lid, "team-a")
    for lid in plain:
        token = head.wait_lease(lid, 60, KEY)["fencing_token"]
        head.activate(lid, token, None, None, KEY)
    return plain


def test_two_teams_converge_to_equal_shares_and_the_reclaimed_training_actor_resumes(head: Any, ray_cluster: Any,
                                                                                     tmp_path: Path) -> None:
    # Team a: every whole card but one, as plain leases this driver activates (started before the trainer).
    plain = _take_whole_cards_but_one(head, ray_cluster.config, "a")
    cards = len(plain) + 1
    assert cards >= 4, "the demo cluster has whole cards for the test"
    steps, seed = 300, 5
    t, out = _train_in_thread(steps=steps, seed=seed, checkpoint_dir=str(tmp_path), gpu=GpuRequest.whole(1),
                              step_delay_s=0.02, head=head, namespace=SETTINGS.namespace, lease_id="a-train",
                              queue="team-a")
    _until("the training actor at work", lambda: "error" in out or (
        _training_stepped(head, "a-train") and any("training on" in s for s in out.get("log", []))), 120)
    time.sleep(1.0)  # some steps done
    deadline = time.monotonic() + 30  # read until it holds: the full suite once saw 7 of 8 here, cause unknown
    while _held(head, "team-a") != cards:
        assert time.monotonic() < deadline, (f"team a holds {_held(head, 'team-a')} of {cards} cards", _leases(head))
        time.sleep(0.5)
    # Team b asks for as many cards, at the same priority: only fair share can give it any.
    for i in range(cards):
        _ask(head, f"b-{i}", "team-b")
    half = cards // 2
    _until(f"team b reclaiming {half} of {cards} cards", lambda: _held(head, "team-b") >= half, 120)
    time.sleep(3.0)  # a few more cycles: the reclaim rule must stop at equal shares, not swing past them

    def settled() -> tuple[float, float] | None:
        """Both teams' holdings once no card is in transit (a victim's card is held until its agent confirms the
        stop, and a busy machine stretches that past any fixed sleep: the full suite once read 3 and 4 of 8)."""
        a, b = _held(head, "team-a"), _held(head, "team-b")
        return (a, b) if a + b == cards else None

    a, b = _until("every card held again", settled, 60)
    assert (a, b) == (cards - half, half), (a, b, _leases(head))
    time.sleep(3.0)  # and it stays there: no reclaim swings past equal shares
    assert (_held(head, "team-a"), _held(head, "team-b")) == (a, b), _leases(head)
    rows = {q["queue"]: q for q in head.status()["queues"]}
    # Equal weights, equal asks: equal fair shares. The demo cluster's MIG cards count in its capacity but hold
    # no whole card, so each team ends a card below its share -- and neither may take one from the other.
    assert rows["team-a"]["fair_share_gpus"] == rows["team-b"]["fair_share_gpus"]
    assert {rows["team-a"]["cause"], rows["team-b"]["cause"]} <= {"fair.below", "fair.at"}
    preempted = [le for le in head.status()["ended_leases"] if le["state"] == "preempted"]
    assert preempted and all(any("fair share" in h["reason"] for h in le["history"]) for le in preempted), \
        [le["history"] for le in preempted]
    assert any(le["lease_id"] == "a-train" for le in preempted), "the trainer, least work lost, went first"
    # Team b is done: its cards go back, the trainer resumes from its checkpoint and ends as an undisturbed run.
    for i in range(cards):
        _give_back(head, f"b-{i}")
    t.join(timeout=240)
    assert "error" not in out, out.get("error")
    res = out["result"]
    assert len(res["attempts"]) >= 2 and res["attempts"][1]["resumed_at"] > 0  # resumed where it stopped
    assert res["step"] == steps and res["digest"] == _reference_digest(steps, seed)
    _give_back_all(head)


def _give_back_all(head: Any) -> None:
    """Every live lease this driver asked for (the victims' retries too), released or withdrawn."""
    for le in head.status()["leases"]:
        if (le["lease_id"].split(".")[0].startswith(("a-", "b-", "c-", "r-"))
                and not le["lease_id"].startswith("a-train")):
            _give_back(head, le["lease_id"])
    _until("every card free", lambda: not [le for le in head.status()["leases"]
                                           if le["state"] in ("granted", "active", "checkpointing")], 60)


def test_replicas_fall_back_down_their_chain_and_the_last_preempts_training_which_resumes(head: Any,
                                                                                        ray_cluster: Any,
                                                                                        tmp_path: Path) -> None:
    """Issue #36 on a real cluster: four inference replicas asked at once with the chain `mig:1g.10gb|1` while
    training holds every whole card: three get the demo cluster's three 1g slices, the fourth falls back to a
    whole card and preempts the training actor through its checkpoint; it resumes bit-identical after."""
    _take_whole_cards_but_one(head, ray_cluster.config, "c")  # training takes them, then the trainer the last
    steps, seed = 300, 9
    t, out = _train_in_thread(steps=steps, seed=seed, checkpoint_dir=str(tmp_path), gpu=GpuRequest.whole(1),
                              step_delay_s=0.02, head=head, namespace=SETTINGS.namespace, lease_id="a-train2",
                              queue="team-a")
    _until("the training actor at work", lambda: "error" in out or (
        _training_stepped(head, "a-train2") and any("training on" in s for s in out.get("log", []))), 120)
    time.sleep(1.0)
    chain = GpuRequest.parse("mig:1g.10gb|1").model_dump(mode="json")
    for k in range(4):
        head.request_lease({"lease_id": f"r-{k}", "request": chain, "owner": "it", "priority_class": "inference",
                            "requester_digest": key_digest(KEY)})
    _until("every replica granted", lambda: all(head.get_lease(f"r-{k}")["state"] == "granted" for k in range(4)), 90)
    kinds = sorted(head.get_lease(f"r-{k}")["allocation"]["kind"] for k in range(4))
    assert kinds == ["mig", "mig", "mig", "whole"], kinds
    trainer = head.get_lease("a-train2")
    assert trainer["state"] == "preempted" and any("checkpoint" in h["reason"] for h in trainer["history"]), trainer
    for k in range(4):
        _give_back(head, f"r-{k}")
    t.join(timeout=240)
    assert "error" not in out, out.get("error")
    res = out["result"]
    assert len(res["attempts"]) == 2 and res["attempts"][1]["resumed_at"] > 0
    assert res["step"] == steps and res["digest"] == _reference_digest(steps, seed)
    _give_back_all(head)
