"""Built-in target workloads for the FGD family (``fgd``, ``default``).

FGD measures fragmentation against a *target workload*: the task shapes the
cluster expects and how often each arrives. A caller that knows its stream
passes its own (``get_policy("fgd", workload=...)``, or
:func:`orchestrator.sim.workload.typical_workload` of a pod list); without one,
``get_policy("fgd")`` and ``get_policy("default")`` use
:data:`DEFAULT_WORKLOAD` below, so the runtime head can run them by name.

``DEFAULT_WORKLOAD`` is the *typical pods* of Alibaba's openb trace
(``openb_pod_list_default``, 8,152 pods; ATC'23 FGD artifact): the 35 most
frequent shapes covering 95% of the pods, CPU-only pods included, each with
the largest host-memory request seen for it (``default`` checks memory,
``fgd`` ignores it). Columns: CPU milli-cores, GPU milli per GPU (1000 = a
whole card, 0 = CPU-only), GPUs, allowed models ('' = any), host memory MiB,
pods of that shape in the list (the popularity, renormalised on use).
Regenerate with ``typical_workload(load_pods(<openb default>), with_memory=True)``.

Invariants: data only (imports only the maths of :mod:`.fragmentation`);
``DEFAULT_WORKLOAD`` is normalised (popularities sum to 1, most popular first)
and never changes at run time, so policies built on it share one memo key.
"""

from __future__ import annotations

from orchestrator.scheduling.fragmentation import TaskType, Workload, normalise_workload

_OPENB_DEFAULT_TYPICAL = (
    # cpu_milli, gpu_milli, gpu_count, models, memory_mib, pods
    (3152, 810, 1, "", 5600, 1047),
    (11300, 1000, 1, "", 49152, 874),
    (11400, 1000, 1, "", 77824, 599),
    (3152, 1000, 1, "", 5600, 470),
    (11908, 470, 1, "", 47104, 388),
    (12500, 0, 0, "", 65536, 366),
    (8000, 470, 1, "", 30517, 360),
    (12000, 1000, 1, "", 49152, 326),
    (32000, 0, 0, "", 65536, 290),
    (18708, 1000, 1, "", 64512, 255),
    (11908, 650, 1, "", 47104, 237),
    (4000, 320, 1, "", 30517, 232),
    (9810, 1000, 1, "", 41560, 195),
    (8000, 0, 0, "", 62500, 185),
    (8000, 1000, 1, "", 65536, 164),
    (4000, 1000, 1, "", 32768, 159),
    (15700, 1000, 1, "", 58368, 158),
    (11908, 1000, 1, "", 47104, 153),
    (16000, 1000, 1, "", 65536, 150),
    (4000, 230, 1, "", 30517, 122),
    (15400, 0, 0, "", 51200, 120),
    (6000, 460, 1, "", 23552, 120),
    (16500, 0, 0, "", 51200, 95),
    (14200, 1000, 1, "", 58368, 93),
    (24200, 1000, 1, "", 93184, 84),
    (3152, 590, 1, "", 5600, 75),
    (8000, 320, 1, "", 30517, 72),
    (4152, 550, 1, "", 10600, 72),
    (11900, 1000, 1, "", 77824, 55),
    (4000, 160, 1, "", 22888, 54),
    (4152, 370, 1, "", 10600, 45),
    (4000, 220, 1, "", 30517, 43),
    (8200, 1000, 1, "", 33792, 41),
    (15200, 1000, 1, "", 80896, 36),
    (4152, 810, 1, "", 10600, 31),
)

DEFAULT_WORKLOAD: Workload = normalise_workload(
    (TaskType(cpu, milli, count, tuple(m for m in models.split("|") if m), mem), pods)
    for cpu, milli, count, models, mem, pods in _OPENB_DEFAULT_TYPICAL
)
