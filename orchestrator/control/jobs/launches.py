"""The one hand-out of the calls due to Ray's job API: what is due, in which order, and how each is applied.

The job layer has one mode: a step of the head decides and writes (a job admitted, a job cancelled, a job
dropped) and never calls Ray's job API; the calls that step made due wait until whoever drives the head
takes them (:func:`take_due`), after the store holds what made them due. Two drivers share this module:

* the head actor (``rayport.head.launch_off_loop``): once the journal's batch is in the GCS, it makes each
  call on a thread of its own and applies the answer back on its event loop;
* an in-process head (tests, ``tests/headless.py``, the benches): :func:`run_due` makes each call and applies
  its answer at once, where the actor would have handed them out.

Invariants:

* **durable first**: nothing is taken before the store holds every write made so far (:func:`run_due` checks
  it; the actor awaits its group commit), so no Ray job starts on a grant, and none is stopped for a
  record, that a restarted head would not restore;
* **stops first**: the stops and deletes (:class:`~.intents.Chore`) are handed out before the submissions,
  so on one thread a preempted attempt is stopped before its successor starts;
* **once each**: an item is handed out once (the side marks it in flight) and its answer applied once, by
  its own ``apply``; ``send`` reads and changes no state of the side (it may run off the head's loop).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from orchestrator.control.jobs.intents import Chore, RaySubmission


class JobApiSide(Protocol):
    """Who hands out the calls due to Ray's job API and applies their answers: the job layer
    (:class:`~.manager.JobManager`) and the head over it (:class:`~orchestrator.control.service.HeadService`,
    which logs each answer)."""

    @property
    def store(self) -> Any: ...

    def take_chores(self) -> list[Chore]: ...

    def send_chore(self, chore: Chore) -> Exception | None: ...

    def chore_done(self, chore: Chore, error: Exception | None) -> str: ...

    def take_submissions(self) -> list[RaySubmission]: ...

    def send_submission(self, sub: RaySubmission) -> Exception | None: ...

    def submission_sent(self, sub: RaySubmission, error: Exception | None) -> str: ...


@dataclass(frozen=True, slots=True)
class JobApiCall:
    """One call due to Ray's job API: the ``item`` (a stop, a delete, a submission), the blocking ``send`` that
    makes it (safe off the head's loop) and the ``apply`` that takes its answer back (on the loop)."""

    item: Chore | RaySubmission
    send: Callable[[Any], Exception | None]
    apply: Callable[[Any, Exception | None], str]

    @property
    def submission(self) -> bool:
        return isinstance(self.item, RaySubmission)

    def run(self) -> str:
        """Make the call and apply its answer, here and now; returns the event the answer made."""
        return self.apply(self.item, self.send(self.item))


def take_due(side: JobApiSide) -> list[JobApiCall]:
    """The calls due now, each handed out once: the stops and deletes first, then the submissions. Call only
    once the store holds every write made so far (the module docstring)."""
    calls = [JobApiCall(c, side.send_chore, side.chore_done) for c in side.take_chores()]
    calls += [JobApiCall(s, side.send_submission, side.submission_sent) for s in side.take_submissions()]
    return calls


class StoreNotDurableError(RuntimeError):
    """:func:`run_due` was called while the store still held writes it had not made durable (``pending``): a
    call to Ray's job API would have acted on a record a restarted head might not restore."""

    def __init__(self, store: Any) -> None:
        super().__init__(f"{type(store).__name__} has writes not yet durable: flush it (run_due's flush) before "
                         "handing Ray's job API anything")
        self.store = store


def run_due(side: JobApiSide, flush: Callable[[], object] | None = None) -> list[str]:
    """The in-process head's hand-out: ``flush()`` the store (a store with group commit; a
    :class:`~orchestrator.control.store.MemoryStore` is durable on each write and needs none), then make every
    call now due (:func:`take_due`) and apply its answer at once, in order. Returns the events the answers
    made. Where the head actor hands the calls out after its group commit, this is called after the step
    that made them due: it is the actor's ``launch_off_loop`` on one thread, waited for.

    Raises :class:`StoreNotDurableError`, taking nothing, when the store still says writes are pending."""
    if flush is not None:
        flush()
    if getattr(side.store, "pending", False):  # a Journal: the batch holding what made the calls due is not written
        raise StoreNotDurableError(side.store)
    return [call.run() for call in take_due(side)]
