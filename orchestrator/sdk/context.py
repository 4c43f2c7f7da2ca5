"""The job side: what a workload started by the orchestrator knows about itself.

When the head starts a job (``orchestrator submit`` / ``Client.submit``) it
runs the entrypoint as a Ray job with these environment variables, beside the
lease's ``CUDA_VISIBLE_DEVICES`` and friends:

=============================== =================================================
``ORCHESTRATOR_JOB_ID``         the job's id (absent: not run by the orchestrator)
``ORCHESTRATOR_NAMESPACE``      Ray namespace of the head actor
``ORCHESTRATOR_HEAD_NAME``      name of the head actor
``ORCHESTRATOR_CHECKPOINT_DIR`` where the job writes checkpoints (training)
``ORCHESTRATOR_RESUME_FROM``    the checkpoint to resume from (a later attempt)
``ORCHESTRATOR_LEASE_ID``       the lease this attempt runs on
``ORCHESTRATOR_FENCING_TOKEN``  its fencing token: acknowledging a checkpoint needs it
``ORCHESTRATOR_ATTEMPT``        1 for the first run, +1 per resume
=============================== =================================================

:func:`job_context` reads them. A job asks :meth:`JobContext.preemption_requested`
between steps (cheap: it calls the head at most once per ``min_interval_s``
and caches the answer; once true it stays true), checkpoints when told, and
calls :meth:`JobContext.acknowledge_checkpoint` so the head can stop it and
requeue it to resume from that path.

The same code runs unmanaged (plain ``python jobs/train.py``): the context
then has ``job_id=None``, is never asked to checkpoint, and acknowledging
does nothing. A head that does not answer (restarting) is not a reason to
stop training: the poll keeps the last answer and says so once on stderr.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from orchestrator.core import env as E
from orchestrator.core.api import HeadApi
from orchestrator.core.errors import NotConnectedError
from orchestrator.sdk.connect import DEFAULT_HEAD_NAME, DEFAULT_NAMESPACE, connect_head

DEFAULT_POLL_S = 1.0


class Poll:
    """A yes/no question to the head, asked at most once per ``interval_s``; a yes is final.

    ``ask()`` returns the cached answer between calls. When the question
    raises :class:`NotConnectedError` the last answer stands (warned once).
    """

    def __init__(self, question: Callable[[], bool], interval_s: float, *, what: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._question = question
        self.interval_s = interval_s
        self._what = what
        self._clock = clock
        self._asked_at: float | None = None
        self.answer = False
        self.calls = 0
        self._warned = False

    def ask(self) -> bool:
        if self.answer:
            return True
        now = self._clock()
        if self._asked_at is not None and now - self._asked_at < self.interval_s:
            return self.answer
        self._asked_at = now
        self.calls += 1
        try:
            self.answer = bool(self._question())
        except NotConnectedError as e:
            if not self._warned:
                print(f"[orchestrator] {self._what}: head not reachable ({e}); carrying on", file=sys.stderr, flush=True)
                self._warned = True
        return self.answer


@dataclass
class JobContext:
    """What a job knows about itself; see the module docstring. ``managed`` is False outside the orchestrator."""

    job_id: str | None
    namespace: str = DEFAULT_NAMESPACE
    head_name: str = DEFAULT_HEAD_NAME
    checkpoint_dir: str | None = None
    resume_from: str | None = None
    lease_id: str | None = None
    fencing_token: int | None = None
    attempt: int = 1
    min_interval_s: float = DEFAULT_POLL_S
    head: HeadApi | None = field(default=None, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    _poll: Poll | None = field(default=None, init=False, repr=False)

    @property
    def managed(self) -> bool:
        return self.job_id is not None

    def preemption_requested(self) -> bool:
        """True once the head has asked this job to checkpoint and yield. Rate-limited; never raises on a lost head."""
        if not self.managed:
            return False
        if self._poll is None:
            self._poll = Poll(lambda: self._head().job_preemption_requested(self.job_id)["requested"],
                              self.min_interval_s, what=f"job {self.job_id}", clock=self.clock)
        return self._poll.ask()

    def acknowledge_checkpoint(self, path: str, step: int | None = None) -> dict[str, Any] | None:
        """Tell the head the checkpoint at ``path`` (after ``step`` steps) is written; it then stops and requeues us."""
        if not self.managed:
            return None
        return self._head().job_ack_checkpoint(self.job_id, str(path), step, self.fencing_token)

    def record_inference(self, service: str, latencies_s: list[float], slo_s: float | None = None) -> bool:
        """Report requests served and their latencies to the head's metrics; False (and no error) if not managed
        or the head does not answer -- serving never stops for a report."""
        if not self.managed:
            return False
        try:
            self._head().record_inference(service, latencies_s, slo_s)
        except NotConnectedError:
            return False
        return True

    def _head(self) -> HeadApi:
        if self.head is None:
            self.head = connect_head(namespace=self.namespace, head_name=self.head_name)
        return self.head


def job_context(environ: Mapping[str, str] | None = None, *, head: HeadApi | None = None,
                clock: Callable[[], float] = time.monotonic, limits: bool = True) -> JobContext:
    """The context of the running job, from its environment (see the module docstring); with ``limits``
    it also applies the lease's memory limit in this process (:func:`apply_limits`)."""
    env = os.environ if environ is None else environ
    if limits:
        apply_limits(env)
    try:
        interval = float(env.get(E.POLL_S, DEFAULT_POLL_S))
    except ValueError:
        interval = DEFAULT_POLL_S
    try:
        attempt = int(env.get(E.ATTEMPT, "1"))
    except ValueError:
        attempt = 1
    try:
        token: int | None = int(env[E.FENCING_TOKEN])
    except (KeyError, ValueError):
        token = None
    return JobContext(job_id=env.get(E.JOB_ID) or None, namespace=env.get(E.NAMESPACE) or DEFAULT_NAMESPACE,
                      head_name=env.get(E.HEAD_NAME) or DEFAULT_HEAD_NAME,
                      checkpoint_dir=env.get(E.CHECKPOINT_DIR) or None, resume_from=env.get(E.RESUME_FROM) or None,
                      lease_id=env.get(E.LEASE_ID) or None, fencing_token=token, attempt=attempt, min_interval_s=interval, head=head,
                      clock=clock)


def apply_limits(environ: Mapping[str, str] | None = None, *, torch: Any = None) -> float | None:
    """Apply the lease's GPU memory limit inside this process; the fraction applied, or None.

    MIG slices are isolated by the hardware and whole cards need nothing. For an
    MPS share or a time-slice the hand-out sets ``ORCHESTRATOR_MEMORY_LIMIT_MIB``;
    with PyTorch present (``torch``, injectable for tests) this calls
    ``torch.cuda.set_per_process_memory_fraction(limit / card memory, 0)``, so an
    allocation past the limit raises ``torch.cuda.OutOfMemoryError`` in this
    process instead of taking a neighbour's memory. MPS clients also get NVIDIA's
    own pinned-memory limit through ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``. A
    process started some other way (a subprocess of the holder, another
    framework) should call this itself, or read ``ORCHESTRATOR_MEMORY_LIMIT_MIB``.
    """
    env = os.environ if environ is None else environ
    if env.get(E.SHARE_KIND) not in ("mps", "timeslice") or not env.get(E.MEMORY_LIMIT_MIB):
        return None
    if torch is None:
        if importlib.util.find_spec("torch") is None:
            return None
        import torch  # type: ignore[no-redef]
    if not torch.cuda.is_available():
        return None
    total_mib = torch.cuda.get_device_properties(0).total_memory / (1024 * 1024)
    fraction = min(1.0, int(env[E.MEMORY_LIMIT_MIB]) / total_mib)
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    return fraction
