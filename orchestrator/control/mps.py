"""The MPS control daemons of one node: one per GPU that holds MPS leases, started and stopped by its agent.

What NVIDIA's MPS needs (CUDA MPS documentation, "Starting and stopping MPS"):

* a control daemon per GPU, ``nvidia-cuda-mps-control -d``, started with
  ``CUDA_VISIBLE_DEVICES`` = that GPU and its own ``CUDA_MPS_PIPE_DIRECTORY``
  (where clients find it) and ``CUDA_MPS_LOG_DIRECTORY``;
* clients with the same pipe directory in their environment, and their limits
  (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``),
  which the head's hand-out already sets (:mod:`.handout`);
* stopping: ``echo quit | nvidia-cuda-mps-control`` with the same pipe directory.

Layout: the pipe directory is ``mps_pipe_directory(root, gpu)`` -- the one the
head writes into every MPS hand-out -- and the log directory sits beside it
(``<root>/gpu-<index>.log``); ``root`` is ``RuntimeSettings.mps_pipe_root``,
the agent's state for MPS.

The commands go through :class:`ProcessPort`, the process boundary:
:class:`SubprocessPort` runs them; :class:`RecordingPort` records them and
keeps the daemons' states, which is what a simulated GPU has (and what unit
tests assert on). Invariant: :meth:`MpsDaemons.sync` leaves a daemon running
on exactly the GPUs that hold an MPS lease.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Protocol

from orchestrator.control.handout import mps_pipe_directory

CONTROL = "nvidia-cuda-mps-control"


class ProcessPort(Protocol):
    """What the daemons ask of the operating system."""

    def run(self, argv: list[str], env: Mapping[str, str], stdin: str = "") -> int:
        """Run a command to completion; its exit status."""
        ...

    def daemon_running(self, pipe_dir: str) -> bool:
        """Whether an MPS control daemon answers in ``pipe_dir``."""
        ...


class SubprocessPort:
    """The real boundary: ``nvidia-cuda-mps-control`` through :mod:`subprocess`."""

    def run(self, argv: list[str], env: Mapping[str, str], stdin: str = "") -> int:
        return subprocess.run(argv, env={**os.environ, **env}, input=stdin, text=True, capture_output=True,
                              timeout=30).returncode

    def daemon_running(self, pipe_dir: str) -> bool:
        return os.path.exists(os.path.join(pipe_dir, "control"))  # the daemon's socket


@dataclass
class RecordingPort:
    """A simulated node's boundary (and the tests' fake): records each command and keeps daemon states."""

    commands: list[tuple[list[str], dict[str, str], str]] = field(default_factory=list)
    running: set[str] = field(default_factory=set)
    fail_start: bool = False

    def run(self, argv: list[str], env: Mapping[str, str], stdin: str = "") -> int:
        self.commands.append((list(argv), dict(env), stdin))
        pipe = env.get("CUDA_MPS_PIPE_DIRECTORY", "")
        if argv[1:] == ["-d"]:
            if self.fail_start:
                return 1
            self.running.add(pipe)
        elif stdin.strip() == "quit":
            self.running.discard(pipe)
        return 0

    def daemon_running(self, pipe_dir: str) -> bool:
        return pipe_dir in self.running


class MpsError(RuntimeError):
    """An MPS control daemon did not start; the lease that needed it is refused."""


class MpsDaemons:
    """One control daemon per GPU with MPS leases; see the module docstring."""

    def __init__(self, root: str, port: ProcessPort | None = None) -> None:
        self.root = root
        self.port = port or SubprocessPort()
        self.gpus: dict[int, str] = {}  # GPU index -> its UUID, for the daemons this object started

    def env(self, gpu_index: int, gpu_uuid: str) -> dict[str, str]:
        pipe = mps_pipe_directory(self.root, gpu_index)
        return {"CUDA_VISIBLE_DEVICES": gpu_uuid, "CUDA_MPS_PIPE_DIRECTORY": pipe,
                "CUDA_MPS_LOG_DIRECTORY": f"{pipe}.log"}

    def ensure(self, gpu_index: int, gpu_uuid: str) -> None:
        """Start the GPU's daemon unless it runs; raises :class:`MpsError` when it does not come up."""
        env = self.env(gpu_index, gpu_uuid)
        pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
        if self.port.daemon_running(pipe):
            self.gpus[gpu_index] = gpu_uuid
            return
        for d in (pipe, env["CUDA_MPS_LOG_DIRECTORY"]):
            if isinstance(self.port, SubprocessPort):
                os.makedirs(d, exist_ok=True)
        rc = self.port.run([CONTROL, "-d"], env)
        if rc != 0 or not self.port.daemon_running(pipe):
            raise MpsError(f"MPS control daemon for GPU {gpu_index} did not start (exit {rc}; log in "
                           f"{env['CUDA_MPS_LOG_DIRECTORY']})")
        self.gpus[gpu_index] = gpu_uuid

    def stop(self, gpu_index: int) -> None:
        uuid = self.gpus.pop(gpu_index, "")
        env = self.env(gpu_index, uuid)
        if self.port.daemon_running(env["CUDA_MPS_PIPE_DIRECTORY"]):
            self.port.run([CONTROL], env, stdin="quit\n")

    def sync(self, wanted: Iterable[tuple[int, str]]) -> dict[int, str]:
        """Daemons on exactly the ``(index, uuid)`` GPUs wanted; returns GPUs whose daemon failed, with why."""
        want = dict(wanted)
        failed: dict[int, str] = {}
        for idx in [i for i in self.gpus if i not in want]:
            self.stop(idx)
        for idx, uuid in sorted(want.items()):
            try:
                self.ensure(idx, uuid)
            except (MpsError, OSError, subprocess.SubprocessError) as e:
                failed[idx] = str(e)
        return failed

    def close(self) -> None:
        for idx in list(self.gpus):
            self.stop(idx)
