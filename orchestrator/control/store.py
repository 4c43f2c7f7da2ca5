"""The head's durable store: where hard state lives before the head acts on it.

Hard state is what cannot be rebuilt from the agents: the lease ledger, the
queue order and the fencing counter (plus the last inventory of each node, so
a restarted head can rebuild its snapshot and re-apply the ledger before the
agents have re-registered). It is written here *before* the head answers a
caller or hands devices out, so a head that dies at any point restarts into
a state it has already promised nothing beyond.

Keys are plain strings under a per-namespace prefix; values are JSON. Two
implementations:

* :class:`MemoryStore` -- a dict, for unit tests (and for a head that runs
  without Ray, which nothing here does);
* :class:`orchestrator.rayport.store.GcsKvStore` -- Ray's GCS key-value
  store (in the Ray port, the one layer that imports Ray). It survives a head-actor restart; it
  survives a GCS restart only where GCS fault tolerance (external Redis, as
  KubeRay configures it) is on.

Writes of one key are atomic; there are no multi-key transactions, so the
head orders its writes so that any prefix of them restores consistently
(fencing counter first, then the leases it covers).
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
