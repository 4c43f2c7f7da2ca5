"""Finding the cluster fails fast and says why (issue #18, item 2), without a Ray cluster: real sockets on
loopback stand for "nothing listens" and "something listens, but not a Ray GCS". Ray is imported, never
started (``ray.init`` fails in this tier, so an error that got past the probe would say so). The refused
token and the cluster without our head need a real cluster: ``tests/integration/test_connect.py``."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
from typer.testing import CliRunner

from orchestrator.cli import jobs as cli
from orchestrator.core import env as E
from orchestrator.core.errors import (
    EXIT_UNREACHABLE,
    ClusterAuthError,
    ClusterNotFoundError,
    HeadNotFoundError,
    InvalidRequestError,
    exit_code,
)
from orchestrator.deploy.local import free_port  # a loopback port nothing listens on
from orchestrator.rayport import ray_api

runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_ray_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # Ray lets it override any address given
    monkeypatch.delenv(E.CONNECT_TIMEOUT_S, raising=False)



@pytest.fixture
def mute_listener() -> Iterator[str]:
    """A loopback port that accepts connections and never says a word (not a Ray GCS)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


# ---- the errors ---------------------------------------------------------------------------------
def test_each_way_of_failing_has_its_own_one_line_error_and_exit_3() -> None:
    errors = [ClusterNotFoundError("127.0.0.1:1", "--address", "nothing listens there (Connection refused)"),
              ClusterAuthError("127.0.0.1:2", "auto, no state file in /tmp/x", "RAY_AUTH_TOKEN (unset)", sent=False),
              ClusterAuthError("127.0.0.1:2", "--address", "RAY_AUTH_TOKEN (set, used)", sent=True),
              HeadNotFoundError("127.0.0.1:3", "the state file in /tmp/x", "rgo", "rgo-head")]
    for e in errors:
        assert exit_code(e) == EXIT_UNREACHABLE
        assert "\n" not in str(e) and e.address in str(e) and e.source in str(e)
        d = e.to_dict()
        assert d["error"] == type(e).__name__ and d["address"] == e.address and d["source"] == e.source
    assert "requires an auth token and we had none to send" in str(errors[1])
    assert "refused our auth token" in str(errors[2]) and not errors[2].retryable  # the token must change
    assert "orchestrator up --address 127.0.0.1:3" in str(errors[3]) and "namespace 'rgo'" in str(errors[3])


def test_the_connect_timeout_comes_from_the_environment_and_must_be_positive() -> None:
    assert ray_api.connect_timeout_s({}) == ray_api.DEFAULT_CONNECT_TIMEOUT_S == 10.0
    assert ray_api.connect_timeout_s({E.CONNECT_TIMEOUT_S: "2.5"}) == 2.5
    for bad in ("0", "-1", "soon", "nan", "inf"):
        with pytest.raises(InvalidRequestError) as ei:
            ray_api.connect_timeout_s({E.CONNECT_TIMEOUT_S: bad})
        assert ei.value.field == E.CONNECT_TIMEOUT_S and exit_code(ei.value) == 2


def test_token_sources_say_where_ray_looks_in_its_order_and_never_the_token(tmp_path: Path) -> None:
    secret = "s3cr3t-token-value-0123456789abcdef"
    path = tmp_path / "tok"
    path.write_text(secret)
    home = tmp_path / "home"
    both = ray_api.token_sources({E.RAY_AUTH_TOKEN: secret, E.RAY_AUTH_TOKEN_PATH: str(path),
                                  E.RAY_AUTH_MODE: "token"}, home=home)
    assert secret not in both
    assert both.startswith("RAY_AUTH_TOKEN (set, used); ") and f"RAY_AUTH_TOKEN_PATH={path} (a token file);" in both
    assert "used" not in both.split(";", 1)[1] and both.endswith("; RAY_AUTH_MODE=token")
    file_only = ray_api.token_sources({E.RAY_AUTH_TOKEN_PATH: str(path)}, home=home)
    assert f"RAY_AUTH_TOKEN_PATH={path} (a token file, used)" in file_only and "RAY_AUTH_TOKEN (unset)" in file_only and "RAY_AUTH_MODE=unset" in file_only
    missing = ray_api.token_sources({E.RAY_AUTH_TOKEN_PATH: str(tmp_path / "nope")}, home=home)
    assert "(no token file there)" in missing and f"{home}/.ray/auth_token (absent)" in missing
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secret)
    assert f"{home}/.ray/auth_token (a token file, used)" in ray_api.token_sources({}, home=home)


# ---- the probe, on real loopback sockets --------------------------------------------------------
def test_nothing_listening_fails_at_once_naming_the_address() -> None:
    address = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(ClusterNotFoundError) as ei:
        ray_api.connect(address, "rgo", timeout_s=10, source="--address")
    assert time.monotonic() - t0 < 2.0
    assert str(ei.value).startswith(f"no Ray cluster at {address} (found through --address): nothing listens there")


def test_a_listener_that_is_not_a_ray_gcs_fails_within_the_budget(mute_listener: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(ClusterNotFoundError) as ei:
        ray_api.connect(mute_listener, "rgo", timeout_s=1.0)
    took = time.monotonic() - t0
    assert 0.9 < took < 3.0, took
    assert "no Ray GCS answered within 1s" in str(ei.value)


def test_auto_with_no_cluster_on_the_machine_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray._private import services

    def none_here(addr: str, temp_dir: object) -> str:
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(services, "get_ray_address_from_environment", none_here)
    with pytest.raises(ClusterNotFoundError) as ei:
        ray_api.connect(None, "rgo", source="auto, no state file in /tmp/x")
    assert str(ei.value) == ("no Ray cluster at auto (found through auto, no state file in /tmp/x): no Ray cluster "
                             "runs on this machine; start one with `orchestrator up`, or give --address HOST:PORT")


def test_auto_among_several_clusters_says_so_in_the_same_line(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from ray._private import services

    address = f"127.0.0.1:{free_port()}"

    def latest(addr: str, temp_dir: object) -> str:
        logging.getLogger(services.__name__).warning("Found multiple active Ray instances")  # as Ray does
        return address

    monkeypatch.setattr(services, "get_ray_address_from_environment", latest)
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: frozenset({address, "10.0.0.1:6379", "10.0.0.2:6379"}))
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(ClusterNotFoundError) as ei:
            ray_api.connect("auto", "rgo", source="auto, no state file in /tmp/x")
    assert "(found through auto, no state file in /tmp/x; one of 3 Ray clusters running here)" in str(ei.value)
    assert "multiple active" not in caplog.text  # Ray's warning would be a second line on stderr


# ---- the command line ---------------------------------------------------------------------------
def test_token_auth_on_with_no_token_to_send_is_a_typed_error_not_a_crash(
        mute_listener: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """RAY_AUTH_MODE=token with no token anywhere: Ray refuses to open the channel; we say so and exit 3."""
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "no-such-token"))
    monkeypatch.setenv("HOME", str(tmp_path))
    r = runner.invoke(cli.app, ["jobs", "--address", mute_listener, "--state-dir", str(tmp_path),
                                "--connect-timeout", "0.5"])
    assert r.exit_code == 3 and "we had none to send" in r.stderr, r.output


def test_a_command_without_a_cluster_exits_3_with_one_line_and_one_json_error(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    r = runner.invoke(cli.app, ["leases", "--json", "--address", address, "--state-dir", str(tmp_path)])
    assert r.exit_code == 3, r.output
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"error: no Ray cluster at {address}")
    assert json.loads(r.stdout)["error"] == "ClusterNotFoundError"


def test_connect_timeout_option_bounds_finding_the_cluster_and_is_not_left_behind(
        mute_listener: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):  # no token auth here, whatever ran before
        monkeypatch.delenv(k, raising=False)
    t0 = time.monotonic()
    r = runner.invoke(cli.app, ["jobs", "--address", mute_listener, "--state-dir", str(tmp_path),
                                "--connect-timeout", "0.5"])
    assert time.monotonic() - t0 < 3.0
    assert r.exit_code == 3 and "no Ray GCS answered within 0.5s" in r.stderr, r.output
    import os

    assert E.CONNECT_TIMEOUT_S not in os.environ
