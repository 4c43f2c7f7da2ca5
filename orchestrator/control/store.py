"""The head's durable store: where hard state lives before the head acts on it.

Hard state is what cannot be rebuilt from the agents: the lease ledger, the
queue order and the fencing counter (plus the last inventory of each node, so
a restarted head can rebuild its snapshot and re-apply the ledger before the
agents have re-registered). No caller is answered, and no device or Ray job
handed out, on hard state the store does not hold yet, so a head that dies at
any point restarts into a state it has already promised nothing beyond.

Keys are plain strings under a per-namespace prefix; values are JSON. Two
implementations:

* :class:`MemoryStore` -- a dict, durable on each write, for unit tests and
  in-process heads;
* :class:`orchestrator.control.journal.Journal` -- the real head's: answers
  from memory and writes in batches (group commit) to Ray's GCS key-value
  table, through :mod:`orchestrator.rayport.store`; the head actor waits for
  the batch holding a change before it answers or acts on it. It survives a
  head-actor restart; it survives a GCS restart only where GCS fault
  tolerance (external Redis, as KubeRay configures it) is on.

A :class:`MemoryStore` write is durable at once, so in-process the order of
writes is the order of effects; in the journal a batch lands whole, so a
restart sees the state as of some batch boundary, never half a change.
"""

from __future__ import annotations

import json
from typing import Any, Protocol


class StateStore(Protocol):
    """A small key-value store of JSON values."""

    def get(self, key: str) -> Any | None: ...

    def put(self, key: str, value: Any) -> None: ...

    def delete(self, key: str) -> None: ...

    def keys(self, prefix: str) -> list[str]: ...


class MemoryStore:
    """In-memory store. ``writes`` counts puts and deletes, so tests can assert an order of effects."""

    def __init__(self) -> None:
        self._data: dict[str, str] = {}
        self.writes: list[tuple[str, str]] = []

    def get(self, key: str) -> Any | None:
        raw = self._data.get(key)
        return None if raw is None else json.loads(raw)

    def put(self, key: str, value: Any) -> None:
        self._data[key] = json.dumps(value, sort_keys=True)  # a round trip, as the real store does
        self.writes.append(("put", key))

    def delete(self, key: str) -> None:
        self._data.pop(key, None)
        self.writes.append(("delete", key))

    def keys(self, prefix: str) -> list[str]:
        return sorted(k for k in self._data if k.startswith(prefix))
