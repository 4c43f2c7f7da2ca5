"""The sharing schemes compared on the hand-made openb_tiny trace (its README derives the placements)."""

from __future__ import annotations

import json
import subprocess
import sys

from orchestrator.core import datafiles
from orchestrator.core.request import Isolation, ShareKind
from orchestrator.sim.schemes import SCHEMES, compare_schemes, scheme_request

TINY = datafiles.openb_sample()[0].parent


def test_each_scheme_asks_for_a_sharing_pod_its_own_way() -> None:
    share = (2000, 4096, 1, 400, ())
    assert scheme_request("whole", *share).kind is ShareKind.WHOLE
    assert scheme_request("timeslice", *share).kind is ShareKind.TIMESLICE
    assert scheme_request("mps", *share).sm_percent == 40
    assert scheme_request("mig", *share).isolation is Isolation.HARD
    assert scheme_request("adaptive", *share).isolation is Isolation.NONE
    for s, _ in SCHEMES:  # whole-card and CPU-only pods are the same under every scheme
        assert scheme_request(s, 8000, 4096, 2, 1000, ()).count == 2


def test_whole_cards_serve_less_and_occupy_more_than_sharing() -> None:
    out = compare_schemes(TINY / "nodes.csv", TINY / "pods.csv", target_pct=130)
    rows = {r["scheme"]: r for r in out["schemes"]}
    assert list(rows) == [s for s, _ in SCHEMES]
    # Pod 5 (0.4 GPU) shares pod 3's P100 under time-slicing and ours; as a whole card it no longer fits.
    assert rows["adaptive"]["placed"] == rows["timeslice"]["placed"] == 4
    assert rows["whole"]["placed"] == 3 and rows["whole"]["served_pct"] == 48.0
    assert rows["whole"]["occupied_pct"] == 60.0 and rows["adaptive"]["served_pct"] == 60.0
    # No MIG-capable card in openb: hard isolation lands on whole cards, and says so.
    assert set(rows["mig"]["by_kind"]) == {"whole"}
    assert rows["adaptive"]["by_kind"] == {"timeslice": 2, "whole": 1}


def test_the_command_prints_one_json_object() -> None:
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "sim", "schemes", "--nodes",
                          str(TINY / "nodes.csv"), "--pods", str(TINY / "pods.csv"), "--target-pct", "130"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert [r["scheme"] for r in json.loads(out.stdout)["schemes"]] == [s for s, _ in SCHEMES]
    bad = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "sim", "schemes", "--nodes",
                          str(TINY / "nodes.csv"), "--pods", str(TINY / "pods.csv"), "--policy", "nope"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "policy" in bad.stderr
