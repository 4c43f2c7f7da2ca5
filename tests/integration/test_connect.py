"""Finding the cluster on a real token-protected Ray cluster (issue #18, items 2 and 9).

The module's cluster is ``tests/integration/conftest.py``'s ``ray_cluster``: token auth on, its token in
its own folder. Each command runs as a user would run it -- ``python -m orchestrator.cli.main`` in a fresh
process, with no state file, no ``~/.ray`` and only the auth settings the test gives -- and must exit 3
with one line on stderr naming the right cause, within a bounded time (the default budget is 10 s).

Item 9: a short scenario (``up --address`` with the token in ``RAY_AUTH_TOKEN``, ``status --json``,
``leases --json``, a job, a connect with a wrong token, ``down``), then every output stream, every file
of the Ray session and our state folder are searched for the token's value (and the wrong one's).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from orchestrator.deploy.local import free_port  # a loopback port nothing listens on

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
#: A failing command, Python and Ray's import included, must end within this (default budget: 10 s).
BOUND_S = 15.0
WRONG_TOKEN = "wrong-token-7f3a9c2e51d84b60a1e2c3d4e5f60718"



@pytest.fixture
def clean_env(tmp_path: Path) -> dict[str, str]:
    """A user's environment: none of our or Ray's variables, an empty home and temp folder (no state file,
    no ``~/.ray/auth_token``). Only the loopback site and the repository stay on PYTHONPATH."""
    return _clean_env(tmp_path)


def _clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "ORCHESTRATOR_"))}
    (tmp_path / "home").mkdir()
    env.update(HOME=str(tmp_path / "home"), TMPDIR=str(tmp_path), RAY_TMPDIR=str(tmp_path),
               ORCHESTRATOR_STATE_DIR=str(tmp_path / "state"), RAY_USAGE_STATS_ENABLED="0",
               ORCHESTRATOR_KEEP_LOOPBACK="1")
    return env


def _cli(*args: str, env: dict[str, str], timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=timeout)
    return r, time.monotonic() - t0


def _fails_fast(r: subprocess.CompletedProcess[str], took: float, starts: str, *contains: str) -> str:
    """Exit 3, exactly one line on stderr starting with ``starts``, within the bound."""
    line = r.stderr.strip()
    assert r.returncode == 3, (r.returncode, r.stderr[-2000:])
    assert r.stderr.count("\n") == 1, f"more than one line on stderr:\n{r.stderr[-3000:]}"
    assert line.startswith("error: " + starts), line
    assert all(c in line for c in contains), line
    assert took < BOUND_S, f"took {took:.1f}s: {line}"
    print(f"\n{took:4.1f}s {line}")
    return line


# ---- item 2: fail fast, say why -------------------------------------------------------------------
def test_nothing_listening(clean_env: dict[str, str]) -> None:
    address = f"127.0.0.1:{free_port()}"
    r, took = _cli("submit", "--gpu", "1", "--address", address, "--", "echo", "hi", env=clean_env)
    _fails_fast(r, took, f"no Ray cluster at {address} (found through --address): nothing listens there")


def test_no_token_to_send(ray_cluster: Any, clean_env: dict[str, str]) -> None:
    """The issue's case: no token of ours, a token-protected cluster; was 21 s of C++ errors, then 'no Ray cluster'."""
    r, took = _cli("submit", "--gpu", "1", "--address", ray_cluster.address, "--", "echo", "hi", env=clean_env)
    _fails_fast(r, took, f"the Ray cluster at {ray_cluster.address} (found through --address) requires an auth token "
                         "and we had none to send; token looked for in: RAY_AUTH_TOKEN (unset); RAY_AUTH_TOKEN_PATH "
                         f"(unset); {clean_env['HOME']}/.ray/auth_token (absent); RAY_AUTH_MODE=unset")


def test_no_token_to_send_to_the_cluster_auto_found(ray_cluster: Any, clean_env: dict[str, str], tmp_path: Path) -> None:
    """The issue's command exactly: no --address, no state file; ``auto`` finds the cluster (here through the
    file ``ray start`` leaves in Ray's temp folder, so it is this module's cluster whatever else runs here)."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(ray_cluster.address)
    r, took = _cli("submit", "--gpu", "1", "--", "echo", "hi", env=clean_env)
    _fails_fast(r, took, f"the Ray cluster at {ray_cluster.address} (found through auto, no state file in "
                         f"{clean_env['ORCHESTRATOR_STATE_DIR']}", "requires an auth token and we had none to send")


def test_a_wrong_token(ray_cluster: Any, clean_env: dict[str, str], tmp_path: Path) -> None:
    wrong = tmp_path / "wrong_token"
    wrong.write_text(WRONG_TOKEN)
    env = dict(clean_env, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(wrong))
    r, took = _cli("status", "--json", "--address", ray_cluster.address, env=env)
    line = _fails_fast(r, took, f"the Ray cluster at {ray_cluster.address} (found through --address) refused our "
                                f"auth token; token looked for in: RAY_AUTH_TOKEN (unset); RAY_AUTH_TOKEN_PATH={wrong} "
                                "(a token file, used)")
    assert WRONG_TOKEN not in line + r.stdout
    assert json.loads(r.stdout)["error"] == "ClusterAuthError"


def test_the_cluster_without_our_head(ray_cluster: Any, clean_env: dict[str, str]) -> None:
    env = dict(clean_env, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(ray_cluster.tmpdir / "auth_token"))
    r, took = _cli("leases", "--address", ray_cluster.address, "--ray-namespace", "rgo-nobody", env=env)
    _fails_fast(r, took, f"the Ray cluster at {ray_cluster.address} (found through --address) has no orchestrator "
                         "head 'rgo-head' in namespace 'rgo-nobody'; start one with "
                         f"`orchestrator up --address {ray_cluster.address}`")


def test_a_listener_that_is_not_ray_is_given_up_on_after_the_default_budget(clean_env: dict[str, str]) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)  # the kernel accepts; nobody ever answers
    address = f"127.0.0.1:{srv.getsockname()[1]}"
    try:
        r, took = _cli("jobs", "--address", address, env=clean_env)
    finally:
        srv.close()
    _fails_fast(r, took, f"no Ray cluster at {address} (found through --address): something listens there but no "
                         "Ray GCS answered within 10s")
    assert took > 9.5


# ---- item 9: the token never shows ------------------------------------------------------------------
def _files_containing(root: Path, needles: list[bytes], skip: set[Path]) -> list[str]:
    hits = []
    for p in root.rglob("*"):
        if p in skip or not p.is_file() or p.is_symlink():
            continue
        try:
            data = p.read_bytes()
        except OSError:
            continue
        hits += [f"{p} holds needle #{i}" for i, n in enumerate(needles) if n in data]
    return hits


@pytest.fixture(scope="module")
def scenario(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``up --address`` and a few commands with the token in ``RAY_AUTH_TOKEN`` (its value in the environment:
    the easiest to leak), a connect with a wrong token, then ``down``. Yields every output, the state folder and
    what still held cards after ``down``."""
    tmp_path = tmp_path_factory.mktemp("scenario")
    clean_env = _clean_env(tmp_path)
    token = (ray_cluster.tmpdir / "auth_token").read_text().strip()
    state = tmp_path / "state"
    env = dict(clean_env, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    outputs: dict[str, str] = {}

    def run(name: str, *args: str, environ: dict[str, str] = env, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        r, _ = _cli(*args, "--state-dir", str(state), env=environ, timeout=timeout)
        outputs[f"{name} stdout"], outputs[f"{name} stderr"] = r.stdout, r.stderr
        return r

    up = run("up", "up", "--address", ray_cluster.address)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        assert run("status", "status", "--json").returncode == 0
        sub = run("submit", "submit", "--gpu", "1", "--json", "--wait", "--timeout", "180", "--", "echo", "hi")
        assert sub.returncode == 0, sub.stdout + sub.stderr[-3000:]
        job_id = json.loads(sub.stdout)["job_id"]
        assert run("leases", "leases", "--json").returncode == 0
        assert run("logs", "logs", job_id, "--json").returncode == 0
        assert run("explain", "explain", job_id, "--json").returncode == 0
        wrong = dict(env, RAY_AUTH_TOKEN=WRONG_TOKEN)
        assert run("wrong token", "status", "--json", environ=wrong).returncode == 3
        # The head's direct channel has a secret of its own (rayport/channel.py): read through Ray by a process of
        # ours into a file outside everything searched, to be searched for as well.
        channel = tmp_path / "channel_token"
        got = subprocess.run([sys.executable, "-c", (
            "import sys, ray; from orchestrator.sdk.connect import connect_head; "
            f"h = connect_head(state_dir={str(state)!r}); "
            "open(sys.argv[1], 'w').write(ray.get(h.handle.direct_endpoint.remote())['ok']['token'])"),
            str(channel)], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert got.returncode == 0, got.stderr[-2000:]
        state_files = {p.relative_to(state): p.read_bytes() for p in state.rglob("*") if p.is_file()}
    finally:
        down = run("down", "down")
    yield {"token": token, "outputs": outputs, "state_files": state_files, "channel": channel.read_text(),
           "down": down.returncode, "held_after_down": _held_after(ray_cluster)}


def _held_after(ray_cluster: Any, settle_s: float = 15.0) -> dict[str, Any]:
    """What still holds cards once ``down`` returned: our placement groups, and Ray's GPUs not free (waited for
    up to ``settle_s``: the GCS frees a removed group's capacity a moment later)."""
    import ray
    from ray.util.placement_group import placement_group_table

    deadline = time.monotonic() + settle_s
    while True:
        groups = sorted(row["name"] for row in placement_group_table().values()
                        if row.get("state") != "REMOVED" and (row.get("name") or "").startswith(("rgo-hold/", "rgo-lease/")))
        busy = ray.cluster_resources().get("GPU", 0.0) - ray.available_resources().get("GPU", 0.0)
        if (not groups and busy < 1e-6) or time.monotonic() > deadline:
            return {"groups": groups, "gpus_busy": busy}
        time.sleep(0.2)


def test_down_on_an_attached_cluster_gives_every_card_back(scenario: dict[str, Any]) -> None:
    """The agents' holds outlive them by design (a successor adopts them), so ``down`` on a cluster ``up`` attached
    to must remove them, or the user's own ``num_gpus`` work finds every card taken with nobody left to lend it."""
    assert scenario["down"] == 0, scenario["outputs"]["down stderr"][-2000:]
    assert scenario["held_after_down"] == {"groups": [], "gpus_busy": 0.0}


def test_the_token_never_appears_in_output_logs_or_state(ray_cluster: Any, scenario: dict[str, Any]) -> None:
    token, outputs = scenario["token"], scenario["outputs"]
    assert len(token) >= 32 and scenario["state_files"], "the scenario did not run"
    assert "refused our auth token" in outputs["wrong token stderr"]
    assert len(scenario["channel"]) >= 32
    needles = [token.encode(), WRONG_TOKEN.encode(), scenario["channel"].encode()]
    leaks = [f"{name} holds needle #{i}" for name, text in outputs.items()
             for i, n in enumerate(needles) if n.decode() in text]
    leaks += [f"state folder file {name} holds needle #{i}" for name, data in scenario["state_files"].items()
              for i, n in enumerate(needles) if n in data]
    # Ray's session folder (every process's logs, the job's driver log, the dashboard's) and the cluster's
    # temp root; the one file meant to hold the token is the fixture's own token file.
    searched = [p.name for p in ray_cluster.tmpdir.rglob("*.log")]
    assert any(n.startswith("job-driver-") for n in searched), "the job's own log is not where we search"
    assert any(n.startswith("python-core-driver-") for n in searched), "the commands' driver logs are not searched"
    leaks += _files_containing(ray_cluster.tmpdir, needles, skip={ray_cluster.tmpdir / "auth_token"})
    assert not leaks, "\n".join(leaks)
