"""Typed errors of the orchestrator.

Every error carries fields, never a message to be parsed. ``retryable`` says
whether the same call may succeed later without the caller changing anything
(capacity frees up, an agent comes back); a non-retryable error means the
input itself is wrong and the message says what is allowed instead.
"""

from __future__ import annotations

from typing import Any, Iterable


class OrchestratorError(Exception):
    """Base of every error this package raises on purpose."""

    retryable: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"error": type(self).__name__, "message": str(self), "retryable": self.retryable}


class InvalidRequestError(OrchestratorError, ValueError):
    """Input that can never be accepted as given.

    ``field`` names the offending field (dotted for nested ones), ``value`` is
    what was given and ``allowed`` says what would have been accepted.
    """

    def __init__(self, field: str, value: Any, allowed: str | Iterable[str], detail: str = "") -> None:
        self.field = field
        self.value = value
        self.allowed = allowed if isinstance(allowed, str) else ", ".join(str(a) for a in allowed)
        self.detail = detail
        msg = f"invalid {field}={_short_repr(value)}"
        if detail:
            msg += f": {detail}"
        msg += f" (allowed: {self.allowed})"
        super().__init__(msg)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d.update(field=self.field, value=_short_repr(self.value, 1000), allowed=self.allowed)
        return d


def _short_repr(value: Any, limit: int = 120) -> str:
    """``repr(value)``, cut to ``limit`` characters: a message stays one readable line whatever was sent."""
    try:
        r = repr(value)
    except Exception:  # noqa: BLE001 - a client's object whose repr fails still gets its error
        r = f"<{type(value).__name__}>"
    return r if len(r) <= limit else r[: limit - 3] + "..."


class ConfigError(InvalidRequestError):
    """A configuration file or object that fails validation."""


class IllegalTransitionError(OrchestratorError):
    """A state machine was asked for an edge its transition table does not have."""

    def __init__(self, machine: str, current: str, target: str) -> None:
        self.machine, self.current, self.target = machine, current, target
        super().__init__(f"{machine}: no transition {current} -> {target}")


class CapacityError(OrchestratorError):
    """The allocation does not fit the snapshot it is applied to (a stale plan)."""

    retryable = True


class UnknownObjectError(OrchestratorError, KeyError):
    """A job, lease or node id that the head does not know."""

    def __init__(self, kind: str, ident: str) -> None:
        self.kind, self.ident = kind, ident
        super().__init__(f"unknown {kind} {ident!r}")

    def __str__(self) -> str:  # KeyError quotes its argument; keep the sentence readable
        return f"unknown {self.kind} {self.ident!r}"


class StaleFencingTokenError(OrchestratorError):
    """A lease was used with a fencing token that is not the lease's (older, revoked, or never its).

    It names the token the caller sent and never the lease's own: a refusal must not tell a caller that
    is not the holder what the holder's token is (docs/security.md)."""

    def __init__(self, lease_id: str, token: int) -> None:
        self.lease_id, self.token = lease_id, token
        super().__init__(f"lease {lease_id}: fencing token {token} is not the lease's (stale, revoked or wrong)")


class LeaseTimeoutError(OrchestratorError, TimeoutError):
    """A lease was not granted within the caller's timeout. Retryable."""

    retryable = True

    def __init__(self, request: str, timeout_s: float, explanation: str = "") -> None:
        self.request, self.timeout_s, self.explanation = request, timeout_s, explanation
        msg = f"lease for {request} not granted within {timeout_s:g}s"
        if explanation:
            msg += f": {explanation}"
        super().__init__(msg)


class JobApiUnavailableError(OrchestratorError):
    """Ray's job API did not take a submission for a reason that may pass by itself: it did not answer
    (refused, timed out), or it answered that it cannot now (HTTP 5xx: "no available agent, please try
    again later"). ``detail`` is what it said. Retryable: the job layer submits again, under the same
    submission id, so a submission that did land is not run twice."""

    retryable = True

    def __init__(self, submission_id: str, detail: str) -> None:
        self.submission_id, self.detail = submission_id, detail
        super().__init__(f"Ray's job API did not take {submission_id}: {detail}")


class NotConnectedError(OrchestratorError):
    """No orchestrator head is reachable at the given address. Retryable."""

    retryable = True


class ConnectError(NotConnectedError):
    """Finding the cluster failed in one of three ways (the subclasses), each with its own one-line
    message (exit 3). ``address`` is where we looked, ``source`` how we came to look there (``--address``,
    the state file, ``auto``)."""

    def __init__(self, address: str, source: str, message: str) -> None:
        self.address, self.source = address, source
        super().__init__(message)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d.update(address=self.address, source=self.source)
        return d


class ClusterNotFoundError(ConnectError):
    """No Ray cluster answers at ``address``: nothing listens, what listens is not a Ray GCS, or nothing
    answered within the connect timeout; ``detail`` says which. Retryable (a cluster may be starting)."""

    def __init__(self, address: str, source: str, detail: str) -> None:
        self.detail = detail
        super().__init__(address, source, f"no Ray cluster at {address} (found through {source}): {detail}")


class ClusterAuthError(ConnectError):
    """The Ray cluster at ``address`` refused our auth token, or we had none to send (``sent``).
    ``looked_in`` says where the token was looked for and what was there -- never the token itself.
    Not retryable: the token must change."""

    retryable = False

    def __init__(self, address: str, source: str, looked_in: str, sent: bool) -> None:
        self.looked_in, self.sent = looked_in, sent
        what = "refused our auth token" if sent else "requires an auth token and we had none to send"
        super().__init__(address, source, f"the Ray cluster at {address} (found through {source}) {what}; "
                                          f"token looked for in: {looked_in}")


class HeadNotFoundError(ConnectError):
    """The Ray cluster answers but runs no orchestrator head ``head_name`` in namespace ``namespace``; the
    message says how to start one. Retryable (a head may be starting)."""

    def __init__(self, address: str, source: str, namespace: str, head_name: str) -> None:
        self.namespace, self.head_name = namespace, head_name
        super().__init__(address, source, f"the Ray cluster at {address} (found through {source}) has no "
                                          f"orchestrator head {head_name!r} in namespace {namespace!r}; start "
                                          f"one with `orchestrator up --address {address}`")


class MissingExtraError(OrchestratorError, ImportError):
    """An optional dependency is not installed: ``module`` is what was imported, ``extra`` the
    ``pip install 'ray-gpu-orchestrator[<extra>]'`` that brings it. Not retryable."""

    def __init__(self, module: str, extra: str, what: str = "") -> None:
        self.module, self.extra = module, extra
        hint = f" ({what})" if what else ""
        super().__init__(f"{module} is not installed; install the {extra!r} extra{hint}: "
                         f"pip install 'ray-gpu-orchestrator[{extra}]'")

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d.update(module=self.module, extra=self.extra)
        return d


class PermissionDeniedError(OrchestratorError, PermissionError):
    """The caller may not call ``method`` (on ``target``, when it names one): ``requires`` says who may
    (``the lease's holder``, ``the agent of node a100-0``, ``an administrator`` ...). The message never
    says what the right credential is. Not retryable."""

    def __init__(self, method: str, requires: str, target: str | None = None) -> None:
        self.method, self.requires, self.target = method, requires, target
        on = f" on {target}" if target else ""
        super().__init__(f"{method}{on} may be called only by {requires}")

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d.update(method=self.method, requires=self.requires, target=self.target)
        return d


#: Exit statuses of every command line of the project.
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_UNREACHABLE = 0, 1, 2, 3


def exit_code(e: BaseException) -> int:
    """The one error -> exit status mapping of every command line (``orchestrator ...``,
    ``python -m orchestrator.deploy.kuberay``): input that can never be accepted, or an
    unknown object, 2; no reachable orchestrator 3; anything else 1."""
    if isinstance(e, (InvalidRequestError, UnknownObjectError)):
        return EXIT_BAD_INPUT
    if isinstance(e, NotConnectedError):
        return EXIT_UNREACHABLE
    return EXIT_FAILED
