"""Refusals before queueing: a submission that can never run is refused at once, naming the field.

Pure checks over the config and the cluster snapshot's static part; invariant:
a request refused here could never be placed on this cluster, whatever runs on
it and whichever GPUs are unhealthy now (no refusal for what is only busy),
and -- for the fields below -- a request the engine could place on the empty
cluster is never refused (a property test checks both against the engine).
What they catch, each naming the field and the largest that exists:

* ``gpu.node``: a node the cluster does not have;
* ``gpu.models``: allowed models none of the (pinned) nodes have;
* ``gpu.cpu_milli`` / ``gpu.host_memory_mib``: more than any node has;
* ``gpu.kind``: an MPS share or time-slice where every card has MIG on (or
  no model runs MPS);
* ``gpu.memory_mib``: more GPU memory than any card that could take the
  share has ("no GPU of the cluster has 200 GiB of memory; the largest has
  80 GiB (A100-80GB)");
* ``gpu.count`` / ``gpu.nvlink``: more whole cards than the largest node
  has, or than its largest NVLink island;
* ``gpu.profile``: a MIG profile that no MIG-enabled GPU in the cluster offers,
  or that fits none of them even empty (fixed layouts without it: the
  engine's one MIG fit check, :func:`~orchestrator.scheduling.gpufit.mig_fits`);
* ``priority`` / ``queue``: unknown names (the allowed ones are listed);
* everything :class:`~orchestrator.core.job.JobSpec` and
  :class:`~orchestrator.core.request.GpuRequest` validate on construction
  (SM share over 100%, negative or unparsable memory, an empty command).
"""

from __future__ import annotations

import numpy as np

from orchestrator.core.catalogue import MODEL_INDEX, MODEL_NAMES, gpu_model
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.priorities import PriorityClass, SchedulerConfig
from orchestrator.core.request import Alternative, GpuRequest, ShareKind
from orchestrator.scheduling.alternatives import resolve
from orchestrator.scheduling.candidates import mig_placements
from orchestrator.scheduling.snapshot import ClusterSnapshot, SnapshotStatic


def check_request(request: GpuRequest, snapshot: ClusterSnapshot) -> None:
    """Raise :class:`InvalidRequestError` when no node of the cluster could ever host ``request``."""
    err = never_fits(request, snapshot)
    if err is not None:
        raise err


def never_fits(request: GpuRequest, snapshot: ClusterSnapshot) -> InvalidRequestError | None:
    """Why no node of the cluster could ever host ``request``, even with nothing running; None if one could.

    A pure function of the request and the snapshot's static part (GPU health counts as
    recoverable), kept per snapshot family, so the scheduler may ask it for every waiting item.
    A cluster with no node yet refuses nothing: it is still starting."""
    st = snapshot.static
    if st.n == 0:
        return None
    memo: dict[GpuRequest, InvalidRequestError | None] = st.cache(("admission.never_fits",), dict)
    try:
        return memo[request]
    except KeyError:
        pass
    if len(memo) > 4096:  # distinct requests are few; a flood of odd ones must not grow it for ever
        memo.clear()
    out = memo[request] = _never_fits(request, st)
    return out


def _never_fits(request: GpuRequest, st: SnapshotStatic) -> InvalidRequestError | None:
    nodes = np.ones(st.n, dtype=bool)
    where = "the cluster"
    if request.node is not None:
        if request.node not in st.index:
            return InvalidRequestError("gpu.node", request.node, _listed(st.names),
                                       detail="no node of that name in the cluster")
        nodes[:] = False
        nodes[st.index[request.node]] = True
        where = f"the cluster's node {request.node}"
    if request.models:
        present = _models(st, nodes)
        nodes &= np.isin(st.model, [MODEL_INDEX[m] for m in request.models])
        if not nodes.any():
            return InvalidRequestError("gpu.models", "|".join(request.models), present or ["(no GPUs)"],
                                       detail=f"no node in {where} has these models")
        where += f" (models {'|'.join(request.models)})"
    for need, total, name, unit in ((request.cpu_milli, st.cpu_total, "gpu.cpu_milli", "milli-cores"),
                                    (request.host_memory_mib, st.mem_total, "gpu.host_memory_mib", "MiB")):
        if need:
            largest = int(total[nodes].max())
            if need > largest:
                return InvalidRequestError(name, need, f"at most {largest} {unit}",
                                           detail=f"no node in {where} has that much; the largest has {largest} {unit}")
            nodes &= total >= need
    if request.kind is ShareKind.WHOLE and request.count == 0:
        return None
    errors = [_alternative_never_fits(st, nodes, alt, where) for alt in resolve(request).alternatives]
    if any(e is None for e in errors):
        return None
    return errors[-1]  # the last alternative is the broadest (a whole card for a unified request)


def _alternative_never_fits(st: SnapshotStatic, nodes: np.ndarray, alt: Alternative, where: str) -> InvalidRequestError | None:
    """Why ``alt`` fits no empty card of ``nodes``; None when one would hold it."""
    cards = st.present & nodes[:, None]
    plain = cards & ~st.mig_enabled
    if alt.kind is ShareKind.MIG:
        return _mig_never_fits(st, nodes, alt, where)
    if alt.kind is ShareKind.MPS:
        plain = plain & st.mps_ok[:, None]
        if not plain.any():
            return InvalidRequestError("gpu.kind", "mps", "a kind some GPU here offers",
                                       detail=f"no GPU in {where} can take an MPS share "
                                       + ("(MIG is on)" if (cards & st.mps_ok[:, None]).any() else "(no model with MPS)"))
    elif not plain.any():
        return InvalidRequestError("gpu.kind", alt.kind.value, "mig", detail=f"every GPU in {where} has MIG on")
    memory = np.where(plain, st.gpu_memory[:, None], 0)
    if alt.memory_mib and alt.memory_mib > memory.max():
        i, j = np.unravel_index(int(np.argmax(memory)), memory.shape)
        largest = int(memory[i, j])
        return InvalidRequestError("gpu.memory_mib", alt.memory_mib, f"at most {largest} MiB",
                                   detail=f"no GPU in {where} has {mib_text(alt.memory_mib)} of memory; "
                                   f"the largest has {mib_text(largest)} ({MODEL_NAMES[st.model[i]]})")
    if alt.kind is not ShareKind.WHOLE or alt.count <= 1:
        return None
    if alt.memory_mib:
        plain = plain & (st.gpu_memory >= alt.memory_mib)[:, None]
    per_node = int(plain.sum(axis=1).max())
    if alt.count > per_node:
        return InvalidRequestError("gpu.count", alt.count, f"1 to {per_node}",
                                   detail=f"no node in {where} has {alt.count} whole cards; the largest has {per_node}")
    if alt.nvlink:
        islands = max(int(((st.island == k) & plain).sum(axis=1).max()) for k in range(st.g))
        if alt.count > islands:
            return InvalidRequestError("gpu.nvlink", True, f"false, or at most {islands} cards",
                                       detail=f"no NVLink island in {where} has {alt.count} cards; "
                                       f"the largest has {islands}")
    return None


def _mig_never_fits(st: SnapshotStatic, nodes: np.ndarray, alt: Alternative, where: str) -> InvalidRequestError | None:
    mig_models = {MODEL_NAMES[st.model[i]] for i in np.flatnonzero(nodes & st.mig_enabled.any(axis=1))}
    wanted = sorted({p for _, p in alt.profiles})
    offered = sorted({p.name for m in mig_models for p in gpu_model(m).mig_profiles})
    if not any(m in mig_models for m, _ in alt.profiles):
        return InvalidRequestError("gpu.profile", "|".join(wanted), offered or ["(no MIG-enabled GPU)"],
                                   detail=f"no MIG-enabled GPU in {where} offers this profile")
    empty = np.zeros((st.n, st.g), dtype=np.int16)
    if not mig_placements(st, np.arange(st.n), empty, empty, st.mig_enabled & st.present & nodes[:, None],
                          alt.profiles):
        fixed = sorted(p for p, bits in st.layout_bits.items() if (bits[nodes] != 0).any())
        return InvalidRequestError("gpu.profile", "|".join(wanted), fixed,
                                   detail=f"the MIG cards in {where} have fixed layouts without this profile")
    return None


def mib_text(mib: int) -> str:
    """``200 GiB``, ``999 TiB``, ``512 MiB``: a memory size as people read it."""
    for unit, size in (("TiB", 1 << 20), ("GiB", 1 << 10)):
        if mib >= size:
            return f"{mib / size:.4g} {unit}"
    return f"{mib} MiB"


def _models(st: SnapshotStatic, nodes: np.ndarray) -> list[str]:
    return sorted({MODEL_NAMES[m] for m in np.unique(st.model[nodes]) if m >= 0})


def _listed(names: tuple[str, ...], limit: int = 20) -> list[str]:
    shown = sorted(names)
    return shown if len(shown) <= limit else [*shown[:limit], f"... ({len(shown)} nodes)"]


def check_submission(request: GpuRequest, priority: str | None, queue: str | None, config: SchedulerConfig,
                     snapshot: ClusterSnapshot) -> tuple[str, PriorityClass]:
    """All refusals for a submission; returns the resolved (class name, class)."""
    name, cls = config.priority_class(priority)
    config.leaf_queue(queue)
    check_request(request, snapshot)
    return name, cls
