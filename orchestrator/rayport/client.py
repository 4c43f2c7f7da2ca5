"""The head, as a client sees it: :class:`HeadClient` calls the head actor and raises its typed errors again.

Its methods are made from :data:`orchestrator.core.api.HEAD_METHODS` (one per
method of :class:`~orchestrator.core.api.HeadApi`, with the declared
signature), so the client cannot drift from the actor or the service.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Mapping

import ray
from pydantic import BaseModel

from orchestrator.core.api import BATCHED, HEAD_METHODS, HeadApi
from orchestrator.core.errors import NotConnectedError
from orchestrator.rayport.coalesce import Coalescer, SendInterrupted
from orchestrator.rayport.ray_api import get_head
from orchestrator.rayport.wire import unwrap

#: Seconds a call waits for the head's answer (a method in ``WAITING`` waits its own timeout plus this).
CALL_TIMEOUT_S = 60.0
#: Methods that wait on the head for up to their ``timeout`` argument: the call may take that much longer.
WAITING = frozenset({"wait_lease", "acquire_lease"})


class HeadClient(HeadApi):
    """Calls the head actor and raises its typed errors (never ``RayTaskError``) again.

    Calls of :data:`~orchestrator.core.api.BATCHED` methods that several threads make at once share one Ray call
    (``HeadActor.call_many``; :mod:`.coalesce`): each still gets its own answer or typed error, and a lone call goes
    at once. It subclasses the protocol so type checkers see every method; each is replaced below by a real call."""

    def __init__(self, namespace: str = "rgo", name: str = "rgo-head", handle: Any = None) -> None:
        self.handle = handle if handle is not None else get_head(namespace, name)
        self.batched = Coalescer(self._send_batch)
        self.gone = False  # a call found the actor dead: a new client must look the head up again

    def call(self, method: str, *args: Any, timeout: float | None = CALL_TIMEOUT_S, **kwargs: Any) -> Any:
        """``method`` on the head; its answer, or its typed error raised again. A batched method goes with the calls
        made meanwhile and waits for its batch, which waits :data:`CALL_TIMEOUT_S` once sent (none of them waits
        on the head: ``timeout`` is for the others)."""
        if method in BATCHED:
            try:
                return unwrap(self.batched.call([method, list(args), kwargs]))
            except SendInterrupted as e:
                raise NotConnectedError(f"orchestrator head did not answer {method}: {e}") from None
        return unwrap(self._get(method, getattr(self.handle, method).remote(*args, **kwargs), timeout))

    def _send_batch(self, calls: list[Any]) -> list[Any]:
        """One ``call_many`` carrying ``calls``: their envelopes, in order."""
        return unwrap(self._get(", ".join(sorted({c[0] for c in calls})), self.handle.call_many.remote(calls),
                                CALL_TIMEOUT_S))

    def _get(self, what: str, ref: Any, timeout: float | None) -> Any:
        try:
            return ray.get(ref, timeout=timeout)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
            self.gone = self.gone or isinstance(e, ray.exceptions.RayActorError)
            raise NotConnectedError(f"orchestrator head did not answer {what}: {type(e).__name__}") from None


def _plain(v: Any) -> Any:
    """What goes over the wire: a model as its JSON form, a mapping as a dict, a sequence as a list."""
    if isinstance(v, BaseModel):
        return v.model_dump(mode="json")
    if isinstance(v, Mapping):
        return dict(v)
    if isinstance(v, (list, tuple)):
        return list(v)
    return v


def _call(name: str) -> Callable[..., Any]:
    declared = getattr(HeadApi, name)
    sig = inspect.signature(declared)

    @functools.wraps(declared)
    def method(self: HeadClient, *args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        values = [_plain(v) for k, v in bound.arguments.items() if k != "self"]
        timeout = CALL_TIMEOUT_S + float(bound.arguments["timeout"]) if name in WAITING else CALL_TIMEOUT_S
        return self.call(name, *values, timeout=timeout)

    return method


for _name in HEAD_METHODS:
    setattr(HeadClient, _name, _call(_name))
