"""The head's edge: every argument of a :class:`~orchestrator.core.api.HeadApi` call checked before use.

The head answers any Ray client, so an argument may be anything a pickle can
carry: a dict where an id belongs, NaN for a timeout, a string where a list of
ids belongs (which Python would happily iterate letter by letter). Each call is
checked here against the types :class:`HeadApi` declares, once, before the
head reads it; a mismatch is an :class:`~orchestrator.core.errors.InvalidRequestError`
naming the parameter. The typed models inside (``LeaseRequest``, ``JobSpec``,
``NodeInventory``) then check the content.

Checks are plain ``isinstance`` tests built once per method from the
declaration (no pydantic on the heartbeat path). Numbers must be finite, ints
fit in 64 bits, a timeout is at most :data:`MAX_TIMEOUT_S`, a lease or job id
matches :data:`~orchestrator.core.ids.ID_PATTERN`. Invariant: a call
that passes here reaches the service with exactly the declared types, from a caller
:data:`~orchestrator.core.api.CALLERS` lets call it (:func:`authorize`, the identity half).
"""

from __future__ import annotations

import functools
import inspect
import math
import types
import typing
from collections import abc
from collections.abc import Callable, Mapping
from typing import Any

from orchestrator.core import credentials
from orchestrator.core.api import BATCHED, CALLERS, MAX_BATCH_CALLS, Caller, HeadApi
from orchestrator.core.errors import InvalidRequestError, PermissionDeniedError
from orchestrator.core.ids import ID_ALLOWED, ID_PATTERN

#: The longest a caller may ask the head to wait for a lease (a week): a bound on what a call holds.
MAX_TIMEOUT_S = 7 * 86400.0
_INT64 = 1 << 63

Check = Callable[[Any], str | None]  # None when the value is acceptable, else what is allowed
#: Parameters that name a lease or a job: one pattern everywhere (``core.ids.ID_PATTERN``). A job id becomes a
#: Ray job submission id, which Ray's job API puts in a URL: no ``/``, ``?``, ``#``, space or ``..`` path can.
_ID_PARAMS = frozenset({"lease_id", "job_id"})


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and (
        -_INT64 < v < _INT64 if isinstance(v, int) else math.isfinite(v))


def _check_for(annotation: Any) -> Check:
    """An ``isinstance`` check for one declared parameter type."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return lambda v: None
    if origin in (typing.Union, types.UnionType):
        inner = [_check_for(a) for a in args if a is not type(None)]
        optional = type(None) in args

        def either(v: Any) -> str | None:
            if v is None and optional:
                return None
            whys = [c(v) for c in inner]
            return None if any(w is None for w in whys) else " or ".join(w for w in whys if w) + \
                (" or null" if optional else "")
        return either
    if annotation is str:
        return lambda v: None if isinstance(v, str) else "a string"
    if annotation is int:
        return lambda v: None if isinstance(v, int) and not isinstance(v, bool) and -_INT64 < v < _INT64 \
            else "an integer"
    if annotation is float:
        return lambda v: None if _number(v) else "a finite number"
    if annotation is bool:
        return lambda v: None if isinstance(v, bool) else "true or false"
    if origin in (abc.Mapping, dict):
        key = _check_for(args[0]) if args else (lambda v: None)
        val = _check_for(args[1]) if len(args) > 1 else (lambda v: None)
        what = f"a mapping of {_noun(args[0]) if args else 'keys'} to {_noun(args[1]) if len(args) > 1 else 'values'}"
        return lambda v: None if isinstance(v, Mapping) and all(key(k) is None and val(x) is None
                                                                  for k, x in v.items()) else what
    if origin in (abc.Sequence, list, tuple):
        item = _check_for(args[0]) if args else (lambda v: None)
        what = f"a list of {_noun(args[0]) if args else 'items'}"
        return lambda v: None if isinstance(v, (list, tuple)) and all(item(x) is None for x in v) else what
    return lambda v: None  # a type this edge does not know: the service's models check it


def _noun(annotation: Any) -> str:
    return {str: "strings", int: "integers", float: "numbers", bool: "booleans"}.get(annotation, "values")


class _Method:
    """The checks of one declared method: parameter names in order, which are required, and each check."""

    def __init__(self, name: str) -> None:
        declared = getattr(HeadApi, name)
        hints = typing.get_type_hints(declared)
        params = [p for p in inspect.signature(declared).parameters.values() if p.name != "self"]
        self.name = name
        self.names = [p.name for p in params]
        self.required = {p.name for p in params if p.default is inspect.Parameter.empty}
        self.checks = {p.name: _check_for(hints.get(p.name, Any)) for p in params}

    def check(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        if len(args) > len(self.names):
            raise InvalidRequestError(self.name, f"{len(args)} arguments", f"at most {len(self.names)}: "
                                      + ", ".join(self.names), detail="too many arguments")
        given = dict(zip(self.names, args))
        for k, v in kwargs.items():
            if k not in self.checks or k in given:
                raise InvalidRequestError(f"{self.name}.{k}", v, ", ".join(self.names),
                                          detail="no such parameter" if k not in self.checks else "given twice")
            given[k] = v
        missing = [n for n in self.names if n in self.required and n not in given]
        if missing:
            raise InvalidRequestError(missing[0], None, "a value", detail=f"{self.name} needs it")
        for k, v in given.items():
            why = self.checks[k](v)
            if why is not None:
                raise InvalidRequestError(k, v, why, detail=f"not accepted by {self.name}")
        if "timeout" in given and not 0 <= given["timeout"] <= MAX_TIMEOUT_S:
            raise InvalidRequestError("timeout", given["timeout"], f"seconds from 0 to {MAX_TIMEOUT_S:g}")
        for k in _ID_PARAMS.intersection(given):
            if given[k] is not None and not ID_PATTERN.match(given[k]):
                raise InvalidRequestError(k, given[k], ID_ALLOWED, detail=f"not accepted by {self.name}")
        authorize(self.name, given)


def authorize(name: str, given: Mapping[str, Any]) -> None:
    """The identity half of ``CALLERS[name]`` for the caller of the call being carried out
    (:func:`orchestrator.core.credentials.current`): an administrator's methods need one, an agent's the agent of
    the node it names (the head itself passes both). What needs an object's capability (a lease's key, a job's
    owner) is the service's to check, where it looks the object up. :class:`PermissionDeniedError` otherwise."""
    role = CALLERS[name]
    who = credentials.current()
    if role is Caller.ADMIN and not who.trusted:
        raise PermissionDeniedError(name, role.value)
    if role is Caller.AGENT and not (who.internal or (who.node is not None and who.node == given.get("node_name"))):
        raise PermissionDeniedError(name, f"the agent of node {given.get('node_name')!r}", str(given.get("node_name")))


@functools.cache
def _method(name: str) -> _Method:
    return _Method(name)


def check_args(name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidRequestError` unless ``args``/``kwargs`` fit ``HeadApi.<name>``'s declaration."""
    _method(name).check(args, kwargs)


def checked(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a :class:`HeadService` method) behind :func:`check_args`."""
    m = _method(name)

    @functools.wraps(fn)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        m.check(args, kwargs)
        return fn(self, *args, **kwargs)

    return method


def check_batch(calls: Any) -> list[tuple[str, list[Any], dict[str, Any]]]:
    """``calls`` of ``HeadActor.call_many`` as ``(method, args, kwargs)`` triples, or :class:`InvalidRequestError`
    naming the first malformed one: a list of at most :data:`MAX_BATCH_CALLS` ``[method, args, kwargs]``, each method
    one of :data:`~orchestrator.core.api.BATCHED`. The arguments themselves are each method's to check."""
    if not isinstance(calls, (list, tuple)):
        raise InvalidRequestError("calls", calls, "a list of [method, args, kwargs]")
    if len(calls) > MAX_BATCH_CALLS:
        raise InvalidRequestError("calls", len(calls), f"at most {MAX_BATCH_CALLS} calls")
    out = []
    for i, c in enumerate(calls):
        if not isinstance(c, (list, tuple)) or len(c) != 3:
            raise InvalidRequestError(f"calls[{i}]", c, "[method, args, kwargs]")
        name, args, kwargs = c
        if not isinstance(name, str) or name not in BATCHED:
            raise InvalidRequestError(f"calls[{i}].method", name, ", ".join(sorted(BATCHED)))
        if not isinstance(args, (list, tuple)):
            raise InvalidRequestError(f"calls[{i}].args", args, "a list of positional arguments")
        if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
            raise InvalidRequestError(f"calls[{i}].kwargs", kwargs, "a mapping of parameter names to values")
        out.append((name, list(args), dict(kwargs)))
    return out
