"""Re-packing small shares when a GPU request fits nowhere (our ``default``'s last resort).

The FGD paper leaves migration open. When a request fails, this module looks
for one node where moving a few time-sliced shares elsewhere makes room:

* for a **share** of ``m`` milli: a GPU of that node in time-slice mode whose
  free milli plus the smallest of its shares reach ``m``;
* for ``k`` **whole cards**: the ``k - free`` time-sliced GPUs of that node
  with the least milli in use, all of whose shares move.

Nodes are tried cheapest first (least milli to move, then fewest shares, then
lowest index), at most ``max_nodes`` of them and never moving more than
``max_moves`` shares. Each move releases the share, *blocks* what it freed
with a placeholder share (so the engine cannot put it back), and places it
again with the same policy; once every share has a new home the
placeholders go and the waiting request is placed by the engine. Snapshots
are immutable, so giving up at any step is simply keeping the old one: the
search is a transaction with a free rollback.

Invariants: a plan either places the request or changes nothing; shares are
only moved, never dropped; whole cards and CPU-only pods never move.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from orchestrator.core.allocation import Allocation
from orchestrator.core.catalogue import MODEL_NAMES
from orchestrator.core.request import GpuRequest, ResolvedRequest, ShareKind
from orchestrator.scheduling.engine import Placement, place
from orchestrator.scheduling.policy import PlacementPolicy
from orchestrator.scheduling.snapshot import ClusterSnapshot, Mode


@dataclass
class Ledger:
    """Which pod holds what: allocations by pod, and time-sliced shares by (node, GPU column)."""

    allocs: dict[int, Allocation] = field(default_factory=dict)
    shares: dict[tuple[int, int], set[int]] = field(default_factory=dict)
    migrations: int = 0

    def add(self, pod: int, a: Allocation) -> None:
        self.allocs[pod] = a
        if a.kind is ShareKind.TIMESLICE:
            self.shares.setdefault((a.node, a.gpus[0]), set()).add(pod)

    def remove(self, pod: int) -> Allocation:
        a = self.allocs.pop(pod)
        if a.kind is ShareKind.TIMESLICE:
            self.shares[(a.node, a.gpus[0])].discard(pod)
        return a


def _placeholder(snap: ClusterSnapshot, node: int, col: int, milli: int) -> Allocation:
    st = snap.static
    return Allocation(node=node, node_name=st.names[node], kind=ShareKind.TIMESLICE, gpus=(col,),
                      gpu_indices=(int(st.gpu_index[node, col]),), gpu_uuids=(st.uuids[node][col],),
                      model=MODEL_NAMES[st.model[node]], milli=int(milli), memory_mib=0)


def _node_ok(snap: ClusterSnapshot, req: GpuRequest) -> np.ndarray:
    st = snap.static
    ok = (st.cpu_total - snap.cpu_used >= req.cpu_milli) & (st.mem_total - snap.mem_used >= req.host_memory_mib)
    ok &= st.model >= 0
    if req.models:
        ok &= np.isin(st.model, [MODEL_NAMES.index(m) for m in req.models])
    return ok


def _plans(snap: ClusterSnapshot, req: GpuRequest, ledger: Ledger, max_moves: int) -> list[tuple[int, int, int, list[tuple[int, int]]]]:
    """(milli moved, moves, node, [(column, pod), ...]) for every node where moving shares makes room."""
    st = snap.static
    free = snap.free_milli()
    mode = snap.mode
    ts = (mode == Mode.TIMESLICE) & st.present
    plans = []
    nodes = np.flatnonzero(_node_ok(snap, req) & ts.any(axis=1))
    for n in nodes:
        n = int(n)
        if req.kind is ShareKind.WHOLE:
            need = req.count - int(((mode[n] == Mode.FREE) & st.present[n]).sum())
            cols = [c for c in np.flatnonzero(ts[n])]
            if need <= 0 or len(cols) < need:
                continue
            used = snap.used_milli[n]
            cols = sorted(cols, key=lambda c: (int(used[c]), c))[:need]
            moves = [(int(c), p) for c in cols for p in sorted(ledger.shares.get((n, int(c)), ()))]
            if len(moves) > max_moves or any(len(ledger.shares.get((n, int(c)), ())) != snap.holders[n, c] for c in cols):
                continue
            plans.append((sum(ledger.allocs[p].milli for _, p in moves), len(moves), n, moves))
        else:
            m = round(req.fraction * 1000)
            best = None
            for c in np.flatnonzero(ts[n] & (free[n] < m)):
                c = int(c)
                held = sorted(ledger.shares.get((n, c), ()), key=lambda p: (ledger.allocs[p].milli, p))
                got, moved = int(free[n, c]), []
                for p in held:
                    if got >= m or len(moved) >= max_moves:
                        break
                    moved.append((c, p))
                    got += ledger.allocs[p].milli
                if got >= m:
                    cost = (sum(ledger.allocs[p].milli for _, p in moved), len(moved))
                    if best is None or cost < best[0]:
                        best = (cost, moved)
            if best is not None:
                plans.append((best[0][0], best[0][1], n, best[1]))
    plans.sort(key=lambda t: (t[0], t[1], t[2]))
    return plans


def try_repack(snap: ClusterSnapshot, req: GpuRequest, resolved: ResolvedRequest, policy: PlacementPolicy, ledger: Ledger,
               requests: dict[int, tuple[GpuRequest, ResolvedRequest]], *, max_nodes: int = 3,
               max_moves: int = 4) -> tuple[ClusterSnapshot, Placement, list[tuple[int, Allocation]]] | None:
    """Make room for ``req`` by moving shares; ``(snapshot, placement, [(pod, new allocation)])`` or None.

    ``requests[pod]`` is each placed pod's request (to place it again). The
    ledger is updated only on success.
    """
    if req.kind is not ShareKind.TIMESLICE and not (req.kind is ShareKind.WHOLE and req.count > 0):
        return None
    for _, _, node, moves in _plans(snap, req, ledger, max_moves)[:max_nodes]:
        s = snap
        blocks: list[Allocation] = []
        moved: list[tuple[int, Allocation]] = []
        ok = True
        for col, pod in moves:
            old = ledger.allocs[pod]
            s = s.release(old)
            block = _placeholder(s, node, col, old.milli)
            s = s.apply(block)
            blocks.append(block)
            r, rr = requests[pod]
            res = place(s, r, policy, resolved=rr)
            if not isinstance(res, Placement):
                ok = False
                break
            s = s.apply(res.allocation)
            moved.append((pod, res.allocation))
        if not ok:
            continue
        for b in blocks:
            s = s.release(b)
        res = place(s, req, policy, resolved=resolved)
        if not isinstance(res, Placement):
            continue
        for pod, a in moved:
            ledger.remove(pod)
            ledger.add(pod, a)
        ledger.migrations += len(moved)
        return s.apply(res.allocation), res, moved
    return None
