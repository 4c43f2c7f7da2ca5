"""The openb loader: what it reads, and the typed errors that name file, line and column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.core.errors import InvalidRequestError
from orchestrator.sim.openb import TraceFormatError, load_nodes, load_pods

POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
GOOD_POD = "p0,1000,1024,1,500,,LS,Running,0,10,0"


def write(tmp_path: Path, text: str, name: str = "pods.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_tiny_trace_reads_back(tiny: tuple[Path, Path]) -> None:
    nodes, pods = load_nodes(tiny[0]), load_pods(tiny[1])
    assert nodes.name == ("tiny-a", "tiny-b", "tiny-c")
    assert nodes.model == ("T4", "T4", "P100") and nodes.total_gpu_milli == 5000
    assert len(pods) == 7 and pods.has_times
    assert pods.gpu_request_milli.tolist() == [2000, 0, 2000, 600, 500, 400, 1000]
    assert pods.models[3] == ("P100",) and pods.models[0] == ()
    assert pods.qos[2] == "LS"
    assert pods.scheduled_time[6] == -1  # empty cell
    sub = pods.take(np.array([3, 3, 0]))
    assert sub.name == ("tiny-pod-3", "tiny-pod-3", "tiny-pod-0")


def test_five_column_lists_have_no_times(tmp_path: Path) -> None:
    pods = load_pods(write(tmp_path, "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,8,1000\n"))
    assert not pods.has_times and pods.creation_time.tolist() == [-1] and pods.models == ((),)


@pytest.mark.parametrize(
    "row, line, column, field",
    [
        ("p1,abc,1024,1,500,,LS,Running,0,10,0", 3, 2, "cpu_milli"),
        ("p1,1000,-5,1,500,,LS,Running,0,10,0", 3, 3, "memory_mib"),
        ("p1,1000,1024,1,1500,,LS,Running,0,10,0", 3, 5, "gpu_milli"),
        ("p1,1000,1024,2,500,,LS,Running,0,10,0", 3, 5, "gpu_milli"),       # a share of two cards
        ("p1,1000,1024,0,300,,LS,Running,0,10,0", 3, 5, "gpu_milli"),       # milli without a GPU
        ("p1,1000,1024,1,500,H100X,LS,Running,0,10,0", 3, 6, "gpu_spec"),  # unknown model
        ("p1,1000,1024,1,500,,VIP,Running,0,10,0", 3, 7, "qos"),
        ("p1,1000,1024,1,500,,LS,Running,50,10,0", 3, 10, "deletion_time"),
        ("p1,1000,1024,1,500,,LS,Running,x,10,0", 3, 9, "creation_time"),
        (",1000,1024,1,500,,LS,Running,0,10,0", 3, 1, "name"),
    ],
)
def test_bad_pod_cell_names_file_line_and_column(tmp_path: Path, row: str, line: int, column: int, field: str) -> None:
    path = write(tmp_path, f"{POD_HEADER}\n{GOOD_POD}\n{row}\n")
    with pytest.raises(TraceFormatError) as ei:
        load_pods(path)
    e = ei.value
    assert (e.path, e.line, e.column, e.field) == (str(path), line, column, field)
    assert isinstance(e, InvalidRequestError) and not e.retryable
    msg = str(e)
    assert str(path) in msg and f"line {line}" in msg and f"column {column} ({field})" in msg
    assert e.to_dict()["line"] == line


def test_row_with_wrong_cell_count(tmp_path: Path) -> None:
    path = write(tmp_path, f"{POD_HEADER}\n{GOOD_POD}\n\np2,1,1\n")
    with pytest.raises(TraceFormatError) as ei:
        load_pods(path)
    assert ei.value.line == 4 and ei.value.column == 0 and "3 cells" in str(ei.value)


def test_missing_column_empty_file_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="no column 'gpu_milli'") as ei:
        load_pods(write(tmp_path, "name,cpu_milli,memory_mib,num_gpu\np,1,1,1\n"))
    assert ei.value.line == 1
    with pytest.raises(TraceFormatError, match="empty"):
        load_pods(write(tmp_path, "", "empty.csv"))
    with pytest.raises(TraceFormatError, match="no such file") as ei:
        load_pods(tmp_path / "nope.csv")
    assert ei.value.line == 0
    with pytest.raises(TraceFormatError, match="no pods"):
        load_pods(write(tmp_path, POD_HEADER + "\n", "header_only.csv"))


@pytest.mark.parametrize(
    "row, column, field",
    [("n1,32000,1024,2,Z9", 5, "model"), ("n1,32000,1024,x,T4", 4, "gpu"), ("n0,1,1,0,", 1, "sn")],
)
def test_bad_node_cell(tmp_path: Path, row: str, column: int, field: str) -> None:
    path = write(tmp_path, f"sn,cpu_milli,memory_mib,gpu,model\nn0,32000,1024,2,T4\n{row}\n", "nodes.csv")
    with pytest.raises(TraceFormatError) as ei:
        load_nodes(path)
    assert (ei.value.line, ei.value.column, ei.value.field) == (3, column, field)


def test_cpu_only_nodes_need_no_model(tmp_path: Path) -> None:
    nodes = load_nodes(write(tmp_path, "sn,cpu_milli,memory_mib,gpu,model\nc0,32000,1024,0,\n", "nodes.csv"))
    assert nodes.model == ("",) and nodes.total_gpu_milli == 0


def test_real_lists_load(openb: Path) -> None:
    nodes = load_nodes(openb / "openb_node_list_gpu_node.csv")
    assert len(nodes) == 1213 and nodes.total_gpu_milli == 6212 * 1000
    assert len(load_nodes(openb / "openb_node_list_all_node.csv")) == 1523
    for name, n in [("default", 8152), ("gpuspec10", 8152), ("multigpu20", 8324), ("cpu050", 7439)]:
        assert len(load_pods(openb / f"openb_pod_list_{name}.csv")) == n
