"""The head service in-process: one failing cycle never stops the head; the API edge validates once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from headless import InProcessHead

from orchestrator.control.jobs import run_due
from orchestrator.core.config import RuntimeSettings
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.lease import key_digest


def test_a_failing_cycle_is_logged_and_the_next_one_runs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    head = InProcessHead(workdir=tmp_path)
    try:
        calls = {"n": 0}
        real = head.cluster.alive_nodes

        def flaky():  # the GCS node table unreadable once, as during a GCS restart
            calls["n"] += 1
            if calls["n"] == 1:
                raise ConnectionError("GCS unavailable")
            return real()

        with head.lock:
            head.cluster.alive_nodes = flaky  # type: ignore[method-assign]
            head.service._nodes_read_at = float("-inf")  # read the table on the next cycle
            assert head.service.cycle_safely() is None
            assert head.service.cycle_safely() is not None
        assert "reconcile cycle failed" in caplog.text and "GCS unavailable" in caplog.text
        head.request_lease({"lease_id": "after", "request": "1"})
        assert head.wait_lease("after", 5)["state"] == "granted"  # the loop kept going
    finally:
        head.close()


def test_bad_input_at_the_edge_is_a_typed_error_and_the_head_keeps_every_lease(tmp_path: Path) -> None:
    head = InProcessHead(workdir=tmp_path)
    try:
        head.request_lease({"lease_id": "keep", "request": "1", "requester_digest": key_digest("k")})
        granted = head.wait_lease("keep", 5, "k")
        bad = [("submit_job", ({"name": "x", "entrypoint": "true", "gpu": {"kind": "whole", "count": -1}}, None), "gpu"),
               ("submit_job", ({"name": "Bad Name", "entrypoint": "true"}, None), "name"),
               ("request_lease", ({"lease_id": "a b", "request": "1"},), "lease_request.lease_id"),
               ("request_lease", ({"lease_id": "x", "request": "mps:300%"},), "sm_percent")]
        for method, args, field in bad:
            with pytest.raises(InvalidRequestError) as e:
                getattr(head, method)(*args)
            assert field in e.value.field, (method, e.value.field)
        assert head.get_lease("keep", "k")["fencing_token"] == granted["fencing_token"] > 0
        assert head.get_lease("keep")["fencing_token"] is None and head.get_lease("keep", "guess")["fencing_token"] is None
        assert head.get_lease("keep")["state"] == "granted"
    finally:
        head.close()


def test_a_request_alone_in_the_queue_is_granted_in_the_call_that_brought_it(tmp_path: Path) -> None:
    # Issue #18 item 4: the fast grant path. Under the lock the background cycle cannot run in between.
    head = InProcessHead(workdir=tmp_path)
    try:
        with head.lock:
            svc = head.service
            svc.request_lease({"lease_id": "alone", "request": "1"})
            assert svc.grant_now().granted == ["alone"]
            assert svc.get_lease("alone")["state"] == "granted"
            # Two waiting: left to the next cycle, which plans them together (one plan, not one per request).
            svc.request_lease({"lease_id": "b1", "request": "1"})
            svc.request_lease({"lease_id": "b2", "request": "1"})
            assert svc.grant_now().granted == []
            assert sorted(svc.cycle().granted) == ["b1", "b2"]
    finally:
        head.close()


def test_a_failing_fast_grant_path_leaves_the_request_queued_for_the_cycle_not_an_error(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The head actor's waiting acquire caught a fast-path failure; submit_job and acquire_lease_now did not, so
    # their caller got an error for a job (or lease) that had been queued. The service's fast path catches it.
    head = InProcessHead(workdir=tmp_path)
    try:
        with head.lock:
            svc = head.service
            real = svc.ctl.schedule_now

            def broken():  # a fault in the plan, once
                svc.ctl.schedule_now = real  # type: ignore[method-assign]
                raise RuntimeError("plan failed")

            svc.ctl.schedule_now = broken  # type: ignore[method-assign]
            d = svc.submit_job({"name": "j", "entrypoint": "true", "gpu": {"kind": "whole", "count": 1}})
            assert d["state"] == "queued" and "fast grant path failed" in caplog.text
            svc.cycle()
            assert svc.get_job(d["job_id"])["state"] in ("admitted", "running")
    finally:
        head.close()


def test_acquire_lease_queues_grants_and_activates_with_the_holder_in_one_call(tmp_path: Path) -> None:
    head = InProcessHead(workdir=tmp_path)
    try:
        got = head.acquire_lease({"lease_id": "one", "request": "1", "requester_digest": key_digest("k")}, 5.0, "k",
                                 "holder-actor")
        assert got["state"] == "active" and got["holder"] == "holder-actor" and got["fencing_token"] >= 1
        assert head.methods() == ["acquire_lease"]
        # Without the requester's key the holder cannot activate it: granted, token redacted.
        other = head.acquire_lease({"lease_id": "two", "request": "1", "requester_digest": key_digest("k")}, 5.0,
                                   "guess", "holder-actor")
        assert other["state"] == "granted" and other["fencing_token"] is None
        # The holder's death frees what it activated (fate sharing, one holder for many leases).
        head.kill_holder("holder-actor")
        head.wait_for(lambda: head.service.get_lease("one")["state"] == "lost", 5, "the holder's lease lost")
    finally:
        head.close()


def test_acquire_lease_now_grants_and_activates_what_fits_and_leaves_the_rest_queued(tmp_path: Path) -> None:
    head = InProcessHead(workdir=tmp_path)
    try:
        with head.lock:  # no background cycle in between: whatever is granted is granted in the call
            svc = head.service
            got = svc.acquire_lease_now({"lease_id": "now", "request": "4", "requester_digest": key_digest("k")},
                                        "k", "holder-actor")
            assert got["state"] == "active" and got["holder"] == "holder-actor" and got["fencing_token"] >= 1
            # a retry is the same lease, not a second one
            again = svc.acquire_lease_now({"lease_id": "now", "request": "4", "requester_digest": key_digest("k")},
                                          "k", "holder-actor")
            assert again["lease_id"] == "now" and again["fencing_token"] == got["fencing_token"]
            # a100-0's four cards are taken: the next asks for four waits, queued, and says why
            wait = svc.acquire_lease_now({"lease_id": "later", "request": "4", "requester_digest": key_digest("k")},
                                         "k", "holder-actor")
            assert wait["state"] == "pending" and wait["why_pending"]
            svc.release("now", got["fencing_token"])
            assert svc.cycle().granted == ["later"]
            assert svc.get_lease("later")["state"] == "granted"  # activated by whoever waited for it
    finally:
        head.close()


def test_calls_begun_together_are_planned_once_in_priority_order_and_each_answered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The head's call_many begins a client's submissions one by one and plans what they queued once: one plan for
    # the batch (not one per submission), in the scheduler's order, each call answered from it.
    from orchestrator.control.controller import HeadController
    from orchestrator.control.service import HeadService

    plans: list[int] = []
    real_plan = HeadController._plan

    def counted(self: HeadController, pending: Any, now: float) -> Any:
        plans.append(len(pending))
        return real_plan(self, pending, now)

    monkeypatch.setattr(HeadController, "_plan", counted)
    both = {"kind": "whole", "count": 2, "models": ["H100-80GB"]}  # all of h100-0: one of them fits
    head = InProcessHead(workdir=tmp_path)
    try:
        with head.lock:  # no background cycle in between
            svc = head.service
            calls = [("submit_job", [{"name": "low", "entrypoint": "true", "gpu": both, "priority": "batch"}, "low-1"]),
                     ("acquire_lease_now", [{"lease_id": "small", "request": "timeslice:0.25",
                                             "requester_digest": key_digest("k")}, "k", "holder-actor"]),
                     ("submit_job", [{"name": "high", "entrypoint": "true", "gpu": both, "priority": "inference"},
                                     "high-1"])]
            begun = [svc.begin(name, args, {}) for name, args in calls]
            assert plans == [] and [b.queued for b in begun] == [True, True, True]
            assert svc.get_job("low-1")["state"] == "queued"  # begun: queued, not yet planned
            report = svc.plan_begun(begun)
            assert plans == [3]  # one plan over the three requests
            low, small, high = (b.finish(report) for b in begun)
            assert high["state"] in ("admitted", "running") and low["state"] == "queued", (high, low)
            assert low["lease"]["why_pending"]  # the plan said why it waits
            assert small["state"] == "active" and small["holder"] == "holder-actor" and small["fencing_token"]
            # A known job begun again queues nothing; a refusal is raised by begin, naming its field; only the
            # planned calls may be begun.
            assert not svc.begin("submit_job", calls[2][1], {}).queued
            with pytest.raises(InvalidRequestError) as e:
                svc.begin("submit_job", [{"name": "x", "entrypoint": "true", "gpu": {"kind": "timeslice",
                                                                                     "fraction": 7}}], {})
            assert "fraction" in e.value.field
            with pytest.raises(InvalidRequestError) as e:
                svc.begin("release", ["small"], {})
            assert e.value.field == "method" and "submit_job" in str(e.value)
            assert HeadService.PLANNED == {"submit_job", "acquire_lease_now"}
    finally:
        head.close()


def test_a_job_submitted_to_an_idle_queue_is_admitted_in_the_submit_call(tmp_path: Path) -> None:
    head = InProcessHead(workdir=tmp_path)
    try:
        with head.lock:  # no background cycle in between: the submit call itself admits it
            d = head.service.submit_job({"name": "quick", "entrypoint": "true", "gpu": {"kind": "timeslice", "fraction": 0.25}})
            assert d["state"] == "admitted" and [h["state"] for h in d["history"]] == ["queued", "admitted"]
            run_due(head.service)  # and the head's hand-out, next (the actor's once the reply's batch is durable), starts it
            d = head.service.get_job(d["job_id"])
        assert d["state"] == "running" and [h["state"] for h in d["history"]][:2] == ["queued", "admitted"]
    finally:
        head.close()


def test_the_admission_only_runner_runs_nothing_and_each_job_succeeds_once() -> None:
    from orchestrator.control.jobs import AdmissionOnlyRunner

    r = AdmissionOnlyRunner()
    assert r.status("a.a1") is None
    r.submit("a.a1", "true", {}, {}, {}, {})
    r.submit("a.a1", "true", {}, {}, {}, {})  # idempotent per id, as JobRunner.submit says
    assert r.status_many(["a.a1", "b.a1"]) == {"a.a1": "SUCCEEDED", "b.a1": None}


def test_ended_jobs_leave_with_their_leases_in_the_controllers_prune_pass(tmp_path: Path) -> None:
    class Clock:
        t = 1000.0

        def __call__(self) -> float:
            return self.t

    clock = Clock()
    settings = RuntimeSettings(heartbeat_interval_s=0.1, agent_ttl_s=5.0, reconcile_interval_s=0.02,
                               ended_retention_s=60.0)
    head = InProcessHead(settings=settings, workdir=tmp_path, clock=clock)
    try:
        with head.lock:
            d = head.service.submit_job({"name": "short", "entrypoint": "true",
                                         "gpu": {"kind": "timeslice", "fraction": 0.25}})
        job, lease = d["job_id"], d["lease_id"]
        head.wait_for(lambda: head.service.get_job(job)["state"] == "succeeded", 30, "the job ended")

        def held() -> tuple[bool, bool]:
            return (job in {j["job_id"] for j in head.service.list_jobs()},
                    lease in head.service.ctl.ledger.entries)

        with head.lock:
            clock.t += 30  # within the retention: the next passes keep both
        head.wait_for(lambda: head.service.ctl._last_prune >= clock.t, 5, "a prune pass")  # noqa: SLF001
        with head.lock:
            assert held() == (True, True)
            clock.t += 41  # past it, and past the 10 s between passes
        head.wait_for(lambda: held() == (False, False), 5, "the job and its lease dropped in one pass")
    finally:
        head.close()


def test_only_a_cluster_local_dashboard_is_announced(tmp_path: Path) -> None:
    # issue #38: announce_dashboard published any URL in `status`, which every user reads: a link out of the cluster
    from orchestrator.control.service import cluster_local_url

    head = InProcessHead(workdir=tmp_path)
    try:
        for bad in ("http://evil.example.com/", "https://8.8.8.8:443/", "http://user:pw@127.0.0.1:80/",
                    "http://127.0.0.1:notaport/", "ftp://127.0.0.1/"):
            with pytest.raises(InvalidRequestError) as e:
                head.announce_dashboard(bad)
            assert e.value.field == "url", bad
        assert head.announce_dashboard("http://127.0.0.1:8265/")["dashboard_url"] == "http://127.0.0.1:8265/"
        assert head.service._dashboard[0] == "http://127.0.0.1:8265/"  # the only one it ever took
    finally:
        head.close()
    assert all(cluster_local_url(u) for u in ("http://10.0.3.4:8080/", "http://localhost:1/",
                                              "http://rgo-dashboard.rgo.svc:8080/", "http://[::1]:9/"))
