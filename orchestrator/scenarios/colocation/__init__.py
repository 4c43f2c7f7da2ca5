"""The co-location day (``orchestrator demo --scenario colocation``): inference by day, training by night.

One compressed 24 h on the demo cluster's hardware, replayed once per
*scheme* in the same invocation, each on a fresh head and fresh agents of the
same Ray cluster (so nothing of one replay's ledger, MIG layout or actors is
left for the next):

* ``ours`` -- the inference service asks for 1g MIG slices (hard isolation;
  never a whole card for a 10 GB model: the day's relayout makes the slices it
  needs) and the orchestrator scales it with its load
  (:mod:`orchestrator.scheduling.autoscale`, with hysteresis); its leases
  preempt training through the checkpoint path and give the cards back when
  the load falls; the time windows of the config move the queues' quotas at
  08:00 and 22:00, and the MIG cards are repartitioned for the window (small
  slices by day, big ones by night), draining only the leases on the cards
  being changed;
* the **baselines**, as those schemes are deployed today -- the service
  provisioned for its peak (the most replicas ``ours`` needed in the same
  run) all day, no load-driven preemption, no windows, no repartitioning:
  ``whole_card`` (a whole card per replica, MIG off), ``static_mig`` (1g
  slices of the administrator's fixed layout), ``timeslice`` (a quarter-card
  time-slice per replica, MIG off).

The training backlog is the same in every replay: lease-holding
:class:`TrainingActor` runs (``jobs/train.py``, ``requeue=True``) that train
for the whole day, paced at the workload model's speed on the share they
hold (:mod:`orchestrator.sim.perfmodel`); a preempted run checkpoints, waits
in the queue and resumes from its checkpoint.

Figures per replay: ``gpu_utilization_pct`` (useful GPU-time -- training
steps and inference batches valued by the workload model -- over
``cards × wall``, over the day), ``inference_slo_attainment_pct`` (requests
answered within the SLO, failures counted as misses), ``p99_latency_ms``,
``preemptions`` and ``checkpoints`` (training leases preempted; checkpoints
acknowledged), ``work_lost_steps`` (steps trained past a run's last
checkpoint and so trained again), ``mig_reconfigurations``,
``training_steps_done``. ``timeline`` (opt-in) holds one sample per tick for
the chart of the day.

The parts, one module each: :mod:`.schemes` (what a replay shares and how: the schemes, the default day,
the backlog, the windows and MIG layouts, read from ``configs/colocation.schemes.yaml``), :mod:`.backlog`
(the training runs), :mod:`.replay` (one scheme's day), :mod:`.charts` (the chart of the day),
:mod:`.driver` (the cluster up, every scheme replayed, the cluster down). Every name is importable from
here, as it was when this was one module.
"""

from orchestrator.scenarios.colocation.backlog import TrainingBacklog, _Attempt, _Run
from orchestrator.scenarios.colocation.charts import day_charts, replica_cards, rolling_mean, write_day_charts
from orchestrator.scenarios.colocation.driver import run_colocation
from orchestrator.scenarios.colocation.replay import DayConfig, Replay, ReplayResult, _percentile
from orchestrator.scenarios.colocation.schemes import (
    DAY_S, DEFAULT_DAY, DEFAULT_TRAINING, LOADGEN, MIG_TARGETS, OPEN_ENDED, SCHEMES, WINDOWS, Say, Scheme,
    TrainingJob, baseline_replicas, default_curve, load_loadgen, static_slices,
)

__all__ = [
    "DAY_S", "DEFAULT_DAY", "DEFAULT_TRAINING", "LOADGEN", "MIG_TARGETS", "OPEN_ENDED", "SCHEMES", "WINDOWS",
    "DayConfig", "Replay", "ReplayResult", "Say", "Scheme", "TrainingBacklog", "TrainingJob",
    "_Attempt", "_Run", "_percentile",
    "baseline_replicas", "day_charts", "default_curve", "load_loadgen", "replica_cards", "rolling_mean",
    "run_colocation", "static_slices", "write_day_charts",
]
