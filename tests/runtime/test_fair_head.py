"""The queue tree on the real head, in-process: who may submit to which queue, leaves only, the tree with its
fair shares in ``status``, and a queue below its fair share reclaiming from one above it at equal priority."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from headless import InProcessHead

from orchestrator.core import credentials as C
from orchestrator.core.config import DEMO_CONFIG, RuntimeSettings, load_config
from orchestrator.core.errors import ConfigError, PermissionDeniedError
from orchestrator.core.lease import key_digest
from orchestrator.core.priorities import SchedulerConfig

ADMIN, ALICE, MALLORY = C.new_key(), C.new_key(), C.new_key()
_SKEW = [0.0]  # seconds the head's clock is ahead of the machine's (past the class's minimum runtime)


def _tree(fair: bool) -> SchedulerConfig:
    base = load_config(DEMO_CONFIG).scheduler.model_dump(mode="json")
    base["queues"] = {"default": {}, "org": {"submitters": [C.user_id(C.digest(ALICE))]},
                      "team-a": {"parent": "org"}, "team-b": {}}
    base["fairness"] = {"enabled": fair, "max_reclaims_per_cycle": 8}
    return SchedulerConfig.model_validate(base)


@pytest.fixture
def head(tmp_path: Path) -> Iterator[InProcessHead]:
    config = load_config(DEMO_CONFIG)
    config = config.model_copy(update={"scheduler": _tree(True)})
    settings = RuntimeSettings(heartbeat_interval_s=0.1, agent_ttl_s=5.0, reconcile_interval_s=0.02,
                               admin_key_sha256=C.digest(ADMIN))
    _SKEW[0] = 0.0
    h = InProcessHead(config, settings=settings, workdir=tmp_path / "head", clock=lambda: time.time() + _SKEW[0])
    yield h
    h.close()


@contextlib.contextmanager
def as_(head: InProcessHead, **creds: str) -> Iterator[None]:
    with C.calling_as(head.service.caller(creds or None)):
        yield


def _ask(lid: str, queue: str, **extra: Any) -> dict[str, Any]:
    return {"lease_id": lid, "request": {"kind": "whole", "count": 1}, "queue": queue,
            "priority_class": "training", **extra}


def test_only_a_queues_submitters_may_submit_to_it_and_only_to_leaves(head: InProcessHead) -> None:
    with as_(head, user=ALICE):
        assert head.service.request_lease(_ask("a-1", "team-a")) == "a-1"
    with as_(head, user=MALLORY), pytest.raises(PermissionDeniedError, match="submitters of queue team-a"):
        head.service.request_lease(_ask("m-1", "team-a"))
    with as_(head, user=MALLORY):
        assert head.service.request_lease(_ask("m-2", "team-b")) == "m-2"  # a queue naming no one: anyone
    with as_(head, admin=ADMIN):
        assert head.service.request_lease(_ask("adm", "team-a")) == "adm"
    with as_(head, user=ALICE), pytest.raises(ConfigError, match="has queues below it"):
        head.service.request_lease(_ask("a-org", "org"))


def test_a_queue_below_its_share_reclaims_from_one_above_at_equal_priority(head: InProcessHead) -> None:
    gpus = int(head.service.ctl.capacity_gpus())
    with as_(head, user=MALLORY):
        for i in range(gpus):
            head.service.request_lease(_ask(f"b-{i}", "team-b", requester_digest=key_digest(MALLORY)))
    # every request granted or considered (the demo cluster's MIG cards hold no whole-card lease), then the
    # granted ones activated by their holder, as a training actor would
    head.wait_for(lambda: all(lease["state"] == "granted" or lease.get("why_pending")
                              for lease in head.service.status()["leases"]), 20, "team-b takes what it can")
    with head.lock, as_(head, user=MALLORY):
        for lease in head.service.status()["leases"]:
            if lease["state"] == "granted":
                settled = head.service.lease_settled(lease["lease_id"], MALLORY)
                head.service.activate_settled(settled, MALLORY, f"holder-{lease['lease_id']}")
    _SKEW[0] = 3600.0  # an hour later: past the training class's minimum runtime
    with as_(head, user=ALICE):
        for i in range(gpus):
            head.service.request_lease(_ask(f"a-{i}", "team-a"))
    head.wait_for(lambda: any(lease["state"] in ("checkpointing", "preempted") or lease.get("revoked")
                              for lease in head.service.status()["leases"] if lease["lease_id"].startswith("b-"))
                  or any(e["lease_id"].startswith("b-") for e in head.service.status()["ended_leases"]),
                  20, "a lease of team-b is preempted for team-a")
    with head.lock:
        rows = {r["queue"]: r for r in head.service.status()["queues"]}
    assert rows["team-b"]["cause"] == "fair.above" and rows["team-a"]["cause"] == "fair.below"
    assert rows["org"]["fair_share_gpus"] == pytest.approx(gpus / 2)
    assert rows["team-b"]["fair_share_gpus"] == pytest.approx(gpus / 2)
