"""The GCS internal key-value store, as the head's store and the job table reads use it.

Invariant: every call names its KV namespace; nothing here reads or writes outside it.
"""

from __future__ import annotations


class GcsKv:
    """Ray's GCS internal key-value store, in one KV namespace."""

    def __init__(self, namespace: str) -> None:
        from ray.experimental import internal_kv

        self._kv = internal_kv
        self._ns = namespace

    def get(self, key: str) -> bytes | None:
        return self._kv._internal_kv_get(key, namespace=self._ns)

    def multi_get(self, keys: list[str], timeout_s: float | None = None) -> dict[str, bytes]:
        """The values of those of ``keys`` that exist, in one round trip (``timeout_s``: else Ray's own)."""
        if not keys:
            return {}
        got = self._kv.global_gcs_client.internal_kv_multi_get([k.encode() for k in keys], self._ns.encode(),
                                                               timeout=timeout_s)
        return {k.decode(): v for k, v in got.items()}

    def put(self, key: str, value: bytes) -> None:
        self._kv._internal_kv_put(key, value, overwrite=True, namespace=self._ns)

    async def aput(self, key: str, value: bytes, timeout_s: float = 10.0) -> None:
        """``put`` through Ray's asynchronous GCS client, awaited on the calling event loop (no thread: a
        thread waiting for the GIL behind a busy loop waits out Python's switch interval on every write)."""
        await self._kv.global_gcs_client.async_internal_kv_put(key.encode(), value, True, self._ns.encode(),
                                                               timeout=timeout_s)

    def delete(self, key: str) -> None:
        self._kv._internal_kv_del(key, namespace=self._ns)

    def keys(self, prefix: str) -> list[str]:
        return [k.decode() for k in self._kv._internal_kv_list(prefix, namespace=self._ns)]

    def delete_prefix(self, prefix: str) -> int:
        return int(self._kv._internal_kv_del(prefix, del_by_prefix=True, namespace=self._ns))
