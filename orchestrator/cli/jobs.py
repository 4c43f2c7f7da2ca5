"""``orchestrator submit | jobs | logs | cancel | explain | nodes | leases | queue``.

Thin: each command builds what it needs, calls :class:`orchestrator.sdk.jobs.Client`
and renders the answer (the tables, ``explain``'s text and ``jobs --watch``:
:mod:`orchestrator.cli.job_views`). Conventions, as ``up``/``down``/``status``:

* the head is found as ``status`` finds it: ``--address``, else the state
  file ``up`` wrote (``--state-dir``), else ``auto``; ``--ray-namespace`` overrides
  (``--namespace`` is its deprecated alias here: on ``orchestrator k8s`` it is Kubernetes');
* finding the cluster is bounded: ``--connect-timeout`` (default
  ``$ORCHESTRATOR_CONNECT_TIMEOUT_S``, else 10 s); no cluster, a refused
  token and a cluster without our head each get their own one-line error, exit 3;
* ``-o json`` (``--json``) on every command prints exactly one JSON object or list on
  stdout, ``-o yaml`` the same as YAML; tables, progress and errors otherwise, progress and
  errors on stderr. ``jobs --watch`` is the exception: it prints one object per line, each time
  a job changes, until Ctrl-C, SIGTERM or SIGHUP (exit 0);
* ``submit --working-dir DIR`` zips DIR here and uploads it to the cluster's GCS, as ``ray job
  submit`` does (:meth:`orchestrator.sdk.jobs.Client.submit`): the job carries the ``gcs://`` URI;
* ``submit`` validates everything it can (``--gpu``, ``--env``, the command,
  the name) before it connects: bad input exits 2 even with no cluster;
* exit codes: 0 ok; 1 the operation failed, a wait timed out, or the job
  failed or was cancelled; 2 bad input (the message names the field and what
  is allowed; an unknown job id lists known ones); 3 orchestrator not reachable.
"""

from __future__ import annotations

import re
import shlex
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Optional

import typer

from orchestrator.cli.job_views import (
    WATCH_POLL_S, _console, _real_stdout, _sleep_between_reads, _stop_signals_interrupt, jobs_table, leases_table,
    nodes_table, queue_table, queues_table, render_explain, watch_jobs, watch_line,
)
from orchestrator.cli.options import (
    ConnectTimeout, OldNamespace, Output, RayNamespace, connect_timeout, emit, output_format, ray_namespace,
)
from orchestrator.core.errors import EXIT_FAILED, InvalidRequestError, OrchestratorError, UnknownObjectError, exit_code
from orchestrator.core.jsonout import stdout_to_stderr

__all__ = ["Address", "AsJson", "EXIT_CODES", "JobId", "StateDir", "WATCH_POLL_S", "app", "build_spec", "cancel",
    "default_name", "explain", "job_states", "jobs_cmd", "jobs_table", "leases", "leases_table", "local_working_dir",
    "logs", "make_client", "nodes", "nodes_table", "parse_env", "queue_cmd", "queue_table", "render_explain",
    "submit", "watch_jobs", "watch_line"]


EXIT_CODES = ("Exit codes: 0 ok; 1 operation failed or timed out, or the job failed; 2 bad input (names the "
              "field and what is allowed); 3 orchestrator not reachable.")

app = typer.Typer(help="Jobs, leases, nodes and the queue.\n\n" + EXIT_CODES, no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)

Address = Annotated[Optional[str], typer.Option("--address", help="Ray address (default: the one `up` recorded, else auto)")]
StateDir = Annotated[Optional[Path], typer.Option("--state-dir", help="Where `up` wrote its state; default $ORCHESTRATOR_STATE_DIR or $TMPDIR/rgo-<uid>")]
AsJson = Annotated[bool, typer.Option("--json", help="Print exactly one JSON value on stdout (as -o json)")]
JobId = Annotated[str, typer.Argument(help="Job id (as `submit` printed it; `orchestrator jobs` lists them)")]


# ---- plumbing ------------------------------------------------------------------------------------
def make_client(address: Optional[str], namespace: Optional[str], state_dir: Optional[Path]) -> Any:
    """The SDK client the commands use (tests replace this with one around a fake head)."""
    from orchestrator.sdk.jobs import Client

    return Client(address, namespace=namespace, state_dir=state_dir)


@contextmanager
def _errors(fmt: str) -> Iterator[None]:
    """Our typed errors become a message on stderr (and, with ``-o json|yaml``, the error as that on stdout) and
    an exit code."""
    try:
        yield
    except OrchestratorError as e:
        if fmt != "table":
            emit(e.to_dict(), fmt)
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(exit_code(e)) from None


def _grammar(output: Optional[str], as_json: bool, namespace: Optional[str],
             old_namespace: Optional[str]) -> tuple[str, Optional[str]]:
    """The output format (``-o``, ``--json``) and the Ray namespace (``--ray-namespace``, or its deprecated alias
    ``--namespace``) of a command, checked before anything connects: bad input exits 2."""
    with _errors("json" if as_json or output == "json" else "table"):
        return output_format(output, as_json), ray_namespace(namespace, old_namespace)


@contextmanager
def _client(address: Optional[str], namespace: Optional[str], state_dir: Optional[Path], fmt: str,
            connect_timeout_s: Optional[float] = None) -> Iterator[Any]:
    """A client of the head for one command. With ``-o json|yaml`` stdout is the document's alone: while
    connected, what Ray's driver prints there (a raylet that died, a worker killed) goes to stderr, so a command
    prints its document after the block (:mod:`orchestrator.core.jsonout`); an error's is printed after it too."""
    with _errors(fmt), stdout_to_stderr(fmt != "table"):
        with connect_timeout(connect_timeout_s):
            client = make_client(address, namespace, state_dir)
        try:
            yield client
        finally:
            client.close()


def _progress(msg: str) -> None:
    typer.echo(f"[orchestrator] {msg}", err=True)


def _show(fetch: Callable[[Any], Any], table: Callable[[Any], Any], address: Optional[str], namespace: Optional[str],
          state_dir: Optional[Path], fmt: str, connect_timeout_s: Optional[float] = None) -> None:
    """A read command: fetch with a client, print one JSON (or YAML) value or a table."""
    with _client(address, namespace, state_dir, fmt, connect_timeout_s) as client:
        data = fetch(client)
    if fmt != "table":
        emit(data, fmt)
    else:
        _console().print(table(data))


def _job(client: Any, job_id: str) -> Any:
    """A handle on ``job_id``; an unknown id is bad input whose message lists the known ones."""
    try:
        return client.job(job_id)
    except UnknownObjectError:
        known = [j["job_id"] for j in client.jobs()]
        shown = known[-10:] if known else ["(no jobs yet)"]
        raise InvalidRequestError("job", job_id, (["..."] if len(known) > 10 else []) + shown,
                                  detail="no such job") from None


# ---- submit --------------------------------------------------------------------------------------
def parse_env(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in pairs:
        k, eq, v = p.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise InvalidRequestError("env", p, "KEY=VALUE with KEY a shell variable name")
        out[k] = v
    return out


def default_name(command: list[str]) -> str:
    """A job name from its command: the first ``*.py``/``*.sh`` file's stem, else the program's name."""
    words = [w for w in command if not w.startswith("-")]
    script = next((w for w in words if w.endswith((".py", ".sh"))), words[0] if words else "job")
    name = re.sub(r"[^a-z0-9_.-]+", "-", Path(script).stem.lower()).strip("-_.")[:63].strip("-_.")
    return name or "job"


def local_working_dir(value: str) -> str:
    """``--working-dir`` as the spec carries it until :meth:`Client.submit` uploads it: a URI as given, a local
    folder (or ``.zip``) as an absolute path. Raises ``InvalidRequestError`` naming ``working_dir``."""
    from orchestrator.sdk.jobs import WORKING_DIR_ALLOWED

    if "://" in value:
        return value
    wd = Path(value).expanduser().resolve()
    if not (wd.is_dir() or (wd.is_file() and wd.suffix == ".zip")):
        raise InvalidRequestError("working_dir", value, WORKING_DIR_ALLOWED, detail="no such directory here")
    return str(wd)


def build_spec(command: list[str], *, gpu: str, priority: Optional[str], name: Optional[str], queue: str,
               checkpoint_dir: Optional[str], env: list[str], working_dir: Optional[str]) -> Any:
    """The :class:`JobSpec` of a ``submit`` command line. Raises ``InvalidRequestError`` naming the field."""
    from orchestrator.sdk.inputs import as_spec

    runtime_env: dict[str, Any] = {}
    env_vars = parse_env(env)
    if env_vars:
        runtime_env["env_vars"] = env_vars
    if working_dir:
        # A local folder is checked here and uploaded from here by Client.submit (the head never reads it).
        runtime_env["working_dir"] = local_working_dir(working_dir)
    if checkpoint_dir and "://" not in checkpoint_dir:
        checkpoint_dir = str(Path(checkpoint_dir).expanduser().resolve())
    # As `ray job submit -- ...`: the words after `--` are joined into one shell command.
    entrypoint = shlex.join(command) if command else ""
    return as_spec({"name": name or default_name(command), "entrypoint": entrypoint, "gpu": gpu, "priority": priority,
                    "queue": queue, "runtime_env": runtime_env, "checkpoint_dir": checkpoint_dir})


@app.command(context_settings={"allow_interspersed_args": False}, epilog=EXIT_CODES)
def submit(
    command: Annotated[Optional[list[str]], typer.Argument(help="-- COMMAND [ARGS...]: the shell command to run as a Ray job", show_default=False)] = None,
    gpu: Annotated[str, typer.Option("--gpu", help="1, 2 (whole cards), mig:1g.10gb, mps:30%,20GiB, timeslice:0.25, mem=20GiB,compute=0.3,isolation=hard|soft|none, or a gang NxSPEC: 2x4 (2 workers of 4 cards, all or nothing), or an elastic gang MIN-MAXxSPEC: 1-4x1")] = "1",
    priority: Annotated[Optional[str], typer.Option("--priority", help="Priority class: inference, training, batch or one from the config (default: the config's)")] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="Job name (default: from the command)")] = None,
    queue: Annotated[str, typer.Option("--queue", help="Queue (quota group)")] = "default",
    checkpoint_dir: Annotated[Optional[str], typer.Option("--checkpoint-dir", help="Where a training job checkpoints (ORCHESTRATOR_CHECKPOINT_DIR inside it)")] = None,
    env: Annotated[Optional[list[str]], typer.Option("--env", help="KEY=VALUE in the job's environment (repeatable)")] = None,
    working_dir: Annotated[Optional[str], typer.Option("--working-dir", help="Directory (or .zip) shipped with the job: zipped here and uploaded to the cluster, as `ray job submit` does; or a URI (gcs://, s3://, https://...zip), passed as is")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the job ends, printing progress; exit 1 unless it succeeded")] = False,
    timeout: Annotated[Optional[float], typer.Option("--timeout", help="With --wait: give up after this many seconds (exit 1)")] = None,
    job_id: Annotated[Optional[str], typer.Option("--job-id", help="Choose the job id (a retry with the same id and spec returns the same job)")] = None,
    as_json: AsJson = False, output: Output = None,
    address: Address = None,
    namespace: RayNamespace = None, old_namespace: OldNamespace = None,
    state_dir: StateDir = None, connect_timeout_s: ConnectTimeout = None,
) -> None:
    """Queue a command as a job on a GPU lease: `orchestrator submit --gpu mig:1g.10gb -- python jobs/inference.py`."""
    fmt, namespace = _grammar(output, as_json, namespace, old_namespace)
    with _errors(fmt):  # everything local is checked before connecting
        spec = build_spec(command or [], gpu=gpu, priority=priority, name=name, queue=queue,
                          checkpoint_dir=checkpoint_dir, env=env or [], working_dir=working_dir)
    with _client(address, namespace, state_dir, fmt, connect_timeout_s) as client:
        handle = client.submit(spec, job_id=job_id)
        if fmt == "table":
            _progress(f"submitted {handle.job_id} ({spec.name}): {spec.describe_gpu()}, "
                      f"priority {handle.info.get('priority_class')}, queue {spec.queue}")
        final = handle.wait(timeout, on_change=_reporter(handle)) if wait else handle.info
    if fmt != "table":
        emit(final, fmt)
    else:
        typer.echo(f"{final['job_id']}: {final['state']}" if wait else handle.job_id)
    if wait and final["state"] != "succeeded":
        if fmt == "table":
            typer.echo(f"see `orchestrator logs {final['job_id']}` and `orchestrator explain {final['job_id']}`", err=True)
        raise typer.Exit(EXIT_FAILED)


def _reporter(handle: Any) -> Callable[[dict[str, Any]], None]:
    """``submit --wait``'s progress: each change of the job's state on stderr, with the time since the wait began
    and why it stands there."""
    t0 = time.monotonic()

    def changed(d: dict[str, Any]) -> None:
        _progress(f"{time.monotonic() - t0:6.1f}s {d['job_id']}: {d['state']} -- {_why(handle, d)}")
    return changed


def _why(handle: Any, d: dict[str, Any]) -> str:
    if d["state"] == "queued":
        try:
            return handle.explain().get("summary") or ""
        except OrchestratorError:
            pass
    if d.get("message"):
        return d["message"]
    hist = d.get("history") or []
    return hist[-1]["reason"] if hist else ""


# ---- read commands (their tables and the watch: job_views) -----------------------------------------
_JOB_STATES_HELP = "queued, admitted, running, preempting, succeeded, failed, cancelled"


@app.command("jobs", epilog=EXIT_CODES)
def jobs_cmd(state: Annotated[Optional[list[str]], typer.Option("--state", metavar="STATE", show_default=False, help=f"Only jobs in STATE (repeatable): {_JOB_STATES_HELP}")] = None,
             watch: Annotated[bool, typer.Option("--watch", "-w", help="Then print each change of a job until Ctrl-C, SIGTERM or SIGHUP (exit 0): a line per change; with -o json one JSON object per line, with -o yaml one document each")] = False,
             as_json: AsJson = False, output: Output = None, address: Address = None,
             namespace: RayNamespace = None, old_namespace: OldNamespace = None,
             state_dir: StateDir = None, connect_timeout_s: ConnectTimeout = None) -> None:
    """Every job the head knows, oldest first (--state: only those in these states)."""
    fmt, namespace = _grammar(output, as_json, namespace, old_namespace)
    with _errors(fmt):
        states = job_states(state or [])
    if not watch:
        _show(lambda c: [j for j in c.jobs() if not states or j["state"] in states],
              lambda d: jobs_table(d, now=time.time()), address, namespace, state_dir, fmt, connect_timeout_s)
        return
    with _real_stdout() as out, _stop_signals_interrupt():
        try:
            with _client(address, namespace, state_dir, fmt, connect_timeout_s) as client:
                watch_jobs(client.jobs, states, fmt, out, sleep=_sleep_between_reads)
        except KeyboardInterrupt:
            pass  # Ctrl-C, SIGTERM or SIGHUP: the watch's one way to end, and not a failure


def job_states(given: list[str]) -> frozenset[str]:
    """``--state`` values, checked against the job states. Raises ``InvalidRequestError`` naming ``state``."""
    from orchestrator.core.job import JobState

    allowed = [s.value for s in JobState]
    for s in given:
        if s not in allowed:
            raise InvalidRequestError("state", s, allowed)
    return frozenset(given)


@app.command(epilog=EXIT_CODES)
def logs(job_id: JobId, follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends")] = False,
         attempt: Annotated[Optional[int], typer.Option("--attempt", metavar="N", show_default=False, help="The job's Nth run (1 is the first; a preempted job runs again as its next attempt); default: the current one")] = None,
         as_json: AsJson = False, output: Output = None, address: Address = None,
         namespace: RayNamespace = None, old_namespace: OldNamespace = None, state_dir: StateDir = None,
         connect_timeout_s: ConnectTimeout = None) -> None:
    """The job's output (its Ray job's logs: the current attempt's, or --attempt N's)."""
    from orchestrator.sdk.jobs import TERMINAL_STATES

    fmt, namespace = _grammar(output, as_json, namespace, old_namespace)
    with _errors(fmt):
        if attempt is not None and attempt < 1:
            raise InvalidRequestError("attempt", attempt, "1 (the first attempt) or more")
    with _client(address, namespace, state_dir, fmt, connect_timeout_s) as client:
        handle = _job(client, job_id)
        text = handle.logs(attempt)  # the head refuses an attempt the job has not had, naming `attempt`

        def following() -> bool:  # a past attempt has ended: nothing to follow
            d = handle.status()
            return d["state"] not in TERMINAL_STATES and (attempt is None or d.get("attempt") == attempt)

        if fmt == "table":
            typer.echo(text, nl=False)
            while follow and following():
                time.sleep(1.0)
                more = handle.logs(attempt)
                typer.echo(more[len(text):] if more.startswith(text) else more, nl=False)
                text = more
            if follow:
                rest = handle.logs(attempt)
                typer.echo(rest[len(text):] if rest.startswith(text) else "", nl=False)
                _progress(f"{job_id}: {handle.state}")
    if fmt != "table":
        emit({"job_id": job_id, "state": handle.state, "attempt": attempt or handle.info.get("attempt"), "logs": text},
             fmt)


@app.command(epilog=EXIT_CODES)
def cancel(job_id: JobId, as_json: AsJson = False, output: Output = None, address: Address = None,
           namespace: RayNamespace = None, old_namespace: OldNamespace = None,
           state_dir: StateDir = None, connect_timeout_s: ConnectTimeout = None) -> None:
    """Stop a job (queued, running or checkpointing) and release its lease. Cancelling an ended job changes nothing."""
    fmt, namespace = _grammar(output, as_json, namespace, old_namespace)
    with _client(address, namespace, state_dir, fmt, connect_timeout_s) as client:
        handle = _job(client, job_id)
        was = handle.state
        d = handle.cancel()
    if fmt != "table":
        emit(d, fmt)
    else:
        typer.echo(f"{job_id}: {d['state']}" + (f" (was {was})" if was != d["state"] else " (already ended)"))


@app.command(epilog=EXIT_CODES)
def explain(job_id: JobId, as_json: AsJson = False, output: Output = None, address: Address = None,
            namespace: RayNamespace = None, old_namespace: OldNamespace = None,
            state_dir: StateDir = None, connect_timeout_s: ConnectTimeout = None) -> None:
    """Why a job waits (reasons grouped by node, queue position, what preemption would admit it), where it runs and why, who preempted it."""
    fmt, namespace = _grammar(output, as_json, namespace, old_namespace)
    with _client(address, namespace, state_dir, fmt, connect_timeout_s) as client:
        d = _job(client, job_id).explain()
    if fmt != "table":
        emit(d, fmt)
    else:
        typer.echo(render_explain(d))


@app.command(epilog=EXIT_CODES)
def nodes(as_json: AsJson = False, output: Output = None, address: Address = None,
          namespace: RayNamespace = None, old_namespace: OldNamespace = None,
          state_dir: StateDir = None, connect_timeout_s: ConnectTimeout = None) -> None:
    """Nodes and their GPUs: model, memory, health, MIG slices and the leases holding them."""
    fmt, namespace = _grammar(output, as_json, namespace, old_namespace)
    _show(lambda c: c.nodes(), nodes_table, address, namespace, state_dir, fmt, connect_timeout_s)


@app.command(epilog=EXIT_CODES)
def leases(as_json: AsJson = False, output: Output = None, address: Address = None,
           namespace: RayNamespace = None, old_namespace: OldNamespace = None,
           state_dir: StateDir = None, connect_timeout_s: ConnectTimeout = None) -> None:
    """Live leases: pending, granted, active and checkpointing."""
    fmt, namespace = _grammar(output, as_json, namespace, old_namespace)
    _show(lambda c: c.leases(), lambda d: leases_table(d, now=time.time()), address, namespace, state_dir, fmt,
          connect_timeout_s)


@app.command("queue", epilog=EXIT_CODES)
def queue_cmd(as_json: AsJson = False, output: Output = None, address: Address = None,
              tree: bool = typer.Option(False, "--tree", help="Only the queue tree with fair shares"),
              namespace: RayNamespace = None, old_namespace: OldNamespace = None,
              state_dir: StateDir = None, connect_timeout_s: ConnectTimeout = None) -> None:
    """The queue tree (each queue's guarantee, weight, limit, usage, fair share and why), then the pending
    leases in the order the scheduler considers them, each with why it waits. --tree: the tree alone (its JSON
    with --json; without --tree the JSON is the pending list, as before)."""
    fmt, namespace = _grammar(output, as_json, namespace, old_namespace)
    if tree:
        _show(lambda c: c.queues(), queues_table, address, namespace, state_dir, fmt, connect_timeout_s)
        return
    if fmt == "table":
        _show(lambda c: (c.queues(), c.queue()), lambda d: _both(queues_table(d[0]), queue_table(d[1])), address,
              namespace, state_dir, fmt, connect_timeout_s)
        return
    _show(lambda c: c.queue(), queue_table, address, namespace, state_dir, fmt, connect_timeout_s)


def _both(*tables: Any) -> Any:
    from rich.console import Group

    return Group(*tables)


if __name__ == "__main__":  # pragma: no cover
    app()
