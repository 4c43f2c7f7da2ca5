"""The head's :class:`~orchestrator.control.store.StateStore` on Ray's GCS key-value table.

Values are JSON with sorted keys (what :class:`~orchestrator.control.store.MemoryStore`
round-trips too, so unit tests and the real head store the same bytes).
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.rayport.ray_api import GcsKv


def kv_namespace(namespace: str) -> str:
    """The GCS KV namespace of an orchestrator namespace (no colon: Ray splits listed keys at the first one)."""
    return f"rgo.{namespace}"


class GcsKvStore:
    """Ray's GCS internal KV, in its own KV namespace (:func:`kv_namespace`)."""

    def __init__(self, namespace: str) -> None:
        self._kv = GcsKv(kv_namespace(namespace))

    def get(self, key: str) -> Any | None:
        raw = self._kv.get(key)
        return None if raw is None else json.loads(raw)

    def put(self, key: str, value: Any) -> None:
        self._kv.put(key, json.dumps(value, sort_keys=True).encode())

    def delete(self, key: str) -> None:
        self._kv.delete(key)

    def keys(self, prefix: str) -> list[str]:
        return sorted(self._kv.keys(prefix))
