"""up/down without Ray: the ray start commands, auth, the state file, and stopping only our own sessions."""

from __future__ import annotations

import json
import os
from itertools import count
from pathlib import Path

import pytest

from orchestrator.core.errors import ConfigError

from orchestrator.core.config import ClusterConfig, parse_config, with_environment
from orchestrator.core.statefile import Proc, State
from orchestrator.deploy.local import (RAY_SESSION_TAIL, UNIX_SOCKET_MAX, auth_env, down, plan_local_cluster, ray_root, session_members,
                                       with_metrics_port)

from .standins import session_leader, standin_raylet


def _opt(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_one_ray_start_per_node_head_first(demo: ClusterConfig, tmp_path: Path) -> None:
    ports = count(20000)
    plan = plan_local_cluster(demo, tmp_path, ports=lambda: next(ports))
    assert plan.address == "127.0.0.1:20000"
    head, *workers = plan.nodes
    assert head.head and head.name == "a100-0" and "--head" in head.argv and "--block" in head.argv
    assert _opt(head.argv, "--port") == "20000" and _opt(head.argv, "--dashboard-host") == "127.0.0.1"
    assert plan.dashboard == f"http://127.0.0.1:{_opt(head.argv, '--dashboard-port')}"
    root = ray_root(tmp_path)  # pytest's tmp_path is too deep for Ray's sockets: a short folder of our own
    assert _opt(head.argv, "--temp-dir") == str(root / "ray")
    for n in plan.nodes:
        assert _opt(n.argv, "--node-ip-address") == "127.0.0.1"
        node = demo.node(n.name)
        # Ray's GPU as Ray would detect it (the agent holds what no lease covers), its accelerator type, and
        # one resource per card
        assert _opt(n.argv, "--num-gpus") == str(node.gpus)  # type: ignore[union-attr]
        accel = {"A100-80GB": "A100", "H100-80GB": "H100"}[node.model]  # type: ignore[union-attr]
        assert json.loads(_opt(n.argv, "--resources")) == {
            f"rgo-node-{n.name}": 1.0, f"accelerator_type:{accel}": 1.0,
            **{f"rgo-gpu-{i}": 1.0 for i in range(node.gpus)}}  # type: ignore[union-attr]
        assert f"rgo.io/node={n.name}" in _opt(n.argv, "--labels").split(",")
        assert n.log.startswith(str(tmp_path))
    temps = [_opt(n.argv, "--temp-dir") for n in plan.nodes]
    assert len(set(temps)) == len(temps)  # a session dir per raylet: their runtime-env agents never share one
    assert all(len(t) + RAY_SESSION_TAIL <= UNIX_SOCKET_MAX for t in temps)  # every raylet's socket paths fit, whatever the state folder's depth
    for w in workers:
        assert _opt(w.argv, "--address") == plan.address and "--head" not in w.argv
    # Each dashboard agent binds a port of its own choosing (none picked ahead that may be taken meanwhile).
    assert {_opt(n.argv, "--dashboard-agent-listen-port") for n in plan.nodes} == {"0"}
    with pytest.raises(ConfigError) as e:
        plan_local_cluster(parse_config({}), tmp_path)
    assert e.value.field == "nodes" and "at least one node" in str(e.value)


def test_rays_temp_root_is_the_state_folder_when_its_socket_paths_fit_else_a_short_one(tmp_path: Path) -> None:
    assert ray_root(Path("/tmp/rgo-0")) == Path("/tmp/rgo-0")
    deep = tmp_path / ("x" * 60)
    short = ray_root(deep)
    assert short != deep and short == ray_root(deep) and short.parent == Path("/tmp")  # deterministic: down finds it
    assert ray_root(tmp_path / ("y" * 60)) != short  # one per state folder


def test_a_local_cluster_serves_its_metrics_on_a_free_loopback_port_unless_told_otherwise(demo: ClusterConfig) -> None:
    """`up` with a config that names no metrics port: the head gets a free one on 127.0.0.1 (`status` shows its
    URL). A port in the config or in $ORCHESTRATOR_METRICS_PORT, or an address off loopback, is left as it is."""
    assert demo.settings.metrics_port == 0 and demo.settings.metrics_host == "127.0.0.1"
    got = with_metrics_port(demo, ports=lambda: 40123)
    assert got.settings.metrics_port == 40123 and got.settings.metrics_host == "127.0.0.1"
    assert got.model_copy(update={"settings": demo.settings}) == demo  # nothing else changed
    set_port = demo.model_copy(update={"settings": demo.settings.model_copy(update={"metrics_port": 9100})})
    assert with_metrics_port(set_port, ports=lambda: 40123) is set_port
    from_env = with_environment(demo, {"ORCHESTRATOR_METRICS_PORT": "9200"})  # as load_config applies it
    assert with_metrics_port(from_env, ports=lambda: 40123) is from_env and from_env.settings.metrics_port == 9200
    everywhere = demo.model_copy(update={"settings": demo.settings.model_copy(update={"metrics_host": "0.0.0.0"})})
    assert with_metrics_port(everywhere, ports=lambda: 40123) is everywhere


def test_auth_stays_on_and_writes_only_inside_the_state_dir(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    sd = tmp_path / "state"
    env = auth_env(sd, environ={}, home=home)
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == str(sd / "auth_token")
    assert (sd / "auth_token").stat().st_mode & 0o777 == 0o600 and not (home / ".ray").exists()
    assert auth_env(sd, environ={}, home=home) == env  # idempotent, same token
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text("t")
    assert auth_env(tmp_path / "s2", environ={}, home=home) == {"RAY_AUTH_MODE": "token"}
    assert auth_env(tmp_path / "s3", environ={"RAY_AUTH_TOKEN_PATH": "/x"}, home=home)["RAY_AUTH_TOKEN_PATH"] == "/x"
    assert auth_env(tmp_path / "s4", environ={"RAY_AUTH_MODE": "disabled"}) == {"RAY_AUTH_MODE": "disabled"}


def _session(tmp_path: Path, name: str) -> Proc:
    return standin_raylet(name)


def test_down_stops_exactly_the_sessions_it_started_and_removes_the_state_dir(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    ours = [_session(tmp_path, "head"), _session(tmp_path, "w1")]
    bystander = _session(tmp_path, "not-ours")
    try:
        State("127.0.0.1:1", "rgo", "rgo-head", attached=False, processes=ours).save(sd)
        (sd / "logs").mkdir()
        (sd / "logs" / "head.log").write_text("x")
        report = down(sd, progress=lambda m: None, grace_s=1.0)
        assert sorted(report.terminated) == ["head", "w1"]
        assert all(session_members(p.sid) == [] for p in ours)
        assert len(session_members(bystander.sid)) == 2
        assert not sd.exists() and report.removed == str(sd)
        assert down(sd, progress=lambda m: None).terminated == []  # idempotent
    finally:
        for pid in session_members(bystander.sid):
            os.kill(pid, 9)


def test_a_recycled_pid_is_never_signalled(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    other = _session(tmp_path, "someone-else")
    try:
        stale = Proc("head", other.pid, other.sid, other.start_ticks + 1)  # same pid, another process
        State("127.0.0.1:1", "rgo", "rgo-head", attached=False, processes=[stale]).save(sd)
        report = down(sd, progress=lambda m: None, grace_s=0.5)
        assert report.terminated == [] and report.killed == []
        assert len(session_members(other.sid)) == 2
    finally:
        for pid in session_members(other.sid):
            os.kill(pid, 9)


def test_state_round_trip(tmp_path: Path) -> None:
    s = State("127.0.0.1:5", "ns", "h", attached=True, env={"RAY_AUTH_MODE": "token"}, processes=[Proc("a", 1, 1, 2)])
    s.save(tmp_path)
    assert State.load(tmp_path) == s
    assert State.load(tmp_path / "nothing") is None


def test_a_raylet_that_timed_out_registering_is_started_again_and_its_leftovers_stopped(
        demo: ClusterConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray gives a worker's raylet a fixed 30 s to register with the GCS; on a busy host `ray start` gives up with
    "The current node timed out during startup" (twice in the suite's full runs). `up` starts that node again,
    once, after stopping what the failed `ray start` left in its session; any other failure still fails `up`."""
    from orchestrator.deploy import local

    said: list[str] = []
    spawned: list[tuple[str, Proc]] = []
    timeout = "The current node timed out during startup. This could happen because ..."
    fail = {"a100-0": [timeout], "a100-1": [timeout]}  # the head node and a worker

    def spawn(node, env, cwd):  # type: ignore[no-untyped-def]
        msg = fail.get(node.name, []).pop(0) if fail.get(node.name) else None
        # a session leader with a child, as `ray start`: it says it started and stays, or says why not and exits
        # leaving its child (its raylet, still registering) behind
        # (SIGTERM: it stops its child and exits, as `ray start --block` does)
        script = ("import signal, subprocess, sys, time; c = subprocess.Popen(['sleep', '300']); "
                  "signal.signal(signal.SIGTERM, lambda *a: (c.kill(), c.wait(), sys.exit(0))); "
                  + ("time.sleep(0.5); " if msg else "")
                  + f"open({node.log!r}, 'a').write({(msg or 'Ray runtime started.') + chr(10)!r}); "
                  + ("sys.exit(1)" if msg else "time.sleep(300)"))
        Path(node.log).parent.mkdir(parents=True, exist_ok=True)
        proc = session_leader(node.name, script, {**os.environ, **env})
        spawned.append((node.name, proc))
        return proc

    monkeypatch.setattr(local, "_spawn", spawn)
    monkeypatch.setattr(local, "_start_orchestrator", lambda *a, **k: True)
    monkeypatch.setattr(local, "_apply_env", lambda env: None)
    sd = tmp_path / "state"
    try:
        state = local.up_local(demo, sd, progress=said.append, timeout_s=60)
        names = [n for n, _ in spawned]
        assert names == ["a100-0", "a100-0", "a100-1", "a100-1", "h100-0"]
        for failed in (spawned[0][1], spawned[2][1]):
            assert session_members(failed.sid) == [], "the failed ray start's leftovers are stopped"
        assert [p.node for p in state.processes] == ["a100-0", "a100-1", "h100-0"]
        assert [p.pid for p in state.processes] == [spawned[1][1].pid, spawned[3][1].pid, spawned[4][1].pid]
        assert any("did not register with the GCS" in m for m in said)
        # any other failure is not retried: up fails and stops what it started
        fail["h100-0"] = ["Some other error"]
        down(sd, progress=lambda m: None, grace_s=1.0)
        spawned.clear()
        with pytest.raises(local.OrchestratorError, match="exited during startup"):
            local.up_local(demo, sd, progress=said.append, timeout_s=60)
        assert [n for n, _ in spawned] == ["a100-0", "a100-1", "h100-0"]
        assert all(session_members(p.sid) == [] for _, p in spawned)
    finally:
        down(sd, progress=lambda m: None, grace_s=1.0)
        for _, p in spawned:
            for pid in session_members(p.sid):
                os.kill(pid, 9)
