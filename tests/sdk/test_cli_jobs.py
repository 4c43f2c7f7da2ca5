"""The job commands' contract against the real head in-process (tests/headless.py): refusals (exit 2) before
connecting, one JSON value with --json, exit codes, progress on stderr, and the rendering of tables and
explanations. No Ray."""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from headless import InProcessHead
from typer.testing import CliRunner

from orchestrator.cli import jobs as cli
from orchestrator.sdk.jobs import Client

runner = CliRunner()
FOUR = {"kind": "whole", "count": 4}  # the head's API takes a request's JSON form, not the --gpu string


class Uploads:
    """Stands in for the upload of a local working directory to the cluster's GCS (Ray's packaging: the real
    one runs in tests/integration/test_submission.py); records what it was given."""

    def __init__(self) -> None:
        self.given: list[dict[str, Any]] = []

    def __call__(self, runtime_env: Any) -> dict[str, Any]:
        self.given.append(dict(runtime_env))
        return {**runtime_env, "working_dir": "gcs://_ray_pkg_0123456789abcdef.zip"}


@pytest.fixture
def uploads() -> Uploads:
    return Uploads()


@pytest.fixture
def head(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, uploads: Uploads) -> Iterator[InProcessHead]:
    h = InProcessHead(workdir=tmp_path / "head")
    monkeypatch.setattr(cli, "make_client", lambda *a: Client(head=h, upload=uploads))
    yield h
    h.close()


def _running(head: InProcessHead, job_id: str) -> None:
    head.wait_for(lambda: head.service.get_job(job_id)["state"] == "running", 60, f"{job_id} running")  # a busy machine starts processes slowly


def _blocked(head: InProcessHead, job_id: str) -> None:
    """``job_id`` waits behind a 4-card inference job on a100-0 (the only node with 4 free cards)."""
    head.submit_job({"name": "blocker", "entrypoint": "sleep 600", "gpu": FOUR, "priority": "inference"},
                    "blocker-1")
    _running(head, "blocker-1")
    head.submit_job({"name": job_id.rsplit("-", 1)[0], "entrypoint": "true", "gpu": FOUR, "priority": "batch"}, job_id)
    head.wait_for(lambda: head.service.explain_job(job_id)["pending"] is not None, 60, f"{job_id} considered")


@pytest.fixture
def no_head(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a: Any) -> Any:
        raise AssertionError("bad input must be refused before connecting")

    monkeypatch.setattr(cli, "make_client", refuse)


def run(*args: str) -> Any:
    # Tables fit the terminal's width (COLUMNS when set, as pytest-xdist's workers set it to 80): a fixed wide one
    # here, so what a table shows does not depend on where the suite runs.
    return runner.invoke(cli.app, list(args), env={"COLUMNS": "200"})


@pytest.mark.parametrize("args, field, shown", [
    (["--gpu", "mig:9g.99gb"], "profile", "9g.99gb"),          # a MIG profile no GPU offers
    (["--gpu", "mps:130%"], "gpu.sm_percent", "130%"),          # an SM share over 100%
    (["--gpu", "mps:30%,-2GiB"], "gpu.memory", "-2GiB"),        # negative memory
    (["--gpu", "mem=lots,isolation=soft"], "gpu.memory", "lots"),  # unparsable memory
    (["--gpu", "0"], "gpu", "0"),
    (["--env", "NOEQUALS"], "env", "NOEQUALS"),
    (["--name", "Bad Name"], "name", "Bad Name"),
    (["--working-dir", "/no/such/dir"], "working_dir", "/no/such/dir"),
])
def test_bad_input_exits_2_naming_the_field_before_connecting(no_head: None, args: list[str], field: str, shown: str) -> None:
    r = run("submit", *args, "--", "python", "x.py")
    assert r.exit_code == 2, r.output
    assert f"invalid {field}=" in r.stderr and shown in r.stderr and "allowed:" in r.stderr


def test_an_empty_command_exits_2(no_head: None) -> None:
    r = run("submit", "--gpu", "1", "--json")
    assert r.exit_code == 2
    err = json.loads(r.stdout)
    assert err["error"] == "InvalidRequestError" and err["field"] == "entrypoint" and "empty command" in err["message"]


def test_the_heads_refusals_exit_2_listing_what_is_allowed(head: InProcessHead) -> None:
    r = run("submit", "--priority", "urgent", "--", "true")
    assert r.exit_code == 2 and "invalid priority='urgent'" in r.stderr and "batch, inference, training" in r.stderr
    r = run("submit", "--gpu", "mig:7g.80gb", "--json", "--", "true")
    assert r.exit_code == 2 and json.loads(r.stdout)["field"] == "gpu.profile"


def test_an_unreachable_orchestrator_exits_3_with_one_json_object(tmp_path: Path) -> None:
    r = run("jobs", "--json", "--address", "127.0.0.1:1", "--state-dir", str(tmp_path))
    assert r.exit_code == 3
    assert json.loads(r.stdout)["error"] == "ClusterNotFoundError"  # a NotConnectedError that says which way it failed


def test_submit_prints_the_job_id_and_sends_what_ray_job_submit_would(head: InProcessHead, uploads: Uploads,
                                                                       tmp_path: Path) -> None:
    r = run("submit", "--gpu", "mps:30%,20GiB", "--priority", "training", "--checkpoint-dir", str(tmp_path),
            "--env", "A=1", "--env", "B=x=y", "--working-dir", str(tmp_path), "--",
            "sh", "-c", "sleep 600", "--note", "two words")
    assert r.exit_code == 0, r.output
    job_id = r.stdout.strip()
    spec = head.calls[0][1][0]
    # (a command that runs: `sleep 600 --note ...` exited at once, so on a busy machine the job had failed before
    # the head first saw it running)
    assert job_id.startswith("sh-") and spec["name"] == "sh"
    assert shlex.split(spec["entrypoint"]) == ["sh", "-c", "sleep 600", "--note", "two words"]
    # The folder is uploaded from here; the head gets the package's URI, never a path on this machine.
    assert [u["working_dir"] for u in uploads.given] == [str(tmp_path)]
    assert spec["runtime_env"] == {"env_vars": {"A": "1", "B": "x=y"},
                                   "working_dir": "gcs://_ray_pkg_0123456789abcdef.zip"}
    assert spec["checkpoint_dir"] == str(tmp_path) and spec["priority"] == "training"
    assert "submitted " + job_id in r.stderr and "mps:30%,20480MiB" in r.stderr
    _running(head, job_id)  # what Ray's job API received: the job's env plus the lease's devices
    sent = head.runner.submitted[f"{job_id}.a1"]
    assert sent["env"]["A"] == "1" and sent["env"]["B"] == "x=y" and sent["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert sent["env"]["ORCHESTRATOR_JOB_ID"] == job_id and list(sent["handout"]["resources"].values()) == [0.3]


def test_submit_json_prints_exactly_one_object(head: InProcessHead) -> None:
    r = run("submit", "--json", "--gpu", "timeslice:0.25", "--name", "ts", "--", "true")
    assert r.exit_code == 0
    d = json.loads(r.stdout)
    # an idle cluster admits it in the submit call itself (the fast grant path); the head hands it to Ray's job
    # API after the reply, once the store holds the admission (jobs.launches), as the head actor does
    assert d["name"] == "ts" and d["state"] == "admitted" and d["gpu"] == "timeslice:0.25"


def test_submit_wait_prints_progress_and_exits_by_the_outcome(head: InProcessHead) -> None:
    r = run("submit", "--wait", "--name", "ok", "--", "sleep", "0.5")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip().endswith(": succeeded")
    states = [ln.split()[3] for ln in r.stderr.splitlines()[1:]]
    assert states[-2:] == ["running", "succeeded"] and set(states) <= {"queued", "admitted", "running", "succeeded"}
    r = run("submit", "--wait", "--name", "bad", "--", "false")
    assert r.exit_code == 1 and "failed" in r.stdout and "orchestrator logs" in r.stderr


def test_read_commands_print_one_json_value(head: InProcessHead) -> None:
    head.submit_job({"name": "e", "entrypoint": "echo out"}, "e-1")
    head.wait_for(lambda: head.service.get_job("e-1")["state"] == "succeeded", 10, "e-1 done")
    _blocked(head, "a-1")
    head.request_lease({"lease_id": "l-1", "request": {"kind": "whole", "count": 4}, "owner": "o"})  # behind the blocker: queued
    for cmd, check in ((["jobs"], lambda v: {j["job_id"] for j in v} == {"e-1", "blocker-1", "a-1"}),
                       (["nodes"], lambda v: [n["name"] for n in v] == ["a100-0", "a100-1", "h100-0"]),
                       (["leases"], lambda v: "l-1" in [le["lease_id"] for le in v]),
                       (["queue"], lambda v: [q["lease_id"] for q in v] == ["a-1.a1", "l-1"]),
                       (["logs", "e-1"], lambda v: v["logs"] == "out\n"),
                       (["explain", "a-1"], lambda v: v["pending"]["position"] == 0),
                       (["cancel", "a-1"], lambda v: v["state"] == "cancelled")):
        r = run(*cmd, "--json")
        assert r.exit_code == 0, (cmd, r.output)
        assert check(json.loads(r.stdout)), cmd
    # Another driver's `leases --json` shows no fencing token, for its own leases or the head's jobs'.
    shown = json.loads(run("leases", "--json").stdout)
    assert shown and all(le["fencing_token"] is None for le in shown)
    assert all("<redacted>" == le["handout"]["env_vars"]["ORCHESTRATOR_FENCING_TOKEN"] for le in shown if le["handout"])


def test_tables_show_what_matters(head: InProcessHead) -> None:
    head.submit_job({"name": "m", "entrypoint": "sleep 600", "gpu": {"kind": "mig", "profile": "1g.10gb"}}, "m-1")
    _running(head, "m-1")
    _blocked(head, "a-1")
    head.request_lease({"lease_id": "l-1", "request": {"kind": "whole", "count": 1, "node": "h100-0"}, "owner": "me"})
    head.wait_for(lambda: head.service.get_lease("l-1")["state"] == "granted", 10, "l-1 granted")
    out = run("jobs").stdout
    assert "m-1" in out and "running" in out and "mig:1g.10gb" in out and "a-1" in out and "queued" in out
    out = run("nodes").stdout
    assert "h100-0" in out and "A100-80GB" in out and "80GiB" in out and "l-1" in out
    out = run("leases").stdout
    assert "l-1" in out and "granted" in out and "job:m-1" in out
    out = run("queue").stdout
    assert "a-1.a1" in out and "job:a-1" in out
    head.submit_job({"name": "b", "entrypoint": "echo '[red]x[/red]'; exit 1"}, "b-1")
    head.wait_for(lambda: head.service.get_job("b-1")["state"] == "failed", 10, "b-1 failed")
    assert "Ray job b-1.a1 FAILED" in run("jobs").stdout  # reasons are text, not rich markup


def test_unknown_job_ids_exit_2_listing_known_ones(head: InProcessHead) -> None:
    head.submit_job({"name": "a", "entrypoint": "true"}, "a-1")
    for cmd in ("logs", "cancel", "explain"):
        r = run(cmd, "zzz")
        assert r.exit_code == 2 and "invalid job='zzz': no such job (allowed: a-1)" in r.stderr, cmd


def test_cancel_says_what_it_was(head: InProcessHead) -> None:
    _blocked(head, "a-1")
    assert run("cancel", "a-1").stdout.strip() == "a-1: cancelled (was queued)"
    assert run("cancel", "a-1").stdout.strip() == "a-1: cancelled (already ended)"


def test_help_documents_the_exit_codes() -> None:
    for args in ([], ["submit"]):
        r = run(*args, "--help")
        assert "3 orchestrator not reachable" in " ".join(r.stdout.split()), args


# ---- explain, rendered ---------------------------------------------------------------------------
def test_render_explain_pending() -> None:
    text = cli.render_explain({
        "job_id": "big-1", "name": "big", "state": "queued", "summary": "pending at queue position 2: no node fits",
        "pending": {"position": 1, "reason": "no node fits 4x whole (3 nodes)",
                    "reasons": [{"alternative": "whole", "reason": "not enough free GPUs", "nodes": 2},
                                {"alternative": "whole", "reason": "only 2 GPUs", "nodes": 1}],
                    "would_preempt": [{"lease_id": "t-1.a1", "owner": "t-1"}], "being_preempted": [],
                    "preemption_blocked": ""},
        "placement": None, "preemptions": []})
    assert text.splitlines()[:2] == ["job big-1 (big): queued", "  pending at queue position 2: no node fits"]
    assert "  queue position: 2" in text
    assert "    2 nodes: not enough free GPUs  [whole]" in text and "    1 node: only 2 GPUs  [whole]" in text
    assert "preempting these would admit it:\n    t-1 (lease t-1.a1)" in text


def test_render_explain_running_and_preempted() -> None:
    text = cli.render_explain({
        "job_id": "t-1", "name": "t", "state": "running", "summary": "running on a100-1 GPU 2 (mig): best fit",
        "pending": None, "placement": {"node": "a100-1", "gpu_indices": [2], "kind": "mig", "reason": "best fit"},
        "preemptions": [{"by": "serve-1", "reason": "inference needs the card", "at": 0.0,
                         "checkpoint_path": "/ck/checkpoint.pt"}]})
    assert "  placed on: a100-1 GPU 2 (mig)" in text
    assert "preempted #1 at " in text and "by serve-1: inference needs the card; checkpoint /ck/checkpoint.pt" in text


def test_every_command_maps_errors_to_the_same_exit_codes() -> None:
    """One mapping (orchestrator.core.errors.exit_code) for up/down/status, the job commands, `k8s` and
    `python -m orchestrator.deploy.kuberay` (an unknown object was 1 in some, 2 in others)."""
    import typer

    from orchestrator.cli import cluster
    from orchestrator.core.errors import CapacityError, InvalidRequestError, NotConnectedError, UnknownObjectError
    from orchestrator.cli import k8s as k8s_cli

    cases = {InvalidRequestError("gpus", "x", "a number"): 2, UnknownObjectError("job", "j-1"): 2,
             NotConnectedError("no head"): 3, CapacityError("full"): 1}
    for err, code in cases.items():
        assert cluster._fail(err).exit_code == code

        def boom(err: Exception = err) -> None:
            raise err

        with pytest.raises(typer.Exit) as k8s_exit:
            k8s_cli._run(boom)
        assert k8s_exit.value.exit_code == code
        with pytest.raises(typer.Exit) as jobs_exit:
            with cli._errors("table"):
                boom()
        assert jobs_exit.value.exit_code == code


def test_submit_takes_a_gang_and_explain_says_what_each_worker_waits_on(head: InProcessHead) -> None:
    r = run("submit", "--gpu", "2x2", "--priority", "training", "--json", "--", "sleep", "600")
    assert r.exit_code == 0, r.output
    job = json.loads(r.stdout)
    assert job["gpu"].startswith("gang 2x[2x whole") and job["workers"] == 2
    _running(head, job["job_id"])
    d = head.service.get_job(job["job_id"])
    assert [w["state"] for w in d["worker_leases"]] == ["active", "active"]
    # Two workers of four cards: only a100-0 holds one; the gang waits whole, and explain says why per worker.
    r = run("submit", "--gpu", "2x4", "--json", "--", "true")
    assert r.exit_code == 0, r.output
    big = json.loads(r.stdout)["job_id"]
    head.wait_for(lambda: head.service.explain_job(big)["pending"] is not None, 10, f"{big} considered")
    r = run("explain", big)
    assert r.exit_code == 0, r.output
    assert "gang of 2 workers, granted all or none:" in r.stdout
    assert f"worker 0 ({big}.a1-w0): pending" in r.stdout and f"worker 1 ({big}.a1-w1): pending" in r.stdout
    ex = json.loads(run("explain", big, "--json").stdout)
    assert all(w["state"] == "pending" and "gang" in w["reason"] for w in ex["workers"]), ex["workers"]


# ---- one grammar (#39): -o, --ray-namespace, jobs --state/--watch, logs --attempt, --working-dir ----------------
def test_o_json_is_json_and_o_yaml_the_same_value(head: InProcessHead) -> None:
    import yaml

    head.submit_job({"name": "e", "entrypoint": "echo out"}, "e-1")
    head.wait_for(lambda: head.service.get_job("e-1")["state"] == "succeeded", 10, "e-1 done")
    for cmd in (["jobs"], ["explain", "e-1"], ["logs", "e-1"]):  # (nodes' heartbeat ages differ from read to read)
        as_json, dash_o, as_yaml = run(*cmd, "--json"), run(*cmd, "-o", "json"), run(*cmd, "--output", "yaml")
        assert as_json.exit_code == dash_o.exit_code == as_yaml.exit_code == 0, (cmd, as_yaml.output)
        assert json.loads(dash_o.stdout) == json.loads(as_json.stdout), cmd
        assert yaml.safe_load(as_yaml.stdout) == json.loads(as_json.stdout), cmd
    assert run("jobs", "-o", "table").stdout == run("jobs").stdout  # the default, named


@pytest.mark.parametrize("args, shown", [(["-o", "xml"], "'xml'"), (["-o", "yaml", "--json"], "'yaml'")])
def test_a_bad_output_format_exits_2_naming_it_before_connecting(no_head: None, args: list[str], shown: str) -> None:
    for cmd, tail in ((["jobs"], []), (["logs", "j-1"], []), (["submit"], ["--", "true"])):
        r = run(*cmd, *args, *tail)
        assert r.exit_code == 2, (cmd, r.output)
        assert f"invalid output={shown}" in r.stderr and "allowed:" in r.stderr and "json" in r.stderr, cmd


def test_ray_namespace_reaches_the_client_and_namespace_is_a_deprecated_alias(monkeypatch: pytest.MonkeyPatch,
                                                                              tmp_path: Path) -> None:
    h = InProcessHead(workdir=tmp_path / "head")
    seen: list[Any] = []
    monkeypatch.setattr(cli, "make_client", lambda address, namespace, state_dir: seen.append(namespace) or Client(head=h))
    try:
        r = run("jobs", "--ray-namespace", "team-a")
        assert r.exit_code == 0 and seen[-1] == "team-a" and "deprecated" not in r.stderr, r.output
        r = run("queue", "--namespace", "team-b", "--json")
        assert r.exit_code == 0 and seen[-1] == "team-b" and json.loads(r.stdout) == []
        assert "--namespace is deprecated here: use --ray-namespace" in r.stderr
        calls = len(seen)
        r = run("nodes", "--ray-namespace", "a", "--namespace", "b")
        assert r.exit_code == 2 and "invalid ray_namespace='a'" in r.stderr and len(seen) == calls
        assert "--namespace" not in run("jobs", "--help").stdout.replace("--ray-namespace", "")  # hidden
    finally:
        h.close()


def test_jobs_state_filters_and_a_bad_state_exits_2_listing_the_states(head: InProcessHead,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    head.submit_job({"name": "e", "entrypoint": "true"}, "e-1")
    head.wait_for(lambda: head.service.get_job("e-1")["state"] == "succeeded", 10, "e-1 done")
    _blocked(head, "a-1")
    jobs = lambda *a: {j["job_id"] for j in json.loads(run("jobs", "--json", *a).stdout)}  # noqa: E731
    assert jobs("--state", "queued") == {"a-1"}
    assert jobs("--state", "running", "--state", "succeeded") == {"blocker-1", "e-1"}
    assert jobs() == {"e-1", "blocker-1", "a-1"}
    monkeypatch.setattr(cli, "make_client", lambda *a: pytest.fail("bad input must be refused before connecting"))
    r = run("jobs", "--state", "done", "--json")
    assert r.exit_code == 2, r.output
    err = json.loads(r.stdout)
    assert err["field"] == "state" and err["value"] == "'done'"
    assert err["allowed"] == "queued, admitted, running, preempting, succeeded, failed, cancelled"


def _snapshots(*states: dict[str, str]) -> Any:
    """A fetch that returns one job list per call, each job given as id -> state, then the last one forever."""
    calls = iter(states)
    last: list[dict[str, Any]] = []

    def fetch() -> list[dict[str, Any]]:
        nonlocal last
        step = next(calls, None)
        if step is not None:
            last = [{"job_id": j, "state": st, "attempt": 1, "message": f"{j} is {st}"} for j, st in step.items()]
        return last
    return fetch


def _stop_after(reads: int) -> Any:
    n = 0

    def sleep(s: float) -> None:
        nonlocal n
        assert s == cli.WATCH_POLL_S
        n += 1
        if n == reads:
            raise KeyboardInterrupt
    return sleep


def test_watch_prints_each_change_once_and_a_job_leaving_the_filter_once_more() -> None:
    fetch = _snapshots({"a": "queued", "b": "running", "c": "succeeded"},
                       {"a": "queued", "b": "running", "c": "succeeded"},    # nothing changed: nothing printed
                       {"a": "running", "b": "running", "c": "succeeded"},   # a starts
                       {"a": "running", "b": "succeeded", "c": "succeeded"},  # b leaves `running`: shown once more
                       {"a": "running", "b": "succeeded", "c": "succeeded", "d": "running"},
                       {"a": "running", "b": "succeeded", "c": "succeeded", "d": "running"})
    out: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        cli.watch_jobs(fetch, frozenset({"running", "queued"}), "json", out.append, sleep=_stop_after(6))
    assert [(d["job_id"], d["state"]) for d in map(json.loads, out)] == [
        ("a", "queued"), ("b", "running"), ("a", "running"), ("b", "succeeded"), ("d", "running")]


def test_watch_in_a_table_then_a_line_per_change(head: InProcessHead, monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    head.submit_job({"name": "e", "entrypoint": "true"}, "e-1")
    head.wait_for(lambda: head.service.get_job("e-1")["state"] == "succeeded", 10, "e-1 done")
    reads = 0

    def between_reads(s: float) -> None:  # the cluster changes between the watch's reads; then SIGTERM ends it
        nonlocal reads
        reads += 1
        if reads == 1:
            _blocked(head, "w-1")
        elif reads == 2:
            head.cancel_job("w-1")
        else:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler interrupts this
            pytest.fail("SIGTERM did not end the watch")

    def missed(signum: int, frame: Any) -> None:  # not the default handler: a miss must not kill the test run
        raise AssertionError("the SIGTERM reached the test: the watch did not take it")

    saved = signal.signal(signal.SIGTERM, missed)
    try:
        monkeypatch.setattr(cli, "_sleep_between_reads", between_reads)
        r = run("jobs", "--watch")
        assert r.exit_code == 0, r.output
        out = r.stdout
        assert "jobs (1)" in out and "e-1" in out  # the table first
        changes = [ln for ln in out.splitlines() if ln[:2].isdigit() and ln[2] == ":"]
        assert [ln.split()[1:3] for ln in changes] == [["blocker-1", "running"], ["w-1", "queued"],
                                                       ["w-1", "cancelled"]]
        assert signal.getsignal(signal.SIGTERM) is missed  # the command put the handler back
        r = run("jobs", "--watch", "-o", "json", "--state", "cancelled")
        assert r.exit_code == 0 and [json.loads(ln)["job_id"] for ln in r.stdout.splitlines()] == ["w-1"], r.output
    finally:
        signal.signal(signal.SIGTERM, saved)


def test_logs_attempt(head: InProcessHead) -> None:
    head.submit_job({"name": "e", "entrypoint": "echo first"}, "e-1")
    head.wait_for(lambda: head.service.get_job("e-1")["state"] == "succeeded", 10, "e-1 done")
    r = run("logs", "e-1", "--attempt", "1", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout) == {"job_id": "e-1", "state": "succeeded", "attempt": 1,
                                                         "logs": "first\n"}, r.output
    r = run("logs", "e-1", "--attempt", "2")  # the head knows the job has had one attempt
    assert r.exit_code == 2 and "invalid attempt=2" in r.stderr and "1 to 1" in r.stderr, r.output


def test_logs_attempt_below_1_exits_2_before_connecting(no_head: None) -> None:
    r = run("logs", "e-1", "--attempt", "0", "--json")
    assert r.exit_code == 2, r.output
    assert json.loads(r.stdout)["field"] == "attempt" and "1 (the first attempt) or more" in r.stderr


def test_the_sdk_uploads_a_local_working_dir_and_passes_a_uri_through(tmp_path: Path) -> None:
    from orchestrator.core.errors import InvalidRequestError

    h = InProcessHead(workdir=tmp_path / "head")
    uploads = Uploads()
    try:
        client = Client(head=h, upload=uploads)
        sent = lambda: h.calls[-1][1][0]["runtime_env"]["working_dir"]  # noqa: E731 - the spec the head got
        client.submit({"name": "w", "entrypoint": "true", "runtime_env": {"working_dir": str(tmp_path)}})
        assert sent() == "gcs://_ray_pkg_0123456789abcdef.zip"
        for uri in ("gcs://_ray_pkg_abc.zip", "s3://bucket/wd.zip", "https://example.com/wd.zip"):
            client.submit({"name": "u", "entrypoint": "true", "runtime_env": {"working_dir": uri}})
            assert sent() == uri
        assert [u["working_dir"] for u in uploads.given] == [str(tmp_path)]
        with pytest.raises(InvalidRequestError) as e:
            client.submit({"name": "n", "entrypoint": "true", "runtime_env": {"working_dir": str(tmp_path / "nope")}})
        assert e.value.field == "working_dir" and "no such directory here" in str(e.value)
        with pytest.raises(InvalidRequestError) as e:  # a head but no cluster to upload to: not silently a path
            Client(head=h).submit({"name": "n", "entrypoint": "true", "runtime_env": {"working_dir": str(tmp_path)}})
        assert e.value.field == "working_dir" and "a URI" in e.value.allowed
    finally:
        h.close()
