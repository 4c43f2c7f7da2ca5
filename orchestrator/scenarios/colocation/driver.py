"""The co-location day, every scheme: up the demo cluster, replay the day once per scheme (``ours``
first: the baselines are provisioned for the peak it needed), write the chart of the day, down (always).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.scenarios.colocation.charts import write_day_charts
from orchestrator.scenarios.colocation.replay import DayConfig, Replay, ReplayResult
from orchestrator.scenarios.colocation.schemes import (
    DEFAULT_TRAINING, SCHEMES, Say, baseline_replicas, default_curve,
)


def run_colocation(day: DayConfig, service: Any, say: Say, *, schemes: tuple[str, ...] = tuple(SCHEMES),
                   state_dir: Path | None = None, keep: bool = False, out_dir: Path | None = None,
                   cluster: Any = None) -> dict[str, Any]:
    """Up the demo cluster, replay the day under each scheme (``ours`` first: the baselines are provisioned
    for the peak it needed), down (always). Returns ``ours``' figures with ``baselines`` beside them."""
    import shutil
    import tempfile

    from orchestrator.core.config import DEMO_CONFIG, load_config
    from orchestrator.deploy import local as launcher

    for name in schemes:
        if name not in SCHEMES:
            raise ValueError(f"scheme {name!r}: expected one of {', '.join(SCHEMES)}")
    cfg = cluster or load_config(DEMO_CONFIG)
    sched = cfg.scheduler.model_copy(update={"classes": {
        **cfg.scheduler.classes,
        "training": cfg.scheduler.classes["training"].model_copy(update={"min_runtime_s": 1.0,
                                                                          "grace_period_s": 30.0})}})
    cfg = cfg.model_copy(update={"scheduler": sched})
    if day.curve is None:
        day = DayConfig(**{**day.__dict__, "curve": default_curve()})
    if not day.training:
        day = DayConfig(**{**day.__dict__, "training": DEFAULT_TRAINING})
    sd = state_dir or Path(tempfile.mkdtemp(prefix="rgo-colocation-"))
    results: dict[str, ReplayResult] = {}
    started = False
    try:
        state = launcher.up_local(cfg, sd, progress=say)
        started = True
        launcher.stop_orchestrator_actors(state.address, cfg)  # each replay starts its own head
        peak: int | None = None
        for name in schemes:
            scheme = SCHEMES[name]
            fixed = baseline_replicas(scheme, peak or service.autoscale.max_replicas, cfg)
            say(f"[{name}] replaying the day ({day.day_s:g}s): {scheme.label}"
                + (f", {fixed} replicas all day" if fixed else ", replicas follow the load"))
            res = Replay(cfg, scheme, day, service, state.address, sd / "work", say, fixed_replicas=fixed).run()
            results[name] = res
            if scheme.load_driven:
                peak = res.peak_replicas
            f = res.figures
            say(f"[{name}] utilisation {f['gpu_utilization_pct']}%, SLO {f['inference_slo_attainment_pct']}%, "
                f"p99 {f['p99_latency_ms']} ms, preemptions {f['preemptions']}, lost steps {f['work_lost_steps']}")
        if out_dir is not None and "ours" in results:
            files = write_day_charts(out_dir, results["ours"].timeline, SCHEMES["ours"].label)
            (out_dir / "colocation.json").write_text(json.dumps(
                {k: {"figures": r.figures, "timeline": r.timeline, "requests": r.requests}
                 for k, r in results.items()}))
            say(f"chart of the day: {', '.join(str(p) for p in files)}")
    finally:
        if started or (sd / "state.json").exists():
            launcher.down(sd, progress=say, keep_logs=keep)
        if not keep and state_dir is None:
            shutil.rmtree(sd, ignore_errors=True)
    first = next(iter(results.values()), None)
    out = dict(results["ours"].figures) if "ours" in results else (dict(first.figures) if first else {})
    out["baselines"] = {k: r.figures for k, r in results.items() if k != "ours"}
    return out
