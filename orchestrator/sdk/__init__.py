"""The user's side: the Python SDK.

* :mod:`~orchestrator.sdk.connect` -- finding the head and connecting this
  process to its cluster (the SDK's one module that imports Ray);
* :mod:`~orchestrator.sdk.inputs` -- validating what the user passed, once,
  before any call;
* :mod:`~orchestrator.sdk.jobs` -- :class:`Client` and :class:`JobHandle`;
* :mod:`~orchestrator.sdk.leases` -- :func:`lease` and :class:`LeaseHandle`;
* :mod:`~orchestrator.sdk.context` -- the job side: what a running job knows
  about itself, and the checkpoint handshake.

May import: ``orchestrator.core`` and, for a connection, ``orchestrator.rayport``.
"""

from orchestrator.sdk.connect import Target, connect_head, discover
from orchestrator.sdk.context import JobContext, job_context
from orchestrator.sdk.inputs import as_request, as_spec
from orchestrator.sdk.jobs import TERMINAL_STATES, Client, JobHandle, JobWaitTimeoutError
from orchestrator.sdk.leases import LeaseHandle, lease

__all__ = ["Client", "JobHandle", "JobWaitTimeoutError", "TERMINAL_STATES", "LeaseHandle", "lease", "Target",
           "discover", "connect_head", "as_request", "as_spec", "JobContext", "job_context"]
