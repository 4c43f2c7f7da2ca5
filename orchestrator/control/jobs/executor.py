"""The job layer's effects against Ray's job API, with its one retry policy.

The manager decides (:mod:`.transitions`) and writes; the executor makes the calls its intents
(:mod:`.intents`) ask for -- a submission, a stop, a delete -- through the :class:`~.runner.JobRunner`, and
keeps what a call that did not go through needs to be made again.

Invariants:

* **one retry policy**: a call Ray's job API could not take for a reason that may pass
  (``JobApiUnavailableError``) is made again after 1, 2, 4 ... at most 30 s (``core.backoff``; by default:
  ``settings.tuning.submit_backoff_first_s`` and ``_max_s``), counted from its first failure, for ``retry_for_s``; then it is given up (a submission: the job fails with what
  Ray said; a stop or delete: said in the log). Any other failure is Ray's answer and is not asked again;
* :meth:`Executor.send` and :meth:`Executor.send_chore` read and change no state: the head actor calls
  them on a thread of its own, and applies the answer back on its loop (:meth:`Executor.chore_done`, the
  manager's ``sent``);
* a chore is handed out once (:meth:`Executor.take_chores`), stops first, and at most
  :data:`DELETES_IN_FLIGHT` deletes are out at a time.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from orchestrator.control.jobs.intents import Chore, ChoreKind, RaySubmission
from orchestrator.control.jobs.runner import JobRunner
from orchestrator.core.backoff import backoff_s
from orchestrator.core.config import Tuning
from orchestrator.core.errors import JobApiUnavailableError

log = logging.getLogger(__name__)

#: A submission Ray's job API could not take for a reason that may pass (JobApiUnavailableError) is sent
#: again after 1, 2, 4 ... at most 30 s, for ``submit_retry_s`` (the job then fails with what Ray said). The
#: defaults of ``settings.tuning.submit_backoff_first_s`` and ``_max_s``, which the job manager gives the executor.
SUBMIT_BACKOFF_FIRST_S = Tuning().submit_backoff_first_s
SUBMIT_BACKOFF_MAX_S = Tuning().submit_backoff_max_s
#: Deletes of dropped jobs' Ray records out at a time (they wait behind nothing, and nothing waits behind more).
DELETES_IN_FLIGHT = 2


@dataclass(frozen=True, slots=True)
class Retry:
    """A call Ray's job API could not take yet (a submission, a stop, a delete): since ``first``, ``tries`` times;
    next at ``due``."""

    first: float
    due: float
    tries: int

    @staticmethod
    def after(prev: "Retry | None", now: float, first_s: float = SUBMIT_BACKOFF_FIRST_S,
              max_s: float = SUBMIT_BACKOFF_MAX_S) -> "Retry":
        """The retry after one more failure at ``now``: due ``first_s``, twice that ... at most ``max_s`` later
        (1, 2, 4 ... 30 s by default), counted from the first."""
        first, tries = (prev.first, prev.tries) if prev is not None else (now, 0)
        return Retry(first=first, due=now + backoff_s(tries, first_s, max_s), tries=tries + 1)


class Executor:
    """Makes the job layer's calls to ``runner`` and keeps their retries; see the module docstring."""

    def __init__(self, runner: JobRunner, *, clock: Callable[[], float], retry_for_s: float,
                 backoff_first_s: float = SUBMIT_BACKOFF_FIRST_S, backoff_max_s: float = SUBMIT_BACKOFF_MAX_S) -> None:
        self.runner = runner
        self.clock = clock
        self.retry_for_s = retry_for_s
        self._backoff = (backoff_first_s, backoff_max_s)  # each retry's first wait and longest wait (Retry.after)
        # Ray submission ids whose submission the job API could not take yet.
        # Soft: a restarted head submits every admitted job again at once (the same id: never run twice).
        self._submit_retry: dict[str, Retry] = {}
        # Ray jobs to stop or delete: handed out by take_chores() once the store holds the record that made the
        # call needed; one Ray's job API could not take yet waits in _chore_retry.
        self._chores: dict[Chore, None] = {}
        self._chore_retry: dict[Chore, Retry] = {}
        self._deleting = 0  # deletes handed out by take_chores() and not yet answered (chore_done)

    # ---- submissions ---------------------------------------------------------------------------
    def send(self, sub: RaySubmission) -> Exception | None:
        """Hand ``sub`` to Ray's job API; returns what it raised (None: taken). Reads and changes no state."""
        try:
            self.runner.submit(sub.submission_id, sub.entrypoint, sub.runtime_env, sub.label_selector, sub.demand,
                               sub.metadata)
        except Exception as e:
            return e
        return None

    def retrying(self, submission_id: str) -> bool:
        """Whether the submission ``submission_id`` failed for now and waits to be sent again."""
        return submission_id in self._submit_retry

    def retry_waiting(self, submission_id: str, now: float) -> bool:
        """Whether ``submission_id`` waits for its backoff at ``now`` (its next try not yet due)."""
        retry = self._submit_retry.get(submission_id)
        return retry is not None and now < retry.due

    def submit_failed(self, submission_id: str, now: float) -> tuple[Retry, bool]:
        """One more failure of ``submission_id`` that may pass, at ``now``: the retry it is now at, and whether to
        give up (``retry_for_s`` of failures; the retry is then not kept: the caller fails the job)."""
        retry = Retry.after(self._submit_retry.get(submission_id), now, *self._backoff)
        if now - retry.first >= self.retry_for_s:
            return retry, True
        self._submit_retry[submission_id] = retry
        return retry, False

    def submission_over(self, submission_id: str) -> None:
        """The submission was taken, or its job went another way: no retry of it is due any more."""
        self._submit_retry.pop(submission_id, None)

    # ---- stops and deletes ---------------------------------------------------------------------
    def ask(self, chore: Chore) -> None:
        """Queue ``chore`` for :meth:`take_chores` (idempotent)."""
        self._chores[chore] = None

    def due_chores(self) -> list[Chore]:
        """What :meth:`take_chores` hands out now: the stops due, then the deletes due, at most
        :data:`DELETES_IN_FLIGHT` out at a time (the one selection both read)."""
        now = self.clock()
        due = [c for c in self._chores if (r := self._chore_retry.get(c)) is None or r.due <= now]
        stops = [c for c in due if c.kind is ChoreKind.STOP]
        deletes = [c for c in due if c.kind is ChoreKind.DELETE][:max(0, DELETES_IN_FLIGHT - self._deleting)]
        return stops + deletes

    def take_chores(self) -> list[Chore]:
        """The chores due now (:meth:`due_chores`), each handed out once."""
        chores = self.due_chores()
        for c in chores:
            del self._chores[c]
        self._deleting += sum(1 for c in chores if c.kind is ChoreKind.DELETE)
        return chores

    def send_chore(self, chore: Chore) -> Exception | None:
        """Make the call to Ray's job API; returns what it raised (None: done). Reads and changes no state."""
        try:
            if chore.kind is ChoreKind.STOP:
                self.runner.stop(chore.submission_id)
            else:
                self.runner.delete(chore.submission_id)
        except Exception as e:
            return e
        return None

    def chore_done(self, chore: Chore, error: Exception | None) -> str:
        """Apply Ray's answer: done; unavailable for now (:class:`JobApiUnavailableError`) -> asked again after a
        backoff, for ``retry_for_s``, then given up (said in the log); anything else -> done, Ray's own state
        being the truth for it (a stop of a job that ended or that Ray never had; a delete of a job Ray no
        longer has, or that still runs because its stop was never taken)."""
        sub_id, what = chore.submission_id, chore.kind.value
        if chore.kind is ChoreKind.DELETE:
            self._deleting = max(0, self._deleting - 1)
        if error is None:
            self._chore_retry.pop(chore, None)
            return f"{sub_id}: {chore.kind.done} in Ray"
        if not isinstance(error, JobApiUnavailableError):
            self._chore_retry.pop(chore, None)
            return f"{sub_id}: not {chore.kind.done}, Ray says {type(error).__name__}: {error}"
        now = self.clock()
        retry = Retry.after(self._chore_retry.get(chore), now, *self._backoff)
        if now - retry.first >= self.retry_for_s:
            self._chore_retry.pop(chore, None)
            log.error("Ray's job API did not take the %s of %s in %.0fs of trying: %s%s", what, sub_id,
                      now - retry.first, error, "; it may still run" if chore.kind is ChoreKind.STOP else "")
            return f"{sub_id}: gave up the {what} in Ray: {error}"
        self._chore_retry[chore] = retry
        self._chores[chore] = None
        if retry.tries == 1:
            log.warning("%s of %s in Ray: %s; asking again in %gs", what, sub_id, error, retry.due - now)
        return f"{sub_id}: {what} not taken ({error}); asking again in {retry.due - now:g}s"
