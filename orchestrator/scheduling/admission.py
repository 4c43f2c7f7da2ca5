"""Refusals before queueing: a submission that can never run is refused at once, naming the field.

Pure checks over the config and the cluster snapshot; invariant: a request
refused here could never be placed on this cluster, whatever runs on it (no
refusal for what is only busy now). What they catch (and the field each names):

* ``gpu.profile``: a MIG profile that no MIG-enabled GPU in the cluster offers,
  or that fits none of them even empty (fixed layouts without it: the
  engine's one MIG fit check, :func:`~orchestrator.scheduling.gpufit.mig_fits`);
* ``gpu.models``: allowed models none of the cluster's nodes have;
* ``gpu.count``: more whole cards than the largest node has;
* ``priority`` / ``queue``: unknown names (the allowed ones are listed);
* everything :class:`~orchestrator.core.job.JobSpec` and
  :class:`~orchestrator.core.request.GpuRequest` validate on construction
  (SM share over 100%, negative or unparsable memory, an empty command).
"""

from __future__ import annotations

import numpy as np

from orchestrator.core.catalogue import MODEL_NAMES, gpu_model
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.priorities import PriorityClass, SchedulerConfig
from orchestrator.core.request import GpuRequest, ShareKind, resolve
from orchestrator.scheduling.candidates import mig_placements
from orchestrator.scheduling.snapshot import ClusterSnapshot


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
        if request.profile not in offered:
            raise InvalidRequestError("gpu.profile", request.profile, offered or ["(no MIG-enabled GPU in the cluster)"],
                                      detail="no MIG-enabled GPU in the cluster offers this profile")
        if not _mig_could_fit(snapshot, request):
            fixed = sorted(p for p, bits in st.layout_bits.items() if bits.any())
            raise InvalidRequestError("gpu.profile", request.profile, fixed,
                                      detail="the cluster's MIG cards have fixed layouts without this profile")
    if request.kind is ShareKind.WHOLE and request.count > int(st.present.sum(axis=1).max(initial=0)):
        raise InvalidRequestError("gpu.count", request.count, f"1..{int(st.present.sum(axis=1).max(initial=0))}",
                                  detail="more cards than any node has")


def _mig_could_fit(snapshot: ClusterSnapshot, request: GpuRequest) -> bool:
    """Whether the MIG slice fits some MIG-enabled card of the cluster once it is empty (the engine's
    own MIG fit check, on no usage): its model offers the profile, and its layout, if fixed, has it."""
    st = snapshot.static
    nodes = np.arange(st.n)
    empty = np.zeros((st.n, st.g), dtype=np.int16)
    profiles = resolve(request).alternatives[0].profiles
    return bool(mig_placements(st, nodes, empty, empty, st.mig_enabled & st.present, profiles))


def check_submission(request: GpuRequest, priority: str | None, queue: str | None, config: SchedulerConfig,
                     snapshot: ClusterSnapshot) -> tuple[str, PriorityClass]:
    """All refusals for a submission; returns the resolved (class name, class)."""
    name, cls = config.priority_class(priority)
    config.queue(queue)
    check_request(request, snapshot)
    return name, cls
