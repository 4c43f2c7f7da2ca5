"""Calls that many threads of one process make at once, sent together: one send carries every call made while
the previous send was on its way (the combining pattern). Pure threading; no Ray.

Why: a Ray actor call costs both ends a fixed ~0.3-0.7 ms of CPU (task submission, serialization, the hand-over
to the actor's event loop), more than the head's own work for a small call. A process that submits jobs from 16
threads paid it 16 times for what one call can carry (docs/load.md has the figures).

How, without a timer or a thread of its own (so that a lone caller's call goes at once, as an unbatched one would):

* a call that finds nothing on its way sends itself, at once, as a batch of one;
* a call made while a batch is on its way waits in the queue; when that batch comes back, its sender makes the
  first queued call the *leader* of the next batch (every call queued meanwhile, up to ``max_batch``) and wakes
  it; the leader sends that batch and, when it comes back, hands on in turn.

Invariants (``tests/unit/test_coalesce.py``):

* at most one batch of a :class:`Coalescer` is on its way at a time;
* every call is answered exactly once, with its own reply from its batch or the exception its batch's send
  raised (``send`` answers a batch in order: reply ``i`` is call ``i``'s);
* a call leaves only when its batch has come back, or when its own thread is interrupted (then it is taken out
  of the queue, or, if it was to lead a batch, it hands the batch on first: no call waits on a caller that left);
* calls go in the order they were made.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

#: The most calls one send carries (a larger backlog goes in several).
MAX_BATCH = 256


class SendInterrupted(RuntimeError):
    """The thread sending this call's batch was interrupted (KeyboardInterrupt, SystemExit) while it waited for
    the answer: the call may or may not have been carried out."""


@dataclass(eq=False)
class _Call:
    item: Any
    done: threading.Event = field(default_factory=threading.Event)
    reply: Any = None
    error: BaseException | None = None
    answered: bool = False
    lead: list["_Call"] | None = None  # set (under the lock) when this call's thread must send this batch

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.reply


class Coalescer:
    """Sends ``item`` s through ``send`` (``send(items) -> replies``, one reply per item, in order), several at a
    time when several threads call at once; see the module docstring. Thread-safe."""

    def __init__(self, send: Callable[[list[Any]], Sequence[Any]], max_batch: int = MAX_BATCH) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._send_fn = send
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self._queue: list[_Call] = []
        self._busy = False  # a batch is on its way (or its leader is about to send it)
        self.sends = 0  # batches sent (for tests and figures)
        self.largest = 0  # the most calls one batch carried

    def call(self, item: Any) -> Any:
        """Send ``item`` (alone, or with the calls made meanwhile) and return its reply, or raise what its batch's
        send raised."""
        return self._enter(_Call(item))

    def _enter(self, c: _Call) -> Any:
        with self._lock:
            if self._busy:
                self._queue.append(c)
                batch = None
            else:
                self._busy = True
                batch = [c]
        if batch is None:
            try:
                c.done.wait()
            except BaseException:  # interrupted (KeyboardInterrupt in the main thread): leave without a trace
                self._abandon(c)
                raise
            if c.lead is None:
                return c.result()
            batch = c.lead
        try:
            self._send(batch)
        finally:
            self._hand_on()
        return c.result()

    def _send(self, batch: list[_Call]) -> None:
        try:
            self.sends += 1
            self.largest = max(self.largest, len(batch))
            replies = list(self._send_fn([c.item for c in batch]))
            if len(replies) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} calls came back with {len(replies)} replies")
        except Exception as e:  # every call of the batch gets what its send raised
            self._answer_all(batch, e)
            return
        except BaseException as e:  # the sender's own thread was interrupted: it raises, the others are told
            self._answer_all(batch, SendInterrupted(f"the thread sending this call was interrupted ({e!r})"))
            raise
        for c, r in zip(batch, replies):
            c.reply, c.answered = r, True
            c.done.set()

    @staticmethod
    def _answer_all(batch: list[_Call], error: BaseException) -> None:
        for c in batch:
            c.error, c.answered = error, True
            c.done.set()

    def _hand_on(self) -> None:
        """The batch on its way came back: the first queued call leads the next one, or the pipe is idle."""
        with self._lock:
            nxt, self._queue = self._queue[:self.max_batch], self._queue[self.max_batch:]
            if nxt:
                nxt[0].lead = nxt
            else:
                self._busy = False
        if nxt:
            nxt[0].done.set()

    def _abandon(self, c: _Call) -> None:
        """``c``'s thread was interrupted while it waited: take it out of the queue, or hand on the batch it was to
        lead (without it); a call already on its way is answered and the answer dropped."""
        with self._lock:
            if c in self._queue:
                self._queue.remove(c)
                return
            batch = c.lead
            if batch is None or c.answered:
                return
            rest = [x for x in batch if x is not c]
            if rest:
                rest[0].lead = rest
        if rest:
            rest[0].done.set()
        else:
            self._hand_on()
