"""Refusals before queueing: a submission that can never run is refused at once, naming the field.

Pure checks over the config and the cluster snapshot. What they catch (and the
field each names):

* ``gpu.profile``: a MIG profile that no MIG-enabled GPU in the cluster offers;
* ``gpu.models``: allowed models none of the cluster's nodes have;
* ``gpu.count``: more whole cards than the largest node has;
* ``priority`` / ``queue``: unknown names (the allowed ones are listed);
* everything :class:`~orchestrator.core.job.JobSpec` and
  :class:`~orchestrator.core.request.GpuRequest` validate on construction
  (SM share over 100%, negative or unparsable memory, an empty command).
"""

from __future__ import annotations

import numpy as np

from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.catalogue import MODEL_NAMES, gpu_model
from orchestrator.core.request import GpuRequest, ShareKind
from orchestrator.scheduling.snapshot import ClusterSnapshot
from orchestrator.core.priorities import PriorityClass, SchedulerConfig


def check_request(request: GpuRequest, snapshot: ClusterSnapshot) -> None:
    """Raise :class:`InvalidRequestError` when no node of the cluster could ever host ``request``."""
    st = snapshot.static
    models_present = {MODEL_NAMES[m] for m in np.unique(st.model) if m >= 0}
    mig_models = {MODEL_NAMES[st.model[i]] for i in range(st.n) if st.mig_enabled[i].any()}
    if request.models and not set(request.models) & models_present:
        raise InvalidRequestError("gpu.models", "|".join(request.models), sorted(models_present) or ["(no GPUs)"],
                                  detail="no node of the cluster has these models")
    if request.kind is ShareKind.MIG:
        offered = sorted({p.name for m in mig_models for p in gpu_model(m).mig_profiles})
        fixed = {p for p, bits in st.layout_bits.items() if bits.any()}
        ok = any(request.profile in [p.name for p in gpu_model(m).mig_profiles] for m in mig_models)
        if not ok:
            raise InvalidRequestError("gpu.profile", request.profile, offered or ["(no MIG-enabled GPU in the cluster)"],
                                      detail="no MIG-enabled GPU in the cluster offers this profile")
        on_demand = bool((st.mig_enabled & ~st.mig_fixed).any())
        if not on_demand and request.profile not in fixed:
            raise InvalidRequestError("gpu.profile", request.profile, sorted(fixed),
                                      detail="the cluster's MIG cards have fixed layouts without this profile")
    if request.kind is ShareKind.WHOLE and request.count > int(st.present.sum(axis=1).max(initial=0)):
        raise InvalidRequestError("gpu.count", request.count, f"1..{int(st.present.sum(axis=1).max(initial=0))}",
                                  detail="more cards than any node has")


def check_submission(request: GpuRequest, priority: str | None, queue: str | None, config: SchedulerConfig,
                     snapshot: ClusterSnapshot) -> tuple[str, PriorityClass]:
    """All refusals for a submission; returns the resolved (class name, class)."""
    name, cls = config.priority_class(priority)
    config.queue(queue)
    check_request(request, snapshot)
    return name, cls
