"""Ids: the one scheme for attempts of the same work, and the slugs job ids are made from.

A job or a lease may run several **attempts** (a preempted job is requeued;
a lease lost with its node is asked for again). Attempt ``n`` of ``root`` is
``<root>.a<n>``; the first attempt of a lease the user named is the name
itself (``lease-3f2a`` is attempt 1, ``lease-3f2a.a2`` the next). A job's
attempts all carry the suffix (``train-1.a1``, ``train-1.a2``), and the same
string is the lease id of that attempt and the Ray job submission id that
runs it, so one id leads from ``orchestrator jobs`` to ``ray job logs``.

Invariant: :func:`parse_attempt` inverts :func:`attempt_id`, and
``next_attempt`` always yields an id no earlier attempt had.
"""

from __future__ import annotations

import re

_ATTEMPT = re.compile(r"^(?P<root>.+)\.a(?P<n>[1-9][0-9]*)$")
#: Lease and job ids a client may choose: 1-128 of letters, digits and ``_ . : -``, starting with a letter or digit.
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
#: What :data:`ID_PATTERN` allows, in words (for errors that name the field).
ID_ALLOWED = "1-128 letters, digits and _ . : -, starting with a letter or digit"


def attempt_id(root: str, n: int) -> str:
    """The id of attempt ``n`` (>= 1) of ``root``."""
    if n < 1:
        raise ValueError(f"attempt numbers start at 1, got {n}")
    return f"{root}.a{n}"


def parse_attempt(ident: str) -> tuple[str, int]:
    """``(root, n)`` of an attempt id; an id without the suffix is attempt 1 of itself."""
    m = _ATTEMPT.match(ident)
    return (m["root"], int(m["n"])) if m else (ident, 1)


def next_attempt(ident: str) -> str:
    """The id of the attempt after ``ident``."""
    root, n = parse_attempt(ident)
    return attempt_id(root, n + 1)


def job_slug(name: str) -> str:
    """The part of a job id made from its name: lowercase letters, digits and ``-``, at most 40 characters."""
    return re.sub(r"[^a-z0-9-]", "-", name.lower())[:40].strip("-") or "job"


def gang_worker_id(gang_id: str, index: int) -> str:
    """The lease id of worker ``index`` of the gang ``gang_id`` (one lease per worker; the SDK's gangs and a
    gang job's attempts alike)."""
    return f"{gang_id}-w{index}"
