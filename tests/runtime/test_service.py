"""The head service in-process: one failing cycle never stops the head; the API edge validates once."""

from __future__ import annotations

from pathlib import Path

import pytest
from headless import InProcessHead

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
        assert head.get_lease("keep", "k")["fencing_token"] == granted["fencing_token"] == 1
        assert head.get_lease("keep")["fencing_token"] is None and head.get_lease("keep", "guess")["fencing_token"] is None
        assert head.get_lease("keep")["state"] == "granted"
    finally:
        head.close()
