"""The bench's double-use checker (``orchestrator/scenarios/actors.py``) against the real head in process:
a card counts as used twice when a live holder process and another lease, or two live holders, share it."""

from __future__ import annotations

import os
import subprocess
import sys

from orchestrator.core.lease import key_digest
from orchestrator.core.request import GpuRequest
from orchestrator.scenarios.actors import DoubleUseChecker
from tests.headless import InProcessHead


def _granted(head: InProcessHead, lease_id: str, node: str) -> dict:
    head.request_lease({"lease_id": lease_id, "request": GpuRequest.whole(1, node=node).model_dump(mode="json"),
                        "owner": "t", "requester_digest": key_digest("k")})
    return head.wait_lease(lease_id, 10, "k")


def test_a_card_held_by_a_live_process_of_another_lease_is_a_double_use(head: InProcessHead) -> None:
    a = _granted(head, "a", "h100-0")
    uuid = a["allocation"]["gpu_uuids"][0]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    holders: list[tuple[str, int, str]] = [("a", os.getpid(), uuid)]
    checker = DoubleUseChecker(head, lambda: holders)
    checker.sample()
    assert checker.events == [] and checker.samples == 1  # the lease and its own holder: one user
    holders.append(("old", int(dead.stdout), uuid))  # a holder whose process is gone holds nothing
    checker.sample()
    assert checker.events == []
    holders.append(("old", os.getpid(), uuid))  # a live process of another lease on the same card
    checker.sample()
    assert [e["leases"] for e in checker.events] == [["a", "old"]] and checker.events[0]["device"] == uuid
    head.release("a", a["fencing_token"])
    holders[:] = [("x", os.getpid(), uuid), ("y", os.getpid(), uuid)]  # two live holders, no lease at all
    checker.sample()
    assert [e["leases"] for e in checker.events][-1] == ["x", "y"]
