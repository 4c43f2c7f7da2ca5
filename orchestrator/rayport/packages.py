"""A job's working directory, shipped as ``ray job submit`` ships it: zipped on the submitter's machine and
stored in the cluster's GCS, the job's runtime env naming it by its ``gcs://_ray_pkg_<hash>.zip`` URI.

Ray's own packaging does the work (``ray._private.runtime_env.working_dir.upload_working_dir_if_needed``, the
function ``JobSubmissionClient`` and ``ray.init(runtime_env=...)`` call): the folder's ``.gitignore`` and
``.rayignore`` and the runtime env's ``excludes`` are honoured, with Ray's default excludes; the name is a
hash of the content, so an unchanged folder is not sent twice; a local ``.zip`` is sent as it is. Two things
differ from ``ray job submit``:

* the bytes go through this process's driver connection to the GCS (the route ``ray.init`` takes), not
  through the dashboard's HTTP package endpoint: every CLI command and SDK client is a Ray driver already;
* the package is pinned for :data:`PIN_S`, not Ray's 10 minutes (``RAY_RUNTIME_ENV_URI_PIN_EXPIRATION_S``).
  The GCS deletes a ``gcs://`` package once nothing references it, and Ray's pin only bridges the moment
  between an upload and the Ray job that takes its own reference. An orchestrator job may wait in the queue
  longer than that, and each attempt after a preemption is a new Ray job, started after the last one let go.

Ray is imported only when a package is uploaded.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any, Mapping

from orchestrator.core.errors import InvalidRequestError, OrchestratorError

#: How long an uploaded working directory stays in the GCS without a job referencing it (seconds).
PIN_S = 24 * 3600


def upload_working_dir(runtime_env: Mapping[str, Any]) -> dict[str, Any]:
    """``runtime_env`` with its local ``working_dir`` (a folder or a ``.zip``) uploaded to the connected
    cluster's GCS and replaced by the package's ``gcs://`` URI; a runtime env without one, or with a URI, comes
    back as it was. Needs this process to be a driver of the cluster. Raises ``InvalidRequestError`` naming
    ``working_dir`` (not a folder or zip, or over the GCS's size limit) or ``OrchestratorError`` (the GCS did
    not take it)."""
    from ray._private.runtime_env.packaging import pin_runtime_env_uri
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed
    from ray.exceptions import RuntimeEnvSetupError

    out = dict(runtime_env)
    path = out.get("working_dir")
    if path is None or "://" in str(path):
        return out
    include_gitignore = os.environ.get("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "0") != "1"  # as JobSubmissionClient
    try:
        with tempfile.TemporaryDirectory(prefix="rgo-pkg-") as scratch:  # where Ray writes the zip before sending
            out = upload_working_dir_if_needed(out, include_gitignore=include_gitignore, scratch_dir=scratch,
                                               logger=logging.getLogger(__name__))
    except ValueError as e:  # neither a folder nor a supported archive
        raise InvalidRequestError("working_dir", str(path), "an existing directory or .zip file", detail=str(e)) from None
    except RuntimeEnvSetupError as e:
        if isinstance(e.__cause__, ValueError):  # over the GCS's package size limit: Ray's message says what to do
            raise InvalidRequestError("working_dir", str(path), "a package under the GCS's size limit",
                                      detail=str(e.__cause__)) from None
        raise OrchestratorError(f"uploading working_dir {path} to the cluster failed: {e}") from e
    pin_runtime_env_uri(out["working_dir"], expiration_s=PIN_S)
    return out
