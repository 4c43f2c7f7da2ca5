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
* :class:`GcsKvStore` -- Ray's GCS key-value store through
  :mod:`orchestrator.rayport.ray_api`. It survives a head-actor restart; it
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


class GcsKvStore:
    """Ray's GCS internal KV, in its own KV namespace (``rgo.<namespace>``; no colon: Ray splits listed keys at the first one)."""

    def __init__(self, namespace: str) -> None:
        from orchestrator.rayport import ray_api

        self._kv = ray_api.GcsKv(f"rgo.{namespace}")

    def get(self, key: str) -> Any | None:
        raw = self._kv.get(key)
        return None if raw is None else json.loads(raw)

    def put(self, key: str, value: Any) -> None:
        self._kv.put(key, json.dumps(value, sort_keys=True).encode())

    def delete(self, key: str) -> None:
        self._kv.delete(key)

    def keys(self, prefix: str) -> list[str]:
        return sorted(self._kv.keys(prefix))
