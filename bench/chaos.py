"""Chaos on a real local Ray cluster: seeded faults and load, and after every step the invariants.

Starts the demo cluster (``configs/cluster.demo.yaml``: raylets a100-0 -- the Ray head node -- a100-1 and
h100-0) with the project's own launcher (``deploy.local.up_local``) in a state directory of its own, and
runs for ``--minutes`` a sequence drawn from ``random.Random(--seed)`` of:

* SDK lease requests (``orchestrator.lease()``, a mix of whole cards, MPS, time-slices and MIG; withdrawn
  when not granted within 3 s) and releases;
* job submissions (a Ray job that sleeps, on a lease the head's job layer holds) and cancellations;
* load spikes: a burst of 5-12 raw ``request_lease`` calls at once, released a few steps later;
* SIGKILLs, one every ``--kill-every-s`` seconds: the head actor's worker process (Ray restarts it; it restores from the GCS), an agent's worker
  process (the head notices within its TTL and starts another), and a worker node's ``raylet`` (``ray start
  --block`` then stops that node; the bench starts it again with ``deploy.local.restart_worker``).

After every step it reads the head's ``status`` and each agent's held leases and checks them with
``orchestrator/control/invariants.py``: no double grant (at once), ledger and agents agree (once
reconciliation settles: retried until ``--settle-s``, longer after a kill, when it also waits for every
node's agent to register), fencing only grows, no lease lost. Prints one JSON object last: ``operations``,
``kills`` (and ``kills_by_kind``), ``leases_lost``, ``double_grants``, ``invariant_violations`` (the last
three must be 0), ``ended_by_faults`` (leases ended *lost* on a node a kill hit: expected), recovery
figures and the first violations.

    .venv/bin/python bench/chaos.py --minutes 10 --seed 1 --json

Stops exactly what it started: its own ``down`` on exit, SIGINT, SIGTERM and SIGHUP; the cluster's
watchdog if the bench is SIGKILLed (docs/signals.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's orchestrator, not another install's

from orchestrator.control.invariants import History, Violation, disagreements, double_grants, observation
from orchestrator.core.config import DEMO_CONFIG, ClusterConfig, load_config
from orchestrator.core.errors import OrchestratorError, UnknownObjectError
from orchestrator.core.job import JobSpec
from orchestrator.core.jsonout import stdout_to_stderr
from orchestrator.core.lease import key_digest
from orchestrator.core.request import GpuRequest
from orchestrator.core.statefile import State
from orchestrator.deploy.local import down, restart_worker, session_members, up_local
from orchestrator.sdk.leases import lease

#: What the SDK and the spikes ask for: (``--gpu`` form, weight).
MIX = (("1", 4), ("2", 1), ("mps:30%,10GiB", 2), ("timeslice:0.5", 2), ("mig:1g.10gb", 1), ("mig:3g.40gb", 1))
#: Operations and their weights; kills come apart, every ``--kill-every-s`` seconds.
OPS = (("sdk_request", 5), ("sdk_release", 4), ("job_submit", 1.5), ("job_cancel", 1), ("spike", 0.6),
       ("spike_release", 1.5))
KILLS = (("head", 2), ("agent", 2), ("raylet", 1))
KEY = "chaos-requester-key"


def _log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Stop(BaseException):
    """SIGTERM or SIGHUP: leave through the same path as Ctrl-C, so ``down`` runs."""


def _stop(signum: int, frame: object) -> None:
    raise Stop(signum)


def chaos_config(namespace: str = "rgo-chaos") -> ClusterConfig:
    """The demo cluster with quick heartbeats (0.5 s) and a TTL a loaded 2-core machine survives (6 s)."""
    cfg = load_config(DEMO_CONFIG)
    s = cfg.settings.model_copy(update={"namespace": namespace, "heartbeat_interval_s": 0.5, "agent_ttl_s": 6.0,
                                        "reconcile_interval_s": 0.1})
    return cfg.model_copy(update={"settings": s})


@dataclass
class Chaos:
    config: ClusterConfig
    state_dir: Path
    rng: random.Random
    settle_s: float
    kill_settle_s: float
    head: Any = None
    history: History = field(default_factory=lambda: History(fault_window_s=30.0))
    sdk: dict[str, AbstractContextManager[Any]] = field(default_factory=dict)  # lease id -> its open block
    tokens: dict[str, int] = field(default_factory=dict)  # our leases' tokens (the views redact them)
    spikes: list[str] = field(default_factory=list)  # raw requests of the spikes, not yet released
    jobs: list[str] = field(default_factory=list)
    ops: Counter[str] = field(default_factory=Counter)
    kills: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    recovery: dict[str, list[float]] = field(default_factory=dict)
    n: int = 0
    t0: float = 0.0
    _seen: set[tuple[str, str]] = field(default_factory=set)

    def record(self, found: list[Violation]) -> None:
        """Keep each distinct violation once: one that persists over steps is one broken invariant."""
        for v in found:
            if (v.kind, v.detail) not in self._seen:
                self._seen.add((v.kind, v.detail))
                self.violations.append(v)
                _log(f"VIOLATION {v.kind}: {v.detail}")

    # ---- reading ----------------------------------------------------------------------------------
    def agents_held(self) -> dict[str, list[str] | None]:
        from orchestrator.rayport import ray_api

        out: dict[str, list[str] | None] = {}
        ns = self.config.settings.namespace
        for node in self.config.nodes:
            try:
                info = ray_api.get(ray_api.get_actor(ray_api.agent_name(node.name), ns).info.remote(), timeout=5)
                out[node.name] = list(info["allocated"])
            except Exception:  # dead, restarting or not started yet: not judged
                out[node.name] = None
        return out

    def observe(self) -> tuple[Any, dict[str, Any]]:
        status = self.head.status()
        held = self.agents_held()
        shown = {d["lease_id"] for d in (*status["leases"], *status["ended_leases"])}
        extra, gone = [], []
        for lid, t in self.history.leases.items():  # leases seen holding and not seen ending: asked one by one
            if lid not in shown and t.held is not None and not t.ended:
                try:
                    extra.append(self.head.get_lease(lid))
                except UnknownObjectError:
                    gone.append(lid)
        obs = observation(status, held, at=time.time(), tokens=self.tokens, extra=extra,
                          timeslice_capacity_milli=self.config.settings.timeslice_capacity_milli)
        return obs, {"status": status, "gone": gone}

    def check(self, after_kill: bool = False) -> None:
        """The invariants after one step: double grants and history at once, agreement once settled."""
        deadline = time.monotonic() + (self.kill_settle_s if after_kill else self.settle_s)
        want = {n.name for n in self.config.nodes}
        while True:
            try:
                obs, more = self.observe()
            except OrchestratorError as e:  # the head restarting: it must answer before the deadline
                if time.monotonic() > deadline:
                    self.record([Violation("recovery", f"the head did not answer: {e}")])
                    return
                time.sleep(0.5)
                continue
            self.record(double_grants(obs))
            self.record(self.history.observe(obs, more["gone"]))
            disagree = disagreements(obs)
            settled = not disagree and (not after_kill or (obs.registered >= want and all(
                obs.agents.get(n) is not None for n in want)))
            if settled:
                return
            if time.monotonic() > deadline:
                answering = sorted(n for n, v in obs.agents.items() if v is not None)
                self.record(disagree or [Violation("recovery", f"not settled in time: registered "
                                                   f"{sorted(obs.registered)}, agents answering {answering}")])
                _log(f"not settled: {[v.detail for v in disagree][:3]}")
                return
            time.sleep(0.3)

    # ---- operations -------------------------------------------------------------------------------
    def _gpu(self) -> str:
        forms, weights = zip(*MIX)
        return self.rng.choices(forms, weights)[0]

    def _id(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}-{self.n}"

    def sdk_request(self) -> None:
        lid = self._id("sdk")
        block = lease(self._gpu(), head=self.head, timeout=3.0, lease_id=lid, owner="chaos")
        self.history.requested(lid)
        try:
            handle = block.__enter__()
        except OrchestratorError as e:  # not granted in time (withdrawn), or never fits
            self.history.released(lid)
            self.ops["sdk_not_granted"] += 1
            _log(f"{lid}: {type(e).__name__}")
            return
        self.sdk[lid] = block
        self.tokens[lid] = handle.fencing_token

    def sdk_release(self) -> None:
        if not self.sdk:
            return
        lid = self.rng.choice(sorted(self.sdk))
        self.history.released(lid)
        block = self.sdk.pop(lid)
        try:
            block.__exit__(None, None, None)
        except OrchestratorError as e:  # lost meanwhile (a kill): its release is refused or a no-op
            _log(f"release of {lid}: {type(e).__name__}: {e}")

    def job_submit(self) -> None:
        live = [j for j in self.jobs if self.head.get_job(j)["state"] not in ("succeeded", "failed", "cancelled")]
        if len(live) >= 2:  # each job is a Ray job driver and supervisor: keep the 2-core machine breathing
            return
        jid = self._id("job")
        secs = self.rng.randint(10, 40)
        gpu = self.rng.choice((GpuRequest.whole(1), GpuRequest.parse("timeslice:0.5")))
        spec = JobSpec(name=jid, entrypoint=f"python -c 'import time; time.sleep({secs})'", gpu=gpu, priority="batch")
        self.head.submit_job(spec.model_dump(mode="json"), job_id=jid)
        self.jobs.append(jid)

    def job_cancel(self) -> None:
        live = [j for j in self.jobs if self.head.get_job(j)["state"] not in ("succeeded", "failed", "cancelled")]
        if live:
            self.head.cancel_job(self.rng.choice(live))

    def spike(self) -> None:
        for _ in range(self.rng.randint(5, 12)):
            lid = self._id("spike")
            self.history.requested(lid)
            self.head.request_lease({"lease_id": lid, "request": self._gpu(), "owner": "chaos-spike",
                                     "requeue_on_loss": False, "requester_digest": key_digest(KEY)})
            self.spikes.append(lid)

    def note_token(self, d: dict[str, Any]) -> None:
        """Keep a granted lease's token. A pending one shows 0, not a token: noting it would make the
        lease's first holding sighting carry 0 when it is granted before the next status read."""
        if d["state"] != "pending" and d.get("fencing_token"):
            self.tokens[d["lease_id"]] = int(d["fencing_token"])

    def spike_release(self) -> None:
        """Release (or withdraw) half of the spikes' leases; a granted one is activated first, as a holder would."""
        self.rng.shuffle(self.spikes)
        for lid in self.spikes[: max(1, len(self.spikes) // 2)]:
            d = self.head.get_lease(lid, KEY)
            self.note_token(d)
            if d["state"] in ("pending", "granted", "active", "checkpointing"):
                self.history.released(lid)
                try:
                    self.head.release(lid, d.get("fencing_token"), "released by the chaos bench", KEY)
                except OrchestratorError as e:
                    _log(f"release of {lid}: {type(e).__name__}: {e}")
            self.spikes.remove(lid)

    def activate_spikes(self) -> None:
        """Spike leases granted since the last step are activated (their holder started), token noted."""
        for lid in self.spikes:
            d = self.head.get_lease(lid, KEY)
            self.note_token(d)
            if d["state"] == "granted":
                try:
                    self.head.activate(lid, int(d["fencing_token"]), key=KEY)
                except OrchestratorError:
                    pass  # ended meanwhile

    # ---- kills ------------------------------------------------------------------------------------
    def kill(self, what: str) -> None:
        from orchestrator.rayport import ray_api

        ns = self.config.settings.namespace
        t0 = time.monotonic()
        if what == "head":
            pong = self.head.ping()
            os.kill(int(pong["pid"]), signal.SIGKILL)
            _log(f"SIGKILL head worker pid {pong['pid']}")
            while True:
                try:
                    if self.head.ping()["started_at"] != pong["started_at"]:
                        break
                except OrchestratorError:
                    pass
                if time.monotonic() - t0 > self.kill_settle_s:
                    self.record([Violation("recovery", "the head did not come back")])
                    return
                time.sleep(0.1)
            self.recovery.setdefault("head_back_s", []).append(time.monotonic() - t0)
        elif what == "agent":
            node = self.rng.choice([n.name for n in self.config.nodes])
            try:
                info = ray_api.get(ray_api.get_actor(ray_api.agent_name(node), ns).info.remote(), timeout=10)
            except Exception as e:  # no agent there right now: nothing to kill
                _log(f"no agent of {node} to kill: {type(e).__name__}")
                return
            self.history.fault(node, time.time())
            os.kill(int(info["pid"]), signal.SIGKILL)
            _log(f"SIGKILL agent of {node} (pid {info['pid']}, held {info['allocated']})")
        else:
            node = self.rng.choice([n.name for n in self.config.nodes[1:]])
            pid = self._raylet_pid(node)
            if pid is None:
                _log(f"no raylet of {node} to kill")
                return
            self.history.fault(node, time.time())
            os.kill(pid, signal.SIGKILL)
            _log(f"SIGKILL raylet of {node} (pid {pid})")
            self._restart_raylet(node, t0)
        self.kills[what] += 1
        self.check(after_kill=True)
        self.recovery.setdefault(f"{what}_settled_s", []).append(time.monotonic() - t0)

    def _raylet_pid(self, node: str) -> int | None:
        state = State.load(self.state_dir)
        procs = [p for p in (state.processes if state else []) if p.node == node]
        for pid in session_members(procs[-1].sid) if procs else []:
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet":
                    return pid
            except OSError:
                continue
        return None

    def _restart_raylet(self, node: str, t0: float) -> None:
        """Wait for Ray to see the node gone and its ``ray start`` to finish, then start it again."""
        from orchestrator.rayport import ray_api

        state = State.load(self.state_dir)
        sid = [p for p in state.processes if p.node == node][-1].sid if state else 0
        while time.monotonic() - t0 < self.kill_settle_s:
            alive = {n.name for n in ray_api.alive_nodes()}
            if node not in alive and not session_members(sid):
                break
            time.sleep(0.25)
        self.recovery.setdefault("raylet_gone_s", []).append(time.monotonic() - t0)
        restart_worker(self.config, self.state_dir, node, progress=_log)

    # ---- the run ------------------------------------------------------------------------------------
    def step(self, kill: str | None) -> str:
        if kill is not None:
            self.kill(kill)
            return f"kill_{kill}"
        names, weights = zip(*OPS)
        op = self.rng.choices(names, weights)[0]
        try:
            getattr(self, op)()
            self.activate_spikes()
        except OrchestratorError as e:  # a typed refusal (a lease gone, a token stale): the check says if it matters
            self.ops["op_errors"] += 1
            _log(f"{op}: {type(e).__name__}: {e}")
        self.check()
        return op


def run(a: argparse.Namespace) -> dict[str, Any]:
    config = chaos_config()
    state_dir = Path(a.state_dir or tempfile.mkdtemp(prefix="rgo-chaos-", dir="/tmp"))
    # The GCS declares a dead raylet's node dead after 3 missed 1 s health checks (default 5 x 3 s).
    os.environ.setdefault("RAY_health_check_period_ms", "1000")
    os.environ.setdefault("RAY_health_check_failure_threshold", "3")
    t_up = time.monotonic()
    up_local(config, state_dir, progress=_log, dashboard=True)
    from orchestrator.rayport import ray_api
    from orchestrator.rayport.client import HeadClient

    state = State.load(state_dir)
    assert state is not None
    ray_api.connect(state.address, config.settings.namespace)
    _log(f"cluster up in {time.monotonic() - t_up:.1f}s at {state.address}")
    c = Chaos(config, state_dir, random.Random(a.seed), a.settle_s, a.kill_settle_s,
              head=HeadClient(config.settings.namespace, config.settings.head_name))
    error = None
    try:
        _loop(c, a)
    except Exception as e:  # the bench itself failed: still report what it saw, and fail
        error = f"{type(e).__name__}: {e}"
        _log(f"the run stopped early: {error}")
    return _figures(c, a, error)


def _loop(c: Chaos, a: argparse.Namespace) -> None:
    t0 = time.monotonic()
    c.t0 = t0
    end = t0 + a.minutes * 60
    # --min-kills: a busy host settles each kill slower, so fewer fit in the minutes; the run goes on (each kill
    # still a kill interval after the last one settled) until that many happened, bounded by one settle each
    last = end + (a.min_kills or 0) * (a.kill_settle_s + a.kill_every_s)
    next_kill = t0 + a.kill_every_s
    kinds, weights = zip(*KILLS)

    def going() -> bool:
        now = time.monotonic()
        return now < end or (now < last and sum(c.kills.values()) < (a.min_kills or 0))

    while going():
        kill = None
        if time.monotonic() >= next_kill and (a.max_kills is None or sum(c.kills.values()) < a.max_kills):
            n = sum(c.ops[f"kill_{k}"] for k in kinds)
            kill = kinds[n % len(kinds)] if a.kill_cycle else c.rng.choices(kinds, weights)[0]
        c.ops[c.step(kill)] += 1
        if kill is not None:  # the next one a kill interval after this one settled
            next_kill = time.monotonic() + a.kill_every_s
        time.sleep(max(0.0, min(60.0 / a.steps_per_minute, max(end, next_kill) - time.monotonic())) * c.rng.random())
    c.check()


def _figures(c: Chaos, a: argparse.Namespace, error: str | None) -> dict[str, Any]:
    kinds = Counter(v.kind for v in c.violations)
    ops = sum(v for k, v in c.ops.items() if k != "sdk_not_granted")
    return {
        "minutes": a.minutes, "seed": a.seed, "operations": ops, "operations_by_kind": dict(sorted(c.ops.items())),
        "kills": sum(c.kills.values()), "kills_by_kind": dict(sorted(c.kills.items())),
        "leases_lost": c.history.leases_lost, "double_grants": kinds["double_grant"],
        "invariant_violations": len(c.violations), "violations_by_kind": dict(kinds),
        "ended_by_faults": c.history.ended_by_faults, "leases_seen": len(c.history.leases),
        "leases_held_seen": sum(1 for t in c.history.leases.values() if t.held is not None),
        "fencing_counter": c.history.counter, "jobs": len(c.jobs),
        "recovery_s": {k: {"median": round(statistics.median(v), 2), "max": round(max(v), 2), "n": len(v)}
                       for k, v in sorted(c.recovery.items())},
        "violations": [v.to_json() for v in c.violations[:20]], "lost_leases": c.history.lost_ids[:20],
        "wall_s": round(time.monotonic() - c.t0, 1), "error": error,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object on one line")
    p.add_argument("--kill-every-s", type=float, default=30.0,
                   help="seconds from one kill's recovery to the next kill (the first after this long)")
    p.add_argument("--kill-cycle", action="store_true",
                   help="kill head, agent, raylet in turn (default: drawn from the seed, weights 2:2:1)")
    p.add_argument("--max-kills", type=int, default=None, help="stop killing after this many")
    p.add_argument("--min-kills", type=int, default=None,
                   help="go on past --minutes until this many kills happened (each kill's settle bounds the wait)")
    p.add_argument("--steps-per-minute", type=float, default=30.0, help="operations drawn per minute (at most)")
    p.add_argument("--settle-s", type=float, default=10.0, help="how long ledger and agents may disagree after a step")
    p.add_argument("--kill-settle-s", type=float, default=90.0, help="the same after a kill (and for nodes to return)")
    p.add_argument("--state-dir", default=None, help="default: a fresh /tmp/rgo-chaos-* directory")
    a = p.parse_args(argv)
    with stdout_to_stderr():  # stdout is the JSON's: Ray's driver prints a killed raylet's last words there
        old = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
        state_dir = a.state_dir = a.state_dir or tempfile.mkdtemp(prefix="rgo-chaos-", dir="/tmp")
        try:
            out = run(a)
        except (KeyboardInterrupt, Stop) as e:
            signum = e.args[0] if isinstance(e, Stop) else signal.SIGINT
            _log(f"stopped by {signal.Signals(signum).name}; stopping the cluster")
            return 128 + signum
        finally:
            from orchestrator.rayport import ray_api

            try:
                ray_api.disconnect()
            except Exception:
                pass
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # let our own down finish
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            down(Path(state_dir), progress=_log)
            for sig, h in old.items():
                signal.signal(sig, h)
    print(json.dumps(out) if a.json else json.dumps(out, indent=2))
    ok = out["leases_lost"] == out["double_grants"] == out["invariant_violations"] == 0 and out["error"] is None
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
