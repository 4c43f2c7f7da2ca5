"""The up/down/status commands' contract without a cluster: exit codes and one JSON object."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from orchestrator.cli.cluster import app, render_status
from orchestrator.core.config import ClusterConfig
from orchestrator.control.controller import HeadController

from .conftest import SimAgent

runner = CliRunner()


def test_bad_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("nodes:\n  - {name: x, model: A100-80GB, gpus: 2, mig: {0: [{profile: 9g.1gb, start: 0}]}}\n")
    r = runner.invoke(app, ["up", "--config", str(bad), "--state-dir", str(tmp_path / "s")])
    assert r.exit_code == 2, r.output
    assert "nodes[x].mig" in r.output and "9g.1gb" in r.output
    assert not (tmp_path / "s").exists()


def test_status_without_an_orchestrator_exits_3_with_one_json_object(tmp_path: Path) -> None:
    r = runner.invoke(app, ["status", "--json", "--address", "127.0.0.1:1", "--state-dir", str(tmp_path)])
    assert r.exit_code == 3
    first_line = r.stdout.strip().splitlines()[0]
    assert json.loads(first_line)["error"] == "ClusterNotFoundError"  # a NotConnectedError that says which way it failed


def test_down_with_nothing_up_is_a_no_op(tmp_path: Path) -> None:
    r = runner.invoke(app, ["down", "--state-dir", str(tmp_path / "none")])
    assert r.exit_code == 0


def test_render_status(ctl: HeadController, agents: dict[str, SimAgent], demo: ClusterConfig) -> None:
    ctl.request_lease({"lease_id": "m", "request": "mig:1g.20gb"})
    ctl.request_lease({"lease_id": "big", "request": "16"})  # the controller queues what the head's edge refuses
    ctl.request_lease({"lease_id": "four", "request": "4"})
    ctl.request_lease({"lease_id": "wait", "request": "4"})
    ctl.reconcile()
    text = render_status(ctl.status())
    assert "node a100-1: registered" in text and "mig 1g.20gb@6" in text and "lease: m" in text
    assert "wait: 4x whole" in text and "no node fits" in text  # none free now
    assert "big: 16x whole" in text and "no node in the cluster has 16 whole cards; the largest has 4" in text


def test_version_prints_ours_and_rays() -> None:
    from importlib.metadata import version

    from orchestrator.cli import main

    r = runner.invoke(main.app, ["--version"])
    assert r.exit_code == 0, r.output
    assert r.output.strip() == f"orchestrator {version('ray-gpu-orchestrator')} (ray {version('ray')})"


def test_no_help_text_shows_a_doubled_percent_sign() -> None:
    # Click does not %-format help: "10%%" was shown as is (issue #39).
    import typer.main

    from orchestrator.cli import main

    def walk(cmd, path):  # every command and group, with each option's help
        yield path, cmd.help or ""
        for p in cmd.params:
            yield f"{path} {p.name}", getattr(p, "help", None) or ""
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, f"{path} {name}")

    texts = list(walk(typer.main.get_command(main.app), "orchestrator"))
    assert len(texts) > 100
    assert [where for where, text in texts if "%%" in text] == []


#: Commands without ``--json``, and why. A new command without it fails the test below; so does one of these
#: gaining it (take it off the list).
NO_JSON = {"orchestrator dashboard": "serves the live page until stopped",
           "orchestrator sim schemes": "prints JSON and nothing else"}


def test_every_command_prints_one_json_object_with_json_but_those_listed() -> None:
    commands = _leaves()
    assert {"orchestrator up", "orchestrator down", "orchestrator status", "orchestrator env"} <= set(commands)
    without = {path for path, cmd in commands.items()
               if not any("--json" in getattr(p, "opts", []) for p in cmd.params)}
    assert without == set(NO_JSON), sorted(without ^ set(NO_JSON))


def _leaves() -> dict[str, object]:
    import typer.main

    from orchestrator.cli import main

    def leaves(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                yield from leaves(sub, f"{path} {name}")
        else:
            yield path, cmd

    return dict(leaves(typer.main.get_command(main.app), "orchestrator"))


#: Commands where ``-o`` is not yet the output format, and why (a one-way list: empty, and it stays so).
O_NOT_OUTPUT_YET: dict[str, str] = {}
#: Commands with ``--json`` but no ``-o/--output`` yet, and why (the same one-way list).
NO_OUTPUT_YET: dict[str, str] = {}


def test_o_is_the_output_format_on_every_command() -> None:
    """One grammar (#39): wherever ``-o`` exists it is ``--output``, the output format, and every command with
    ``--json`` takes ``-o json|yaml|table`` too. kubectl's grammar; never an overlay, an out folder, anything else."""
    from orchestrator.cli.options import OUTPUT_FORMATS

    commands = _leaves()
    o_other, no_output = set(), set()
    for path, cmd in commands.items():
        by_opt = {o: p for p in cmd.params for o in getattr(p, "opts", [])}
        if "-o" in by_opt and "--output" not in by_opt["-o"].opts:
            o_other.add(path)
        if "--json" in by_opt and not ("--output" in by_opt and "-o" in by_opt["--output"].opts):
            no_output.add(path)
    assert o_other <= set(O_NOT_OUTPUT_YET), sorted(o_other - set(O_NOT_OUTPUT_YET))
    assert no_output <= set(NO_OUTPUT_YET), sorted(no_output - set(NO_OUTPUT_YET))
    assert OUTPUT_FORMATS == ("table", "json", "yaml")
    with_output = [p for p, c in commands.items() if any("--output" in getattr(q, "opts", []) for q in c.params)]
    assert len(with_output) >= 15, with_output  # up, down, env, status, submit, jobs, logs, ..., demo, bench, sim


def test_ray_namespace_is_rays_and_namespace_only_kubernetes() -> None:
    """``--ray-namespace`` on every command that finds the head; ``--namespace`` shown only on ``orchestrator k8s``
    (Kubernetes'), elsewhere a hidden deprecated alias."""
    commands = _leaves()
    shown_ns, finds_head_without = set(), set()
    for path, cmd in commands.items():
        by_opt = {o: p for p in cmd.params for o in getattr(p, "opts", [])}
        if "--namespace" in by_opt and not by_opt["--namespace"].hidden and not path.startswith("orchestrator k8s"):
            shown_ns.add(path)
        if "--address" in by_opt and "--ray-namespace" not in by_opt and path != "orchestrator up":
            finds_head_without.add(path)  # (up starts the head, in the namespace its cluster file names)
    assert shown_ns == set() and finds_head_without == set(), (shown_ns, finds_head_without)
    finders = [p for p, c in commands.items() if any("--ray-namespace" in getattr(q, "opts", []) for q in c.params)]
    assert {"orchestrator status", "orchestrator jobs", "orchestrator dashboard", "orchestrator submit"} <= set(finders)


def test_status_takes_o_yaml_and_refuses_another_format(tmp_path: Path) -> None:
    import yaml

    r = runner.invoke(app, ["status", "-o", "yaml", "--address", "127.0.0.1:1", "--state-dir", str(tmp_path)])
    assert r.exit_code == 3
    assert yaml.safe_load(r.stdout)["error"] == "ClusterNotFoundError"  # the error, as YAML
    r = runner.invoke(app, ["status", "-o", "wide", "--address", "127.0.0.1:1", "--state-dir", str(tmp_path)])
    assert r.exit_code == 2 and "invalid output='wide'" in r.stderr and "table, json, yaml" in r.stderr
