"""Typed errors across the actor boundary.

Our errors carry fields and take them as constructor arguments, which neither
pickling nor Ray's ``RayTaskError`` wrapping preserves. The head's methods
therefore answer ``{"ok": value}`` or ``{"error": {...}}`` and the client
raises the same typed error again (:func:`unwrap`). Pure.
"""

from __future__ import annotations

from typing import Any, Callable

from orchestrator.core import errors as E

_FIELDS: dict[str, tuple[type[E.OrchestratorError], Callable[[E.OrchestratorError], dict[str, Any]]]] = {
    "InvalidRequestError": (E.InvalidRequestError, lambda e: {"field": e.field, "value": e.value, "allowed": e.allowed, "detail": e.detail}),  # type: ignore[attr-defined]
    "ConfigError": (E.ConfigError, lambda e: {"field": e.field, "value": e.value, "allowed": e.allowed, "detail": e.detail}),  # type: ignore[attr-defined]
    "IllegalTransitionError": (E.IllegalTransitionError, lambda e: {"machine": e.machine, "current": e.current, "target": e.target}),  # type: ignore[attr-defined]
    "UnknownObjectError": (E.UnknownObjectError, lambda e: {"kind": e.kind, "ident": e.ident}),  # type: ignore[attr-defined]
    "StaleFencingTokenError": (E.StaleFencingTokenError, lambda e: {"lease_id": e.lease_id, "token": e.token}),  # type: ignore[attr-defined]
    "PermissionDeniedError": (E.PermissionDeniedError, lambda e: {"method": e.method, "requires": e.requires, "target": e.target}),  # type: ignore[attr-defined]
    "LeaseTimeoutError": (E.LeaseTimeoutError, lambda e: {"request": e.request, "timeout_s": e.timeout_s, "explanation": e.explanation}),  # type: ignore[attr-defined]
}


def encode(e: E.OrchestratorError) -> dict[str, Any]:
    name = type(e).__name__
    entry = _FIELDS.get(name)
    fields = entry[1](e) if entry else {}
    if "value" in fields:
        fields["value"] = _plain(fields["value"])
    return {"type": name, "fields": fields, "message": str(e)}


def _plain(v: Any) -> Any:
    return v if isinstance(v, (str, int, float, bool, type(None), list, dict, tuple)) else repr(v)


def decode(d: dict[str, Any]) -> E.OrchestratorError:
    entry = _FIELDS.get(d.get("type", ""))
    if entry is not None:
        try:
            return entry[0](**d["fields"])
        except TypeError:
            pass
    cls = getattr(E, d.get("type", ""), None)
    if isinstance(cls, type) and issubclass(cls, E.OrchestratorError):
        try:
            return cls(d.get("message", ""))
        except TypeError:
            pass
    return E.OrchestratorError(d.get("message", "error in the head"))


def answer(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run ``fn`` and wrap its result or typed error for the wire."""
    try:
        return {"ok": fn(*args, **kwargs)}
    except E.OrchestratorError as e:
        return {"error": encode(e)}


def fault(what: str, e: BaseException) -> dict[str, Any]:
    """A fault of the head's (an exception no typed error covers), as a caller's answer: an
    ``OrchestratorError`` saying ``what`` failed and how, never an untyped exception across the boundary."""
    return {"error": encode(E.OrchestratorError(f"{what}: {type(e).__name__}: {e}"))}


def unwrap(reply: dict[str, Any]) -> Any:
    if "error" in reply:
        raise decode(reply["error"])
    return reply["ok"]
