"""The local state folder (core.statefile.checked_state_dir): made 0700, used only when it is a directory of
this user's that nobody else may write to -- its default name ($TMPDIR/rgo-<uid>) is predictable, and it holds
the cluster's auth token and the processes `down` stops (issue #38, docs/security.md)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orchestrator.core.errors import ConfigError
from orchestrator.core.statefile import State, checked_state_dir
from orchestrator.deploy.local import auth_env


def test_up_makes_the_folder_0700_and_its_token_0600(tmp_path: Path) -> None:
    sd = tmp_path / "deep" / "rgo-state"
    State("127.0.0.1:1", "rgo", "rgo-head", attached=True).save(sd)
    assert stat.S_IMODE(sd.stat().st_mode) == 0o700
    env = auth_env(sd, environ={}, home=tmp_path / "home")
    assert stat.S_IMODE(Path(env["RAY_AUTH_TOKEN_PATH"]).stat().st_mode) == 0o600


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_folder_others_may_write_to_is_refused_naming_the_field(tmp_path: Path, mode: int) -> None:
    sd = tmp_path / "rgo-shared"
    sd.mkdir()
    (sd / "auth_token").write_text("planted")
    sd.chmod(mode)
    for use in (lambda: State.load(sd), lambda: State("a", "n", "h", attached=True).save(sd),
                lambda: checked_state_dir(sd, create=True)):
        with pytest.raises(ConfigError) as e:
            use()
        assert e.value.field == "state_dir" and "chmod 700" in str(e.value)


def test_a_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(ConfigError) as e:
        State.load(link)
    assert e.value.field == "state_dir"


@pytest.mark.skipif(os.getuid() != 0, reason="making a folder another user owns needs root")
def test_a_folder_another_user_made_is_refused_and_its_token_never_adopted(tmp_path: Path) -> None:
    sd = tmp_path / "rgo-0"
    sd.mkdir(mode=0o700)
    (sd / "auth_token").write_text("the other user's")
    os.chown(sd, 65534, 65534)  # nobody
    with pytest.raises(ConfigError) as e:
        checked_state_dir(sd, create=True)
    assert "belongs to uid 65534" in str(e.value)


def test_a_missing_folder_is_nothing_to_read(tmp_path: Path) -> None:
    assert State.load(tmp_path / "absent") is None
