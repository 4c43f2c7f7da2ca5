"""Who is calling the head: credentials a caller presents, and the :class:`Principal` the head makes of them.

Ray hands an actor method no verifiable identity of its caller (a driver may pass any job id or actor id it
likes, and an ``ObjectRef`` can be built from any bytes), so the head trusts what a caller can *prove*: a
secret whose SHA-256 digest the head already holds. Three kinds, each a random 256-bit key:

* **user key** -- who owns a job. Made on first use in the caller's own state folder (``user.key``, 0600, in
  the 0700 per-user folder of :mod:`.statefile`) or given as ``ORCHESTRATOR_USER_KEY``. The head records the
  key's digest (its first 16 hex digits are the ``owner`` views show) with each job submitted under it; only
  that key, or an administrator, may cancel the job or read its logs. A caller without one is anonymous: it
  may read the public views and ask for leases, nothing else.
* **administrator key** -- ``orchestrator up`` writes ``admin.key`` (0600) in the state folder and hands its
  digest to the head it starts (``RuntimeSettings.admin_key_sha256``); on Kubernetes it comes from a Secret
  (``ORCHESTRATOR_ADMIN_KEY``). Administrators may call everything (repartition, the day clock, announcing
  the dashboard, cancelling any job).
* **agent key** -- made by the head for each node agent it starts, passed to that agent's constructor and
  never shown to a driver; the head keeps its digest in the journal. Only node N's agent may register,
  heartbeat or report the inventory of node N, and its heartbeat acts only on leases of node N.

Leases have their own capability (the requester's key, :mod:`.lease`), which is not a caller identity: a
lease's requester may hand it to the holder it starts.

Invariants: a credential never leaves the process that holds it except inside a call to the head; the head
keeps only digests; comparisons are constant-time; :func:`principal` is pure.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping
from contextlib import contextmanager

from orchestrator.core.errors import InvalidRequestError

#: Environment variables a client reads its credentials from (before the state folder's files).
USER_KEY_ENV = "ORCHESTRATOR_USER_KEY"
ADMIN_KEY_ENV = "ORCHESTRATOR_ADMIN_KEY"
#: Where a head's starter (the Kubernetes sidecar) finds the secret its tokens are made from (64 hex digits).
HEAD_SECRET_ENV = "ORCHESTRATOR_HEAD_SECRET"
#: Files in the state folder that hold them (0600).
USER_KEY_FILE = "user.key"
ADMIN_KEY_FILE = "admin.key"
#: The keyword a transport carries a caller's credentials in, beside a method's own arguments.
CALLER_KWARG = "_caller"
#: How long a credential may be (a key is 43 characters of base64).
MAX_KEY_CHARS = 256


def new_key() -> str:
    """A fresh random key (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def matches(digest_: str | None, key: str | None) -> bool:
    """True when ``key`` is the secret behind ``digest_`` (constant time; never for a missing one)."""
    return bool(digest_ and key) and hmac.compare_digest(digest_, digest(key))  # type: ignore[arg-type]


def user_id(key_digest: str) -> str:
    """The name views give the owner of a user key: its digest's first 16 hex digits (names nobody's key)."""
    return "u-" + key_digest[:16]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a call comes from, as far as the head could verify. ``user``: the user id of a valid user key;
    ``admin``: it showed the administrator key; ``node``: it showed the agent key of that node; ``internal``:
    the call comes from the head's own process (never from a transport)."""

    user: str | None = None
    admin: bool = False
    node: str | None = None
    internal: bool = False

    @property
    def trusted(self) -> bool:
        """An administrator or the head itself: may do anything."""
        return self.admin or self.internal

    def describe(self) -> str:
        parts = (["the head itself"] if self.internal else []) + (["an administrator"] if self.admin else []) + \
            ([f"the agent of {self.node}"] if self.node else []) + ([f"user {self.user}"] if self.user else [])
        return ", ".join(parts) or "an anonymous caller"


ANONYMOUS = Principal()
INTERNAL = Principal(internal=True)


def principal(credentials: Any, *, admin_digest: str | None,
              agent_digest: Callable[[str], str | None]) -> Principal:
    """The :class:`Principal` a transport's ``credentials`` prove: ``{"user": key, "admin": key, "agent": key,
    "node": name}``, every entry optional. A key that matches nothing proves nothing (as if it were not sent:
    an administrator key of another cluster, an agent key the head has since replaced), so a wrong guess and no
    guess look the same to the caller; a malformed mapping is an :class:`InvalidRequestError` naming it."""
    if credentials is None:
        return ANONYMOUS
    if not isinstance(credentials, Mapping) or not set(credentials) <= {"user", "admin", "agent", "node"}:
        raise InvalidRequestError(CALLER_KWARG, "<credentials>", 'a mapping with "user", "admin", "agent", "node"')
    for k, v in credentials.items():
        if v is not None and (not isinstance(v, str) or not 0 < len(v) <= MAX_KEY_CHARS):
            raise InvalidRequestError(f"{CALLER_KWARG}.{k}", "<credential>", f"a string of 1 to {MAX_KEY_CHARS}")
    admin_key, agent_key, node = credentials.get("admin"), credentials.get("agent"), credentials.get("node")
    admin = matches(admin_digest, admin_key)
    agent_of = node if node and matches(agent_digest(node), agent_key) else None
    user_key = credentials.get("user")
    return Principal(user=user_id(digest(user_key)) if user_key else None, admin=admin, node=agent_of)


#: The caller of the call being carried out; :data:`INTERNAL` unless a transport set it (:func:`calling_as`).
_CURRENT: contextvars.ContextVar[Principal] = contextvars.ContextVar("rgo_caller", default=INTERNAL)


def current() -> Principal:
    return _CURRENT.get()


@contextmanager
def calling_as(who: Principal) -> Iterator[Principal]:
    """Carry out the calls inside as ``who`` (the head's transports wrap each call they answer in this)."""
    token = _CURRENT.set(who)
    try:
        yield who
    finally:
        _CURRENT.reset(token)


# ---- the client's side ------------------------------------------------------------------------------------

def _read_key(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text or None


def _write_key(path: Path) -> str:
    """A new key in ``path``, created 0600 (never over an existing file: a race reads the winner's)."""
    key = new_key()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read_key(path) or key
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key


#: The administrator key of the cluster this process started (``up`` in-process: a demo, a bench), which its own
#: clients present: kept in memory, never in the environment its children inherit.
_STARTED: dict[str, str] = {}


def use_admin_key(key: str) -> None:
    """This process started the cluster whose administrator key is ``key``: its clients present it."""
    _STARTED["admin"] = key


def client_credentials(environ: Mapping[str, str] | None = None, *, state_dir: Path | None = None,
                       create_user_key: bool = True) -> dict[str, str]:
    """What this process presents to the head: its user key (``ORCHESTRATOR_USER_KEY``, else the state
    folder's ``user.key``, made there on first use) and, where it has one, the administrator key
    (``ORCHESTRATOR_ADMIN_KEY``, else that of the cluster this process started (:func:`use_admin_key`), else the
    state folder's ``admin.key``). The state folder is checked as
    :func:`~.statefile.checked_state_dir` checks it: a folder someone else owns gives nothing. ``state_dir``:
    the folder (default: :func:`~.statefile.default_state_dir`)."""
    from orchestrator.core.statefile import checked_state_dir, default_state_dir

    started = _STARTED.get("admin") if environ is None else None
    environ = os.environ if environ is None else environ
    out: dict[str, str] = {}
    user, admin = environ.get(USER_KEY_ENV) or None, environ.get(ADMIN_KEY_ENV) or started
    folder: Path | None = None
    if user is None or admin is None:
        try:
            folder = checked_state_dir(state_dir or default_state_dir(environ), create=create_user_key and user is None)
        except (InvalidRequestError, OSError):
            folder = None
    if user is None and folder is not None:
        user = _read_key(folder / USER_KEY_FILE) or (_write_key(folder / USER_KEY_FILE)
                                                   if create_user_key and folder.is_dir() else None)
    if admin is None and folder is not None:
        admin = _read_key(folder / ADMIN_KEY_FILE)
    if user:
        out["user"] = user
    if admin:
        out["admin"] = admin
    return out


def admin_key_for(state_dir: Path, environ: Mapping[str, str] | None = None) -> str:
    """The administrator key of the cluster ``up`` starts from ``state_dir``: ``ORCHESTRATOR_ADMIN_KEY`` (a
    Kubernetes Secret), else the folder's ``admin.key`` (made 0600 on first use)."""
    environ = os.environ if environ is None else environ
    return environ.get(ADMIN_KEY_ENV) or _read_key(state_dir / ADMIN_KEY_FILE) or _write_key(state_dir / ADMIN_KEY_FILE)


#: The state folder's file holding the secret the head's fencing tokens are made from (0600; hex).
HEAD_SECRET_FILE = "head.secret"


def head_secret_for(state_dir: Path, environ: Mapping[str, str] | None = None) -> str:
    """The secret (hex) the head of ``state_dir``'s cluster makes its tokens from, made 0600 on first use: kept
    outside the GCS, so a head made again over the same journal (``up`` on a GCS that survived) derives the same
    tokens, and a driver reading the GCS KV derives none. ``ORCHESTRATOR_HEAD_SECRET`` (hex) comes first."""
    environ = os.environ if environ is None else environ
    if environ.get(HEAD_SECRET_ENV):  # a Kubernetes Secret: the same for every head its supervisor starts
        return environ[HEAD_SECRET_ENV]
    path = state_dir / HEAD_SECRET_FILE
    key = _read_key(path) or _write_key(path)
    return hashlib.sha256(key.encode()).hexdigest()  # 64 hex digits from the file's random key
