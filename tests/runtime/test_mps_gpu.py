"""The MPS control daemon for real: started and stopped by ``MpsDaemons`` on a GPU machine (skips elsewhere)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from orchestrator.control.discovery.nvml import NvmlBackend, nvml_available
from orchestrator.control.mps import CONTROL, MpsDaemons, SubprocessPort


@pytest.mark.gpu
def test_a_real_mps_daemon_starts_and_stops(tmp_path: Path) -> None:
    if not nvml_available():
        pytest.skip("NVML is absent: no NVIDIA driver or GPU on this machine")
    if shutil.which(CONTROL) is None:
        pytest.skip(f"{CONTROL} is not on PATH (the CUDA toolkit's MPS binaries are not installed)")
    gpu = NvmlBackend("this-node").inventory().gpus[0]
    daemons = MpsDaemons(str(tmp_path / "mps"), SubprocessPort())
    try:
        assert daemons.sync([(gpu.index, gpu.uuid)]) == {}
        assert daemons.port.daemon_running(daemons.env(gpu.index, gpu.uuid)["CUDA_MPS_PIPE_DIRECTORY"])
    finally:
        daemons.close()
    pipe = daemons.env(gpu.index, gpu.uuid)["CUDA_MPS_PIPE_DIRECTORY"]
    deadline = time.monotonic() + 10
    while SubprocessPort().daemon_running(pipe) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not SubprocessPort().daemon_running(pipe)
