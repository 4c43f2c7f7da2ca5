"""The head, as a client sees it: :class:`HeadClient` calls the head actor and raises its typed errors again.

Its methods are made from :data:`orchestrator.core.api.HEAD_METHODS` (one per
method of :class:`~orchestrator.core.api.HeadApi`, with the declared
signature), so the client cannot drift from the actor or the service.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
import time
from typing import Any, Callable, Mapping

import orjson
import ray
from pydantic import BaseModel

from orchestrator.core import env
from orchestrator.core.api import BATCHED, HEAD_METHODS, HeadApi
from orchestrator.core.credentials import CALLER_KWARG, client_credentials
from orchestrator.core.errors import NotConnectedError
from orchestrator.rayport.channel import Channel, ChannelBroken, Endpoint
from orchestrator.rayport.ray_api import get_head
from orchestrator.rayport.wire import unwrap

#: Seconds a call waits for the head's answer (a method in ``WAITING`` waits its own timeout plus this).
CALL_TIMEOUT_S = 60.0
#: Methods that wait on the head for up to their ``timeout`` argument: the call may take that much longer.
WAITING = frozenset({"wait_lease", "acquire_lease"})
#: Seconds to open the head's channel before calling the actor instead (in a cluster it takes a few ms).
DIRECT_CONNECT_S = 5.0

log = logging.getLogger(__name__)


class HeadClient(HeadApi):
    """Calls the head actor and raises its typed errors (never ``RayTaskError``) again.

    Calls of :data:`~orchestrator.core.api.BATCHED` methods (the grant path) go over the head's channel
    (:mod:`.channel`, gRPC), each at once (the head batches what arrives together from every client); like Ray's
    retries of a call to a restarting head (``max_task_retries=-1``), a call whose channel broke is sent again to
    the head's next incarnation, which every batched method allows: each is idempotent
    (:class:`~orchestrator.control.service.HeadService`), and ``submit_job`` is given a client-made ``job_id`` here
    when the caller named none, so a resend cannot make a second job. A client that cannot reach the channel (a Ray
    Client driver) sends each as a ``call_many`` actor call; either way the answer is decoded from the same JSON.
    It subclasses the protocol so type checkers see every method; each is replaced below by a real call."""

    def __init__(self, namespace: str = "rgo", name: str = "rgo-head", handle: Any = None,
                 direct: bool | None = None, credentials: Mapping[str, str] | None = None) -> None:
        self.handle = handle if handle is not None else get_head(namespace, name)
        #: what every call presents (``_caller``): this process's user key and, where it has one, the administrator
        #: key (:func:`~orchestrator.core.credentials.client_credentials`); never sent anywhere but the head
        self.credentials = dict(client_credentials() if credentials is None else credentials)
        self.actor_sends = 0  # quick calls sent as call_many actor calls (no channel): for tests and figures
        self.gone = False  # a call found the actor dead: a new client must look the head up again
        self._direct: Channel | None = None
        self._opening = threading.Lock()
        if direct is None:
            # the knob settings.direct_calls names, as its environment variable spells it (core.config)
            direct = os.environ.get(env.DIRECT_CALLS, "1").strip().lower() not in ("0", "false", "no", "off")
        self.direct = direct  # False once the head has no channel this process can reach: actor calls only

    def call(self, method: str, *args: Any, timeout: float | None = CALL_TIMEOUT_S, **kwargs: Any) -> Any:
        """``method`` on the head; its answer, or its typed error raised again. A batched method goes with the calls
        made meanwhile and waits for its batch, which waits :data:`CALL_TIMEOUT_S` once sent (none of them waits
        on the head: ``timeout`` is for the others)."""
        if self.credentials:
            kwargs[CALLER_KWARG] = self.credentials
        if method in BATCHED:
            if self.direct:
                reply = self._call_direct(method, [method, list(args), kwargs])
                if reply is not None:
                    return unwrap(reply)
            return unwrap(self._send_batch([[method, list(args), kwargs]])[0])
        return unwrap(self._get(method, getattr(self.handle, method).remote(*args, **kwargs), timeout))

    def _send_batch(self, calls: list[Any]) -> list[Any]:
        """One ``call_many`` actor call carrying ``calls``: their envelopes, in order (decoded from its JSON)."""
        self.actor_sends += 1
        raw = self._get(", ".join(sorted({c[0] for c in calls})), self.handle.call_many.remote(calls), CALL_TIMEOUT_S)
        return unwrap(orjson.loads(raw))  # type: ignore[no-any-return]

    def _call_direct(self, method: str, call: list[Any]) -> dict[str, Any] | None:
        """``call`` over the channel, at once: its envelope, or ``None`` when this client has no channel (then the
        caller sends it to the actor). A broken channel is opened again, at the address the head gives now, and
        the call sent again, until :data:`CALL_TIMEOUT_S` has passed."""
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while True:
            conn = self._connection(method, deadline)
            if conn is None:
                return None
            try:
                return unwrap(conn.call([call], max(0.001, deadline - time.monotonic())))[0]  # type: ignore[no-any-return]
            except TypeError:  # arguments JSON cannot carry (Ray's pickling can): the actor answers them, typed
                return None
            except TimeoutError:
                raise NotConnectedError(f"orchestrator head did not answer {method}: no answer in "
                                        f"{CALL_TIMEOUT_S:.0f}s") from None
            except ChannelBroken as e:
                if time.monotonic() >= deadline:
                    raise NotConnectedError(f"orchestrator head did not answer {method}: {e}") from None

    def _connection(self, what: str, deadline: float) -> Channel | None:
        """The open channel to the head; if it broke, a new one (one thread opens it, the others wait for it);
        ``None`` once the head has none this process can reach."""
        with self._opening:
            if self._direct is not None and self._direct.broken is None:
                return self._direct
            if not self.direct:
                return None
            self._direct = self._open_direct(what, deadline)
            return self._direct

    def _open_direct(self, what: str, deadline: float) -> Channel | None:
        """Ask the head (through Ray, which waits for a restarting head) where its channel is, and connect.
        ``None``, and actor calls from now on, if it has none or it cannot be reached from here (a Ray Client
        driver, ``ray://``, is outside the cluster's network: it does not try)."""
        if ray.util.client.ray.is_connected():
            self.direct = False
            return None
        try:
            got = unwrap(self._get(what, self.handle.direct_endpoint.remote(),
                                   max(0.001, deadline - time.monotonic())))
        except AttributeError:  # a head from before the channel
            got = None
        if got is None:
            self.direct = False
            return None
        endpoint = Endpoint.from_json(got)
        try:
            return Channel(endpoint, min(DIRECT_CONNECT_S, max(0.001, deadline - time.monotonic())))
        except (OSError, TimeoutError) as e:
            log.warning("the orchestrator head's channel at %s:%s cannot be reached (%s); calling its actor",
                        endpoint.host, endpoint.port, e)
            self.direct = False
            return None

    def _get(self, what: str, ref: Any, timeout: float | None) -> Any:
        try:
            return ray.get(ref, timeout=timeout)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
            self.gone = self.gone or isinstance(e, ray.exceptions.RayActorError)
            raise NotConnectedError(f"orchestrator head did not answer {what}: {type(e).__name__}") from None


def new_job_id(name: Any) -> str:
    """A client-made job id: the job's slug (as the head makes its own) and 8 random hex digits."""
    import secrets

    from orchestrator.core.ids import job_slug

    return f"{job_slug(str(name or 'job'))}-{secrets.token_hex(4)}"


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
        if name == "submit_job" and values[1] is None and isinstance(values[0], dict):
            values[1] = new_job_id(values[0].get("name"))  # made before the first send: a resend is the same job
        timeout = CALL_TIMEOUT_S + float(bound.arguments["timeout"]) if name in WAITING else CALL_TIMEOUT_S
        return self.call(name, *values, timeout=timeout)

    return method


for _name in HEAD_METHODS:
    setattr(HeadClient, _name, _call(_name))
