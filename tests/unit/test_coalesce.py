"""Calls from many threads sent together (``orchestrator.rayport.coalesce``): real threads, and a ``send`` that is
the seam (it stands where ``HeadClient`` puts one Ray call to the head) and records what each send carried."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from orchestrator.rayport.coalesce import Coalescer, SendInterrupted, _Call


class Recorder:
    """``send``: answers each item with ``("re", item)``; records every batch; can hold a send until released and
    checks that no two sends overlap."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.on_the_way = 0
        self.overlapped = False
        self._lock = threading.Lock()

    def __call__(self, items: list[Any]) -> list[Any]:
        with self._lock:
            self.on_the_way += 1
            self.overlapped |= self.on_the_way > 1
            self.batches.append(list(items))
        self.entered.set()
        try:
            assert self.gate.wait(10), "the test never released the send"
            if any(i == "boom" for i in items):
                raise ConnectionError("the head went away")
            return [("re", i) for i in items]
        finally:
            with self._lock:
                self.on_the_way -= 1


def _wait_until(cond: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def _behind_a_held_send(c: Coalescer, rec: Recorder, pool: ThreadPoolExecutor, items: list[Any]) -> tuple[Any, list[Any]]:
    """Call "first" and hold its send on its way; then call each of ``items`` (they queue behind it). The futures."""
    rec.gate.clear()
    first = pool.submit(c.call, "first")
    assert rec.entered.wait(5)
    rest = [pool.submit(c.call, i) for i in items]
    _wait_until(lambda: len(c._queue) == len(items))
    return first, rest


def test_a_lone_call_goes_at_once_alone() -> None:
    rec = Recorder()
    c = Coalescer(rec)
    assert c.call("a") == ("re", "a")
    assert c.call("b") == ("re", "b")
    assert rec.batches == [["a"], ["b"]]


def test_calls_made_while_one_is_on_its_way_go_together_in_the_next_send_each_with_its_own_reply() -> None:
    rec = Recorder()
    c = Coalescer(rec)
    with ThreadPoolExecutor(8) as pool:
        first, rest = _behind_a_held_send(c, rec, pool, list(range(7)))
        rec.gate.set()
        assert first.result(5) == ("re", "first")
        assert [f.result(5) for f in rest] == [("re", i) for i in range(7)]
    assert rec.batches[0] == ["first"] and sorted(rec.batches[1]) == list(range(7)) and len(rec.batches) == 2
    assert not rec.overlapped  # one send on its way at a time
    assert (c.sends, c.largest) == (2, 7)


def test_many_threads_every_call_answered_once_with_its_own_reply_and_fewer_sends_than_calls() -> None:
    def slow(items: list[Any]) -> list[Any]:
        time.sleep(0.002)  # as a call to the head takes time: calls pile up meanwhile
        return [i * 10 for i in items]

    c = Coalescer(slow)
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(c.call, range(800)))
    assert got == [i * 10 for i in range(800)]
    assert c.sends < 400 and c.largest > 1


def test_a_failed_send_is_the_error_of_every_call_it_carried_and_the_next_calls_still_go() -> None:
    rec = Recorder()
    c = Coalescer(rec)
    with ThreadPoolExecutor(4) as pool:
        first, doomed = _behind_a_held_send(c, rec, pool, ["boom", "x"])
        rec.gate.set()
        assert first.result(5) == ("re", "first")
        for f in doomed:
            with pytest.raises(ConnectionError, match="went away"):
                f.result(5)
    assert c.call("after") == ("re", "after")


def test_a_send_answering_the_wrong_number_of_replies_fails_its_calls_not_the_pipe() -> None:
    c = Coalescer(lambda items: [])
    with pytest.raises(RuntimeError, match="1 calls came back with 0 replies"):
        c.call("a")
    assert Coalescer(lambda items: list(items)).call("b") == "b"


def test_a_backlog_larger_than_max_batch_goes_in_several_sends() -> None:
    rec = Recorder()
    c = Coalescer(rec, max_batch=3)
    with ThreadPoolExecutor(8) as pool:
        first, rest = _behind_a_held_send(c, rec, pool, list(range(7)))
        rec.gate.set()
        assert [f.result(5) for f in [first, *rest]] == [("re", "first")] + [("re", i) for i in range(7)]
    assert [len(b) for b in rec.batches] == [1, 3, 3, 1]


def test_a_queued_caller_that_is_interrupted_leaves_the_queue_and_wedges_nobody() -> None:
    rec = Recorder()
    c = Coalescer(rec)
    with ThreadPoolExecutor(4) as pool:
        first, _ = _behind_a_held_send(c, rec, pool, [])
        _interrupted_while_queued(c, "quitter")
        other = pool.submit(c.call, "other")
        _wait_until(lambda: len(c._queue) == 1)
        rec.gate.set()
        assert first.result(5) == ("re", "first") and other.result(5) == ("re", "other")
    assert all("quitter" not in b for b in rec.batches)


def test_a_caller_interrupted_when_it_was_to_lead_the_next_send_hands_it_on() -> None:
    rec = Recorder()
    c = Coalescer(rec)
    with ThreadPoolExecutor(4) as pool:
        first, _ = _behind_a_held_send(c, rec, pool, [])
        quitter = _Interruptible(c, "quitter")  # queued first: it is made the leader of the next send
        _wait_until(lambda: len(c._queue) == 1)
        other = pool.submit(c.call, "other")
        _wait_until(lambda: len(c._queue) == 2)
        quitter.hold_lead.set()  # it stays away until the lead is handed to it, then is interrupted
        rec.gate.set()
        assert first.result(5) == ("re", "first")
        assert other.result(5) == ("re", "other")  # sent by someone: the lead was handed on
        quitter.join()
    assert isinstance(quitter.raised, KeyboardInterrupt) and quitter.was_leader
    assert all("quitter" not in b for b in rec.batches[1:])
    assert c.call("after") == ("re", "after")


def test_the_sender_interrupted_while_waiting_for_its_send_tells_the_others_it_was() -> None:
    entered, never = threading.Event(), threading.Event()

    def send(items: list[Any]) -> list[Any]:
        entered.set()
        if "lead" in items:
            never.wait(0.3)
            raise KeyboardInterrupt  # as Ctrl-C lands in the sending thread
        return list(items)

    c = Coalescer(send)
    with ThreadPoolExecutor(2) as pool:
        lead = pool.submit(c.call, "lead")
        assert entered.wait(5)
        other = pool.submit(c.call, "other")
        _wait_until(lambda: len(c._queue) == 1)
        with pytest.raises(KeyboardInterrupt):
            lead.result(5)
        assert other.result(5) == "other"  # queued behind it: sent next, not lost
    assert c.call("after") == "after"


def test_the_others_carried_by_an_interrupted_send_get_send_interrupted() -> None:
    release = threading.Event()

    def send(items: list[Any]) -> list[Any]:
        if items == ["a"]:
            release.wait(5)
            return ["a"]
        raise KeyboardInterrupt

    c = Coalescer(send)
    with ThreadPoolExecutor(3) as pool:
        a = pool.submit(c.call, "a")
        _wait_until(lambda: c._busy)
        b, d = pool.submit(c.call, "b"), pool.submit(c.call, "d")
        _wait_until(lambda: len(c._queue) == 2)
        release.set()
        assert a.result(5) == "a"
        outcomes = []
        for f in (b, d):
            try:
                outcomes.append(type(f.result(5)))
            except BaseException as e:  # noqa: BLE001 - what each got is the point
                outcomes.append(type(e))
    assert sorted(o.__name__ for o in outcomes) == ["KeyboardInterrupt", "SendInterrupted"]
    assert issubclass(SendInterrupted, RuntimeError)


# ---- helpers: a caller whose wait is interrupted ---------------------------------------------------------------
def _interrupted_while_queued(c: Coalescer, item: str) -> None:
    """Queue ``item`` from a thread whose wait raises KeyboardInterrupt at once (as Ctrl-C in the main thread)."""
    t = _Interruptible(c, item, wait_for_lead=False)
    t.hold_lead.set()
    t.join()
    assert isinstance(t.raised, KeyboardInterrupt) and not t.was_leader


class _Interruptible(threading.Thread):
    """Calls ``c`` with ``item`` from a thread whose wait raises KeyboardInterrupt once ``hold_lead`` is set: at once,
    or (``wait_for_lead``) only once the call has been woken, i.e. made the leader of the next send."""

    def __init__(self, c: Coalescer, item: str, wait_for_lead: bool = True) -> None:
        super().__init__(daemon=True)
        self.c, self.item, self.wait_for_lead = c, item, wait_for_lead
        self.hold_lead = threading.Event()
        self.raised: BaseException | None = None
        self.was_leader = False
        self.start()

    def run(self) -> None:
        me = self

        class Interrupting(threading.Event):
            def wait(self, timeout: float | None = None) -> bool:
                assert me.hold_lead.wait(10)
                if me.wait_for_lead:
                    assert super().wait(10), "never woken"
                me.was_leader = call.lead is not None
                raise KeyboardInterrupt

        call = _Call(self.item, done=Interrupting())
        try:
            self.c._enter(call)
        except BaseException as e:  # noqa: BLE001 - the interruption is the point
            self.raised = e
