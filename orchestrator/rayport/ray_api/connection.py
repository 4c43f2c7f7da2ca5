"""Connecting to a Ray cluster: a driver's connection, the address and token it uses, Ray's own CLI.

**Loopback.** Ray 2.60 rewrites ``127.0.0.1`` given as a node or bootstrap
address to the host's outward IP (``services.resolve_ip_for_localhost``;
ray-project/ray#59110), so a cluster asked to stay on loopback would not.
:func:`keep_loopback` makes loopback addresses resolve to themselves; the
launcher's raylets (:mod:`orchestrator.deploy.raylet`) and our drivers call
it before Ray does anything.

**Finding the cluster** is bounded (``ORCHESTRATOR_CONNECT_TIMEOUT_S``, default
10 s) and says why it failed. Left to itself, ``ray.init`` retries a refused
token or a dead address for 20 s or more, printing a C++ error line each
second, and then reports "no Ray cluster". :func:`connect` resolves the address
as Ray would, then makes one TCP connect and one GCS call (``GetClusterId``,
over Ray's own gRPC channel, with the token Ray would send) within the budget,
and only then calls ``ray.init``. Each failure is its own typed error:
nothing there (:class:`ClusterNotFoundError`), token refused or missing
(:class:`ClusterAuthError`, naming where the token was looked for, never the
token); a cluster without our head is found by the SDK (``HeadNotFoundError``).

Invariants: nothing here starts or changes the cluster; a failure to find it is one line, typed, and
never shows the token.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Mapping

import ray

from orchestrator.core import env as E
from orchestrator.core.errors import ClusterAuthError, ClusterNotFoundError, InvalidRequestError


def keep_loopback() -> None:
    """Make Ray resolve loopback addresses to themselves (idempotent); see the module docstring."""
    from ray._private import services

    # The same patch the cluster's own processes get from rayport/loopback/sitecustomize.py.
    from orchestrator.rayport.loopback.sitecustomize import patch_services

    patch_services(services)


def connect(address: str | None, namespace: str, *, timeout_s: float | None = None, source: str | None = None) -> str:
    """Connect this process as a driver (no-op when already connected); returns the cluster's GCS address.

    Finding the cluster takes at most ``timeout_s`` (default :func:`connect_timeout_s`) and fails with its
    own one-line error: :class:`ClusterNotFoundError` (nothing there, not a Ray GCS, no answer in time) or
    :class:`ClusterAuthError` (our token refused, or none to send). ``source`` says how ``address`` was
    found, for those messages. See "Finding the cluster" in the module docstring.
    """
    if ray.is_initialized():
        return str(ray.get_runtime_context().gcs_address)
    keep_loopback()
    budget = connect_timeout_s() if timeout_s is None else timeout_s
    deadline = time.monotonic() + budget
    given = address or "auto"
    source = source or given
    _refresh_auth()
    gcs, source = _resolve_address(given, source)
    _probe_gcs(gcs, source, deadline, budget)
    # ray.init replaces the driver's SIGTERM handler (with sys.exit) and Ray's core installs a C handler
    # that prints a stack: a command that turns SIGTERM into its own clean-up gets it back afterwards.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main_thread else None
    try:
        # the setup hook is a no-op but in a Serve controller the inference service starts (core.env.SERVE_LEASES)
        ray.init(address=gcs, namespace=namespace, logging_level="ERROR", log_to_driver=False,
                 configure_logging=False, runtime_env={"worker_process_setup_hook": E.SERVE_SETUP_HOOK})
    except ray.exceptions.AuthenticationError:
        raise ClusterAuthError(gcs, source, token_sources(), sent=False) from None
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ClusterNotFoundError(gcs, source, _one_line(e)) from None
    finally:
        if callable(previous):
            signal.signal(signal.SIGTERM, previous)
    return gcs


def _refresh_auth() -> None:
    """Make Ray see the auth settings the environment has now (the CLI reads them from the state file after
    Ray was imported; a process that connects twice may have turned them on or off in between)."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def disconnect() -> None:
    if ray.is_initialized():
        ray.shutdown()


#: Seconds finding the cluster may take when neither the caller nor ORCHESTRATOR_CONNECT_TIMEOUT_S says.
DEFAULT_CONNECT_TIMEOUT_S = 10.0


def connect_timeout_s(environ: Mapping[str, str] | None = None) -> float:
    """The connect budget: ``ORCHESTRATOR_CONNECT_TIMEOUT_S`` (seconds > 0), else 10 s."""
    raw = (os.environ if environ is None else environ).get(E.CONNECT_TIMEOUT_S, "").strip()
    if not raw:
        return DEFAULT_CONNECT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise InvalidRequestError(E.CONNECT_TIMEOUT_S, raw, "seconds > 0, for example 10")
    return value


def token_sources(environ: Mapping[str, str] | None = None, home: Path | None = None) -> str:
    """Where Ray looks for the auth token, in its order, what is there and which one it uses: never the token.

    Ray (2.60) takes ``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH`` names, else
    ``~/.ray/auth_token``, and sends it only when ``RAY_AUTH_MODE`` is ``token``."""
    e = os.environ if environ is None else environ
    path = e.get(E.RAY_AUTH_TOKEN_PATH)
    default = (home or Path.home()) / ".ray" / "auth_token"
    places = [("RAY_AUTH_TOKEN", bool(e.get(E.RAY_AUTH_TOKEN, "").strip()), "set", "unset"),
              (f"RAY_AUTH_TOKEN_PATH={path}" if path else "RAY_AUTH_TOKEN_PATH",
               bool(path) and _readable_token_file(Path(str(path))), "a token file",
               "no token file there" if path else "unset"),
              (str(default), _readable_token_file(default), "a token file", "absent")]
    used = next((i for i, (_, present, _, _) in enumerate(places) if present), None)
    out = [f"{name} ({(yes + ', used') if i == used else yes if present else no})"
           for i, (name, present, yes, no) in enumerate(places)]
    return "; ".join(out) + f"; RAY_AUTH_MODE={e.get(E.RAY_AUTH_MODE) or 'unset'}"


def _readable_token_file(path: Path) -> bool:
    try:
        return bool(path.read_text().strip())
    except (OSError, UnicodeDecodeError):
        return False


def _resolve_address(given: str, source: str) -> tuple[str, str]:
    """The GCS address ``given`` stands for, as ``ray.init`` would pick it (``RAY_ADDRESS`` first; ``auto``:
    the last cluster started here, else any GCS running on this machine), and ``source`` saying so when
    ``auto`` chose among several (Ray's own warning about it would be a second line). For ``auto``, token
    auth is turned on when a token exists, as ``ray.init("auto")`` does (we pass Ray the resolved address,
    for which it would not)."""
    from ray._private import services

    quiet = logging.getLogger(services.__name__)
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        gcs = str(services.get_ray_address_from_environment(given, None))
        running = len(services.find_gcs_addresses()) if given == "auto" else 0
    except ConnectionError:
        raise ClusterNotFoundError(given, source, "no Ray cluster runs on this machine; start one with "
                                                  "`orchestrator up`, or give --address HOST:PORT") from None
    finally:
        quiet.setLevel(level)
    if running > 1:
        source = f"{source}; one of {running} Ray clusters running here"
    if given == "auto" and not os.environ.get(E.RAY_AUTH_MODE):
        from ray._raylet import AuthenticationTokenLoader

        if AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
            os.environ[E.RAY_AUTH_MODE] = "token"
            _refresh_auth()
    return gcs, source


def _probe_gcs(address: str, source: str, deadline: float, budget: float) -> None:
    """Fail fast, and say why, before ``ray.init`` (whose client retries a dead address, or a refused
    token, for 20 s or more, printing a C++ error each second): one TCP connect, then one GCS call
    (``GetClusterId``) on Ray's own channel -- TLS and auth token as Ray would send them -- both within
    ``deadline``. Addresses with a scheme (``ray://``, ``http://``) are left to Ray."""
    if "://" in address:
        return
    import grpc
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=_left(deadline)).close()
    except ValueError:
        raise ClusterNotFoundError(address, source, "not a HOST:PORT address") from None
    except socket.timeout:
        raise ClusterNotFoundError(address, source, f"nothing answered within {budget:g}s") from None
    except OSError as e:
        raise ClusterNotFoundError(address, source, f"nothing listens there ({e.strerror or e})") from None
    try:
        channel = init_grpc_channel(address)
    except ray.exceptions.AuthenticationError:  # token auth is on here and no token was found to send
        raise ClusterAuthError(address, source, token_sources(), sent=False) from None
    try:
        gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
            gcs_service_pb2.GetClusterIdRequest(), timeout=_left(deadline))
    except ray.exceptions.AuthenticationError:
        raise ClusterAuthError(address, source, token_sources(), sent=False) from None
    except grpc.RpcError as e:
        code = e.code()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            from ray._private.authentication.authentication_utils import is_token_auth_enabled
            from ray._raylet import AuthenticationTokenLoader

            sent = is_token_auth_enabled() and AuthenticationTokenLoader.instance().has_token()
            raise ClusterAuthError(address, source, token_sources(), sent=sent) from None
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            detail = f"something listens there but no Ray GCS answered within {budget:g}s"
        elif code == grpc.StatusCode.UNIMPLEMENTED:
            detail = "something listens there, but not a Ray GCS"
        else:
            detail = f"the GCS call failed: {code.name} {_one_line(e.details() or '')}".strip()
        raise ClusterNotFoundError(address, source, detail) from None
    finally:
        channel.close()


def _left(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.05)


def _one_line(e: object, limit: int = 300) -> str:
    """A message that stays one line (Ray's errors carry tracebacks and help paragraphs)."""
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def ray_cli(argv: list[str]) -> None:
    """Run Ray's own command line (``ray start ...``) in this process, loopback kept loopback."""
    import sys

    keep_loopback()
    from ray.scripts.scripts import main

    sys.argv = ["ray", *argv]
    main()
