"""The head's hard state on Ray's GCS key-value table, committed in groups.

:func:`load_journal` reads the head's :class:`~orchestrator.control.journal.Journal` (a
:class:`~orchestrator.control.store.StateStore` answering from memory) from the GCS;
:class:`GroupCommit` writes its batches there while the head's event loop goes on (a batch's one
segment through Ray's asynchronous GCS client; a compaction's snapshot -- encoded, its chunks and
manifest written, then what it covers deleted -- on a thread of its own, after the batch's segment is
acknowledged), and lets a coroutine wait until everything changed before it is written
(:meth:`GroupCommit.durable`): callers that changed state while one batch was in flight share the
next one.

Invariants: one batch in flight at a time, in the order taken; a batch that
fails is retried (with its records merged into the next) after a back-off, and nobody waiting on it
is answered until one lands; :meth:`GroupCommit.durable` never returns before the journal's
``durable`` version has reached the ``version`` it saw when called; one snapshot is written at a time
(:meth:`~orchestrator.control.journal.Journal.segment_acked`), beside later segments.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from orchestrator.control.journal import Batch, Journal, KvTable, Snapshot, drop_covered, write_snapshot
from orchestrator.core.backoff import backoff_s
from orchestrator.core.config import Tuning
from orchestrator.rayport.ray_api import GcsKv

log = logging.getLogger(__name__)

#: Back-off after a failed batch write: doubled from the first to the last, per failure in a row. The defaults of
#: ``settings.tuning.commit_retry_first_s`` and ``commit_retry_max_s``, which the head gives its :class:`GroupCommit`.
RETRY_FIRST_S = Tuning().commit_retry_first_s
RETRY_MAX_S = Tuning().commit_retry_max_s


def kv_namespace(namespace: str) -> str:
    """The GCS KV namespace of an orchestrator namespace (no colon: Ray splits listed keys at the first one)."""
    return f"rgo.{namespace}"


def gcs_table(namespace: str) -> GcsKv:
    """The GCS KV table the head of ``namespace`` keeps its journal in."""
    return GcsKv(kv_namespace(namespace))


def load_journal(namespace: str) -> Journal:
    """The head's hard state as the GCS holds it (snapshot, then later segments)."""
    return Journal.load(gcs_table(namespace))


class CommitObserver(Protocol):
    """Who hears of each batch (the head's metrics: ``HeadMetrics.committed`` / ``commit_failed``)."""

    def committed(self, records: int, seconds: float) -> None: ...

    def commit_failed(self) -> None: ...


class GroupCommit:
    """Writes a :class:`Journal`'s batches to its table on one writer thread; see the module docstring."""

    def __init__(self, journal: Journal, table: KvTable, observer: CommitObserver | None = None, *,
                 retry_first_s: float = RETRY_FIRST_S, retry_max_s: float = RETRY_MAX_S) -> None:
        self.journal = journal
        self.table = table
        self.observer = observer
        self._backoff = (retry_first_s, retry_max_s)  # the wait after a failed write: first, longest
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="rgo-commit")
        self._flushing: asyncio.Future[None] | None = None
        self._retry_s = 0.0
        self._failures = 0  # failed writes in a row

    async def durable(self) -> None:
        """Return once every change made to the journal before this call is in the table."""
        target = self.journal.version
        while self.journal.durable < target:
            if self._flushing is None or self._flushing.done():
                self._flushing = asyncio.ensure_future(self._flush())
            await asyncio.shield(self._flushing)

    async def _flush(self) -> None:
        if self._retry_s:
            await asyncio.sleep(self._retry_s)
        batch = self.journal.take()
        if batch is None:
            return
        t0 = time.monotonic()
        try:  # one segment, written from the loop without blocking it: what makes the batch durable
            await self.table.aput(batch.key, batch.payload)
        except Exception as e:  # the GCS is away (restarting, unreachable): keep the records, try again
            self._failed(batch, e)
            return
        self.journal.segment_acked(batch)
        if batch.snapshot is not None:  # a compaction: after the replies, on the writer thread
            snap = batch.snapshot
            done = asyncio.get_running_loop().run_in_executor(self._writer, self._compact, snap)
            done.add_done_callback(lambda f: self._compacted(snap, f))
        self._retry_s = 0.0
        self._failures = 0
        if self.observer is not None:
            self.observer.committed(batch.records, time.monotonic() - t0)

    def _compact(self, snap: Snapshot) -> None:
        """On the writer thread: encode and write the snapshot and its manifest, then delete what it covers.
        Later batches' segments go on meanwhile (the replies waited for the chunks, megabytes, before)."""
        write_snapshot(self.table, snap)
        try:
            drop_covered(self.table, snap)
        except Exception as e:  # left for the next compaction's drop; a restart ignores what the manifest covers
            log.warning("head: deleting what snapshot %d covers failed (%s: %s); the next compaction retries",
                        snap.upto, type(e).__name__, e)

    def _compacted(self, snap: Snapshot, done: asyncio.Future[None]) -> None:
        """On the loop: the snapshot is written (the next may be taken) or failed (the next batch carries one)."""
        e = done.exception() if not done.cancelled() else asyncio.CancelledError()
        if e is None:
            self.journal.snapshot_written(snap)
            return
        self.journal.snapshot_failed(snap)
        log.warning("head: writing snapshot %d failed (%s: %s); the previous one and the segments after it "
                    "still restore everything; the next batch carries a new one", snap.upto, type(e).__name__, e)

    def _failed(self, batch: Batch, e: Exception) -> None:
        self.journal.failed(batch)
        if self.observer is not None:
            self.observer.commit_failed()
        self._retry_s = backoff_s(self._failures, *self._backoff)
        self._failures += 1
        log.warning("head: writing %d records to the GCS failed (%s: %s); retrying in %.2fs",
                    batch.records, type(e).__name__, e, self._retry_s)

    def close(self) -> None:
        self._writer.shutdown(wait=False)
