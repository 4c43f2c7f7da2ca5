"""FGD and our ``default`` policy on the engine: the policies and their memo tables.

The fragmentation measure itself (task types, workloads, :class:`FragModel`,
the paper's score) is pure maths in :mod:`.fragmentation`; this module runs
it on the engine's contract (:mod:`.policy`).

The engine memoises ``gpu_score`` per interned GPU state, and a GPU state
does not include the node's free CPU and host memory -- but a task type that
lacks CPU turns the node's whole free GPU into a fragment, so FGD's score
depends on them. The two terms are therefore split:

* ``gpu_score`` ranks the slots (which GPU, which cards) of each state by
  the fragmentation increase with CPU and memory taken as plentiful
  (``slot_rank_only``: the engine keeps the best slot and counts it as 0,
  so it never breaks ties between nodes);
* ``node_score`` scores the slot the engine chose for each node's state
  exactly, with the node's free CPU and memory, as a gather from tables:
  ``frag = table[frag_state, level]`` before and after (:class:`~orchestrator.scheduling.frag_tables.FragTables`).

Invariants: a policy's tables live in the snapshot family's cache
(:meth:`~orchestrator.scheduling.snapshot.SnapshotStatic.cache`, key
``("fgd", policy.key)``) and hold only pure functions of their keys, so they
save work and never change an answer; a node's score is a pure function of
its GPU state, free CPU and free memory, so nodes in equal states score
equally (and ties go to the first node, as in the paper's simulator).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Iterable

import numpy as np

from orchestrator.core.catalogue import MODEL_NAMES
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.request import Alternative, GpuRequest
from orchestrator.scheduling.candidates import CandidateView
from orchestrator.scheduling.frag_tables import FragTables
from orchestrator.scheduling.fragmentation import FragModel, cpu_per_gpu_milli, normalise_workload, paper_score
from orchestrator.scheduling.policy import Capabilities, NodeContext, Policy
from orchestrator.scheduling.snapshot import ClusterSnapshot, SnapshotStatic
from orchestrator.scheduling.workloads import DEFAULT_WORKLOAD


class FgdPolicy(Policy):
    """FGD as the reference simulator runs it (``fgd_score.go``).

    Score of a node: ``int(sigmoid((frag_before - frag_after) / 1000) * 100)``,
    negated so that lower is better, with the integer truncation kept -- it
    makes the ties the reference simulator resolves by node order, and the
    paper's figures are reproduced only with it (``docs/trace-evaluation.md``).
    A sharing request takes the GPU with the best score (lowest index among
    equals); whole cards the engine's choice (the lowest free indices when
    there is no NVLink island to keep).

    ``workload`` is the target workload; empty means the built-in one
    (:data:`orchestrator.scheduling.workloads.DEFAULT_WORKLOAD`, openb's typical
    pods). ``quantize=False`` scores by the exact fragmentation increase;
    ``with_memory=True`` also requires a task type's host memory to fit.
    """

    name = "fgd"
    capabilities = Capabilities(node_context=True, slot_rank_only=True)

    def __init__(self, workload: Iterable[tuple[Any, float]] = (), *, quantize: bool = True,
                 with_memory: bool = False, **params: Any) -> None:
        workload = tuple(workload)
        if not workload:
            workload = DEFAULT_WORKLOAD
        wl = normalise_workload(workload)
        super().__init__(workload=wl, quantize=quantize, with_memory=with_memory, **params)
        self.workload = wl
        self.quantize = quantize
        self.frag_model = FragModel(wl, MODEL_NAMES, with_memory=with_memory)

    def delta_score(self, delta: np.ndarray) -> np.ndarray:
        """Lower-is-better score of a fragmentation increase (GPU-milli)."""
        return paper_score(delta) if self.quantize else np.asarray(delta, dtype=np.float64)

    # -- engine hooks ------------------------------------------------------------------------------
    def gpu_score(self, view: CandidateView, alt: Alternative) -> np.ndarray:
        if len(self.frag_model.model_names) != len(MODEL_NAMES):  # a generic model registered since
            self.frag_model = FragModel(self.workload, MODEL_NAMES, with_memory=self.frag_model.with_memory)
        fm, t = self.frag_model, self.tables(view.static)
        top = np.full(len(view.state), fm.top_level)
        free_after = view.free("after")
        view.memo["fgd_free_after"] = free_after
        total, supply = fm.supply(free_after, view.model)
        return self.delta_score(fm.combine(total, supply, top) - t.lookup(t.states(view.state), top))

    def remember_best(self, view: CandidateView, alt: Alternative, win: np.ndarray) -> None:
        """The engine's chosen candidate of each state: keep its frag state after ``alt``
        (only the winners are interned: most candidates are never looked at again)."""
        t = self.tables(view.static)
        t.after_table(alt)[view.state[win]] = t.intern(view.memo["fgd_free_after"][win], view.model[win])

    def node_score(self, snap: ClusterSnapshot, nodes: np.ndarray, alt: Alternative, req: GpuRequest,
                   ctx: NodeContext | None) -> np.ndarray:
        assert ctx is not None  # capabilities.node_context
        return self.delta_score(self.frag_increase(snap, nodes, alt, req, ctx))

    def explain(self, ctx: NodeContext, k: int) -> str:
        """The terms of candidate ``k``'s score, for the placement's reason."""
        terms = [f"fragmentation {ctx.memo['frag'][k]:+.0f} milli"]
        if "stranded" in ctx.memo:
            terms.append(f"CPU-stranded GPU {ctx.memo['stranded'][k]:+.0f} milli")
        if "scarce" in ctx.memo:
            terms.append(f"scarce-model GPU {ctx.memo['scarce'][k]:+.0f} milli")
        return ", ".join(terms)

    def frag_increase(self, snap: ClusterSnapshot, nodes: np.ndarray, alt: Alternative, req: GpuRequest,
                      ctx: NodeContext) -> np.ndarray:
        """(K,) how much each candidate node's fragmentation grows (GPU-milli) if it takes the request."""
        return self._frag_parts(snap, nodes, alt, req, ctx)[0]

    def _frag_parts(self, snap: ClusterSnapshot, nodes: np.ndarray, alt: Alternative, req: GpuRequest,
                    ctx: NodeContext) -> tuple[np.ndarray, np.ndarray]:
        """(fragmentation increase, frag state after) of each candidate node."""
        t = self.tables(ctx.static)
        before = t.current(snap)[nodes]
        f_after = t.states_after(alt, ctx.states, ctx.slots)
        after = t.lookup(f_after, t.levels(ctx.cpu_free - req.cpu_milli, ctx.mem_free - req.host_memory_mib))
        ctx.memo["frag"] = inc = after - before
        return inc, f_after

    def tables(self, st: SnapshotStatic) -> FragTables:
        """This policy's :class:`FragTables` for the snapshot family of ``st``."""
        # keyed by the model count too: tables belong to the frag model they were built with
        return st.cache(("fgd", self.key, len(self.frag_model.model_names)), lambda: FragTables(self.frag_model, st))


class DefaultPolicy(FgdPolicy):
    """Ours: FGD plus what its score does not see (host memory, CPU, scarce models and nodes).

    1. **Host memory** in the fit test: a task type whose memory does not fit
       the node counts like one whose CPU does not (``with_memory=True``).
    2. **CPU stranding.** FGD feels a node's CPU only once it drops below what
       some typical type asks, so it fills a GPU-dense node (8 cards, 96
       cores) with CPU-hungry pods and CPU-only pods until its last free
       cards can never be used -- and on openb host CPU is as scarce as GPUs
       (the cluster has 17 cores per GPU, its GPU pods ask 11 per GPU and its
       CPU-only pods 3 more). A node's *stranded* GPU is the free GPU-milli
       its free CPU cannot feed at the workload's own CPU-per-GPU rate ``r``
       (:func:`cpu_per_gpu_milli`)::

           stranded(node) = max(0, free_gpu_milli - free_cpu_milli / r)

       and the node's score is FGD's on ``frag_increase + strand_weight x
       stranded_increase`` (both GPU-milli), with FGD's integer truncation
       kept, so ties still go to the first node in order. The effect: CPU-only
       and CPU-heavy pods go to CPU-rich nodes (openb's T4 nodes: 52 cores per
       card), GPU-heavy nodes keep the CPU their cards need.
       ``strand_weight=0`` turns it off (then ``default`` is FGD with memory);
       it also fades where the workload asks more CPU per GPU than the
       cluster has (:meth:`strand_weight_on`).
    3. **Scarce models.** FGD's workload names the models its constrained
       types may use, but its score weighs a card of a model only constrained
       pods can use like any other, and the stranding term even prefers such
       cards when their nodes are CPU-rich (openb's T4: 52 cores per card) --
       so on lists where a fifth to two fifths of the GPU pods name a model,
       those pods found their models full from 50% arrival on. A model's
       *scarcity* ``s_m`` is the share of its GPUs the workload's constrained
       types expect to claim: their GPU demand share naming ``m`` (a type
       naming k models counts 1/k on each) over ``m``'s share of the cluster's
       GPUs, capped at 1 (:meth:`scarcity`). Taking ``g`` GPU-milli on a node
       of model ``m`` adds ``scarcity_weight x (s_m - s_min) x g`` to the
       increase, ``s_min`` the least scarcity among the models the request may
       use -- so a pod that may only use ``m`` pays nothing, and a workload
       with no constrained type (openb ``default``) scores exactly as before.
       ``scarcity_weight=0`` turns it off.
    4. **Host-scarce nodes** (the same cost, per node rather than per model).
       A GPU type whose CPU or memory only some of the nodes with its model and
       GPU count can hold (openb: an 8-GPU pod asking 120 cores fits only the
       39 G3 nodes of 128 cores among 617 eight-GPU nodes) claims those nodes
       beyond an even spread; its share of the GPU demand ``d`` adds
       ``d x (1 / share(feasible) - 1 / share(model and count fit))`` of GPU
       capacity to each feasible node's scarcity (:meth:`host_scarcity`). A
       node's scarcity is its model's plus this, capped at 1
       (:meth:`node_scarcity`), and the floor is the least scarcity among the
       nodes the request could ever use (:meth:`scarcity_floor`). CPU taken
       counts too: ``(host_n - host_floor) x cpu x`` the workload's GPU per CPU
       (a CPU-only pod on a G3 node takes cores the big pods need). Without it
       the stranding term sends CPU-hungry pods to exactly those CPU-rich
       nodes, and on ``multigpu20`` and lists with 30-50% multi-GPU demand the
       120-core 8-GPU pods failed from 70% arrival on. ``demand`` is the type
       distribution both scarcity terms read (default: ``workload``); the
       replay passes every shape of the pod list, because the typical pods
       (95% of pods by count) leave out the rare, big shapes that need these
       nodes.

    ``repack=True`` also asks the replay to move small shares when a GPU request
    fits nowhere (:mod:`orchestrator.sim.repack`); off by default, because on
    openb it finds room for ~3 pods a run at 2-4x the cost (``docs/trace-evaluation.md``).

    Invariant: like FGD, the score is a pure function of the node's GPU state,
    free CPU and free memory, so nodes in equal states score equally.
    """

    name = "default"

    def __init__(self, workload: Iterable[tuple[Any, float]] = (), *, strand_weight: float = 2.0,
                 scarcity_weight: float = 1.0, demand: Iterable[tuple[Any, float]] = (), repack: bool = False,
                 **params: Any) -> None:
        params.setdefault("with_memory", True)
        for name, w in (("strand_weight", strand_weight), ("scarcity_weight", scarcity_weight)):
            if not (math.isfinite(w) and w >= 0):
                raise InvalidRequestError(name, w, "a finite number >= 0")
        demand = tuple(demand)
        super().__init__(workload, strand_weight=strand_weight, scarcity_weight=scarcity_weight, repack=repack,
                         **({"demand": demand} if demand else {}), **params)
        self.capabilities = replace(FgdPolicy.capabilities, repack=repack)
        rate = cpu_per_gpu_milli(self.workload)
        self.strand_weight = float(strand_weight) if rate > 0 else 0.0
        self._gpu_per_cpu = 1.0 / rate if rate > 0 else 0.0
        self.scarcity_weight = float(scarcity_weight)
        # GPU demand of the workload's model-constrained types, per model (a type naming k models
        # counts 1/k on each), as a share of all its GPU demand.
        self.demand = normalise_workload(demand) if demand else self.workload
        gpu = sum(p * t.total_gpu_milli for t, p in self.demand if t.gpu_count)
        # (type, its share of the GPU demand) of every GPU type: what the host-scarcity term reads.
        self._gpu_demand = tuple((t, p * t.total_gpu_milli / gpu) for t, p in self.demand
                                 if t.gpu_count and gpu > 0)
        self._constrained: dict[str, float] = {}
        for t, p in self.workload:
            if t.gpu_count and t.models and gpu > 0:
                for m in t.models:
                    self._constrained[m] = self._constrained.get(m, 0.0) + p * t.total_gpu_milli / gpu / len(t.models)

    def scarcity(self, st: SnapshotStatic) -> tuple[np.ndarray, float]:
        """(M,) per model index: the share of that model's GPUs the workload's constrained types
        expect to claim (their demand share over the model's capacity share), capped at 1 --
        models the workload never names score 0 -- and the least of it over the cluster's models."""
        def build() -> tuple[np.ndarray, float]:
            out = np.zeros(len(MODEL_NAMES))
            gpu_nodes = st.model >= 0
            cap = np.bincount(st.model[gpu_nodes], weights=st.present[gpu_nodes].sum(1), minlength=len(MODEL_NAMES))
            total = cap.sum()
            for m, share in self._constrained.items():
                k = MODEL_NAMES.index(m) if m in MODEL_NAMES else -1
                if k >= 0 and cap[k] > 0:
                    out[k] = min(1.0, share / (cap[k] / total))
            return out, float(out[cap > 0].min()) if (cap > 0).any() else 0.0
        return st.cache(("fgd", self.key, "scarcity", len(MODEL_NAMES)), build)

    def host_scarcity(self, st: SnapshotStatic) -> np.ndarray:
        """(N,) per node: the share of its GPUs that GPU types shut out of other nodes by their host
        CPU or memory expect to claim, summed over those types, capped at 1 (0 on CPU-only nodes).

        A type's *feasible nodes* are those of a model it may use, with at least its GPU count,
        CPU and memory in all; it is *host-bound* when its CPU or memory rules out some node that
        has its model and GPU count (openb: an 8-GPU pod asking 120 cores fits only the 39 G3
        nodes of 128 cores, of 617 eight-GPU nodes). Its pressure on each feasible node is its
        share of the GPU demand (of ``demand``) over the feasible nodes' share of the GPUs."""
        def build() -> np.ndarray:
            gpu_nodes = st.model >= 0
            gpus = np.where(gpu_nodes, st.present.sum(1), 0).astype(np.float64)
            total = gpus.sum()
            out = np.zeros(st.n)
            if total <= 0:
                return out
            for t, d in self._gpu_demand:
                fits = self._model_and_count_fit(st, t.models, t.gpu_count)
                feasible = fits & (st.cpu_total >= t.cpu_milli) & (st.mem_total >= t.memory_mib)
                if not feasible.any() or (feasible == fits).all():
                    continue
                # only what the host constraint adds: the type's claim on its feasible nodes beyond
                # the claim it would spread over every node with its model and GPU count
                out[feasible] += d * total * (1.0 / gpus[feasible].sum() - 1.0 / gpus[fits].sum())
            # It offsets the stranding term's pull towards CPU-rich nodes, so it fades with that term:
            # where the workload out-asks the cluster's CPU (openb x2 CPU asks) both are off and FGD's
            # own fit test (a type whose CPU does not fit makes the node's free GPU a fragment) decides.
            fade = self.strand_weight_on(st) / self.strand_weight if self.strand_weight else 1.0
            return np.minimum(out * fade, 1.0)
        return st.cache(("fgd", self.key, "host_scarcity", len(MODEL_NAMES)), build)

    @staticmethod
    def _model_and_count_fit(st: SnapshotStatic, models: tuple[str, ...], count: int) -> np.ndarray:
        """(N,) GPU nodes of a model in ``models`` (any when empty) with at least ``count`` GPUs."""
        ok = (st.model >= 0) & (st.present.sum(1) >= count)
        if models:
            idx = [MODEL_NAMES.index(m) for m in models if m in MODEL_NAMES]
            ok &= np.isin(st.model, idx)
        return ok

    def node_scarcity(self, st: SnapshotStatic) -> np.ndarray:
        """(N,) per node: its model's scarcity (:meth:`scarcity`) plus its host scarcity
        (:meth:`host_scarcity`), capped at 1; 0 on CPU-only nodes."""
        def build() -> np.ndarray:
            sc, _ = self.scarcity(st)
            model_sc = np.where(st.model >= 0, sc[np.maximum(st.model, 0).astype(np.int64)], 0.0)
            return np.minimum(model_sc + self.host_scarcity(st), 1.0)
        return st.cache(("fgd", self.key, "node_scarcity", len(MODEL_NAMES)), build)

    def scarcity_floor(self, st: SnapshotStatic, req: GpuRequest) -> float:
        """The least :meth:`node_scarcity` among the nodes whose model, GPU count, CPU and memory
        could ever hold ``req`` (0 when none could): what the request pays nothing for."""
        def build() -> dict:
            return {}
        memo = st.cache(("fgd", self.key, "scarcity_floor", len(MODEL_NAMES)), build)
        # Read from the request itself (any sharing kind: MIG and MPS requests too).
        key = (tuple(req.models), int(req.count) if req.count is not None else 1, int(req.cpu_milli),
               int(req.host_memory_mib or 0))
        got = memo.get(key)
        if got is None:
            models, count, cpu, mem = key
            ok = (self._model_and_count_fit(st, models, count) & (st.cpu_total >= cpu) & (st.mem_total >= mem))
            got = memo[key] = ((float(self.node_scarcity(st)[ok].min()), float(self.host_scarcity(st)[ok].min()))
                               if ok.any() else (0.0, 0.0))
        return got[0]

    def host_floor(self, st: SnapshotStatic, req: GpuRequest) -> float:
        """The least :meth:`host_scarcity` among the nodes that could ever hold ``req``."""
        self.scarcity_floor(st, req)
        key = (tuple(req.models), int(req.count) if req.count is not None else 1, int(req.cpu_milli),
               int(req.host_memory_mib or 0))
        return st.cache(("fgd", self.key, "scarcity_floor", len(MODEL_NAMES)), dict)[key][1]

    def strand_weight_on(self, st: SnapshotStatic) -> float:
        """The stranding term's weight on a cluster: ``strand_weight x clip(2 (c / r - 1), 0, 1)``,
        ``c`` the cluster's CPU per GPU-milli over its GPU nodes and ``r`` the workload's rate.

        Where the workload asks as much CPU per GPU as the cluster has, or more, every node
        strands and the term only spreads load: on openb ``default`` with CPU asks x2 (c / r =
        0.80) it trails FGD by 0.3-0.4 points from 70% arrival at weight 2 and at 0.5, and x3
        (0.54) by 0.54 at weight 2 -- so it is off there (``default`` is FGD with memory). On
        every openb list c / r is 1.57-1.63 and the weight stays ``strand_weight``; between 1
        and 1.5 it ramps (not measured there)."""
        def build() -> float:
            gpus = float(st.present[st.model >= 0].sum()) * 1000
            cpu = float(st.cpu_total[st.model >= 0].sum())
            if gpus <= 0 or self._gpu_per_cpu <= 0:
                return self.strand_weight
            return self.strand_weight * min(1.0, max(0.0, 2.0 * (cpu / gpus * self._gpu_per_cpu - 1.0)))
        return st.cache(("fgd", self.key, "strand_weight"), build)

    def _scarce_any(self, st: SnapshotStatic) -> bool:
        return bool(st.cache(("fgd", self.key, "scarce_any", len(MODEL_NAMES)),
                             lambda: bool(self.node_scarcity(st).any())))

    def stranded(self, free_gpu_milli: np.ndarray, free_cpu_milli: np.ndarray) -> np.ndarray:
        """GPU-milli the free CPU cannot feed at the workload's CPU-per-GPU rate (>= 0)."""
        return np.maximum(free_gpu_milli - free_cpu_milli * self._gpu_per_cpu, 0.0)

    def frag_increase(self, snap: ClusterSnapshot, nodes: np.ndarray, alt: Alternative, req: GpuRequest,
                      ctx: NodeContext) -> np.ndarray:
        inc, f_after = self._frag_parts(snap, nodes, alt, req, ctx)
        if not self.strand_weight and not (self.scarcity_weight and (self._constrained or self._gpu_demand)):
            return inc
        t = self.tables(ctx.static)
        gpu_before = t.total[t.states(ctx.states)]
        gpu_after = t.total[f_after]
        if self.strand_weight:
            ctx.memo["stranded"] = grow = (self.stranded(gpu_after, ctx.cpu_free - req.cpu_milli)
                                           - self.stranded(gpu_before, ctx.cpu_free))
            inc = inc + self.strand_weight_on(ctx.static) * grow
        if self.scarcity_weight and self._scarce_any(ctx.static):
            # GPU-milli taken from nodes that constrained pods need, beyond the least scarce node this
            # request could use: a T4-only pod pays nothing for T4, an any-model pod pays for taking T4.
            node_sc = self.node_scarcity(ctx.static)[nodes]
            floor = self.scarcity_floor(ctx.static, req)
            cost = (node_sc - floor) * (gpu_before - gpu_after)
            if req.cpu_milli and self._gpu_per_cpu:
                # CPU taken from a host-scarce node, in the GPU-milli it would feed at the workload's rate:
                # a CPU-only pod on a G3 node takes what the 120-core 8-GPU pods need as surely as a GPU pod.
                host = self.host_scarcity(ctx.static)[nodes] - self.host_floor(ctx.static, req)
                cost = cost + np.maximum(host, 0.0) * req.cpu_milli * self._gpu_per_cpu
            ctx.memo["scarce"] = cost
            inc = inc + self.scarcity_weight * cost
        # Rounded like FragModel.combine, so equal states compare equal however they were reached.
        return np.round(inc, 6)
