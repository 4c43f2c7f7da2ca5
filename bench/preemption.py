"""Preemption benchmark on a real local Ray cluster (prints figures; not a test).

Runs the scenario of ``orchestrator demo`` (``orchestrator/scenarios/preemption.py``) with
``--rounds`` inference arrivals, twice on fresh clusters:

* ``orchestrator``: training is asked to checkpoint, yields, resumes;
* ``kubernetes``: the same jobs are killed without notice and restart from
  their last periodic checkpoint (every ``--checkpoint-every`` steps), as a
  pod evicted by kube-scheduler's preemption would.

Prints one JSON object: the orchestrator's figures at the top level
(``preemptions``, ``decision_to_grant_p50_s``, ``decision_to_grant_p99_s``,
``orchestration_overhead_p99_s``, ``checkpoint_s_median``, ``work_lost_steps``,
``resumed_bit_identical``) and both runs under ``orchestrator`` and
``kubernetes``.

    .venv/bin/python bench/preemption.py --rounds 20 --json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ORCHESTRATOR = str(Path(sys.executable).parent / "orchestrator")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--step-delay", type=float, default=0.05)
    p.add_argument("--modes", default="orchestrator,kubernetes")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    out: dict = {}
    t0 = time.monotonic()
    for mode in a.modes.split(","):
        # One process per run: each starts and stops its own cluster, and Ray's client state does not carry over.
        print(f"[{time.monotonic() - t0:7.1f}s] {mode}: {a.rounds} rounds", file=sys.stderr, flush=True)
        proc = subprocess.run([ORCHESTRATOR, "demo", "--json", "--mode", mode, "--rounds", str(a.rounds),
                               "--steps", str(a.steps), "--step-delay", str(a.step_delay)],
                              stdout=subprocess.PIPE, text=True, check=False)
        if proc.returncode not in (0, 1):
            print(f"{mode}: orchestrator demo exited {proc.returncode}", file=sys.stderr)
            return proc.returncode
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    top = dict(out.get("orchestrator", {}))
    top.update(out)
    print(json.dumps(top) if a.json else json.dumps(top, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
