"""Standard output kept for one JSON document, whatever else the process prints meanwhile.

A command or bench with ``--json`` prints one JSON document on stdout, to be piped to ``jq`` or
``json.loads``. A Ray driver does not leave stdout alone: a thread of Ray's own
(``ray._private.worker.listen_error_messages``) prints the cluster's error messages there -- a raylet
that died, a worker that was killed, ``(raylet) Task ... failed`` as Serve is torn down -- and the
processes it starts inherit the same file descriptor. So ``bench/chaos.py --json``, which kills
raylets, printed pages of Ray's text before its JSON. :func:`stdout_to_stderr` points file
descriptor 1 at stderr while the work runs; the document is printed after it.

Invariant: only code that owns the process (a command, a bench) uses it; the SDK never does (a
user's own prints stay where they were).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def stdout_to_stderr(active: bool = True) -> Iterator[None]:
    """While open (and ``active``), file descriptor 1 is stderr's: what this process, its threads and the
    processes it starts write to stdout lands among the progress lines on stderr. Restored on exit,
    however left; nothing changes when not ``active``."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
