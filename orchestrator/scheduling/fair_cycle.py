"""What the queue tree adds to one scheduling cycle (:func:`~.cycle.schedule`), pure.

* **Fair share** (``fairness.enabled``): every queue's share is computed once at the start of the cycle
  (:func:`~.fairshare.compute` over what queues hold and ask), pending items of one effective priority go
  in the order of their queues' standing (furthest below fair share first, then least decayed usage), a
  queue's quota for the cycle is ``max(guarantee, fair share)`` -- so a queue below its fair share may
  preempt for it although it is above its guarantee -- and the preemption planner may take leases of
  equal priority from queues above their share (:func:`~.fairshare.reclaim_block`), at most
  ``max_reclaims_per_cycle`` of them a cycle.
* **Limits** (any queue with ``limit_gpus``, fairness on or off): an alternative that would take the queue,
  or any queue above it, beyond its limit is not granted, borrowed or preempted for (cause ``wait.limit``).
* **Reservations** (``fairness.starvation_bound_s``): the first request in queue order that has waited
  longer than the bound -- with fairness on, of a queue below its fair share -- and still cannot be placed
  or preempted for reserves the nodes where it fits
  soonest -- the fewest nodes, fewest GPUs held on them first, whose holders all ending would make room for
  it (:meth:`FairCycle.reserve`). For the rest of the cycle later items see those nodes as full
  (:meth:`FairCycle.view`) unless they may **backfill**: their class is preemptible and their priority is
  below the reserving request's, so it can take the nodes back by preemption when their other holders end.
  The reservation is recomputed each cycle from the same state, so it stays where it was while nothing
  changes, and ends when the request is placed. Its holders of no higher priority are then preempted
  through the checkpoint path, the fewest that make room (:meth:`FairCycle.clear`, ``victim.reservation``):
  a reservation alone waits for its nodes' work to end, which may be hours.

Invariants: without a fairness section, limits and a bound the cycle behaves exactly as before (this module
returns the config's quotas, no order key, no view); a view is never granted on directly -- the cycle places
on the view and applies the allocation to its real working snapshot, which the view is a restriction of.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from orchestrator.core.errors import CapacityError, InvalidRequestError
from orchestrator.core.lease import Lease, LeaseState
from orchestrator.core.priorities import QueueConfig, SchedulerConfig
from orchestrator.core.reasons import Cause, Reason
from orchestrator.scheduling.fairshare import (
    FairShares, QueueTree, Resources, ZERO, compute, usage_by_queue,
)
from orchestrator.scheduling.preemption import Victim, preemption_cost_gpu_s, work_lost_gpu_s
from orchestrator.scheduling.snapshot import ClusterSnapshot

if TYPE_CHECKING:  # the cycle imports this module; its item type is only named here
    from orchestrator.scheduling.cycle import PendingItem

_EPS = 1e-9
#: A reservation takes at most this many nodes (a gang of whole cards spans several).
MAX_RESERVED_NODES = 16


def capacity_of(snapshot: ClusterSnapshot) -> Resources:
    """The cluster's GPUs, host CPU and host memory (what dominant shares are fractions of)."""
    st = snapshot.static
    return Resources(snapshot.capacity_milli() / 1000.0, float(st.cpu_total.sum()), float(st.mem_total.sum()))


def item_resources(item: "PendingItem") -> Resources:
    return Resources(item.demand, float(item.request.cpu_milli), float(item.request.host_memory_mib))


@dataclass(slots=True)
class FairCycle:
    """The cycle's fair shares, limits and reservation; see the module docstring."""

    config: SchedulerConfig
    tree: QueueTree
    shares: FairShares | None = None
    reclaims_left: int = 0
    limited: bool = False
    reserved: tuple[str, ...] = ()
    reserver: "PendingItem | None" = None
    _view: ClusterSnapshot | None = field(default=None, repr=False)
    _view_of: ClusterSnapshot | None = field(default=None, repr=False)

    @classmethod
    def start(cls, config: SchedulerConfig, snapshot: ClusterSnapshot, pending: Sequence["PendingItem"],
              holding: Sequence[Lease], decayed: Mapping[str, float] | None,
              in_flight: frozenset[str] = frozenset()) -> "FairCycle":
        """The cycle's state; fair shares only when fairness is on (reading ``holding`` only then). A lease
        being preempted (``in_flight``, or checkpointing) still asks for what it holds but no longer counts as
        its queue's: it is leaving, and the item it leaves for counts when the cycle reaches it (nominated) --
        else every cycle of a grace period would see the victim's queue still above its share and reclaim
        again, and the shares would swing past fair and back."""
        fc = cls(config, QueueTree.of(config), limited=any(q.limit_gpus is not None for q in config.queues.values()))
        if config.fairness.enabled:
            staying = [lease for lease in holding
                       if lease.lease_id not in in_flight and lease.state is not LeaseState.CHECKPOINTING]
            used = usage_by_queue(staying)
            asked = usage_by_queue(holding)
            for item in pending:
                asked[item.queue] = asked.get(item.queue, ZERO) + item_resources(item)
            fc.shares = compute(config, capacity_of(snapshot), used, asked, decayed)
            fc.reclaims_left = config.fairness.max_reclaims_per_cycle if config.fairness.reclaim else 0
        return fc

    # ---- fair share ------------------------------------------------------------------------------
    def order_key(self, queue: str) -> tuple[float, ...]:
        return self.shares.order_key(queue) if self.shares is not None else ()

    def quota(self, queue: str, q: QueueConfig | None) -> float | None:
        """The queue's quota this cycle: its guarantee, raised to its fair share when fairness is on."""
        base = q.quota_gpus if q is not None else None
        if self.shares is None or base is None:
            return base
        return max(base, self.shares.fair_gpus(queue))

    def plans_fair(self) -> FairShares | None:
        """The shares the preemption planner may reclaim by; None once this cycle's reclaims are spent."""
        return self.shares if self.reclaims_left > 0 else None

    def granted(self, queue: str, gpus: float) -> None:
        """A grant (or the room a plan frees for an item) this cycle: the queue's standing rises."""
        if self.shares is not None:
            self.shares = self.shares.moved(queue, Resources(gpus))

    def planned(self, queue: str, gpus: float, victims: Sequence[Victim]) -> None:
        """A preemption planned for an item of ``queue`` asking ``gpus``: the victims' queues' standing falls,
        the requester's rises, and its fair-share victims count against this cycle's reclaims -- so the next
        item's reclaim test sees the cluster as this plan leaves it, not as the cycle began."""
        if self.shares is None:
            return
        for v in victims:
            self.shares = self.shares.moved(v.queue, Resources(v.gpus), taken=True)
        self.granted(queue, gpus)
        n = sum(1 for v in victims if v.reason.cause is Cause.VICTIM_FAIRSHARE)
        self.reclaims_left = max(0, self.reclaims_left - n)

    # ---- limits ----------------------------------------------------------------------------------
    def headroom(self, queue: str, usage: Mapping[str, float]) -> tuple[float, str]:
        """The most the queue may still take under its and its ancestors' limits, and the queue whose limit
        binds ((inf, '') when none does)."""
        if not self.limited or queue not in self.config.queues:
            return float("inf"), ""
        best, which = float("inf"), ""
        for q in self.tree.path(queue):
            limit = self.config.queues[q].limit_gpus
            if limit is None:
                continue
            held = sum(v for name, v in usage.items() if name in self.config.queues and q in self.tree.path(name))
            if limit - held < best:
                best, which = limit - held, q
        return best, which

    # ---- reservations ----------------------------------------------------------------------------
    def starving(self, item: "PendingItem", now: float) -> bool:
        """``item`` waited past the bound and nothing is reserved yet this cycle; with fair shares, only while
        its queue holds less than its share (a queue at or above its share waits because it is: that is fair)."""
        bound = self.config.fairness.starvation_bound_s
        if bound is None or self.reserver is not None or now - item.submitted_at <= bound:
            return False
        return self.shares is None or self._below(item.queue)

    def _below(self, queue: str) -> bool:
        line = self.shares.line(queue) if self.shares is not None else None
        return line is not None and line.used_dominant < line.fair_dominant - 1e-9

    def may_backfill(self, item: "PendingItem") -> bool:
        """Whether ``item`` may use the reserved nodes: nothing is reserved, or it is the reserving request, or
        its class is preemptible and its priority below the reserving request's."""
        r = self.reserver
        if r is None or item.item_id == r.item_id or (item.gang is not None and r.gang is not None
                                                      and item.gang.gang_id == r.gang.gang_id):
            return True
        cls = self.config.classes.get(item.priority_class)
        return cls is not None and cls.preemptible and item.priority < r.priority

    def view(self, work: ClusterSnapshot, item: "PendingItem") -> ClusterSnapshot:
        """The snapshot ``item`` is placed on: ``work``, with the reserved nodes full unless it may backfill."""
        if not self.reserved or self.may_backfill(item):
            return work
        if self._view_of is not work:
            self._view, self._view_of = _without(work, self.reserved), work
        assert self._view is not None
        return self._view

    def reserve(self, work: ClusterSnapshot, holding: Sequence[Lease], item: "PendingItem",
                fits: Callable[[ClusterSnapshot], bool]) -> tuple[str, ...]:
        """Reserve for ``item`` the fewest nodes, least held first (then by name), on which it would fit were
        every lease on them released; () when no such set of at most :data:`MAX_RESERVED_NODES` exists."""
        held: dict[str, float] = {n: 0.0 for n in work.node_names}
        on: dict[str, list[Lease]] = {}
        for lease in holding:
            a = lease.allocation
            if lease.holding and a is not None and a.node_name in held:
                held[a.node_name] += lease.gpus_held
                on.setdefault(a.node_name, []).append(lease)
        order = sorted(held, key=lambda n: (held[n], n))
        freed = work
        for k, node in enumerate(order[:MAX_RESERVED_NODES]):
            for lease in on.get(node, ()):
                try:
                    freed = freed.release(lease.allocation)  # type: ignore[arg-type]
                except (CapacityError, InvalidRequestError):  # an allocation the snapshot no longer holds
                    continue
            chosen = tuple(order[:k + 1])
            if fits(_without(freed, tuple(n for n in work.node_names if n not in chosen))):
                self.reserved, self.reserver = chosen, item
                self._view = self._view_of = None
                return chosen
        return ()


    def clear(self, work: ClusterSnapshot, holding: Sequence[Lease], item: "PendingItem", now: float,
              taken: set[str], fits: Callable[[ClusterSnapshot], bool]) -> tuple[Victim, ...]:
        """The fewest leases on the reserved nodes whose release lets ``item`` place there, cheapest first
        (:func:`~.preemption.preemption_cost_gpu_s`), each of a preemptible class, of no higher priority than
        ``item``, past its minimum runtime, not being preempted already and (fairness on) not of a queue below
        its fair share (cause ``victim.reservation``);
        () when releasing all of them would not make room. So a request waits at most the bound plus a
        grace period, whatever its queue's standing (the issue's "no request waiting more than its bound")."""
        nodes = set(self.reserved)
        cands = []
        for lease in holding:
            a, cls = lease.allocation, self.config.classes.get(lease.priority_class)
            started = lease.started_at if lease.started_at is not None else now
            if (a is None or a.node_name not in nodes or not lease.holding or lease.lease_id in taken
                    or lease.state is LeaseState.CHECKPOINTING or cls is None or not cls.preemptible
                    or lease.priority > item.priority or now - started < cls.min_runtime_s
                    or (self.shares is not None and self._below(lease.queue))):  # never from a queue below its share
                continue
            cands.append(lease)
        cands.sort(key=lambda lease: (preemption_cost_gpu_s(lease, now), lease.lease_id))
        outside = tuple(n for n in work.node_names if n not in nodes)
        sim, chosen = work, []
        for lease in cands:
            sim = sim.release(lease.allocation)  # type: ignore[arg-type]
            chosen.append(lease)
            if fits(_without(sim, outside)):
                break
        else:
            return ()
        for lease in reversed(chosen[:-1]):  # add back what it does not need
            trial = sim.apply(lease.allocation)  # type: ignore[arg-type]
            if fits(_without(trial, outside)):
                sim = trial
                chosen.remove(lease)
        bound = self.config.fairness.starvation_bound_s
        return tuple(Victim(
            lease.lease_id, lease.owner, lease.priority, lease.priority_class, lease.queue, lease.gpus_held,
            work_lost_gpu_s(lease, now), lease.restore_estimate_s,
            lease.started_at if lease.started_at is not None else 0.0,
            reason=Reason(Cause.VICTIM_RESERVATION, f"its {lease.allocation.node_name} share is on node(s) "  # type: ignore[union-attr]
                          f"reserved for {item.item_id}, which waited over the {bound:g}s bound "
                          f"(cost {preemption_cost_gpu_s(lease, now):.0f} GPU-s; it checkpoints and resumes later)"))
            for lease in chosen)


def _without(snapshot: ClusterSnapshot, nodes: Sequence[str]) -> ClusterSnapshot:
    """``snapshot`` with every GPU of ``nodes`` unhealthy: nothing new lands there (what holds them stays)."""
    st = snapshot.static
    out = snapshot
    for name in nodes:
        i = st.index[name]
        for g in st.gpu_index[i][st.present[i]]:
            out = out.with_health(name, int(g), False)
    return out
