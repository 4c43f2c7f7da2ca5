"""The head's group-commit journal (``orchestrator.control.journal``) over an in-memory table.

``MemoryKv`` stands in for the GCS KV table (one needs a Ray cluster; the head-restart and GCS
fault-tolerance tests in tests/integration read the real one). A ``Flaky`` table fails after a given
number of operations, which is where a head dies mid-write.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from orchestrator.control.journal import (MANIFEST_KEY, SEGMENT_PREFIX, SNAPSHOT_PREFIX, CorruptJournalError, Journal,
                                          MemoryKv, covering_prefixes, segment_key, write_batch)


class Crash(Exception):
    pass


class Flaky(MemoryKv):
    """A :class:`MemoryKv` whose writes fail from the ``fail_after``-th on (None: never)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_after: int | None = None
        self.ops = 0
        self.deletes = 0  # delete and delete_prefix calls
        self.async_puts = 0
        self.threads: set[str] = set()

    def _tick(self) -> None:
        self.threads.add(threading.current_thread().name)
        self.ops += 1
        if self.fail_after is not None and self.ops > self.fail_after:
            raise Crash(f"table write {self.ops}")

    def put(self, key: str, value: bytes) -> None:
        self._tick()
        super().put(key, value)

    async def aput(self, key: str, value: bytes) -> None:
        self._tick()
        self.async_puts += 1
        await asyncio.sleep(0)  # as the GCS client's future: the loop runs others meanwhile
        super().put(key, value)

    def delete(self, key: str) -> None:
        self._tick()
        self.deletes += 1
        super().delete(key)

    def delete_prefix(self, prefix: str) -> int:
        self._tick()
        self.deletes += 1
        return super().delete_prefix(prefix)


def commit(j: Journal) -> None:
    b = j.take()
    if b is not None:
        write_batch(j.table, b)
        j.acked(b)


def state(j: Journal) -> dict[str, Any]:
    return {k: j.get(k) for k in j.keys("")}


def test_what_was_acknowledged_is_what_a_restarted_head_reads() -> None:
    j = Journal(MemoryKv())
    j.put("ns/lease/a", {"state": "pending"})
    j.put("ns/lease/b", {"state": "granted", "token": 3})
    j.delete("ns/lease/b")
    j.put("ns/meta", {"fencing": 3})
    assert j.pending and j.durable == 0
    commit(j)
    assert not j.pending
    again = Journal.load(j.table)
    assert state(again) == {"ns/lease/a": {"state": "pending"}, "ns/meta": {"fencing": 3}}
    assert again.keys("ns/lease/") == ["ns/lease/a"]


def test_changes_made_while_a_batch_is_out_go_in_the_next_one_and_a_key_written_twice_once() -> None:
    j = Journal(MemoryKv())
    for i in range(5):
        j.put("job", {"step": i})
    j.put("other", 1)
    first = j.take()
    assert first is not None and first.records == 2  # five writes of one key: its last value, once
    j.put("late", True)  # while `first` is being written
    write_batch(j.table, first)
    j.acked(first)
    assert j.pending and j.durable == first.version < j.version
    assert "late" not in state(Journal.load(j.table))
    commit(j)
    assert state(Journal.load(j.table)) == {"job": {"step": 4}, "other": 1, "late": True}
    assert j.take() is None  # nothing left


def test_a_failed_batch_is_written_again_with_the_next_and_durable_waits_for_it() -> None:
    table = Flaky()
    j = Journal(table)
    j.put("a", 1)
    b1 = j.take()
    assert b1 is not None
    table.fail_after = 0
    with pytest.raises(Crash):
        write_batch(table, b1)
    j.failed(b1)
    assert j.durable == 0 and j.failures == 1
    j.put("b", 2)
    table.fail_after = None
    b2 = j.take()
    assert b2 is not None and b2.records == 2  # the failed batch's record rides along
    write_batch(table, b2)
    j.acked(b2)
    assert not j.pending
    assert state(Journal.load(table)) == {"a": 1, "b": 2}


def test_segments_are_replayed_in_the_order_taken_whatever_order_the_table_got_them() -> None:
    table = MemoryKv()
    j = Journal(table)
    j.put("k", "old")
    b1 = j.take()
    j.acked(b1)  # type: ignore[arg-type]  # acknowledged by a write that lands late
    j.put("k", "new")
    b2 = j.take()
    assert b1 is not None and b2 is not None
    write_batch(table, b2)
    write_batch(table, b1)  # lands last
    assert Journal.load(table).get("k") == "new"


def test_compaction_keeps_the_table_small_and_restores_exactly() -> None:
    table = MemoryKv()
    j = Journal(table, min_compact_bytes=2_000)
    model: dict[str, Any] = {}
    for i in range(400):
        key = f"ns/job/{i % 37}"
        if i % 11 == 0:
            j.delete(key)
            model.pop(key, None)
        else:
            j.put(key, {"i": i, "history": list(range(i % 5))})
            model[key] = {"i": i, "history": list(range(i % 5))}
        commit(j)
    segments = table.keys(SEGMENT_PREFIX)
    assert table.get(MANIFEST_KEY) is not None
    assert len(segments) < 60, f"{len(segments)} segments left of 400 batches: compaction did not run"
    gens = {k.split("/")[1] for k in table.keys(SNAPSHOT_PREFIX)}
    assert len(gens) == 1  # older snapshots deleted once a newer manifest was written
    assert state(Journal.load(table, min_compact_bytes=2_000)) == model


@settings(max_examples=300, deadline=None)
@given(upto=st.integers(0, 10**9), near=st.lists(st.integers(-1200, 1200), max_size=30),
       far=st.lists(st.integers(0, 10**10), max_size=30))
@example(upto=0, near=[0, 1], far=[])
@example(upto=999, near=[0, 1, -1], far=[1000, 10**10])
@example(upto=1000, near=[0, 1, -1], far=[999, 10**10])
def test_the_covering_prefixes_match_exactly_the_segments_up_to_the_snapshot(upto: int, near: list[int],
                                                                             far: list[int]) -> None:
    # A compaction deleted its covered segments one call each (thousands of GCS calls after a long run); it
    # deletes them by these prefixes now, so one that matched a later segment would lose a durable batch.
    prefixes = covering_prefixes(upto)
    assert len(prefixes) <= 9 * 12 + 1 and len(prefixes) <= sum(map(int, str(upto))) + 1
    for seq in {upto + d for d in near if upto + d >= 0} | set(far) | {upto}:
        assert any(segment_key(seq).startswith(p) for p in prefixes) == (seq <= upto), (seq, upto)


def test_a_compaction_deletes_its_segments_in_a_few_calls() -> None:
    table = Flaky()
    j = Journal(table, min_compact_bytes=50_000)
    for i in range(3_000):
        j.put(f"k{i % 7}", {"i": i, "pad": "x" * 40})
        b = j.take()
        assert b is not None
        write_batch(table, b)
        j.acked(b)
        if b.snapshot is not None:
            snap = b.snapshot
            assert not [k for k in table.keys(SEGMENT_PREFIX) if int(k[len(SEGMENT_PREFIX):]) <= snap.upto]
            assert table.keys(SEGMENT_PREFIX) == [segment_key(s) for s in range(snap.upto + 1, i + 2)], snap.upto
    assert table.get(MANIFEST_KEY) is not None
    assert table.deletes < 3_000 / 10, table.deletes  # one a segment was ~3,000
    assert state(Journal.load(table)) == state(j)


def test_a_crash_at_any_operation_of_a_compacting_write_restores_a_batch_boundary() -> None:
    import copy

    table = Flaky()
    j = Journal(table, min_compact_bytes=1_000)
    before: dict[str, Any] = {}
    for i in range(400):
        j.put(f"k{i % 13}", {"i": i, "pad": "x" * 40})
        if i % 29 == 0:
            j.delete(f"k{(i + 5) % 13}")
        b = j.take()
        assert b is not None
        if b.snapshot is not None and table.get(MANIFEST_KEY) is not None:
            break  # a second compaction: it has an older snapshot and segments to delete
        write_batch(table, b)
        j.acked(b)
        before = state(j)
    else:
        pytest.fail("no second compaction in 400 batches")
    after = state(j)
    probe = copy.deepcopy(table)
    probe.fail_after = None
    write_batch(probe, b)
    writes = probe.ops - table.ops
    assert writes > 3  # segment, chunk(s), manifest, deletions
    for k in range(writes + 1):  # die after k table operations of this write (k = writes: it finished)
        t = copy.deepcopy(table)
        t.fail_after = t.ops + k
        try:
            write_batch(t, b)
        except Crash:
            pass
        seen = state(Journal.load(t))
        assert seen == (before if k == 0 else after), f"crash after {k} of {writes} operations"


def test_a_manifest_naming_a_missing_chunk_is_refused_not_half_restored() -> None:
    table = MemoryKv()
    j = Journal(table, min_compact_bytes=10)
    j.put("a", "x" * 100)
    commit(j)
    chunk = table.keys(SNAPSHOT_PREFIX)[0]
    table.delete(chunk)
    with pytest.raises(CorruptJournalError, match="missing"):
        Journal.load(table)


# ---- any interleaving, any crash point ------------------------------------------------------------
ops = st.lists(st.one_of(
    st.tuples(st.just("put"), st.sampled_from("abcdef"), st.integers(0, 9)),
    st.tuples(st.just("del"), st.sampled_from("abcdef"), st.just(0)),
    st.tuples(st.just("commit"), st.just(""), st.integers(-1, 12)),  # fail after n table ops (-1: not at all)
), max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_a_restart_at_any_point_sees_a_batch_boundary_at_or_after_the_last_acknowledged_one(plan: list) -> None:
    table = Flaky()
    j = Journal(table, min_compact_bytes=150)
    live: dict[str, Any] = {}
    boundaries: list[dict[str, Any]] = [{}]  # the state at each batch taken, in order
    acked = 0  # index into boundaries of the last acknowledged batch
    for op, key, n in plan:
        if op == "put":
            j.put(key, n)
            live[key] = n
        elif op == "del":
            j.delete(key)
            live.pop(key, None)
        else:
            b = j.take()
            if b is None:
                continue
            boundaries.append(dict(live))
            table.fail_after = None if n < 0 else table.ops + n
            try:
                write_batch(table, b)
            except Crash:
                j.failed(b)
            else:
                j.acked(b)
                acked = len(boundaries) - 1
            table.fail_after = None
        seen = state(Journal.load(table))
        assert seen in boundaries[acked:], (seen, boundaries[acked:])
    assert j.durable <= j.version


# ---- the head actor's writer (rayport.store.GroupCommit), on an event loop, no Ray ----------------
def test_group_commit_shares_one_batch_among_waiters_and_never_blocks_the_loop() -> None:
    from orchestrator.rayport.store import GroupCommit

    from orchestrator.control.metrics import HeadMetrics

    table = Flaky()
    j = Journal(table)
    metrics = HeadMetrics()
    gc = GroupCommit(j, table, metrics)

    async def change_and_wait(i: int) -> None:
        j.put(f"k{i}", i)
        mine = j.version
        await gc.durable()
        assert j.durable >= mine  # answered only once its change is in the table
        assert Journal.load(table).get(f"k{i}") == i

    async def main() -> None:
        await asyncio.gather(*(change_and_wait(i) for i in range(50)))

    asyncio.run(main())
    gc.close()
    assert state(Journal.load(table)) == {f"k{i}": i for i in range(50)}
    sample = metrics.registry.get_sample_value
    batches = sample("orchestrator_state_commits_total")
    assert 0 < batches < 50  # the waiters shared batches
    assert sample("orchestrator_state_commit_records_total") == 50
    assert sample("orchestrator_state_commit_seconds_count") == batches
    assert table.async_puts == batches  # each batch one awaited segment write, none blocking the loop


def test_group_commit_retries_a_failing_table_and_answers_nobody_before_it_lands() -> None:
    from orchestrator.rayport import store

    from orchestrator.control.metrics import HeadMetrics

    table = Flaky()
    j = Journal(table)
    metrics = HeadMetrics()
    gc = store.GroupCommit(j, table, metrics)
    table.fail_after = 0
    answered: list[bool] = []

    async def main() -> None:
        j.put("a", 1)
        waiter = asyncio.ensure_future(gc.durable())
        await asyncio.sleep(0.2)
        answered.append(waiter.done())  # still failing: not answered
        table.fail_after = None
        await asyncio.wait_for(waiter, 10)

    asyncio.run(main())
    gc.close()
    assert answered == [False]
    assert j.failures >= 1 and not j.pending
    assert metrics.registry.get_sample_value("orchestrator_state_commit_failures_total") == j.failures
    assert Journal.load(table).get("a") == 1


# ---- the head over the journal: no Ray job starts on a grant the table does not hold ---------------
class RecordingRunner:
    """Ray's job API stood in for (it needs a cluster): records, at each submission, what the table held."""

    def __init__(self, journal: Journal, namespace: str) -> None:
        self.journal, self.namespace = journal, namespace
        self.submitted: dict[str, dict[str, Any]] = {}

    def submit(self, submission_id: str, entrypoint: str, runtime_env: dict[str, Any],
               label_selector: dict[str, str], handout: dict[str, Any], metadata: dict[str, str]) -> None:
        restarted = Journal.load(self.journal.table)  # what a head restarted now would read
        lease = restarted.get(f"{self.namespace}/lease/{metadata['lease']}") or {}
        job = restarted.get(f"{self.namespace}/job/{metadata['orchestrator_job']}") or {}
        self.submitted[submission_id] = {"lease_state": lease.get("state"),
                                         "job_state": job.get("state"), "sub_id": job.get("ray_submission_id")}

    def status(self, submission_id: str) -> str | None:
        return "RUNNING" if submission_id in self.submitted else None

    def status_many(self, ids: Any) -> dict[str, str | None]:
        return {i: self.status(i) for i in ids}

    def stop(self, submission_id: str) -> None:
        pass

    def delete(self, submission_id: str) -> None:
        pass

    def logs(self, submission_id: str) -> str:
        return ""


def _head_over_journal() -> tuple[Any, Journal, RecordingRunner]:
    from scalebench import scale

    from orchestrator.control.service import HeadService
    from orchestrator.core.config import DEMO_CONFIG, load_config

    cfg = load_config(DEMO_CONFIG)
    settings = cfg.settings.model_copy(update={"namespace": "jt"})
    cfg = cfg.model_copy(update={"settings": settings})
    clock = scale.SimClock()
    port = scale.BenchPort(cfg, settings)
    j = Journal(MemoryKv())
    runner = RecordingRunner(j, "jt")
    head = HeadService(settings, cfg, j, runner, port, clock=clock, status_poll_s=0.0)
    head.cycle()
    for core in port.agents.values():
        ack = head.register_agent(**core.registration())
        core.apply_assignments(ack["assignments"], ack.get("revocations"))
    head.cycle()
    return head, j, runner


def launch(head: Any) -> None:
    """What the head actor does once a batch is durable (``rayport.head.launch_off_loop``), waited for."""
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator.rayport.head import launch_off_loop

    async def run() -> None:
        answered: list[None] = []
        with ThreadPoolExecutor(1) as pool:
            n = launch_off_loop(head, pool, asyncio.get_running_loop(), lambda: answered.append(None))
            while len(answered) < n:
                await asyncio.sleep(0.01)

    asyncio.run(run())


def test_the_head_submits_a_job_to_ray_only_after_the_table_holds_its_admission_and_grant() -> None:
    head, j, runner = _head_over_journal()
    spec = {"name": "t", "entrypoint": "true", "gpu": {"kind": "timeslice", "fraction": 0.25}, "priority": "batch"}
    for i in range(3):
        head.submit_job(spec, f"job-{i}")  # an idle queue: admitted in the call (the fast grant path)
    head.cycle()
    assert runner.submitted == {}  # admitted, not started: nothing is in the table yet
    assert {d["state"] for d in head.list_jobs()} == {"admitted"}
    commit(j)  # the head actor: `await commit.durable()`
    launch(head)
    assert sorted(runner.submitted) == [f"job-{i}.a1" for i in range(3)]
    for seen in runner.submitted.values():
        assert seen == {"lease_state": "granted", "job_state": "admitted", "sub_id": seen["sub_id"]} and seen["sub_id"]
    assert {d["state"] for d in head.list_jobs()} == {"running"}


def test_a_job_cancelled_between_admission_and_launch_is_not_started() -> None:
    head, j, runner = _head_over_journal()
    spec = {"name": "t", "entrypoint": "true", "gpu": {"kind": "timeslice", "fraction": 0.25}, "priority": "batch"}
    head.submit_job(spec, "job-a")
    head.submit_job(spec, "job-b")
    head.cancel_job("job-a")
    commit(j)
    launch(head)
    assert sorted(runner.submitted) == ["job-b.a1"]
    assert head.get_job("job-a")["state"] == "cancelled"


def test_a_head_that_dies_before_a_jobs_running_record_is_written_restores_it_admitted_and_runs_it_once() -> None:
    # The head actor's loop no longer flushes what the job API's answer wrote (the job running, its lease active):
    # it rides with the next caller's batch or the timer's tick. A head that dies in between must neither lose
    # the job nor start a second one: it restores the job admitted and sends the same submission again, which
    # Ray's job API answers as taken (RayJobRunner.submit: the id exists with our metadata).
    from orchestrator.control.service import HeadService

    head, j, runner = _head_over_journal()
    spec = {"name": "t", "entrypoint": "true", "gpu": {"kind": "timeslice", "fraction": 0.25}, "priority": "batch"}
    head.submit_job(spec, "job-a")
    commit(j)  # the reply's batch: the admission
    launch(head)
    assert head.get_job("job-a")["state"] == "running"
    assert Journal.load(j.table).get("jt/job/job-a")["state"] == "admitted"  # what a restart reads now

    again = Journal.load(j.table)
    rerun = RecordingRunner(again, "jt")
    restarted = HeadService(head.settings, head.cluster, again, rerun, head.port, clock=head.clock, status_poll_s=0.0)
    restarted.cycle()
    commit(again)
    launch(restarted)
    assert list(rerun.submitted) == list(runner.submitted) == ["job-a.a1"]  # one Ray job, asked for twice
    d = restarted.get_job("job-a")
    assert (d["state"], d["attempt"], d["lease"]["state"]) == ("running", 1, "active")


async def _write_one_by_one(j: Journal, gc: Any, n: int, *, keys: int, within_s: float | None = None,
                            until: Any = None) -> None:
    """``n`` changes over ``keys`` keys, each waited for (``within_s``) before the next; stop early once
    ``until(i)``."""
    for i in range(n):
        j.put(f"k{i % keys}", {"i": i, "pad": "y" * 30})
        await asyncio.wait_for(gc.durable(), within_s)
        if until is not None and until(i):
            break


def test_group_commit_writes_a_compaction_on_its_writer_thread_in_order() -> None:
    from orchestrator.rayport.store import GroupCommit

    table = Flaky()
    j = Journal(table, min_compact_bytes=500)
    gc = GroupCommit(j, table)
    asyncio.run(_write_one_by_one(j, gc, 60, keys=7))
    gc.close()
    assert table.get(MANIFEST_KEY) is not None  # compactions ran
    assert any(n.startswith("rgo-commit") for n in table.threads)  # ...on the writer thread
    assert state(Journal.load(table)) == {f"k{i % 7}": {"i": i, "pad": "y" * 30} for i in range(53, 60)}


def test_a_snapshot_holds_the_table_as_taken_and_is_encoded_by_the_writer_not_the_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Encoding the whole table on the head's loop at each compaction stalled every call ~45-80 ms (60,000
    # records); the loop now copies the table and the writer thread encodes the copy.
    from orchestrator.control import journal as journal_mod
    from orchestrator.rayport.store import GroupCommit

    table = MemoryKv()
    j = Journal(table, min_compact_bytes=10)
    j.put("a", {"v": 1})
    batch = j.take()
    assert batch is not None and batch.snapshot is not None
    j.put("a", {"v": 2})  # the loop goes on while the writer has the batch: not part of it
    j.put("b", {"v": 2})
    write_batch(table, batch)
    j.acked(batch)
    assert state(Journal.load(table)) == {"a": {"v": 1}}, "a crash now must restore the batch, not what came after"
    encoded_on: list[str] = []
    real = journal_mod._chunks

    def chunks(data: Any) -> list[bytes]:
        encoded_on.append(threading.current_thread().name)
        return real(data)

    monkeypatch.setattr(journal_mod, "_chunks", chunks)
    j2 = Journal(MemoryKv(), min_compact_bytes=500)
    gc = GroupCommit(j2, j2.table)
    asyncio.run(_write_one_by_one(j2, gc, 60, keys=7))
    gc.close()
    assert encoded_on and all(n.startswith("rgo-commit") for n in encoded_on), encoded_on


def test_replies_after_a_compaction_do_not_wait_for_the_deletion_of_what_it_covers() -> None:
    """The deletes a compaction leaves (a few dozen prefixes; one per covered segment, thousands after a long run,
    before) run after the batch is acknowledged: a reply waits for the manifest, not for them; a restart meanwhile
    ignores them."""
    from orchestrator.rayport.store import GroupCommit

    class SlowDeletes(Flaky):
        def __init__(self) -> None:
            super().__init__()
            self.go = threading.Event()

        def delete(self, key: str) -> None:
            assert self.go.wait(30), "deletes never released"
            super().delete(key)

        def delete_prefix(self, prefix: str) -> int:
            assert self.go.wait(30), "deletes never released"
            return super().delete_prefix(prefix)

    table = SlowDeletes()
    j = Journal(table, min_compact_bytes=400)
    gc = GroupCommit(j, table)
    try:  # each reply within 5 s: it would time out if it waited for the blocked deletes
        asyncio.run(_write_one_by_one(j, gc, 40, keys=5, within_s=5,
                                      until=lambda i: table.get(MANIFEST_KEY) is not None and i % 5 == 4))
        assert table.get(MANIFEST_KEY) is not None, "no compaction ran"
        upto = int(json.loads(table.get(MANIFEST_KEY))["upto"])
        covered = [k for k in table.keys(SEGMENT_PREFIX) if int(k[len(SEGMENT_PREFIX):]) <= upto]
        assert covered, "the covered segments are still there: their deletes are waiting"
        assert state(Journal.load(table)) == state(j)  # a head restarted now reads the acknowledged state
    finally:
        table.go.set()
        gc._writer.shutdown(wait=True)  # noqa: SLF001 - the deletes finish
    assert not [k for k in table.keys(SEGMENT_PREFIX) if int(k[len(SEGMENT_PREFIX):]) <= upto]
    assert state(Journal.load(table)) == state(j)


def test_replies_do_not_wait_for_a_snapshots_chunks_and_one_snapshot_is_written_at_a_time() -> None:
    """A compaction's batch is durable with its segment: the snapshot's chunks (megabytes at scale: the longest
    reply of a 6,000-job run waited 75-108 ms for them) are written on the writer thread while later segments
    go on. Until its manifest is written a restart reads the previous snapshot and every segment after it."""
    from orchestrator.rayport.store import GroupCommit

    class SlowChunks(Flaky):
        def __init__(self) -> None:
            super().__init__()
            self.go = threading.Event()
            self.chunk_puts: list[str] = []

        def put(self, key: str, value: bytes) -> None:
            if key.startswith(SNAPSHOT_PREFIX):
                self.chunk_puts.append(key)
                assert self.go.wait(30), "chunks never released"
            super().put(key, value)

    table = SlowChunks()
    j = Journal(table, min_compact_bytes=400)
    gc = GroupCommit(j, table)
    try:  # each reply within 5 s: it would time out if it waited for the held chunks
        asyncio.run(_write_one_by_one(j, gc, 80, keys=5, within_s=5))
        assert len(table.chunk_puts) == 1, "one snapshot at a time: none other started while one is held"
        assert table.get(MANIFEST_KEY) is None and len(table.keys(SEGMENT_PREFIX)) == 80
        assert state(Journal.load(table)) == state(j)  # a head restarted now reads every acknowledged change
    finally:
        table.go.set()
        gc._writer.shutdown(wait=True)  # noqa: SLF001 - the snapshot and its deletes finish
    upto = int(json.loads(table.get(MANIFEST_KEY))["upto"])
    assert all(int(k[len(SEGMENT_PREFIX):]) > upto for k in table.keys(SEGMENT_PREFIX))
    assert state(Journal.load(table)) == state(j)


def test_a_snapshot_whose_write_failed_is_taken_again_with_the_next_batch() -> None:
    table = MemoryKv()
    j = Journal(table, min_compact_bytes=100)  # the first batch's padding makes it due; the later ones are small
    j.put("a", {"v": 1, "pad": "x" * 120})
    first = j.take()
    assert first is not None and first.snapshot is not None
    table.put(first.key, first.payload)
    j.segment_acked(first)
    j.put("a", {"v": 2})
    during = j.take()
    assert during is not None and during.snapshot is None  # one at a time
    table.put(during.key, during.payload)
    j.segment_acked(during)
    j.snapshot_failed(first.snapshot)
    j.put("b", {"v": 3})
    after = j.take()
    assert after is not None and after.snapshot is not None and j.failures == 1
    write_batch(table, after)
    j.acked(after)
    assert state(Journal.load(table)) == {"a": {"v": 2}, "b": {"v": 3}}


def test_a_table_an_earlier_head_wrote_one_key_per_record_is_read_and_folded_into_the_first_snapshot() -> None:
    table = MemoryKv()
    old = {"ns/meta": {"fencing": 7, "seq": 3}, "ns/lease/a": {"state": "active", "fencing_token": 7},
           "ns/job/j": {"state": "running"}}
    for k, v in old.items():  # what GcsKvStore wrote: JSON with sorted keys, one key per record
        table.put(k, json.dumps(v, sort_keys=True).encode())
    j = Journal.load(table, min_compact_bytes=10)
    assert state(j) == old
    j.put("ns/lease/b", {"state": "pending"})
    b = j.take()
    assert b is not None and b.snapshot is not None  # the legacy records count toward the first compaction
    write_batch(table, b)
    j.acked(b)
    assert not [k for k in table.keys("") if not k.startswith("_")], "the old keys are gone after the manifest"
    assert state(Journal.load(table)) == {**old, "ns/lease/b": {"state": "pending"}}


def test_an_in_process_head_hands_out_a_submission_only_once_the_table_holds_its_admission() -> None:
    # One mode: an in-process head drives the same hand-out as the actor (jobs.launches.run_due), and it takes
    # nothing while the journal still holds writes the table has not acknowledged.
    from orchestrator.control.jobs import StoreNotDurableError, run_due

    head, j, runner = _head_over_journal()
    spec = {"name": "t", "entrypoint": "true", "gpu": {"kind": "timeslice", "fraction": 0.25}, "priority": "batch"}
    head.submit_job(spec, "job-a")
    with pytest.raises(StoreNotDurableError):
        run_due(head)
    assert runner.submitted == {} and head.launch_due()  # refused before anything was taken
    run_due(head, flush=lambda: commit(j))
    assert runner.submitted == {"job-a.a1": {"lease_state": "granted", "job_state": "admitted", "sub_id": "job-a.a1"}}
    assert head.get_job("job-a")["state"] == "running" and not head.launch_due()
