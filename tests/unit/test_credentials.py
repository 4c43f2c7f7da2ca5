"""Credentials (core/credentials.py): where a client and a head's starter find them, and what they prove. Pure
or on a temporary folder; no Ray."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from orchestrator.core import credentials as C


def test_a_client_makes_its_user_key_once_0600_in_its_own_folder_and_reads_an_admin_key_there(tmp_path: Path) -> None:
    env = {"ORCHESTRATOR_STATE_DIR": str(tmp_path / "state")}
    first = C.client_credentials(env)
    assert set(first) == {"user"} and C.client_credentials(env) == first  # made once, then read
    key_file = tmp_path / "state" / C.USER_KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    admin = C.admin_key_for(tmp_path / "state", {})
    assert C.client_credentials(env)["admin"] == admin
    assert stat.S_IMODE((tmp_path / "state" / C.ADMIN_KEY_FILE).stat().st_mode) == 0o600
    assert C.client_credentials({**env, C.USER_KEY_ENV: "u", C.ADMIN_KEY_ENV: "a"}) == {"user": "u", "admin": "a"}


def test_a_folder_someone_opened_up_gives_no_credentials(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    (folder / C.ADMIN_KEY_FILE).write_text("planted")
    assert "admin" not in C.client_credentials({"ORCHESTRATOR_STATE_DIR": str(folder)})


def test_the_environment_comes_before_the_folder_for_the_heads_starter(tmp_path: Path) -> None:
    """On Kubernetes the sidecar's Secret (environment) names the administrator and the token secret: a file its
    state folder happens to hold must not override them."""
    C.admin_key_for(tmp_path, {})
    secret = C.head_secret_for(tmp_path, {})
    assert len(secret) == 64 and C.head_secret_for(tmp_path, {}) == secret  # stable across restarts
    assert C.admin_key_for(tmp_path, {C.ADMIN_KEY_ENV: "from-secret"}) == "from-secret"
    assert C.head_secret_for(tmp_path, {C.HEAD_SECRET_ENV: "ab" * 32}) == "ab" * 32


def test_what_credentials_prove() -> None:
    admin, agent = C.new_key(), C.new_key()
    digests = {"n1": C.digest(agent)}
    p = C.principal({"user": "u", "admin": admin, "agent": agent, "node": "n1"}, admin_digest=C.digest(admin),
                    agent_digest=digests.get)
    assert (p.user, p.admin, p.node) == (C.user_id(C.digest("u")), True, "n1")
    wrong = C.principal({"admin": "x", "agent": agent, "node": "n2"}, admin_digest=C.digest(admin),
                        agent_digest=digests.get)
    assert (wrong.admin, wrong.node, wrong.user) == (False, None, None)  # proves nothing, refuses nothing
    assert C.principal(None, admin_digest=None, agent_digest=digests.get) == C.ANONYMOUS
    for bad in ("str", {"evil": "x"}, {"user": 5}, {"user": "x" * 1000}):
        with pytest.raises(C.InvalidRequestError):
            C.principal(bad, admin_digest=None, agent_digest=digests.get)
