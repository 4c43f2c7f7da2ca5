"""``orchestrator sim colocation``: every scheme's simulated 24 h on each curve of a family, and the worst case.

For each curve (:mod:`orchestrator.sim.curves`) and each scheme (``configs/colocation.schemes.yaml``, passed
in: this layer does not read the scenario's package), one :class:`~orchestrator.sim.dayrun.DayRun` on the
same generated cluster, the same training backlog and the same load. The cluster and what is fixed here:

* **inventory** (:func:`inventory`): 8-card nodes, three in four ``A100-80GB`` with MIG on every card, the
  rest ``H100-80GB`` without MIG. A scheme sees it as the scenario's replays do: ``mig: off`` turns MIG off,
  ``static`` keeps the fixed layout (here the schemes file's ``day`` layout: a 4g and three 1g slices a card,
  the layout with the most inference slices), ``live`` starts from the ``night`` layout and is repartitioned
  at each window's start;
* **training backlog** (:func:`training_backlog`): the scenario's kinds of runs, scaled: on each MIG card a
  ``mem=40GiB,compute=0.5,isolation=hard`` and a ``mem=20GiB,compute=0.25,isolation=hard`` run (a 4g or a 2g
  slice, else a whole card), on each H100 node runs of 4, 2 and 2 cards. Every run trains all day;
* **the service** is ``configs/colocation.yaml``'s, unchanged but for ``max_replicas`` (the shipped 5 sizes the
  demo's 10 cards): the load is split evenly over ``services`` identical services, as few as the config's
  bound of 1,024 replicas a service allows (``ceil(cards x 7 / 1024)``), each bounded by ``cards x 7 /
  services`` (what 1g replicas could ever hold);
* **baselines** (``load_driven: false``) hold, all day, the replicas each service needs at the curve's peak
  at the autoscaler's target (:func:`~orchestrator.sim.queueing.rate_at_target` on their share), capped by
  what the scheme's cluster can hold of that share. (The scenario sizes them to ours' peak instead; here
  ours' peak is bounded by what it can get, and a baseline sized to it would share its misses.)

The answer (:func:`evaluate`): per curve, per scheme, the figures of :meth:`DayRun.run`; ``worst_case`` per
scheme across the curves; ``targets`` (issue #36's, for ours) with what each scheme missed, by curve.
"""

from __future__ import annotations

import math
import time
from typing import Any, Mapping, Sequence

from orchestrator.core.colocation import ServiceConfig
from orchestrator.core.config import ClusterConfig, SimNode
from orchestrator.core.priorities import QueueConfig, SchedulerConfig
from orchestrator.core.request import GpuRequest, ShareKind
from orchestrator.scheduling.repartition import validate_layout
from orchestrator.sim.curves import NamedCurve, peak_need, spikes
from orchestrator.sim.dayrun import DayRun, SchemeLike, SimParams
from orchestrator.sim.perfmodel import ShareSpeed
from orchestrator.sim.queueing import ReplicaKind, rate_at_target

NODE_GPUS = 8
MIG_MODEL, WHOLE_MODEL = "A100-80GB", "H100-80GB"
MAX_REPLICAS = 1024  # AutoscaleConfig's bound on max_replicas
#: Issue #36's targets for ours (worst case over the family).
TARGETS = {"slo_attainment_pct": 99.0, "utilisation_pct": 85.0, "steps_lost": 0, "absorb_max_s": 30.0}


def inventory(gpus: int, layout: Sequence[Any], *, mig_nodes_in: int = 4, mig_nodes_of: int = 3) -> tuple[SimNode, ...]:
    """``gpus`` cards on 8-card nodes (the last one smaller): ``mig_nodes_of`` of every ``mig_nodes_in`` nodes
    are A100-80GB with MIG on every card in ``layout``, the others H100-80GB without MIG (and the last of two
    or three nodes is an H100 one)."""
    if gpus < 1:
        raise ValueError(f"a cluster of {gpus} GPUs: expected at least 1")
    slots = [{"profile": m.profile, "start": m.start} for m in validate_layout(MIG_MODEL, layout)]
    nodes = []
    count = math.ceil(gpus / NODE_GPUS)
    for i in range(count):
        n = min(NODE_GPUS, gpus - i * NODE_GPUS)
        # at least one H100 node in a cluster of two nodes or more: the whole-card runs need one
        mig = i % mig_nodes_in < mig_nodes_of and not (count >= 2 and i == count - 1 and count < mig_nodes_in)
        nodes.append(SimNode(name=f"{'a100' if mig else 'h100'}-{i:04d}", model=MIG_MODEL if mig else WHOLE_MODEL,
                             gpus=n, cpus=128, memory="1024GiB", nvlink=(tuple(range(n)),),
                             mig={k: slots for k in range(n)} if mig else {}))
    return tuple(nodes)


def training_backlog(nodes: Sequence[SimNode]) -> list[str]:
    """The runs' requests (see the module docstring)."""
    out: list[str] = []
    for n in nodes:
        if n.model == MIG_MODEL:
            out += ["mem=40GiB,compute=0.5,isolation=hard", "mem=20GiB,compute=0.25,isolation=hard"] * n.gpus
        else:
            sizes, left = [], n.gpus
            for s in (4, 2, 2):
                if left >= s:
                    sizes.append(s)
                    left -= s
            sizes += [1] * left
            out += [str(s) for s in sizes]
    return out


def services_for(gpus: int) -> int:
    return max(1, math.ceil(gpus * 7 / MAX_REPLICAS))


def service_for(service: ServiceConfig, gpus: int, services: int) -> ServiceConfig:
    """The service with ``max_replicas`` sized to the cluster (the one change; see the module docstring)."""
    hi = max(service.autoscale.min_replicas, min(MAX_REPLICAS, math.ceil(gpus * 7 / services)))
    return service.model_copy(update={"autoscale": service.autoscale.model_copy(update={"max_replicas": hi})})


def replica_kind(request: str, service: ServiceConfig, params: SimParams) -> ReplicaKind:
    """The share a replica asked with ``request`` gets (explicit kinds only: the baselines' and ours')."""
    r = GpuRequest.parse(request)
    if r.kind is ShareKind.MIG:
        share = ShareSpeed.mig(r.profile or "")
    elif r.kind is ShareKind.TIMESLICE:
        share = ShareSpeed.timeslice(round(1000 * (r.fraction or 1.0)))
    elif r.kind is ShareKind.MPS:
        share = ShareSpeed.mps(r.sm_percent or 100)
    elif r.kind is ShareKind.WHOLE:
        share = ShareSpeed.whole(r.count)
    else:  # a unified request: its smallest hard-isolated share, a 1g slice, as the service's default asks
        share = ShareSpeed.mig("1g.10gb")
    return ReplicaKind(share, params.inference, service.max_batch_size)


def card_rps(service: ServiceConfig, params: SimParams) -> float:
    """Requests per second one card serves as seven 1g replicas at the autoscaler's target (the curves' need)."""
    kind = replica_kind("mig:1g.10gb", service, params)
    return 7 * rate_at_target(kind, service.autoscale.target_ongoing_per_replica)


def scheme_cluster(nodes: Sequence[SimNode], scheme: SchemeLike, scheduler: SchedulerConfig,
                   windows: Sequence[Mapping[str, Any]], mig_targets: Mapping[str, Mapping[str, Any]]) -> ClusterConfig:
    """The cluster as ``scheme`` sees it: its MIG mode and layout, the inference and training queues, its windows."""
    if scheme.mig == "off":
        nodes = [n.model_copy(update={"mig": {}}) for n in nodes]
    elif scheme.mig == "live":
        slots = [{"profile": m.profile, "start": m.start}
                 for m in validate_layout(MIG_MODEL, mig_targets["night"]["layout"])]
        nodes = [SimNode.model_validate({**n.model_dump(), "mig": {i: slots for i in n.mig}}) if n.mig else n
                 for n in nodes]
    sched = scheduler.model_dump()
    sched["queues"] = {**{k: v.model_dump() for k, v in scheduler.queues.items()},
                       "inference": QueueConfig().model_dump(), "training": QueueConfig().model_dump()}
    sched["windows"] = [dict(w) for w in windows] if scheme.windows else []
    return ClusterConfig(nodes=tuple(nodes), scheduler=SchedulerConfig.parse(sched))


def capacity_of(kind: ReplicaKind, request: str, cluster: ClusterConfig) -> int:
    """How many replicas of ``request`` the scheme's cluster could hold at once."""
    r = GpuRequest.parse(request)
    if r.kind is ShareKind.MIG:
        return sum(1 for n in cluster.nodes for ms in n.mig.values() for m in ms if m.profile == r.profile)
    whole = sum(n.gpus - len(n.mig) for n in cluster.nodes)
    if r.kind is ShareKind.WHOLE:
        return whole // max(1, r.count)
    return whole * int(1 / max(1e-9, kind.share.card_share))


def baseline_replicas(kind: ReplicaKind, request: str, curve: Any, service: ServiceConfig, services: int,
                      cluster: ClusterConfig) -> int:
    peak = max(r for _, r in curve.points) / services
    need = math.ceil(peak / rate_at_target(kind, service.autoscale.target_ongoing_per_replica))
    return max(1, min(need, capacity_of(kind, request, cluster) // services, service.autoscale.max_replicas))


def evaluate(gpus: int, curves: Sequence[NamedCurve], schemes: Mapping[str, SchemeLike],
             windows: Sequence[Mapping[str, Any]], mig_targets: Mapping[str, Mapping[str, Any]], *,
             service: ServiceConfig, scheduler: SchedulerConfig, control_s: float,
             params: SimParams = SimParams(), scheme_names: Sequence[str] | None = None,
             say: Any = None) -> dict[str, Any]:
    """Every scheme on every curve; see the module docstring for the answer's shape."""
    t0 = time.perf_counter()
    names = list(scheme_names or schemes)
    nodes = inventory(gpus, mig_targets["day"]["layout"])
    backlog = training_backlog(nodes)
    services = services_for(gpus)
    svc = service_for(service, gpus, services)
    rps = card_rps(svc, params)
    out: dict[str, Any] = {
        "cluster": {"gpus": gpus, "nodes": len(nodes), "mig_cards": sum(len(n.mig) for n in nodes),
                    "whole_cards": sum(n.gpus - len(n.mig) for n in nodes), "training_runs": len(backlog),
                    "services": services, "max_replicas_per_service": svc.autoscale.max_replicas,
                    "card_rps_at_target": round(rps, 2)},
        "model": _params_json(params, control_s), "curves": {}}
    for nc in curves:
        rows: dict[str, Any] = {}
        for name in names:
            scheme = schemes[name]
            cluster = scheme_cluster(nodes, scheme, scheduler, windows, mig_targets)
            fixed = None
            if not scheme.load_driven:
                kind = replica_kind(scheme.inference_request, svc, params)
                fixed = baseline_replicas(kind, scheme.inference_request, nc.curve, svc, services, cluster)
            run = DayRun(cluster, scheme, svc, services, nc.curve, params, training=backlog,
                         mig_targets=mig_targets if scheme.mig == "live" else {}, control_s=control_s, fixed=fixed)
            rows[name] = run.run()
            if fixed is not None:
                rows[name]["replicas_per_service"] = fixed
            if say:
                f = rows[name]
                say(f"[{nc.name}] {name}: utilisation {f['utilisation_pct']}%, SLO {f['slo_attainment_pct']}%, "
                    f"p99 {f['p99_latency_ms']} ms, steps lost {f['steps_lost']} ({f['wall_s']} s)")
        out["curves"][nc.name] = {"source": nc.source, "peak_need": round(peak_need(nc.curve, gpus, rps), 3),
                                  "spikes": len(spikes(nc.curve)), "schemes": rows}
    out["worst_case"] = worst_case(out["curves"], names)
    out["targets"] = {"ours": TARGETS, "missed": missed(out["curves"], names)}
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def worst_case(curves: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """Per scheme across the curves: min SLO attainment and utilisation, max p99, steps lost and absorb time."""
    out = {}
    for name in names:
        rows = [(c, v["schemes"][name]) for c, v in curves.items() if name in v["schemes"]]
        if not rows:
            continue

        def pick(key: str, fn: Any) -> dict[str, Any]:
            vals = [(r[key], c) for c, r in rows if r[key] is not None]
            if not vals:
                return {"value": None, "curve": None}
            v, c = fn(vals, key=lambda x: x[0])
            return {"value": v, "curve": c}
        out[name] = {"slo_attainment_pct": pick("slo_attainment_pct", min), "utilisation_pct": pick("utilisation_pct", min),
                     "p99_latency_ms": pick("p99_latency_ms", max), "steps_lost": pick("steps_lost", max),
                     "absorb_max_s": pick("absorb_max_s", max),
                     "spikes_not_absorbed": sum(r["spikes_not_absorbed"] for _, r in rows)}
    return out


def missed(curves: Mapping[str, Any], names: Sequence[str]) -> dict[str, list[str]]:
    """Per scheme, ``curve: figure`` for every target of :data:`TARGETS` it missed."""
    out: dict[str, list[str]] = {}
    for name in names:
        miss = []
        for c, v in curves.items():
            r = v["schemes"].get(name)
            if r is None:
                continue
            if r["slo_attainment_pct"] is not None and r["slo_attainment_pct"] < TARGETS["slo_attainment_pct"]:
                miss.append(f"{c}: SLO {r['slo_attainment_pct']}%")
            if r["utilisation_pct"] < TARGETS["utilisation_pct"]:
                miss.append(f"{c}: utilisation {r['utilisation_pct']}%")
            if r["steps_lost"] > TARGETS["steps_lost"]:
                miss.append(f"{c}: {r['steps_lost']} steps lost")
            if r["spikes_not_absorbed"] or (r["absorb_max_s"] or 0) > TARGETS["absorb_max_s"]:
                miss.append(f"{c}: spike absorbed in {r['absorb_max_s']} s, {r['spikes_not_absorbed']} not absorbed")
        out[name] = miss
    return out


def _params_json(p: SimParams, control_s: float) -> dict[str, Any]:
    return {"tick_s": p.tick_s, "control_interval_s": control_s, "replica_start_s": p.replica_start_s,
            "warm_start_s": p.warm_start_s,
            "checkpoint_s": p.checkpoint_s, "checkpoint_every_s": p.checkpoint_every_s, "resume_s": p.resume_s,
            "timeout_s": p.timeout_s, "training_step_s": p.trainer.step_s,
            "inference_model": {"base_ms": p.inference.base_ms, "per_item_ms": p.inference.per_item_ms,
                                "sm_per_item": p.inference.sm_per_item},
            "queue": "M/M/c (Erlang C) while the service keeps up, fluid backlog when not (orchestrator.sim.queueing)"}
