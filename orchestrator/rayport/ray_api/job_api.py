"""Ray's job API: :class:`RayJobRunner`, the job layer's :class:`~orchestrator.control.jobs.JobRunner`.

Invariants: every HTTP request is bounded (:data:`JOB_API_TIMEOUT_S`); a failure that may pass is raised as
``JobApiUnavailableError`` (the job layer's executor asks again), anything else is Ray's answer; a submission
is idempotent per submission id (Ray's "already exists" for our own earlier try is taken).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import ray

from orchestrator.core.config import Tuning
from orchestrator.core.errors import JobApiUnavailableError, NotConnectedError
from orchestrator.rayport.ray_api.devices import gpu_demand
from orchestrator.rayport.ray_api.gcs_kv import GcsKv

log = logging.getLogger(__name__)


def api_server_url() -> str:
    """The cluster's job API (dashboard) URL, as Ray itself records it in the GCS."""
    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(ray_constants.DASHBOARD_ADDRESS, namespace=ray_constants.KV_NAMESPACE_DASHBOARD)
    if not raw:
        raise NotConnectedError("the cluster's job API address is not in the GCS (is the dashboard/API server up?)")
    return "http://" + (raw.decode() if isinstance(raw, bytes) else str(raw))


#: The longest one HTTP request to Ray's job API may take (Ray's client sets none: a dashboard that hangs
#: would hold the head's loop for ever). A submission that timed out is sent again under the same id. The default of
#: ``settings.tuning.job_api_timeout_s``, which the head and the agents give their :class:`RayJobRunner`.
JOB_API_TIMEOUT_S = Tuning().job_api_timeout_s


def job_submission_client(address: str, timeout_s: float | None = JOB_API_TIMEOUT_S) -> Any:
    """Ray's ``JobSubmissionClient`` for the job API at ``address`` (``http://host:port``), each of its HTTP
    requests bounded by ``timeout_s`` (None: Ray's own, unbounded)."""
    from ray.job_submission import JobSubmissionClient

    if timeout_s is None:
        return JobSubmissionClient(address)

    class _Bounded(JobSubmissionClient):  # type: ignore[misc]
        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", timeout_s)  # forwarded to requests.request() (Ray's documented seam)
            return super()._do_request(method, endpoint, **kwargs)

    return _Bounded(address)


def _transient(e: BaseException) -> bool:
    """Whether a job API failure may pass by itself: no answer (refused, reset, timed out), no job API
    address in the GCS yet, or an HTTP 5xx (Ray's "no available agent ... try again later"). A 4xx (a bad
    runtime_env, an invalid label selector) is not, nor an id that exists: Ray 2.60's job head relays its
    agent's 400 "already exists" as a 500, which read as "try again" had a submission that landed retried until
    its job failed."""
    import requests

    if isinstance(e, (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError, NotConnectedError)):
        return True  # (Ray's client turns a refused version check into the builtin ConnectionError)
    if isinstance(e, requests.HTTPError):
        return e.response is not None and e.response.status_code >= 500
    return (isinstance(e, RuntimeError) and str(e).startswith("Request failed with status code 5")
            and _EXISTS not in str(e))


#: Ray's only word for a submission id it has (in its job manager's ValueError, relayed in the HTTP error's text).
_EXISTS = "already exists"


@contextlib.contextmanager
def _unavailable_if_transient(submission_id: str) -> Iterator[None]:
    """A job API failure that may pass (:func:`_transient`) raised as :class:`JobApiUnavailableError`; others as they are."""
    try:
        yield
    except Exception as e:
        if _transient(e):
            raise JobApiUnavailableError(submission_id, f"{type(e).__name__}: {e}") from e
        raise


#: How long after an earlier job of a submission id ended Ray's job API may take the id again. Ray's job manager
#: watches each job's supervisor actor until it has died (a ping each second); a job put under the id before that
#: watcher has seen its old supervisor die is marked FAILED by it ("Job supervisor actor died"), and the new job's
#: own watcher is never started (one per id). Measured on a loaded 2-core machine: a reuse right after the end failed
#: every time. A job the head dropped ended ``ended_retention_s`` (>= 60 s) ago, so this waits only on a reuse
#: sooner than any retention allows. The default of ``settings.tuning.id_reuse_quiet_s``.
ID_REUSE_QUIET_S = Tuning().id_reuse_quiet_s

#: The longest the head's loop waits for one status read (a GCS that is away: the last answers stand). The default
#: of ``settings.tuning.status_read_timeout_s``.
STATUS_READ_TIMEOUT_S = Tuning().status_read_timeout_s


class RayJobRunner:
    """:class:`orchestrator.control.jobs.JobRunner` over Ray's ``JobSubmissionClient``. ``timeout_s``,
    ``id_reuse_quiet_s`` and ``status_read_timeout_s``: the settings' ``tuning`` knobs of those names (the head
    passes them; the defaults are theirs)."""

    def __init__(self, address: str | None = None, timeout_s: float = JOB_API_TIMEOUT_S, *,
                 id_reuse_quiet_s: float = ID_REUSE_QUIET_S, status_read_timeout_s: float = STATUS_READ_TIMEOUT_S
                 ) -> None:
        self._address = address
        self._timeout_s = timeout_s
        self._id_reuse_quiet_s = id_reuse_quiet_s
        self._status_read_timeout_s = status_read_timeout_s
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = job_submission_client(self._address or api_server_url(), self._timeout_s)
        return self._client

    def submit(self, submission_id: str, entrypoint: str, runtime_env: dict[str, Any],
               label_selector: dict[str, str], handout: Mapping[str, Any], metadata: dict[str, str]) -> None:
        """:meth:`orchestrator.control.jobs.JobRunner.submit`: Ray's "already exists" for the id returns as
        taken when Ray's record of it carries our ``metadata`` (an earlier try of this submission landed);
        a record of another job under the id (one that had the same job id, dropped by the head before its
        record left Ray's table) is deleted and the submission made again, or refused while that job still
        runs, or put off (:class:`JobApiUnavailableError`) while it ended under ``id_reuse_quiet_s`` ago.
        :class:`JobApiUnavailableError` where the failure may pass (see :func:`_transient`); anything else Ray
        raised is a refusal."""
        demand = gpu_demand(handout)

        def put() -> None:
            with _unavailable_if_transient(submission_id):
                self.client.submit_job(entrypoint=entrypoint, submission_id=submission_id, runtime_env=runtime_env,
                                       entrypoint_label_selector=label_selector or None,
                                       entrypoint_num_gpus=demand["num_gpus"] or None,
                                       entrypoint_resources=demand.get("resources") or None, metadata=metadata)

        try:
            put()
            return
        except RuntimeError as e:
            if f"{submission_id} {_EXISTS}" not in str(e):
                raise
        record = self._record(submission_id)
        if record is not None:
            if all((record.metadata or {}).get(k) == v for k, v in metadata.items()):
                return  # an earlier try of ours landed
            self._clear_earlier(submission_id, record)
        put()  # once: an "already exists" now is a refusal

    def _clear_earlier(self, submission_id: str, record: Any) -> None:
        """Delete ``record``, Ray's record of an earlier job under ``submission_id``, so the id can be taken again:
        put off (:class:`JobApiUnavailableError`) while that job ended under ``id_reuse_quiet_s`` ago; a
        refusal (``RuntimeError``) where Ray will not delete it (that job still runs)."""
        if record.end_time and time.time() - record.end_time / 1000 < self._id_reuse_quiet_s:
            raise JobApiUnavailableError(submission_id, f"Ray's job manager may still watch the earlier job under "
                                         f"this id (it ended under {self._id_reuse_quiet_s:.0f} s ago)")
        try:
            self.delete(submission_id)  # refused while that job is not over
        except JobApiUnavailableError:
            raise
        except Exception as d:
            raise RuntimeError(f"Ray holds a job of an earlier job with this id under {submission_id} and could "
                               f"not delete it: {d}") from d

    def status(self, submission_id: str) -> str | None:
        try:
            return str(self.client.get_job_status(submission_id).value)
        except RuntimeError:
            return None

    def status_many(self, submission_ids: Sequence[str]) -> dict[str, str | None]:
        """The Ray status of each of ``submission_ids`` (None: unknown to Ray) in one read of Ray's own job
        table in the GCS, for those ids only (:func:`_job_records`).

        ``list_jobs`` reads that table whole, through the dashboard's HTTP API: a key listing and one read per
        job the cluster ever ran, every status read, on the head's loop. This is one multi-get of the jobs the
        head is waiting on."""
        records = _job_records(submission_ids, timeout_s=self._status_read_timeout_s)
        return {s: str(records[s].status.value) if s in records else None for s in submission_ids}

    def stop(self, submission_id: str) -> None:
        """:meth:`orchestrator.control.jobs.JobRunner.stop`: :class:`JobApiUnavailableError` where the failure may
        pass (see :func:`_transient`); Ray's refusal otherwise (no such job). A job that has ended already is
        no error (Ray answers that it did not stop it)."""
        with _unavailable_if_transient(submission_id):
            self.client.stop_job(submission_id)

    def _record(self, submission_id: str) -> Any:
        """Ray's ``JobDetails`` of ``submission_id`` through the job API (None: Ray does not have it)."""
        with _unavailable_if_transient(submission_id):
            try:
                return self.client.get_job_info(submission_id)
            except RuntimeError as e:
                if "does not exist" in str(e) or "status code 404" in str(e):
                    return None
                raise

    def delete(self, submission_id: str) -> None:
        """:meth:`orchestrator.control.jobs.JobRunner.delete`: :class:`JobApiUnavailableError` where the failure
        may pass; Ray's refusal otherwise (no such job, or not ended)."""
        with _unavailable_if_transient(submission_id):
            self.client.delete_job(submission_id)

    def logs(self, submission_id: str) -> str:
        """The job's driver log, read on the node its driver runs on; Ray's job API's answer when that node is not
        known (yet) or cannot be reached.

        Ray's job API reads the log in the session folder its agents take from the GCS: the head node's. On a
        real cluster every host has that folder path, and the driver wrote there. On one host with a session
        folder per raylet (``orchestrator up``'s local clusters; deploy/local.py) the driver of a job on any
        node but the head's wrote in its own raylet's folder, and Ray's API answered only the job manager's
        first line. So the log is read by a task on the driver's node (Ray's job record names the node), in
        that node's own folder: the file the driver wrote, on either kind of cluster."""
        node = self._driver_node(submission_id)
        if node:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            try:
                text = ray.get(_node_job_log.options(
                    num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                    submission_id), timeout=self._timeout_s)
            except Exception as e:  # the node is gone, or no worker started in time: Ray's own answer
                log.debug("could not read the log of %s on its node: %s", submission_id, e)
                text = None
            if text is not None:
                return str(text)
        return str(self.client.get_job_logs(submission_id))

    @staticmethod
    def _driver_node(submission_id: str) -> str | None:
        """The id of the node the job's driver runs (or ran) on, from Ray's job record; None before it has one."""
        record = _job_records([submission_id]).get(submission_id)
        return (record.driver_node_id or None) if record is not None else None


def _job_records(submission_ids: Sequence[str], timeout_s: float | None = None) -> dict[str, Any]:
    """Ray's record (``JobInfo``) of each of ``submission_ids`` that Ray knows, in one multi-get of Ray's job
    table in the GCS KV: the key format and the decoding are Ray's job manager's (``JobInfoStorageClient``),
    imported, not copied."""
    from ray._private import ray_constants
    from ray.dashboard.modules.job.common import JobInfo, JobInfoStorageClient

    key = JobInfoStorageClient.JOB_DATA_KEY
    got = GcsKv(ray_constants.KV_NAMESPACE_JOB.decode()).multi_get([key.format(job_id=s) for s in submission_ids],
                                                                   timeout_s=timeout_s)
    return {s: JobInfo.from_json(json.loads(got[key.format(job_id=s)])) for s in submission_ids
            if key.format(job_id=s) in got}


@ray.remote(num_cpus=0, max_retries=0)
def _node_job_log(submission_id: str) -> str | None:
    """On a job's driver node: the driver's log file in this node's session folder (None: not here)."""
    from ray.dashboard.modules.job.common import JOB_LOGS_PATH_TEMPLATE

    folder = ray._private.worker.global_worker.node.get_logs_dir_path()
    try:
        return (Path(folder) / JOB_LOGS_PATH_TEMPLATE.format(submission_id=submission_id)).read_text(errors="replace")
    except FileNotFoundError:
        return None
