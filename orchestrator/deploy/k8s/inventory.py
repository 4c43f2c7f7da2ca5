"""GPU inventory of Kubernetes nodes from their labels, and its cross-check against the agents'.

On KubeRay the head reads each Node (RBAC: get/list/watch nodes, nothing
else) and turns the labels NVIDIA's GPU feature discovery (GFD) writes, plus
the allocatable resources the device plugin advertises, into the same
:class:`~orchestrator.core.inventory.NodeInventory` the agents report from
NVML. :func:`cross_check` then lists where the two disagree.

Labels read (GFD; device plugin for allocatable):

* ``nvidia.com/gpu.product``: the NVML name with spaces as dashes
  (``NVIDIA-A100-SXM4-80GB``); ``-SHARED`` appended on MPS / time-sliced
  nodes; ``-MIG-<profile>`` appended under the *single* MIG strategy;
* ``nvidia.com/gpu.count`` (physical GPUs), ``nvidia.com/gpu.memory`` (MiB);
* ``nvidia.com/mig.strategy``, ``nvidia.com/mig.config`` (the MIG manager's layout name);
* ``nvidia.com/gpu.sharing-strategy`` and ``nvidia.com/gpu.replicas``;
* allocatable ``nvidia.com/gpu`` and, under the *mixed* strategy, ``nvidia.com/mig-<profile>``.

What labels cannot say, and how it is filled in (so that the result passes
``NodeInventory``'s validators): GPU and MIG UUIDs are synthetic
(``k8s:<node>/gpu<i>``), and MIG devices are laid out on the node's MIG GPUs
at valid placements (largest first, GPU by GPU). :func:`cross_check`
therefore compares counts, models, memory and MIG profile counts, never
UUIDs or placements.

Matching a Kubernetes node to agents: an agent inventory belongs to the node
named by its ``orchestrator.io/k8s-node`` label, else by its ``name``. The
rendered pods pass the node name to the agents as ``ORCHESTRATOR_NODE_NAME``.
Several Ray pods can share one node (MPS, time-slicing, partial requests);
their GPUs are pooled by UUID, so a GPU two pods see counts once.

What the head does with it (:func:`compare_nodes` -> :class:`InventoryReport`):
one call per check, from the Node objects as the API returns them and the
agents' inventories; a node whose labels cannot be read becomes a
disagreement (field ``labels``), never an exception, so one odd node cannot
stop the check. The report gives the samples of the gauge
``orchestrator_inventory_disagreements{node, field, severity}`` (with a 0 for
every label set an earlier report had and this one lacks, so a resolved
disagreement drops to 0 instead of staying at its last value) and one line
per node for ``orchestrator nodes``.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Sequence

from orchestrator.core.catalogue import CATALOGUE, MIG_COMPUTE_SLICES, GpuModel, fill_mig, fit_mig
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.inventory import K8S_NODE_LABEL, GpuDevice, MigDevice, NodeInventory
from orchestrator.core.quantity import parse_quantity

PRODUCT = "nvidia.com/gpu.product"
COUNT = "nvidia.com/gpu.count"
MEMORY = "nvidia.com/gpu.memory"
MIG_STRATEGY = "nvidia.com/mig.strategy"
MIG_CONFIG = "nvidia.com/mig.config"
SHARING = "nvidia.com/gpu.sharing-strategy"
REPLICAS = "nvidia.com/gpu.replicas"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
NODE_NAME_LABEL = K8S_NODE_LABEL
SOURCE_LABEL = "orchestrator.io/inventory-source"

# Relative difference of per-GPU memory above which the two sides disagree
# (NVML reports slightly less than the marketing size; GFD reports NVML's).
MEMORY_TOLERANCE = 0.02


def _gfd_names() -> dict[str, GpuModel]:
    names: dict[str, GpuModel] = {}
    for m in CATALOGUE.values():
        for a in (m.name, *m.aliases):
            names[a.replace(" ", "-").lower()] = m
    return names


_GFD_NAMES = _gfd_names()
_MIG_SUFFIX = re.compile(r"-MIG-(?P<profile>\d+g\.\d+gb)$", re.IGNORECASE)


def resolve_product(product: str) -> tuple[GpuModel, str | None]:
    """The catalogue model of a ``nvidia.com/gpu.product`` value, and the MIG profile of the single strategy."""
    name = product.removesuffix("-SHARED")
    profile = None
    m = _MIG_SUFFIX.search(name)
    if m:
        profile, name = m.group("profile"), name[: m.start()]
    model = _GFD_NAMES.get(name.lower())
    if model is None:
        raise InvalidRequestError(
            f"label {PRODUCT}", product, sorted({a.replace(" ", "-") for m_ in CATALOGUE.values() for a in m_.aliases}),
            detail="a GPU the catalogue does not know",
        )
    return model, profile


def _int_label(labels: Mapping[str, str], key: str, node: str) -> int | None:
    v = labels.get(key)
    if v is None:
        return None
    try:
        return int(v)
    except ValueError:
        raise InvalidRequestError(f"node {node} label {key}", v, "an integer") from None


def _spread_mig(model: GpuModel, counts: Mapping[str, int], n_gpus: int, node: str) -> list[list[tuple[str, int]]]:
    """Lay ``counts`` (profile -> devices) out on ``n_gpus`` cards: per card ``[(profile, start)]``.

    Worst-fit decreasing: largest profiles first, each onto the card with the
    most free compute slices where it still fits. That spreads a uniform
    layout (the MIG manager's ``devices: all``) evenly, one card like the
    next. Raises when the counts cannot fit: labels that contradict the
    catalogue are a disagreement worth stopping on.
    """
    todo = sorted((p for p, n in counts.items() for _ in range(n)),
                  key=lambda p: (-model.profile(p).memory_slices, p))
    cards: list[list[str]] = [[] for _ in range(n_gpus)]
    left: list[str] = []
    for p in todo:
        fits = [i for i, c in enumerate(cards) if fit_mig(model, [*c, p]) is not None]
        if not fits:
            left.append(p)
            continue
        free = {i: MIG_COMPUTE_SLICES - sum(model.profile(q).compute_slices for q in cards[i]) for i in fits}
        cards[max(fits, key=lambda i: (free[i], -i))].append(p)
    todo = left
    if todo:
        raise InvalidRequestError(
            f"node {node} allocatable {MIG_RESOURCE_PREFIX}*", dict(counts),
            f"MIG devices that fit {n_gpus} {model.name} card(s)", detail=f"{len(todo)} device(s) left over",
        )
    return [list(fit_mig(model, c) or ()) for c in cards]


def node_inventory(node: Mapping[str, Any]) -> NodeInventory:
    """A Node object (as the API returns it, a dict) to a :class:`NodeInventory`.

    A node without GPU labels is an inventory without GPUs. Raises
    :class:`InvalidRequestError` naming the label when the labels contradict
    the catalogue (an unknown product, MIG devices that cannot fit).
    """
    meta = node.get("metadata") or {}
    name = meta["name"]
    labels: dict[str, str] = dict(meta.get("labels") or {})
    alloc: dict[str, Any] = dict((node.get("status") or {}).get("allocatable") or {})
    cpu_milli = round(parse_quantity(str(alloc.get("cpu", "0"))) * 1000)
    memory_mib = int(parse_quantity(str(alloc.get("memory", "0"))) // 2**20)
    out_labels = {**labels, SOURCE_LABEL: "kubernetes-labels"}
    base = {"name": name, "cpu_milli": cpu_milli, "memory_mib": memory_mib, "labels": out_labels}
    product = labels.get(PRODUCT)
    if not product:
        return NodeInventory(**base)

    model, single_profile = resolve_product(product)
    memory = _int_label(labels, MEMORY, name)
    count = _int_label(labels, COUNT, name) or 0
    mig_counts = {k.removeprefix(MIG_RESOURCE_PREFIX): int(v) for k, v in alloc.items()
                  if k.startswith(MIG_RESOURCE_PREFIX) and int(v) > 0}
    replicas = max(1, _int_label(labels, REPLICAS, name) or 1)
    if single_profile:
        # Single strategy: every GPU is sliced alike and gpu.count counts MIG devices.
        per_card = len(fill_mig(model, single_profile))
        mig_counts = {single_profile: count}
        n_mig, n_whole, memory = math.ceil(count / per_card), 0, None
    else:
        whole_alloc = int(alloc.get(GPU_RESOURCE, 0) or 0)
        n_whole = min(count, whole_alloc // replicas) if mig_counts else count
        n_mig = count - n_whole if mig_counts else 0
    layout = _spread_mig(model, mig_counts, n_mig, name) if mig_counts else []
    gpus = []
    for i in range(n_mig + n_whole):
        mig = i < n_mig
        devices = tuple(MigDevice(uuid=f"k8s:{name}/gpu{i}/{p}@{s}", profile=p, start=s)
                        for p, s in (layout[i] if mig else []))
        gpus.append(GpuDevice(index=i, uuid=f"k8s:{name}/gpu{i}", model=model.name, memory_mib=memory,
                              mig_enabled=mig, mig_devices=devices))
    return NodeInventory(**base, gpus=tuple(gpus))


Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Disagreement:
    """One fact on which a node's labels and its agents differ, and why that matters.

    ``error``: the two cannot both be right (another model, more GPUs than
    the node has, a MIG layout other than the labelled one); the head should
    trust NVML and an admin should look. ``warning``: expected in some
    setups but worth seeing (Ray pods hold fewer GPUs than the node has).
    """

    node: str
    field: str
    kubernetes: str
    agents: str
    severity: Severity
    reason: str

    @property
    def message(self) -> str:
        return (f"{self.severity}: node {self.node}: {self.field}: Kubernetes labels say {self.kubernetes}, "
                f"agents report {self.agents}: {self.reason}")

    def to_dict(self) -> dict[str, str]:
        return {"node": self.node, "field": self.field, "kubernetes": self.kubernetes, "agents": self.agents,
                "severity": self.severity, "reason": self.reason}


@dataclass(frozen=True)
class _Facts:
    models: frozenset[str]
    gpus: int
    memory_mib: frozenset[int]
    mig: Counter[str]
    mig_gpus: int


def _facts(invs: Iterable[NodeInventory]) -> _Facts:
    gpus: dict[str, GpuDevice] = {}
    migs: dict[str, str] = {}
    for inv in invs:
        for g in inv.gpus:
            gpus.setdefault(g.uuid, g)
            for d in g.mig_devices:
                migs.setdefault(d.uuid, d.profile)
    return _Facts(
        models=frozenset(g.model for g in gpus.values()),
        gpus=len(gpus),
        memory_mib=frozenset(g.total_memory_mib for g in gpus.values()),
        mig=Counter(migs.values()),
        mig_gpus=sum(1 for g in gpus.values() if g.mig_enabled),
    )


def agent_node_name(inv: NodeInventory) -> str:
    return inv.labels.get(NODE_NAME_LABEL) or inv.name


def _fmt_mig(c: Counter[str]) -> str:
    return ", ".join(f"{n}x {p}" for p, n in sorted(c.items())) or "none"


def cross_check(k8s: Iterable[NodeInventory], agents: Iterable[NodeInventory]) -> list[Disagreement]:
    """Every disagreement between nodes' labels and their agents, sorted by (node, field).

    Pure: no I/O, deterministic, and an empty list when the two agree.
    """
    by_node: dict[str, list[NodeInventory]] = {}
    for inv in agents:
        by_node.setdefault(agent_node_name(inv), []).append(inv)
    labelled = {inv.name: inv for inv in k8s}
    out: list[Disagreement] = []

    def add(node: str, fld: str, kube: Any, agent: Any, severity: Severity, reason: str) -> None:
        out.append(Disagreement(node, fld, str(kube), str(agent), severity, reason))

    for node in sorted(set(by_node) - set(labelled)):
        add(node, "node", "no such node", f"{len(by_node[node])} agent(s)", "error",
            "an agent names a node Kubernetes does not list; check ORCHESTRATOR_NODE_NAME reaches the agent")
    for node, kinv in sorted(labelled.items()):
        k = _facts([kinv])
        if node not in by_node:
            if k.gpus:
                add(node, "agents", f"{k.gpus} GPU(s)", "none", "warning",
                    "no agent on this GPU node: no Ray worker pod of this cluster is scheduled there")
            continue
        a = _facts(by_node[node])
        if k.models and a.models and k.models != a.models:
            add(node, "gpu.model", "/".join(sorted(k.models)), "/".join(sorted(a.models)), "error",
                "GPU feature discovery and NVML name different models; check the node's labels are current")
            continue  # counts of different models do not compare
        if a.gpus > k.gpus:
            add(node, "gpu.count", k.gpus, a.gpus, "error", "agents see more GPUs than the node's labels count")
        elif a.gpus < k.gpus:
            add(node, "gpu.count", k.gpus, a.gpus, "warning",
                "Ray pods of this cluster hold fewer GPUs than the node has (other pods, or partial requests)")
        if k.memory_mib and a.memory_mib:
            km, am = max(k.memory_mib), max(a.memory_mib)
            if abs(km - am) > MEMORY_TOLERANCE * km:
                add(node, "gpu.memory", f"{km} MiB", f"{am} MiB", "warning",
                    f"per-GPU memory differs by more than {MEMORY_TOLERANCE:.0%}")
        over = {p: n for p, n in a.mig.items() if n > k.mig.get(p, 0)}
        if over:
            add(node, "mig", _fmt_mig(k.mig), _fmt_mig(a.mig), "error",
                "agents see MIG devices the device plugin does not advertise; the MIG layout changed under it")
        elif a.mig != k.mig and a.mig_gpus >= k.mig_gpus and a.gpus >= k.gpus:
            add(node, "mig", _fmt_mig(k.mig), _fmt_mig(a.mig), "error",
                f"agents cover every GPU but see another MIG layout than {kinv.labels.get(MIG_CONFIG, 'the labels')}")
    return sorted(out, key=lambda d: (d.node, d.field))


#: The head's gauge of disagreements, and its labels in the order :meth:`InventoryReport.samples` keys them.
METRIC = "orchestrator_inventory_disagreements"
METRIC_LABELS: tuple[str, str, str] = ("node", "field", "severity")
MetricKey = tuple[str, str, str]


@dataclass(frozen=True)
class InventoryReport:
    """One cross-check: the disagreements (sorted by node, field) and the Kubernetes nodes it read."""

    disagreements: tuple[Disagreement, ...]
    nodes: tuple[str, ...]

    @property
    def errors(self) -> int:
        return sum(1 for d in self.disagreements if d.severity == "error")

    def samples(self, previous: Iterable[MetricKey] = ()) -> dict[MetricKey, int]:
        """Gauge values by (node, field, severity): how many disagreements of each; 0 for a key only
        ``previous`` (the last report's keys) has, so the head can set every key it ever set."""
        out: dict[MetricKey, int] = {tuple(k): 0 for k in previous}  # type: ignore[misc]
        for d in self.disagreements:
            key = (d.node, d.field, d.severity)
            out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items()))

    def by_node(self) -> dict[str, list[Disagreement]]:
        out: dict[str, list[Disagreement]] = {}
        for d in self.disagreements:
            out.setdefault(d.node, []).append(d)
        return out

    def node_line(self, node: str) -> str:
        """What ``orchestrator nodes`` shows for ``node``: its disagreements, errors first; '' when it agrees."""
        found = sorted(self.by_node().get(node, []), key=lambda d: (d.severity != "error", d.field))
        return "; ".join(f"{d.severity}: {d.field}: labels {d.kubernetes}, agents {d.agents}" for d in found)

    def to_dict(self) -> dict[str, Any]:
        """JSON for the wire (the head keeps the last one; ``orchestrator nodes --json`` shows it)."""
        return {"nodes": list(self.nodes), "disagreements": [d.to_dict() for d in self.disagreements]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "InventoryReport":
        return cls(tuple(Disagreement(**x) for x in d.get("disagreements", [])), tuple(d.get("nodes", [])))


def compare_nodes(node_objs: Sequence[Mapping[str, Any]], agents: Iterable[NodeInventory]) -> InventoryReport:
    """Cross-check Node objects (as the API lists them) against the agents' inventories.

    Pure and total: a node whose labels contradict the catalogue is reported as an ``error`` on field
    ``labels`` (with what :func:`node_inventory` said) and left out of the comparison, instead of raising.
    """
    k8s: list[NodeInventory] = []
    unreadable: list[Disagreement] = []
    for obj in node_objs:
        name = (obj.get("metadata") or {}).get("name", "?")
        try:
            k8s.append(node_inventory(obj))
        except InvalidRequestError as e:
            unreadable.append(Disagreement(name, "labels", str(e.value), "-", "error",
                                           f"labels the catalogue cannot read ({e.field}): fix the node's labels "
                                           "or add the model to the catalogue"))
    agents = list(agents)
    bad = {d.node for d in unreadable}
    # Agents of an unreadable node are not "on a node Kubernetes does not list": drop them from the check.
    checked = cross_check(k8s, [a for a in agents if agent_node_name(a) not in bad])
    names = tuple(sorted((obj.get("metadata") or {}).get("name", "?") for obj in node_objs))
    return InventoryReport(tuple(sorted([*checked, *unreadable], key=lambda d: (d.node, d.field))), names)
