"""The environment of a local cluster: what its raylets, its job drivers and its clients run with.

Auth: Ray 2.60 turns token auth on for local clusters. ``up`` keeps it on: it uses
``RAY_AUTH_TOKEN``/``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token`` when one exists, else makes a token inside the
state directory (not in ``~/.ray``) and records where, so ``status`` and ``down`` connect with it
(:func:`auth_env`). A client (``status``, ``down``, a script ``orchestrator env`` prepared: :func:`driver_env`)
takes the cluster's auth and temp folder from the state file (:func:`load_state`).

Invariants:

* :func:`auth_env` writes nothing outside the state directory, and never turns auth off unless the user did
  (``RAY_AUTH_MODE=disabled``);
* every process the cluster starts carries the run marker (:data:`~orchestrator.deploy.processes.RUN_MARKER`),
  Ray's temp dirs below :func:`~orchestrator.deploy.launch_plan.ray_root`, and a ``PYTHONPATH`` that starts with
  the loopback site package and :data:`CODE_ROOT`: it stays on 127.0.0.1 and runs this same code;
* a client applies the cluster's environment to its own before it imports Ray (:func:`_apply_env`).
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from orchestrator.core.statefile import State
from orchestrator.deploy.launch_plan import ray_root
from orchestrator.deploy.processes import RUN_MARKER
from orchestrator.rayport.loopback import LOOPBACK_SITE

#: The folder the running ``orchestrator`` package was imported from -- a checkout, site-packages, a mutation
#: tester's copy -- put first on the cluster's ``PYTHONPATH`` so every process of it runs this same code.
CODE_ROOT = Path(sys.modules["orchestrator"].__path__[0]).resolve().parent


def auth_env(state_dir: Path, environ: dict[str, str] | None = None, home: Path | None = None) -> dict[str, str]:
    """The token-auth environment for our raylets and clients (see the module docstring).

    May write ``<state_dir>/auth_token``; never writes outside ``state_dir``.
    """
    environ = dict(os.environ if environ is None else environ)
    if environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return {"RAY_AUTH_MODE": "disabled"}  # the user's explicit choice
    env = {"RAY_AUTH_MODE": "token"}
    if environ.get("RAY_AUTH_TOKEN") or environ.get("RAY_AUTH_TOKEN_PATH"):
        if environ.get("RAY_AUTH_TOKEN_PATH"):
            env["RAY_AUTH_TOKEN_PATH"] = environ["RAY_AUTH_TOKEN_PATH"]
        return env
    if ((home or Path.home()) / ".ray" / "auth_token").is_file():
        return env
    token = state_dir / "auth_token"
    if not token.exists():
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    env["RAY_AUTH_TOKEN_PATH"] = str(token)
    return env


def _loopback_env(environ: dict[str, str]) -> dict[str, str]:
    """What keeps a process of ours (a raylet, a job's driver, a user's script) on 127.0.0.1 (rayport/loopback),
    ``environ``'s own ``PYTHONPATH`` kept after ours."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (LOOPBACK_SITE, str(CODE_ROOT), environ.get("PYTHONPATH", ""))
                                          if p),
            "ORCHESTRATOR_KEEP_LOOPBACK": "1"}


def _child_env(state_dir: Path, auth: dict[str, str], run_id: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(auth)
    env["RAY_TMPDIR"] = str(ray_root(state_dir) / "ray")
    env["TMPDIR"] = str(ray_root(state_dir) / "tmp")  # Python's forkserver puts a socket there too
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env[RUN_MARKER] = run_id
    # `down` stops the whole cluster: a SIGTERMed raylet need not wait (30 s by default) for
    # its detached actors to drain away first.
    env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"
    env.update(_loopback_env(env))
    # Job entrypoints say `python ...`: make that the interpreter the orchestrator runs on (its venv).
    env["PATH"] = os.pathsep.join(p for p in (os.path.dirname(sys.executable), env.get("PATH", "")) if p)
    return env


def _apply_env(env: dict[str, str]) -> None:
    """Our client's own environment must match the cluster's (auth, temp dir) before Ray is imported."""
    os.environ.update(env)


def load_state(state_dir: Path) -> State | None:
    """The state of a running ``up``, with its environment applied to this process (for clients)."""
    state = State.load(state_dir)
    if state is not None:
        _apply_env(state.env)
    return state


def driver_env(state: State, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that makes a plain ``python script.py`` on this machine a driver of the cluster ``up``
    started, as a job's driver is: Ray's address, auth and temp folder, 127.0.0.1 kept, the head's namespace and
    name and, on a cluster whose raylets ``up`` started, the hook through which the script's ``num_gpus`` tasks,
    actors and placement groups get leases (``docs/ray-native.md``). What ``orchestrator env`` prints."""
    environ = dict(os.environ if environ is None else environ)
    out = {**state.env, "RAY_ADDRESS": state.address, "ORCHESTRATOR_NAMESPACE": state.namespace,
           "ORCHESTRATOR_HEAD_NAME": state.head_name, **state.driver_env}
    if not state.attached:
        out.update(_loopback_env(environ))
    return out
