"""Which workload the agent may stop for a lease (#38 item 3): only one that holds the lease's devices as Ray
records it. Pure (``control.agent.workload_holds_lease``)."""

from __future__ import annotations

import json

from orchestrator.control.agent import workload_holds_lease
from orchestrator.core import env as E


def test_a_workload_holds_a_lease_only_by_its_hand_out_or_its_group() -> None:
    own = {E.LEASE_ID: "l-1", "OTHER": "x"}
    assert workload_holds_lease("l-1", env_vars=own, placement_group=None, lease_groups=())
    assert not workload_holds_lease("l-2", env_vars=own, placement_group=None, lease_groups=())  # another lease's
    assert workload_holds_lease("l-1", env_vars={}, placement_group="ab12", lease_groups={"ab12"})
    assert not workload_holds_lease("l-1", env_vars={}, placement_group="ab12", lease_groups={"cd34"})
    assert not workload_holds_lease("l-1", env_vars=None, placement_group=None, lease_groups={"ab12"})  # nothing
    gang = {E.GANG: json.dumps([{"env_vars": {E.LEASE_ID: "g.w0"}}, {"env_vars": {E.LEASE_ID: "g.w1"}}])}
    assert workload_holds_lease("g.w1", env_vars=gang, placement_group=None, lease_groups=())
    assert not workload_holds_lease("g.w2", env_vars=gang, placement_group=None, lease_groups=())
    assert not workload_holds_lease("l-1", env_vars={E.GANG: "not json"}, placement_group=None, lease_groups=())
