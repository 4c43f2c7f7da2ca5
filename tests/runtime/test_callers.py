"""Who may call what (issue #38 items 1, 2 and 4), on the real head in-process.

Each call here is made as a transport would carry it: the caller's credentials turned into a principal by the
head (``HeadService.caller``) and the call carried out as that principal (``credentials.calling_as``). Three
callers: the administrator (the key whose digest the head was given), ``alice`` and ``mallory`` (two user keys),
an anonymous caller (no key), and each node's agent (the key the head made when it started it).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from headless import InProcessHead

from orchestrator.core import credentials as C
from orchestrator.core.api import CALLERS, HEAD_METHODS, Caller
from orchestrator.core.config import RuntimeSettings
from orchestrator.core.errors import InvalidRequestError, PermissionDeniedError, StaleFencingTokenError
from orchestrator.core.lease import key_digest

ADMIN, ALICE, MALLORY = C.new_key(), C.new_key(), C.new_key()


_SKEW = [0.0]  # seconds the head's clock is ahead of the machine's (past a class's minimum runtime)


@pytest.fixture
def head(tmp_path: Path) -> Iterator[InProcessHead]:
    settings = RuntimeSettings(heartbeat_interval_s=0.1, agent_ttl_s=5.0, reconcile_interval_s=0.02,
                               admin_key_sha256=C.digest(ADMIN))
    _SKEW[0] = 0.0
    h = InProcessHead(settings=settings, workdir=tmp_path / "head", clock=lambda: time.time() + _SKEW[0])
    yield h
    h.close()


@contextlib.contextmanager
def as_(head: InProcessHead, **creds: str) -> Iterator[None]:
    """Calls inside are made with ``creds`` (``user=``, ``admin=``, ``agent=`` with ``node=``)."""
    with C.calling_as(head.service.caller(creds or None)):
        yield


def _agent(head: InProcessHead, node: str) -> dict[str, str]:
    return {"agent": head.cluster.agent_keys[node], "node": node}


def test_every_method_says_who_may_call_it() -> None:
    assert set(CALLERS) == set(HEAD_METHODS)


#: Arguments good enough to reach the identity check of every administrator's and agent's method.
_ARGS: dict[str, tuple[Any, ...]] = {
    "report_inventory_check": ({"nodes": [], "disagreements": []},),
    "repartition_mig": ("inference", True),
    "set_day_clock": ({"speedup": 720, "start": "06:00"},),
    "announce_dashboard": ("http://127.0.0.1:8265/",),
    "register_agent": ("a100-0", "n", "inc", {}),
    "heartbeat": ("a100-0", "inc"),
    "update_inventory": ("a100-0", "inc", {}),
}


@pytest.mark.parametrize("name", sorted(n for n, c in CALLERS.items() if c in (Caller.ADMIN, Caller.AGENT)))
def test_administrators_and_agents_methods_refuse_everyone_else(head: InProcessHead, name: str) -> None:
    for creds in ({}, {"user": MALLORY}, *([{"admin": ADMIN}] if CALLERS[name] is Caller.AGENT else []),
                  *([_agent(head, "a100-1")] if CALLERS[name] is Caller.AGENT else [_agent(head, "a100-0")])):
        with as_(head, **creds), pytest.raises(PermissionDeniedError) as e:
            getattr(head.service, name)(*_ARGS[name])
        assert e.value.method == name


@pytest.mark.parametrize("name", sorted(n for n, c in CALLERS.items() if c is Caller.ADMIN))
def test_an_administrator_passes_the_check(head: InProcessHead, name: str) -> None:
    with as_(head, admin=ADMIN):
        try:
            getattr(head.service, name)(*_ARGS[name])
        except PermissionDeniedError:
            pytest.fail(f"an administrator was refused {name}")
        except Exception:  # noqa: BLE001 - what the call itself says of these arguments is not this test's
            pass


def test_a_wrong_administrator_or_agent_key_proves_nothing(head: InProcessHead) -> None:
    """A key that matches nothing counts as no key (an administrator key of another cluster must not make every
    call fail), so the methods it would open are refused, saying nothing of the right key."""
    for creds in ({"admin": MALLORY}, {"agent": MALLORY, "node": "a100-0"},
                  {"agent": head.cluster.agent_keys["a100-0"], "node": "a100-1"}):
        who = head.service.caller(creds)
        assert not who.admin and who.node is None
        with as_(head, **creds), pytest.raises(PermissionDeniedError) as e:
            head.service.set_day_clock({"speedup": 720}) if "admin" in creds else \
                head.service.heartbeat(creds["node"], "inc")
        assert not any(k in str(e.value.to_dict()) for k in (ADMIN, *head.cluster.agent_keys.values()))
    with pytest.raises(InvalidRequestError) as e:
        head.service.caller({"admin": 5})
    assert e.value.field == "_caller.admin"


def test_an_agent_speaks_only_for_its_own_node(head: InProcessHead) -> None:
    """A heartbeat's ``rejected``/``checkpointed``/``mig_uuids`` acted on any lease id: the agent of a100-1 could
    have another node's lease lost (``rejected``) or checkpointed. Now they act only on the node's own leases."""
    head.request_lease({"lease_id": "mine", "request": {"kind": "whole", "count": 1, "node": "h100-0"},
                        "requester_digest": key_digest("k")})
    assert head.wait_lease("mine", 5, "k")["state"] == "granted"
    rec = head.service.ctl.nodes.get("a100-1")
    with as_(head, **_agent(head, "a100-1")):
        head.service.heartbeat("a100-1", rec.incarnation, [], rejected={"mine": "stolen"},
                               checkpointed={"mine": "/evil"}, mig_uuids={"mine": "MIG-evil"})
    d = head.get_lease("mine", "k")
    assert d["state"] == "granted" and "MIG-evil" not in str(d)


def _lease(head: InProcessHead, lid: str, state: str) -> int | None:
    """A lease of ``alice``'s key in ``state`` (pending, granted, active or checkpointing); its token."""
    if state == "pending":  # more whole H100s than the node has: it waits
        for i in range(2):
            head.request_lease({"lease_id": f"hog-{i}", "request": {"kind": "whole", "count": 1, "node": "h100-0"},
                                "requester_digest": key_digest("hog"), "priority_class": "inference"})
            head.wait_lease(f"hog-{i}", 5, "hog")
    cls = "training" if state == "checkpointing" else "batch"
    head.request_lease({"lease_id": lid, "request": {"kind": "whole", "count": 2 if state == "checkpointing" else 1,
                                                     "node": "h100-0"},
                        "requester_digest": key_digest(ALICE), "priority_class": cls, "checkpoint_dir": "/ck"})
    if state == "pending":
        assert head.get_lease(lid)["state"] == "pending"
        return None
    token = head.wait_lease(lid, 5, ALICE)["fencing_token"]
    if state in ("active", "checkpointing"):
        head.activate(lid, token, None, None, ALICE)
    if state == "checkpointing":
        _SKEW[0] += 60.0  # past training's minimum runtime (a jump the head reads as its own stall: no node is lost)
        head.request_lease({"lease_id": "preemptor", "request": {"kind": "whole", "count": 2, "node": "h100-0"},
                            "priority_class": "inference", "requester_digest": key_digest("p")})
        head.wait_for(lambda: head.service.ctl.ledger.get(lid).lease.state.value == "checkpointing", 10,
                      "the training lease asked to checkpoint")
    assert head.get_lease(lid)["state"] == state
    return token


@pytest.mark.parametrize("state", ["pending", "granted", "active", "checkpointing"])
def test_a_wrong_or_missing_key_is_refused_for_release_activate_and_acknowledge_in_every_state(
        head: InProcessHead, state: str) -> None:
    token = _lease(head, "l", state)
    t = token if token is not None else 1
    calls = {"release": lambda key: head.service.release("l", token, "stolen", key),
             "activate": lambda key: head.service.activate("l", t, None, None, key),
             "ack_preemption": lambda key: head.service.ack_preemption("l", t, "/evil", key)}
    for name, call in calls.items():
        for who in ({"user": MALLORY}, {"admin": ADMIN}, {}):  # not even an administrator: the key is the lease's
            for key in (None, MALLORY, "k"):
                with as_(head, **who), pytest.raises(PermissionDeniedError) as e:
                    call(key)
                assert e.value.method == name and e.value.target == "l"
    assert head.get_lease("l")["state"] == state  # nothing of it changed
    with as_(head, user=MALLORY):  # the requester's key, from any caller it was handed to, is what counts
        if state == "checkpointing":
            assert head.service.ack_preemption("l", t, "/ck/l", ALICE)["state"] == "preempted"
        else:
            assert head.service.release("l", token, "done", ALICE)["state"] == "released"


def test_the_right_key_with_a_stale_token_is_still_refused(head: InProcessHead) -> None:
    token = _lease(head, "l", "active")
    with as_(head, user=ALICE), pytest.raises(StaleFencingTokenError):
        head.service.release("l", token ^ 1, "stale", ALICE)
    assert head.get_lease("l")["state"] == "active"


def _job(head: InProcessHead) -> str:
    with as_(head, user=ALICE):
        return str(head.service.submit_job({"name": "alices", "entrypoint": "sleep 30", "gpu": {"kind": "whole", "count": 1}},
                                           "alices-1")["job_id"])


def test_only_a_jobs_owner_or_an_administrator_cancels_it_or_reads_its_logs(head: InProcessHead) -> None:
    jid = _job(head)
    assert head.get_job(jid)["owner"] == C.user_id(C.digest(ALICE))
    for who in ({"user": MALLORY}, {}):
        for call in (lambda: head.service.cancel_job(jid), lambda: head.service.job_logs(jid),
                     lambda: head.service.job_log_source(jid)):
            with as_(head, **who), pytest.raises(PermissionDeniedError):
                call()
    assert head.get_job(jid)["state"] != "cancelled"
    with as_(head, user=ALICE):
        head.service.job_logs(jid)
    with as_(head, admin=ADMIN):
        assert head.service.cancel_job(jid)["state"] == "cancelled"


def test_a_job_id_taken_by_another_user_is_not_theirs_to_resubmit(head: InProcessHead) -> None:
    jid = _job(head)
    with as_(head, user=MALLORY), pytest.raises(InvalidRequestError) as e:
        head.service.submit_job({"name": "alices", "entrypoint": "sleep 30", "gpu": {"kind": "whole", "count": 1}}, jid)
    assert e.value.field == "job_id"


def test_a_checkpoint_is_acknowledged_only_by_the_job_while_it_holds_devices(head: InProcessHead) -> None:
    """The job's checkpoint path becomes what its next attempt resumes from: while it held no devices anyone
    could name it (no token was asked), and a wrong token is refused whatever the state."""
    for i in range(2):  # both H100s taken: the job stays queued
        head.request_lease({"lease_id": f"hog-{i}", "request": {"kind": "whole", "count": 1, "node": "h100-0"},
                            "requester_digest": key_digest("hog"), "priority_class": "inference"})
    with as_(head, user=ALICE):
        jid = head.service.submit_job({"name": "q", "entrypoint": "sleep 30",
                                       "gpu": {"kind": "whole", "count": 2, "node": "h100-0"}}, "q-1")["job_id"]
    assert head.get_job(jid)["state"] == "queued"
    for token in (None, 0, 12345):
        with as_(head, user=MALLORY), pytest.raises((PermissionDeniedError, StaleFencingTokenError)):
            head.service.job_ack_checkpoint(jid, "/evil", 1, token)
    assert head.get_job(jid)["resume_from"] is None and jid not in head.service.jobs._acks
