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

``--holder actor`` runs training as Ray actors holding SDK leases
(``orchestrator/scenarios/actors.py``; the orchestrator run only): the
agent asks the victim actor to checkpoint and stops it. ``--victim rogue``
makes the training actors ignore the request, so every victim is stopped by
its agent at the grace deadline (``--grace``, default 3 s). The figures then
also carry ``holder``, ``victim``, ``revoked``, ``revoke_after_grace_p99_s``
and ``double_use_events`` (see that module).

``--holder gang`` runs a Ray Train ``TorchTrainer`` on a ``2x2`` gang lease across two nodes
(``orchestrator/scenarios/gang.py``; the orchestrator run only): the whole gang is one victim,
checkpoints through Ray Train and resumes from that ``Checkpoint``; the figures also carry
``trainer_start_s_median`` and ``moved_nodes``.

    .venv/bin/python bench/preemption.py --rounds 20 --json
    .venv/bin/python bench/preemption.py --holder actor --victim cooperative --rounds 20 --json
    .venv/bin/python bench/preemption.py --holder actor --victim rogue --rounds 10 --json
    .venv/bin/python bench/preemption.py --holder gang --rounds 5 --json

SIGINT, SIGTERM and SIGHUP go on to the running demo, which stops its cluster (and, should it die trying,
its watchdog does: docs/signals.md); the demo also gets SIGTERM if the bench is SIGKILLed.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time

from orchestrator.deploy.watchdog import die_with_parent  # SIGTERM to the demo when the bench dies

#: The demo runs on this interpreter and this checkout's code (PYTHONPATH), as the bench does.
ORCHESTRATOR = [sys.executable, "-m", "orchestrator.cli.main"]


def _run_demo(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run one demo; SIGINT, SIGTERM and SIGHUP to the bench go to it, and the bench waits for its clean-up."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
    got: list[int] = []

    def forward(signum: int, frame: object) -> None:
        got.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)

    old = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        out, _ = proc.communicate()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if got:
        print(f"stopped by {signal.Signals(got[0]).name}; the demo stopped what it started", file=sys.stderr)
        sys.exit(128 + got[0])
    return subprocess.CompletedProcess(argv, proc.returncode, out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--steps", type=int, default=None,
                   help="training steps per job, default 5000; actors: steps after the last round, default 300")
    p.add_argument("--step-delay", type=float, default=None, help="default 0.05 s (jobs), 0.01 s (actors)")
    p.add_argument("--modes", default=None, help="default: orchestrator,kubernetes for jobs, orchestrator for actors")
    p.add_argument("--holder", choices=("job", "actor", "gang"), default="job")
    p.add_argument("--victim", choices=("cooperative", "rogue"), default="cooperative")
    p.add_argument("--grace", type=float, default=None, help="training's grace period, s (actor default 3)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.victim == "rogue" and a.holder != "actor":
        p.error("--victim rogue needs --holder actor")
    # actors: training is open-ended while the rounds go on, then every run trains --steps more
    a.steps = a.steps or {"actor": 300, "gang": 200}.get(a.holder, 5000)
    a.step_delay = a.step_delay if a.step_delay is not None else {"actor": 0.01, "gang": 0.02}.get(a.holder, 0.05)
    a.modes = a.modes or ("orchestrator" if a.holder != "job" else "orchestrator,kubernetes")
    extra = ["--holder", a.holder, "--victim", a.victim]
    grace = a.grace if a.grace is not None else (3.0 if a.holder == "actor" else None)
    if grace is not None:
        extra += ["--grace", str(grace)]
    out: dict = {}
    t0 = time.monotonic()
    for mode in a.modes.split(","):
        # One process per run: each starts and stops its own cluster, and Ray's client state does not carry over.
        print(f"[{time.monotonic() - t0:7.1f}s] {mode}: {a.rounds} rounds", file=sys.stderr, flush=True)
        proc = _run_demo([*ORCHESTRATOR, "demo", "--json", "--mode", mode, "--rounds", str(a.rounds),
                          "--steps", str(a.steps), "--step-delay", str(a.step_delay), *extra])
        if proc.returncode not in (0, 1):
            print(f"{mode}: orchestrator demo exited {proc.returncode}", file=sys.stderr)
            return proc.returncode
        lines = proc.stdout.strip().splitlines()
        if not lines:
            print(f"{mode}: orchestrator demo printed no figures (exit {proc.returncode}); its log is above",
                  file=sys.stderr)
            return proc.returncode or 1
        out[mode] = json.loads(lines[-1])
    top = {"holder": a.holder, "victim": a.victim, **out.get("orchestrator", {})}
    top.update(out)
    print(json.dumps(top) if a.json else json.dumps(top, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
