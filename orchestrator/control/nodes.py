"""The head's node registry: which GPU nodes exist, which agent speaks for each, and when it was last heard.

Names: a *node* is one GPU node (one raylet); its *agent* is our device plugin
on it; an *incarnation* is one life of an agent (a fresh id each start), so
heartbeats of an agent the head has replaced are refused.

Invariants:

* a node is REGISTERED while its current incarnation heartbeats within the
  agent TTL and its Ray node is alive; then it becomes LOST (and the leases on
  it are lost by the controller);
* only :class:`NodeRegistry` changes records, and it writes a record to the
  store before it makes it current (hard state first); ``last_seen`` is soft
  state (a restored node counts as just seen).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Annotated, Any, Iterable, Mapping

from orchestrator.control.store import StateStore
from orchestrator.core import codec
from orchestrator.core.changefeed import ChangeFeed
from orchestrator.core.inventory import NodeInventory


class NodeState(str, enum.Enum):
    REGISTERED = "registered"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """What the head knows of one node and its agent. The stored form (:meth:`to_json`, derived by
    :mod:`~orchestrator.core.codec`) leaves out the soft state: ``last_seen`` and ``allocated``."""

    name: str
    ray_node_id: str
    incarnation: str
    inventory: NodeInventory
    state: NodeState
    last_seen: Annotated[float, codec.left_out(0.0)]
    registered_at: float
    reason: str = ""
    allocated: Annotated[tuple[str, ...], codec.left_out(())] = ()

    def to_json(self) -> dict[str, Any]:
        return codec.dump(self)

    @classmethod
    def from_json(cls, d: dict[str, Any], *, seen_at: float) -> "NodeRecord":
        """The record :meth:`to_json` stored, last seen at ``seen_at`` (a restored node counts as just seen)."""
        return replace(codec.load(cls, d, "node"), last_seen=seen_at)


@dataclass(frozen=True, slots=True)
class RayNodeInfo:
    """A live Ray node as the head's wrapper sees it (from the GCS node table)."""

    ray_node_id: str
    name: str
    is_head: bool = False


@dataclass(frozen=True, slots=True)
class AgentStart:
    """A node that needs an agent started on it, and why."""

    node_name: str
    ray_node_id: str
    reason: str


class NodeRegistry:
    """The registered nodes, the live Ray nodes, and the agent starts in flight; see the module docstring."""

    def __init__(self, store: StateStore, namespace: str) -> None:
        self.store = store
        self.prefix = f"{namespace}/node/"
        self.records: dict[str, NodeRecord] = {}
        self.ray_nodes: dict[str, RayNodeInfo] = {}
        self.starts: dict[str, float] = {}
        self.measured: dict[str, dict[int, float]] = {}  # soft: per node, GPU index -> NVML utilisation
        self._names: list[str] | None = None  # every record's name, sorted (registered() reads it)
        self._feed: ChangeFeed[str] = ChangeFeed()  # the nodes whose record was committed or restored (changed_since)

    def measure(self, name: str, utilization: Mapping[str, float] | None) -> None:
        """The utilisation an agent measured per GPU in its last heartbeat (clamped to 0..1); none: forget."""
        if utilization:
            self.measured[name] = {int(i): min(1.0, max(0.0, float(u))) for i, u in utilization.items()}
        else:
            self.measured.pop(name, None)

    def restore(self, now: float) -> None:
        for key in self.store.keys(self.prefix):
            d = self.store.get(key)
            if d is not None:
                rec = NodeRecord.from_json(d, seen_at=now)
                self.records[rec.name] = rec
                self._names = None
                self._feed.changed(rec.name)

    def commit(self, rec: NodeRecord) -> None:
        """Write ``rec`` to the store, then make it current."""
        self.store.put(self.prefix + rec.name, rec.to_json())
        if rec.name not in self.records:
            self._names = None
        self.records[rec.name] = rec
        self._feed.changed(rec.name)

    @property
    def changes(self) -> int:
        """Records committed (or restored) so far: a mark for :meth:`changed_since`."""
        return self._feed.count

    def changed_since(self, mark: int) -> list[str]:
        """The nodes whose record was committed (registered, re-registered, its inventory or state changed) since
        :attr:`changes` was ``mark``, newest first. What :meth:`touch` and :meth:`heard_all` change (when it was
        heard from) is not a change here. Costs what changed, not the nodes."""
        return self._feed.since(mark)

    def touch(self, rec: NodeRecord, now: float, allocated: tuple[str, ...] | None = None) -> None:
        """Soft state only: the node was heard from (not written to the store)."""
        self.records[rec.name] = replace(rec, last_seen=now, allocated=rec.allocated if allocated is None else allocated)

    def heard_all(self, now: float) -> None:
        """Soft state only: count every registered agent as heard from at ``now``, after the head could not
        listen (a stall of its own); a dead agent is then found one TTL later instead of wrongly at once."""
        for name, rec in self.records.items():
            if rec.state is NodeState.REGISTERED and rec.last_seen < now:
                self.records[name] = replace(rec, last_seen=now)

    def get(self, name: str) -> NodeRecord | None:
        return self.records.get(name)

    def current(self, name: str, incarnation: str) -> NodeRecord | None:
        """The record if ``incarnation`` is the node's registered agent, else None (it must re-register)."""
        rec = self.records.get(name)
        if rec is None or rec.incarnation != incarnation or rec.state is not NodeState.REGISTERED:
            return None
        return rec

    def registered(self) -> list[NodeRecord]:
        """The registered records, by name."""
        if self._names is None:  # sorted again only when a record comes or changes state (commit), not per call
            self._names = sorted(self.records)
        records = self.records
        return [r for n in self._names if (r := records[n]).state is NodeState.REGISTERED]

    def observe(self, nodes: Iterable[RayNodeInfo]) -> None:
        self.ray_nodes = {n.name: n for n in nodes}

    def silent(self, now: float, ttl: float) -> list[tuple[NodeRecord, str]]:
        """Registered nodes to declare lost, each with the reason: silent past ``ttl`` or its Ray node gone."""
        out = []
        for rec in list(self.records.values()):
            if rec.state is not NodeState.REGISTERED:
                continue
            silent = now - rec.last_seen
            ray_node = self.ray_nodes.get(rec.name)
            gone = bool(self.ray_nodes) and (ray_node is None or ray_node.ray_node_id != rec.ray_node_id)
            if silent > ttl:
                out.append((rec, f"agent silent for {silent:.1f}s > ttl {ttl:g}s"))
            elif gone:
                out.append((rec, "its Ray node left the cluster"))
        return out

    def ray_node_alive(self, rec: NodeRecord) -> bool:
        """Whether Ray positively lists ``rec``'s node as alive (False while no node table has been read)."""
        ray_node = self.ray_nodes.get(rec.name)
        return ray_node is not None and ray_node.ray_node_id == rec.ray_node_id

    def gone_while_lost(self) -> list[NodeRecord]:
        """Lost nodes whose Ray node has left since (per the last node table read)."""
        if not self.ray_nodes:
            return []
        return [r for r in self.records.values() if r.state is NodeState.LOST and not self.ray_node_alive(r)]

    def agents_to_start(self, now: float, ttl: float) -> list[AgentStart]:
        """Every live Ray node without a registered agent, unless a start is in flight (one TTL to register)."""
        out = []
        records = self.records
        unregistered = [(name, rn) for name, rn in self.ray_nodes.items()
                        if (rec := records.get(name)) is None or rec.state is not NodeState.REGISTERED]
        for name, rn in sorted(unregistered):  # sorting the few without an agent, not every node, each cycle
            rec = self.records.get(name)
            asked = self.starts.get(name)
            if asked is not None and now - asked < ttl:
                continue
            out.append(AgentStart(name, rn.ray_node_id, "new node" if rec is None else f"agent lost ({rec.reason})"))
        return out
