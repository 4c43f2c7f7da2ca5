"""Scale of the single head, in process (no Ray): thousands of agents, tens of thousands of leases.

Drives the real :class:`~orchestrator.control.service.HeadService` (controller, ledger,
node registry, scheduler, job layer and metrics over a JSON-round-tripping
:class:`~orchestrator.control.store.MemoryStore`) with ``--nodes`` real
:class:`~orchestrator.control.agent.AgentCore` s on simulated GPUs, on a simulated
clock that moves ``--tick`` seconds per step. Each step:

1. the leases due arrive (``request_lease``; ``--rate`` per simulated second, a
   seeded mix of whole cards, MPS and time-slice shares and on-demand MIG slices);
2. a ``tick / heartbeat_interval`` share of the agents heartbeat (so every agent
   beats once per interval, as their actors do) and apply the reply;
3. holders pick up their settled grants (``lease_settled`` with their key, as
   ``wait_lease`` answers) and ``activate`` them; holders whose time is up
   (``--hold`` seconds on average) ``release``;
4. one head cycle (:meth:`HeadService.cycle`: the controller's reconcile -- with
   the scheduling pass -- the job layer and the metrics), timed.

There is no renew call in the head's API: a lease lives while its node's agent
heartbeats and its holder is alive. A **renewal** here is a heartbeat in which the
agent reported the lease held and the head's reply assigned it again.

Prints one JSON object: ``nodes``, ``leases``, ``cycle_p50_ms``, ``cycle_p99_ms`` (wall
time; ``cycle_cpu_p50_ms``/``cycle_cpu_p99_ms``: the same cycles in the process's CPU time,
which other work on a shared machine does not inflate),
``heartbeats_per_s`` (heartbeats the head answered per second of its own time in
``heartbeat``), ``rss_mb`` (peak RSS of this process: the head, the simulated agents
and the store), the accounting (``granted``, ``activated``, ``renewals``,
``released``, ``lost``, ``unaccounted``) and the load it ran under.

    .venv/bin/python bench/scale.py --nodes 5000 --leases 50000 --json
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from orchestrator.control.service import HeadService
from orchestrator.control.store import MemoryStore
from orchestrator.core.config import ClusterConfig, RuntimeSettings, SimNode
from orchestrator.core.lease import LeaseState, key_digest
from orchestrator.core.stats import quantile
from orchestrator.sim.port import SimPort

#: The request mix: (--gpu form, weight). Every node has 8 cards; one in ten has two on-demand MIG cards.
MIX = (("1", 50), ("2", 10), ("4", 3), ("mps:25%,10GiB", 14), ("timeslice:0.5", 15), ("mig:1g.10gb", 8))
KEY = "bench-requester-key"


class NoJobs:
    """Ray's job API stood in for by nothing: this bench submits leases, not jobs."""

    def submit(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the scale bench submits no jobs")

    def status(self, submission_id: str) -> str | None:
        return None

    def status_many(self, submission_ids: Sequence[str]) -> dict[str, str | None]:
        return {s: None for s in submission_ids}

    def stop(self, submission_id: str) -> None:
        pass

    def delete(self, submission_id: str) -> None:
        pass

    def logs(self, submission_id: str) -> str:
        return ""


class SimClock:
    """The head's clock: moved by the bench, never by the wall."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def cluster(nodes: int) -> ClusterConfig:
    """``nodes`` 8-card nodes: mostly A100s and H100s on NVLink, one in ten with MIG on demand on cards 0 and 1."""
    out = []
    for i in range(nodes):
        model = "H100-80GB" if i % 5 == 4 else "A100-80GB"
        mig = {0: (), 1: ()} if i % 10 == 3 else {}
        out.append(SimNode(name=f"n{i:05d}", model=model, gpus=8, cpus=128, memory="1024GiB",
                           nvlink=((0, 1, 2, 3, 4, 5, 6, 7),), mig=mig))
    return ClusterConfig(nodes=tuple(out))


#: The head's :class:`~orchestrator.control.service.ClusterPort` here: every node alive, every holder alive, real
#: agent cores on simulated GPUs -- the simulated day's own port (node ``i``'s Ray id is ``f"{i:056x}"``).
BenchPort = SimPort


@dataclass
class Tally:
    """What the bench saw happen to its leases, to account for every one."""

    requested: set[str] = field(default_factory=set)
    granted: set[str] = field(default_factory=set)  # as the head's cycles reported them
    tokens: dict[str, int] = field(default_factory=dict)  # granted and settled: id -> token
    activated: set[str] = field(default_factory=set)
    renewals: Counter[str] = field(default_factory=Counter)
    released: set[str] = field(default_factory=set)


def _pct(xs: Sequence[float], q: float) -> float:
    return quantile(xs, q) or 0.0


def bring_up(config: ClusterConfig, settings: RuntimeSettings,
             clock: SimClock) -> tuple[HeadService, BenchPort, float]:
    """A head over simulated agents, every one registered: the head starts an agent on every node and each
    registers. Returns the head, its port (the agents) and the seconds spent in ``register_agent`` (timed
    apart from heartbeats)."""
    port = BenchPort(config, settings)
    head = HeadService(settings, config, MemoryStore(), NoJobs(), port, clock=clock, status_poll_s=0.0)
    head.cycle()
    reg_s = 0.0
    for core in port.agents.values():
        s = time.perf_counter()
        ack = head.register_agent(**core.registration())
        reg_s += time.perf_counter() - s
        core.apply_assignments(ack["assignments"], ack.get("revocations"))
    head.cycle()
    assert len(head.ctl.registered_nodes()) == len(config.nodes), "every agent registered"
    return head, port, reg_s


def run(nodes: int = 5000, leases: int = 50000, *, rate: float = 200.0, hold_s: float = 60.0, tick_s: float = 0.25,
        heartbeat_s: float = 1.0, seed: int = 0, progress: bool = False) -> dict[str, Any]:
    """Run the bench; the figures and the accounting as a dict (see the module docstring)."""
    rng = random.Random(seed)
    clock = SimClock()
    settings = RuntimeSettings(heartbeat_interval_s=heartbeat_s, agent_ttl_s=max(10.0, 5 * heartbeat_s),
                               reconcile_interval_s=tick_s)
    digest = key_digest(KEY)
    kinds, weights = zip(*MIX)
    t0 = time.perf_counter()
    head, port, reg_s = bring_up(cluster(nodes), settings, clock)
    names = sorted(port.agents)
    per_tick = max(1, round(heartbeat_s / tick_s))

    tally = Tally()
    arrivals = [i / rate for i in range(leases)]
    release_at: dict[str, float] = {}
    next_lease = 0
    start = clock.now
    cycle_s: list[float] = []
    cycle_cpu_s: list[float] = []  # the same cycles in this process's CPU time: what other work on the machine does not inflate
    hb_s = hb_n = 0.0
    api_s = 0.0
    awaiting: set[str] = set()
    step = 0
    peak_held = 0
    gc.collect()
    while True:
        now = clock.now - start
        # 1. arrivals
        s = time.perf_counter()
        while next_lease < leases and arrivals[next_lease] <= now:
            lid = f"l{next_lease:06d}"
            head.request_lease({"lease_id": lid, "request": rng.choices(kinds, weights)[0], "owner": f"bench-{lid}",
                                "requester_digest": digest})
            tally.requested.add(lid)
            next_lease += 1
        api_s += time.perf_counter() - s
        # 2. heartbeats: one share of the agents this tick
        for name in names[step % per_tick::per_tick]:
            core = port.agents[name]
            payload = core.heartbeat_payload()
            s = time.perf_counter()
            reply = head.heartbeat(**payload)
            hb_s += time.perf_counter() - s
            hb_n += 1
            assert reply.get("ok"), reply
            assignments = reply.get("assignments", {})
            for lid in payload["allocated"]:
                if lid in assignments:
                    tally.renewals[lid] += 1
            core.apply_assignments(assignments, reply.get("revocations"))
        # 3. holders: pick up grants, activate; release when done
        s = time.perf_counter()
        for lid in sorted(awaiting):
            d = head.lease_settled(lid, KEY)
            if d is None:
                continue
            awaiting.discard(lid)
            if d["state"] != LeaseState.GRANTED.value:
                continue  # accounted below: the ledger says what became of it
            tally.tokens[lid] = d["fencing_token"]
            head.activate(lid, d["fencing_token"], holder=f"holder-{lid}", key=KEY)
            tally.activated.add(lid)
            release_at[lid] = now + hold_s * rng.uniform(0.5, 1.5)
        for lid in [lid for lid, at in release_at.items() if at <= now]:
            head.release(lid, tally.tokens[lid], key=KEY)
            tally.released.add(lid)
            del release_at[lid]
        api_s += time.perf_counter() - s
        # 4. one head cycle
        s, c = time.perf_counter(), time.process_time()
        report = head.cycle()
        cycle_s.append(time.perf_counter() - s)
        cycle_cpu_s.append(time.process_time() - c)
        awaiting.update(report.granted)
        tally.granted.update(report.granted)
        peak_held = max(peak_held, len(release_at))
        step += 1
        clock.now += tick_s
        if progress and step % 40 == 0:
            print(f"[{time.perf_counter() - t0:7.1f}s] t={now:6.1f}s requested {len(tally.requested)} "
                  f"held {len(release_at)} released {len(tally.released)} cycle p50 "
                  f"{1000 * _pct(cycle_s[-40:], 0.5):.1f} ms", file=sys.stderr, flush=True)
        drained = next_lease >= leases and not awaiting and not release_at
        if drained and not any(core.allocated for core in port.agents.values()):
            break
        if step > 4 * (leases / rate + 3 * hold_s + 60) / tick_s:
            break  # something is stuck: the accounting below says what

    states = Counter(e.lease.state.value for e in head.ctl.ledger)
    ended_released = {e.lease_id for e in head.ctl.ledger if e.lease.state is LeaseState.RELEASED}
    not_renewed = [lid for lid in tally.released if tally.renewals[lid] == 0]
    sim_s = clock.now - start
    head_busy = sum(cycle_s) + hb_s + api_s
    return {
        "nodes": nodes,
        "leases": leases,
        "cycle_p50_ms": round(1000 * _pct(cycle_s, 0.5), 2),
        "cycle_p99_ms": round(1000 * _pct(cycle_s, 0.99), 2),
        "cycle_max_ms": round(1000 * max(cycle_s), 2),
        "cycle_cpu_p50_ms": round(1000 * _pct(cycle_cpu_s, 0.5), 2),
        "cycle_cpu_p99_ms": round(1000 * _pct(cycle_cpu_s, 0.99), 2),
        "cycles": len(cycle_s),
        "heartbeats": int(hb_n),
        "heartbeats_per_s": round(hb_n / hb_s, 1) if hb_s else 0.0,
        "heartbeat_mean_us": round(1e6 * hb_s / hb_n, 1) if hb_n else 0.0,
        "register_mean_us": round(1e6 * reg_s / nodes, 1),
        "rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "requested": len(tally.requested),
        "granted": len(tally.granted),
        "fencing_counter": head.ctl.ledger.fencing,
        "activated": len(tally.activated),
        "renewals": sum(tally.renewals.values()),
        "released": len(tally.released),
        "not_renewed": len(not_renewed),
        "ledger_states": dict(sorted(states.items())),
        # a lease is accounted for when it was requested, granted, activated, renewed and released, and the
        # ledger agrees that it ended released; anything else is counted here
        "unaccounted": len(tally.requested ^ tally.released) + len(tally.released ^ ended_released)
        + len(tally.requested ^ tally.granted) + len(tally.requested ^ tally.activated) + len(not_renewed),
        "lost": states.get(LeaseState.LOST.value, 0) + states.get(LeaseState.EXPIRED.value, 0),
        "peak_held": peak_held,
        "load": {"rate_per_s": rate, "hold_s": hold_s, "tick_s": tick_s, "heartbeat_s": heartbeat_s,
                 "simulated_s": round(sim_s, 2), "seed": seed},
        "head_busy_ratio": round(head_busy / sim_s, 3) if sim_s else None,
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--leases", type=int, default=50000)
    p.add_argument("--rate", type=float, default=200.0, help="lease arrivals per simulated second")
    p.add_argument("--hold", type=float, default=60.0, help="mean seconds a holder keeps its lease")
    p.add_argument("--tick", type=float, default=0.25, help="simulated seconds per head cycle")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="one line of JSON (else indented)")
    p.add_argument("--progress", action="store_true", help="a line on stderr every 40 cycles")
    a = p.parse_args(argv)
    out = run(a.nodes, a.leases, rate=a.rate, hold_s=a.hold, tick_s=a.tick, seed=a.seed, progress=a.progress)
    print(json.dumps(out) if a.json else json.dumps(out, indent=2))
    return 0 if out["unaccounted"] == 0 and out["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
