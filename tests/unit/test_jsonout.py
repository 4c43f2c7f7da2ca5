"""``--json`` commands and benches (the demo, the co-location day, chaos, load): stdout carries the JSON alone."""

from __future__ import annotations

import os
import subprocess
import sys

from orchestrator.core.jsonout import stdout_to_stderr


def test_with_json_what_is_written_to_fd_1_meanwhile_goes_to_stderr(capfd) -> None:
    with stdout_to_stderr(True):
        os.write(1, b"(raylet) Task ServeController.graceful_shutdown failed\n")  # as Ray's threads do
        subprocess.run([sys.executable, "-c", "print('a child process too')"], check=True)
    print('{"gpu_utilization_pct": 90}')
    out, err = capfd.readouterr()
    assert out == '{"gpu_utilization_pct": 90}\n'
    assert "(raylet) Task" in err and "a child process too" in err


def test_without_json_stdout_is_left_alone(capfd) -> None:
    with stdout_to_stderr(False):
        os.write(1, b"table\n")
    out, err = capfd.readouterr()
    assert out == "table\n" and err == ""
