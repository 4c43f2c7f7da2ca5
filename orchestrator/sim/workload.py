"""The workload distribution FGD measures fragmentation against, from a pod list.

The reference simulator's ``GetTypicalPods`` (``pkg/utils/frag.go``) counts pods
by shape ``(cpu_milli, gpu_milli, num_gpu, gpu_spec)``, sorts the shapes by
count (ties: the larger shape first), keeps the most frequent ones until they
cover ``coverage`` of all pods (the artifact runs with 95%, CPU-only pods
included) and renormalises their popularities to sum to 1. Host memory is not
part of the shape there; ``with_memory=True`` keeps each shape's largest
memory request so that a policy may check memory too.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from orchestrator.scheduling.fragmentation import TaskType, Workload
from orchestrator.sim.openb import PodTable


def pod_task_types(pods: PodTable) -> list[TaskType]:
    """The task type of every pod, in order (memory 0: the paper's shape)."""
    return [TaskType(int(c), int(m) if int(n) else 0, int(n), models)
            for c, m, n, models in zip(pods.cpu_milli, pods.gpu_milli, pods.num_gpu, pods.models)]


def typical_workload(pods: PodTable, coverage: float = 0.95, include_cpu_only: bool = True,
                     with_memory: bool = False) -> Workload:
    """The paper's *typical pods* of a pod list, as ``((TaskType, popularity), ...)``."""
    if not 0 < coverage <= 1:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    types = pod_task_types(pods)
    if not include_cpu_only:
        types = [t for t in types if t.gpu_count]
    if not types:
        raise ValueError("no pods to build a workload from")
    counts = Counter(types)
    # GetTypicalPods: sort.Reverse over (count, then PodResource.Less) -> most frequent, then largest, first.
    ordered = sorted(counts.items(), key=lambda kv: (kv[1], kv[0].cpu_milli, kv[0].gpu_milli,
                                                     kv[0].gpu_count, "|".join(kv[0].models)), reverse=True)
    total = len(types)
    kept: list[tuple[TaskType, int]] = []
    cum = 0
    for t, n in ordered:
        if cum >= coverage * total:
            break
        kept.append((t, n))
        cum += n
    if with_memory:
        mem = _max_memory_by_type(pods)
        kept = [(TaskType(t.cpu_milli, t.gpu_milli, t.gpu_count, t.models, mem[t]), n) for t, n in kept]
    return tuple((t, n / cum) for t, n in kept)


def _max_memory_by_type(pods: PodTable) -> dict[TaskType, int]:
    out: dict[TaskType, int] = {}
    for t, m in zip(pod_task_types(pods), np.asarray(pods.memory_mib)):
        out[t] = max(out.get(t, 0), int(m))
    return out
