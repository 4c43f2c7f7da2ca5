"""Keep loopback addresses loopback in every Python process of a local cluster.

:data:`LOOPBACK_SITE` is this folder: put on ``PYTHONPATH`` of the raylets, its
``sitecustomize`` patches Ray's address resolution in each process Ray starts
(see :func:`orchestrator.rayport.ray_api.keep_loopback` for why).
"""

from pathlib import Path

#: Folder with the ``sitecustomize`` that keeps loopback loopback in every Python process of the cluster.
LOOPBACK_SITE = str(Path(__file__).resolve().parent)
