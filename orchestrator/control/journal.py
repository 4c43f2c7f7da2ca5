"""Group commit for the head's hard state: a write-ahead journal over a plain key-value table.

The head used to write every record to the GCS as it changed, one synchronous round trip per
record (some ten per job: submitted, lease requested, granted, activated, admitted, started,
finished, released, plus the ledger's meta). On its one event loop that was most of its time under
load (``docs/load.md``). :class:`Journal` is a :class:`~orchestrator.control.store.StateStore`
that answers reads from memory and turns writes into *batches*:

* ``put`` / ``delete`` change the in-memory table at once and mark the key dirty (a later write of
  the same key before the batch is taken replaces the earlier one);
* :meth:`Journal.take` turns every dirty key into one :class:`Batch`: one journal segment, one
  value (``_wal/<seq>``) holding all of them. Whoever writes it (the head actor, on a writer thread)
  calls :meth:`Journal.acked` when the table has it, or :meth:`Journal.failed`;
* a caller whose reply depends on what it changed waits until :attr:`Journal.durable` reaches the
  :attr:`Journal.version` its change made (the head actor does: replies, and jobs started on Ray,
  wait for the batch that holds them). Everyone who changed something while one batch was being
  written shares the next one: one round trip for all of them.

**Invariants.**

* A segment is written whole or not at all (one key's value), so a crash leaves the table at a
  batch boundary: no half-applied job or lease.
* Segments are numbered in the order taken; the journal is replayed in that order, so a later write
  of a key wins over an earlier one whatever order the table received them in.
* A failed batch is not lost: its records are written again with the next batch (a segment holds
  everything not yet acknowledged), and ``durable`` does not move until one lands.
* **Compaction.** When the segments since the last snapshot outgrow ``max(min_compact_bytes,
  snapshot size)``, :meth:`Journal.take` attaches a :class:`Snapshot` to the batch: the whole table as
  it is *with that batch applied* (a copy of the table taken then, encoded by the writer), in chunks
  (``_snap/<upto>/<i>``, named by the last segment it covers), then a manifest (``_manifest``: that
  segment, the chunk count), written after the batch's segment (:func:`write_snapshot`). The segment
  alone makes the batch durable, so the head acknowledges it first and writes the snapshot beside
  later segments (numbered after it, replayed over it): one snapshot at a time
  (:meth:`Journal.segment_acked` .. :meth:`Journal.snapshot_written` / :meth:`Journal.snapshot_failed`).
  Only once the manifest is written are the segments it covers and the older snapshots deleted
  (:func:`drop_covered`, by key prefix: a few dozen deletes; one per segment was thousands after a long
  run, and held every reply for most of a second when replies waited for them); a crash before the
  manifest restores from the previous manifest and the segments still there, one after it ignores what
  is left to delete.
  So the table holds O(live state + ``min_compact_bytes``), and each record is rewritten a constant
  number of times per compaction cycle on average.
* **Upgrade.** A table written by an earlier head (one key per record, no manifest) is read as the
  base under the segments; the first snapshot holds it all, and the old keys are deleted after its
  manifest (:data:`LEGACY` keys: those not starting with ``_``).

Values are encoded with orjson when written (the head encodes every change; the standard library's
encoder was a tenth of its time under load): JSON as ``json.dumps`` writes it, except that a
non-finite float, which JSON has no word for, is stored as null (no hard state holds one).

No I/O here beyond the :class:`KvTable` given; no threads, no clock (pure over its inputs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping, Protocol

import orjson

SEGMENT_PREFIX = "_wal/"
SNAPSHOT_PREFIX = "_snap/"
MANIFEST_KEY = "_manifest"
#: Snapshot chunks are cut at about this many bytes (a GCS value may be larger; smaller ones keep one write short).
CHUNK_BYTES = 512 * 1024


class KvTable(Protocol):
    """A byte-valued key-value table: Ray's GCS internal KV (``rayport.ray_api.GcsKv``) or :class:`MemoryKv`."""

    def get(self, key: str) -> bytes | None: ...

    def multi_get(self, keys: list[str]) -> dict[str, bytes]: ...

    def put(self, key: str, value: bytes) -> None: ...

    async def aput(self, key: str, value: bytes) -> None:
        """``put``, awaited on the caller's event loop without blocking it."""

    def delete(self, key: str) -> None: ...

    def keys(self, prefix: str) -> list[str]: ...

    def delete_prefix(self, prefix: str) -> int: ...


class MemoryKv:
    """A :class:`KvTable` in a dict, for unit tests (a stand-in for the GCS table, which needs a Ray cluster)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def multi_get(self, keys: list[str]) -> dict[str, bytes]:
        return {k: self.data[k] for k in keys if k in self.data}

    def put(self, key: str, value: bytes) -> None:
        self.data[key] = bytes(value)

    async def aput(self, key: str, value: bytes) -> None:
        self.put(key, value)

    def delete(self, key: str) -> None:
        self.data.pop(key, None)

    def keys(self, prefix: str) -> list[str]:
        return sorted(k for k in self.data if k.startswith(prefix))

    def delete_prefix(self, prefix: str) -> int:
        gone = self.keys(prefix)
        for k in gone:
            del self.data[k]
        return len(gone)


class CorruptJournalError(RuntimeError):
    """The table's manifest names snapshot chunks that are not there (or not JSON): nothing safe to restore."""


@dataclass(frozen=True)
class Snapshot:
    """The whole table as of segment ``upto`` (``table``: a copy of it, key -> encoded value, taken then): chunk
    values to write, then the manifest.

    The chunks are encoded when first asked for (:attr:`chunks`), by whoever writes them: the head's writer
    thread, not its loop. Taking the copy is what the loop pays (a dict copy; the values are immutable
    bytes), a tenth of encoding the table (~5 ms against ~45 ms at 60,000 records)."""

    upto: int
    table: Mapping[str, bytes] = field(repr=False, compare=False, hash=False)  # big: no repr, no hash

    @cached_property
    def chunks(self) -> tuple[bytes, ...]:
        return tuple(_chunks(self.table))

    @property
    def manifest(self) -> bytes:
        return json.dumps({"upto": self.upto, "chunks": len(self.chunks)}).encode()

    @property
    def prefix(self) -> str:
        """Where its chunks are: one folder per snapshot, named by the segment it covers up to."""
        return f"{SNAPSHOT_PREFIX}{self.upto:012d}/"

    def chunk_key(self, i: int) -> str:
        return f"{self.prefix}{i:06d}"

    @property
    def nbytes(self) -> int:
        return sum(len(c) for c in self.chunks)


@dataclass(frozen=True)
class Batch:
    """One journal segment (``key``, ``payload``) holding ``records`` records, up to :attr:`Journal.version`
    ``version``; with a :class:`Snapshot` to write after it when compaction is due."""

    seq: int
    version: int
    records: int
    payload: bytes
    snapshot: Snapshot | None = None

    @property
    def key(self) -> str:
        return segment_key(self.seq)


def segment_key(seq: int) -> str:
    return f"{SEGMENT_PREFIX}{seq:012d}"


def write_batch(table: KvTable, batch: Batch) -> None:
    """Write a batch to the table in the order the invariants need: :func:`write_durable`, then, with a
    snapshot, :func:`drop_covered`."""
    write_durable(table, batch)
    if batch.snapshot is not None:
        drop_covered(table, batch.snapshot)


def write_durable(table: KvTable, batch: Batch) -> None:
    """A batch's segment, then, with a snapshot, :func:`write_snapshot`. The segment alone makes the batch
    durable: once it is written a restarted head reads the batch, whatever became of the snapshot."""
    table.put(batch.key, batch.payload)
    if batch.snapshot is not None:
        write_snapshot(table, batch.snapshot)


def write_snapshot(table: KvTable, snap: Snapshot) -> None:
    """A snapshot's chunks, then its manifest (the switch to it). Safe beside later segments being written:
    they are numbered after ``snap.upto``, which the restore replays over it, and until the manifest is
    written the previous one and every segment after it are what a restart reads."""
    for i, chunk in enumerate(snap.chunks):
        table.put(snap.chunk_key(i), chunk)
    table.put(MANIFEST_KEY, snap.manifest)


def covering_prefixes(upto: int) -> list[str]:
    """Key prefixes that together match exactly the segments numbered 0 to ``upto``: at each digit of ``upto``
    (zero-padded as :func:`segment_key` pads it), ``upto``'s digits before it followed by each smaller digit,
    then ``upto``'s own key. At most nine a digit (109); a few dozen in practice."""
    digits = segment_key(upto)[len(SEGMENT_PREFIX):]
    lower = [f"{SEGMENT_PREFIX}{digits[:i]}{d}" for i, top in enumerate(digits) for d in range(int(top))]
    return lower + [segment_key(upto)]


def drop_covered(table: KvTable, snap: Snapshot) -> None:
    """Delete what the manifest of ``snap`` (written) covers: the segments up to it (by the prefixes of
    :func:`covering_prefixes`: one delete per segment was thousands of GCS calls after a long run), older
    snapshots' chunks, an earlier head's one-key-per-record layout. The head does it after acknowledging the
    batch, not before. Leftovers of an interrupted call are ignored by :meth:`Journal.load` and deleted by the
    next one."""
    for prefix in covering_prefixes(snap.upto):
        table.delete_prefix(prefix)
    mine = snap.prefix
    for older in {k[:len(mine)] for k in table.keys(SNAPSHOT_PREFIX)} - {mine}:
        table.delete_prefix(older)
    for key in table.keys(""):
        if not key.startswith("_"):  # an earlier head's one-key-per-record layout: the snapshot holds it now
            table.delete(key)


@dataclass
class Journal:
    """A :class:`~orchestrator.control.store.StateStore` with group commit; see the module docstring.

    ``version`` counts changes; ``durable`` is the ``version`` of the last acknowledged batch (every
    change up to it is in the table)."""

    table: KvTable
    min_compact_bytes: int = 4 * 1024 * 1024
    version: int = 0
    durable: int = 0
    _data: dict[str, bytes] = field(default_factory=dict)  # key -> JSON
    _dirty: dict[str, bytes | None] = field(default_factory=dict)  # changed since the last take (None: deleted)
    _unacked: dict[str, bytes | None] = field(default_factory=dict)  # taken, not yet acknowledged
    _seq: int = 0  # the last segment number taken
    _since_snapshot: int = 0  # bytes of segments since the last snapshot
    _snapshot_bytes: int = 0
    _snapshotting: bool = False  # a snapshot is being written (segment_acked .. snapshot_written/_failed)
    _snapshot_due: bool = False  # the last snapshot's write failed: attach one to the next batch
    failures: int = 0  # batches whose write failed (each written again with the next)

    @classmethod
    def load(cls, table: KvTable, min_compact_bytes: int = 4 * 1024 * 1024) -> "Journal":
        """The journal of what ``table`` holds: the manifest's snapshot, then every later segment in order."""
        j = cls(table, min_compact_bytes)
        upto = 0
        raw = table.get(MANIFEST_KEY)
        if raw is not None:
            m = json.loads(raw)
            snap = Snapshot(int(m["upto"]), {})
            keys = [snap.chunk_key(i) for i in range(int(m["chunks"]))]
            got = table.multi_get(keys)
            missing = [k for k in keys if k not in got]
            if missing:
                raise CorruptJournalError(f"the manifest names {len(keys)} snapshot chunks; missing: {missing[:3]}")
            for k in keys:
                j._snapshot_bytes += len(got[k])
                for key, value in orjson.loads(got[k]).items():
                    j._data[key] = _encode(value)
            upto = snap.upto
        else:  # no snapshot yet: an earlier head's records, one key each, are the base (see Upgrade)
            legacy = [k for k in table.keys("") if not k.startswith("_")]
            for key, raw in table.multi_get(legacy).items():
                j._data[key] = _encode(orjson.loads(raw))
                j._since_snapshot += len(raw)  # not in any snapshot yet: counts toward the first
        seqs = sorted(s for s in map(_seq_of, table.keys(SEGMENT_PREFIX)) if s > upto)
        got = table.multi_get([segment_key(s) for s in seqs])
        for s in seqs:
            payload = got.get(segment_key(s))
            if payload is None:  # deleted by a compaction that finished after we listed: covered by its snapshot
                continue
            j._since_snapshot += len(payload)
            for key, value in orjson.loads(payload)["ops"].items():
                if value is None:
                    j._data.pop(key, None)
                else:
                    j._data[key] = _encode(value)
        j._seq = max([upto, *seqs])
        return j

    # ---- StateStore ------------------------------------------------------------------------------
    def get(self, key: str) -> Any | None:
        raw = self._data.get(key)
        return None if raw is None else orjson.loads(raw)

    def put(self, key: str, value: Any) -> None:
        if value is None:  # as the GCS store read it: a key holding null is no key
            self.delete(key)
            return
        text = _encode(value)
        self._data[key] = text
        self._dirty[key] = text
        self.version += 1

    def delete(self, key: str) -> None:
        self._data.pop(key, None)
        self._dirty[key] = None
        self.version += 1

    def keys(self, prefix: str) -> list[str]:
        return sorted(k for k in self._data if k.startswith(prefix))

    # ---- group commit ----------------------------------------------------------------------------
    @property
    def pending(self) -> bool:
        """Changes not yet acknowledged by the table."""
        return self.durable < self.version

    def take(self) -> Batch | None:
        """Every change not yet acknowledged, as one segment (None: nothing to write). The caller writes it
        (:func:`write_durable`), then calls :meth:`acked` or :meth:`failed`, and after an acknowledged
        snapshot :func:`drop_covered` (:func:`write_batch` does both in order); one batch at a time."""
        if not self._dirty and not self._unacked:
            return None
        self._unacked.update(self._dirty)
        self._dirty = {}
        self._seq += 1
        body = b",".join(orjson.dumps(k) + b":" + (b"null" if v is None else v) for k, v in self._unacked.items())
        payload = b'{"seq":%d,"ops":{%s}}' % (self._seq, body)
        self._since_snapshot += len(payload)
        snapshot = None
        if not self._snapshotting and (
                self._snapshot_due or self._since_snapshot > max(self.min_compact_bytes, self._snapshot_bytes)):
            snapshot = Snapshot(self._seq, dict(self._data))  # encoded by the writer (Snapshot.chunks)
            self._snapshot_due = False
        return Batch(self._seq, self.version, len(self._unacked), payload, snapshot)

    def acked(self, batch: Batch) -> None:
        """The table holds ``batch`` and its snapshot (:func:`write_batch`): :meth:`segment_acked`, then
        :meth:`snapshot_written`."""
        self.segment_acked(batch)
        if batch.snapshot is not None:
            self.snapshot_written(batch.snapshot)

    def segment_acked(self, batch: Batch) -> None:
        """The table holds ``batch``'s segment: everything up to its version is durable. Its snapshot, if it
        carries one, is being written (:func:`write_snapshot`, after the segment): until
        :meth:`snapshot_written` or :meth:`snapshot_failed`, no other batch carries one (one snapshot at a
        time: a compaction's deletes would take a newer one's chunks for an older snapshot's)."""
        self._unacked = {}
        self.durable = max(self.durable, batch.version)
        if batch.snapshot is not None:
            self._snapshotting = True
            self._since_snapshot = 0  # the segments after it count toward the next

    def snapshot_written(self, snap: Snapshot) -> None:
        """The table holds ``snap``'s chunks and manifest."""
        self._snapshotting = False
        self._snapshot_bytes = snap.nbytes

    def snapshot_failed(self, snap: Snapshot) -> None:
        """Writing ``snap`` (after its segment) failed: the previous manifest and the segments after it still
        restore everything; the next batch carries a new snapshot."""
        self._snapshotting = False
        self._snapshot_due = True
        self.failures += 1

    def failed(self, batch: Batch) -> None:
        """Writing ``batch`` failed: its records go out again with the next batch (they stay unacknowledged,
        ``durable`` stays where it was, and a snapshot it carried is due again at the next :meth:`take`)."""
        self.failures += 1


def _seq_of(key: str) -> int:
    return int(key[len(SEGMENT_PREFIX):])


def _encode(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


def _chunks(data: Mapping[str, bytes]) -> list[bytes]:
    """The table as JSON objects of about :data:`CHUNK_BYTES` each (values are encoded already)."""
    out: list[bytes] = []
    parts: list[bytes] = []
    size = 0
    for k, v in data.items():
        item = orjson.dumps(k) + b":" + v
        parts.append(item)
        size += len(item) + 1
        if size >= CHUNK_BYTES:
            out.append(b"{" + b",".join(parts) + b"}")
            parts, size = [], 0
    if parts or not out:
        out.append(b"{" + b",".join(parts) + b"}")
    return out
