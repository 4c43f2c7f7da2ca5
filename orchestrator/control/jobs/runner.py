"""Ray's job API as the job layer sees it: the :class:`JobRunner` protocol, and a runner that runs nothing.

Invariants:

* nothing in :mod:`orchestrator.control.jobs` imports Ray: the real runner is
  ``rayport.ray_api.RayJobRunner``; unit tests fake this protocol;
* ``submit`` is idempotent per submission id, and every call says which failures may pass
  (``JobApiUnavailableError``: asked again by the executor) and which are Ray's answer (not asked again).
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence


class JobRunner(Protocol):
    """Ray's job API, as the job layer needs it (``ray_api.RayJobRunner`` is the real one)."""

    def submit(self, submission_id: str, entrypoint: str, runtime_env: dict[str, Any],
               label_selector: dict[str, str], handout: dict[str, Any], metadata: dict[str, str]) -> None:
        """Submit the driver, placed only on a node whose labels match ``label_selector``, asking Ray for the
        devices of ``handout`` (:meth:`~orchestrator.control.handout.Handout.to_dict`).

        Idempotent per ``submission_id``: an id Ray already has (an earlier try whose answer was lost, or a
        head that crashed between recording the id and hearing back) returns as taken; the head never gives
        an id to two attempts. Raises ``JobApiUnavailableError`` where the failure may pass; anything else
        it raises is Ray refusing the job."""
        ...

    def status(self, submission_id: str) -> str | None: ...

    def status_many(self, submission_ids: Sequence[str]) -> dict[str, str | None]:
        """The status of each of ``submission_ids`` in one read (Ray: one ``list_jobs`` call, not one per job);
        an id Ray does not know maps to None."""
        ...

    def stop(self, submission_id: str) -> None:
        """Stop the Ray job ``submission_id``. Raises ``JobApiUnavailableError`` where the failure may pass
        (it is asked again); anything else it raises means there is nothing to stop (unknown to Ray)."""
        ...

    def delete(self, submission_id: str) -> None:
        """Delete the ended Ray job ``submission_id`` from Ray's job table (not its log). Raises
        ``JobApiUnavailableError`` where the failure may pass; anything else: nothing to delete, or still running."""
        ...

    def logs(self, submission_id: str) -> str: ...


class AdmissionOnlyRunner:
    """A :class:`JobRunner` that runs nothing (``settings.job_runner: none``): a submitted job is known at once
    and reads SUCCEEDED from then on, so an admitted job finishes at the next status read and frees its lease.

    For measuring job admission under load (``bench/load.py``) without starting a Ray driver per job; the
    head's job layer, ledger and scheduler do exactly what they do for real jobs."""

    def __init__(self) -> None:
        self._known: set[str] = set()

    def submit(self, submission_id: str, entrypoint: str, runtime_env: dict[str, Any],
               label_selector: dict[str, str], handout: dict[str, Any], metadata: dict[str, str]) -> None:
        self._known.add(submission_id)  # a second submit of an id is taken, as JobRunner.submit says

    def status(self, submission_id: str) -> str | None:
        return "SUCCEEDED" if submission_id in self._known else None

    def status_many(self, submission_ids: Sequence[str]) -> dict[str, str | None]:
        return {s: self.status(s) for s in submission_ids}

    def stop(self, submission_id: str) -> None:
        pass

    def delete(self, submission_id: str) -> None:
        self._known.discard(submission_id)

    def logs(self, submission_id: str) -> str:
        return ""
