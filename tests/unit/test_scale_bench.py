"""bench/scale.py, short: every lease is granted, activated, renewed and released, and the figures are sane.

No timing is asserted (the machine decides those); what is asserted is the
accounting, which a slower or a faster head must get equally right.
"""

from __future__ import annotations

import json

import pytest

from scalebench import scale

NODES, LEASES = 40, 400


@pytest.fixture(scope="module")
def result() -> dict:
    return scale.run(NODES, LEASES, rate=100.0, hold_s=4.0, seed=3)


def test_every_lease_is_accounted_for(result: dict) -> None:
    assert result["requested"] == result["granted"] == result["activated"] == result["released"] == LEASES
    assert result["fencing_counter"] == LEASES  # one token per grant: nothing granted twice
    assert result["ledger_states"] == {"released": LEASES}
    assert result["not_renewed"] == 0 and result["renewals"] >= LEASES
    assert result["unaccounted"] == 0 and result["lost"] == 0
    assert 0 < result["peak_held"] <= LEASES


def test_the_figures_are_present_and_sane(result: dict) -> None:
    assert (result["nodes"], result["leases"]) == (NODES, LEASES)
    assert 0 < result["cycle_p50_ms"] <= result["cycle_p99_ms"] <= result["cycle_max_ms"]
    assert 0 <= result["cycle_cpu_p50_ms"] <= result["cycle_cpu_p99_ms"]
    # every agent beats once per heartbeat interval: a quarter of them each 0.25 s cycle
    assert result["heartbeats"] == result["cycles"] * NODES // 4
    assert result["heartbeats_per_s"] > 0 and result["heartbeat_mean_us"] > 0
    assert result["heartbeats_per_s"] == pytest.approx(1e6 / result["heartbeat_mean_us"], rel=0.01)
    assert result["rss_mb"] > 0 and result["head_busy_ratio"] > 0
    assert result["load"]["simulated_s"] >= LEASES / 100.0


def test_main_prints_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert scale.main(["--nodes", "8", "--leases", "40", "--rate", "40", "--hold", "3", "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    d = json.loads(out[0])
    for k in ("nodes", "leases", "cycle_p50_ms", "cycle_p99_ms", "heartbeats_per_s", "rss_mb"):
        assert k in d
    assert d["released"] == 40 and d["unaccounted"] == 0
