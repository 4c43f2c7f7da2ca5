"""Reader of Alibaba's openb GPU-sharing trace (``cluster-trace-gpu-v2023``).

Two CSV kinds, as published with the ATC'23 FGD paper:

* a **node list** -- ``sn,cpu_milli,memory_mib,gpu,model``; ``model`` is empty
  on CPU-only nodes;
* a **pod list** -- ``name,cpu_milli,memory_mib,num_gpu,gpu_milli`` and, in all
  but the ``multigpu*`` lists, ``gpu_spec,qos,pod_phase,creation_time,
  deletion_time,scheduled_time``.

Nomenclature: a pod with ``num_gpu == 1`` and ``gpu_milli < 1000`` is a
*sharing* pod (a fraction of one card); ``num_gpu >= 1`` with ``gpu_milli ==
1000`` asks for whole cards; ``num_gpu == 0`` is CPU-only. ``gpu_spec`` such as
``V100M16|V100M32`` restricts the card model.

Invariants of what :func:`load_nodes` and :func:`load_pods` return: every
value was checked, so a row that cannot be read never reaches a replay;
the tables keep the file's row order; a rejected row raises
:class:`TraceFormatError` naming the file, the line (1-based, the header is
line 1) and the column (1-based, with its header name).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from orchestrator.core.catalogue import gpu_model
from orchestrator.core.errors import InvalidRequestError

MILLI = 1000
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_REQUIRED = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_OPTIONAL = ("gpu_spec", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time")
QOS_CLASSES = ("LS", "BE", "Burstable", "Guaranteed")
MAX_GPUS_PER_POD = 64


class TraceFormatError(InvalidRequestError):
    """A trace file, or one cell of it, that cannot be read.

    ``path`` is the file, ``line`` the 1-based line (the header is line 1; 0
    when the file itself is missing), ``column`` the 1-based column number
    (0 when the problem is the whole row or file) and ``field`` the column's
    header name. Not retryable: the file must be fixed.
    """

    def __init__(self, path: str | Path, line: int, column: int, field: str, value: Any,
                 allowed: str, detail: str = "") -> None:
        self.path, self.line, self.column = str(path), line, column
        super().__init__(field, value, allowed, detail)
        where = f"{self.path}, line {line}" if line else self.path
        if column:
            where += f", column {column} ({field})"
        msg = f"{where}: invalid value {value!r}"
        if detail:
            msg += f": {detail}"
        self.args = (f"{msg} (allowed: {allowed})",)

    def __str__(self) -> str:
        return str(self.args[0])

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d.update(path=self.path, line=self.line, column=self.column)
        return d


@dataclass(frozen=True)
class NodeTable:
    """A node list as columns (row ``i`` is node ``i``); ``model`` is '' for CPU-only nodes."""

    path: str
    name: tuple[str, ...]
    cpu_milli: np.ndarray
    memory_mib: np.ndarray
    gpus: np.ndarray
    model: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.name)

    @property
    def total_gpu_milli(self) -> int:
        return int(self.gpus.sum()) * MILLI


@dataclass(frozen=True)
class PodTable:
    """A pod list as columns (row ``i`` is the pod on line ``i + 2``).

    Times are seconds from the trace's origin; -1 where the list has no such
    column or the cell is empty. ``models`` is the ``gpu_spec`` split on ``|``
    (empty: any model).
    """

    path: str
    name: tuple[str, ...]
    cpu_milli: np.ndarray
    memory_mib: np.ndarray
    num_gpu: np.ndarray
    gpu_milli: np.ndarray
    models: tuple[tuple[str, ...], ...]
    qos: tuple[str, ...]
    creation_time: np.ndarray
    deletion_time: np.ndarray
    scheduled_time: np.ndarray
    has_times: bool = field(default=False)

    def __len__(self) -> int:
        return len(self.name)

    @property
    def gpu_request_milli(self) -> np.ndarray:
        """GPU-milli each pod asks for in all (``num_gpu * gpu_milli``)."""
        return self.num_gpu * self.gpu_milli

    def take(self, index: np.ndarray) -> "PodTable":
        """The pods at ``index`` (repeats allowed), in that order."""
        idx = np.asarray(index, dtype=np.int64)
        pick = lambda t: tuple(t[i] for i in idx)  # noqa: E731
        return PodTable(self.path, pick(self.name), self.cpu_milli[idx], self.memory_mib[idx],
                        self.num_gpu[idx], self.gpu_milli[idx], pick(self.models), pick(self.qos),
                        self.creation_time[idx], self.deletion_time[idx], self.scheduled_time[idx],
                        self.has_times)


# ---- cell parsers ---------------------------------------------------------------------------------

class _Rows:
    """Iterates a CSV's data rows with their line numbers; checks the header."""

    def __init__(self, path: str | Path, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
        self.path = str(path)
        p = Path(path)
        if not p.is_file():
            raise TraceFormatError(path, 0, 0, "path", str(path), "an existing CSV file", "no such file")
        self._fh = p.open(newline="", encoding="utf-8")
        self._reader = csv.reader(self._fh)
        try:
            header = next(self._reader)
        except StopIteration:
            self._fh.close()
            raise TraceFormatError(path, 1, 0, "header", "", ",".join(required), "the file is empty") from None
        except (UnicodeDecodeError, csv.Error) as e:
            self._fh.close()
            raise _unreadable(path, 1, e) from None
        header = [h.strip() for h in header]
        self.header = header
        for name in required:
            if name not in header:
                self._fh.close()
                raise TraceFormatError(path, 1, 0, name, ",".join(header), ",".join(required + optional),
                                       f"the header has no column {name!r}")
        self.index = {h: i for i, h in enumerate(header)}
        self.present = tuple(n for n in optional if n in self.index)

    def __iter__(self) -> Iterator[tuple[int, list[str]]]:
        with self._fh:
            rows = iter(self._reader)
            while True:
                try:
                    row = next(rows)
                except StopIteration:
                    return
                except (UnicodeDecodeError, csv.Error) as e:
                    raise _unreadable(self.path, self._reader.line_num + 1, e) from None
                line = self._reader.line_num
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue  # blank line
                if len(row) != len(self.header):
                    raise TraceFormatError(self.path, line, 0, "row", ",".join(row),
                                           f"{len(self.header)} comma-separated cells",
                                           f"the row has {len(row)} cells")
                yield line, row

    def cell(self, line: int, row: list[str], name: str, parse: Callable[[str], Any], allowed: str) -> Any:
        col = self.index[name]
        raw = row[col].strip()
        try:
            return parse(raw)
        except (ValueError, InvalidRequestError) as e:
            detail = e.detail if isinstance(e, InvalidRequestError) else str(e)
            raise TraceFormatError(self.path, line, col + 1, name, raw, allowed, detail) from None


def _unreadable(path: str | Path, line: int, e: Exception) -> TraceFormatError:
    """A file that is not UTF-8 CSV at all (binary bytes, a NUL): the line where reading stopped."""
    why = "not UTF-8 text" if isinstance(e, UnicodeDecodeError) else f"not CSV: {e}"
    return TraceFormatError(path, line, 0, "row", "", "UTF-8 comma-separated text", why)


#: The largest whole number a cell may hold: every table column is int64.
_CELL_MAX = (1 << 62)


def _int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            v = int(raw)
        except ValueError:
            raise ValueError("not a whole number") from None
        if v < lo or v > (_CELL_MAX if hi is None else hi):
            raise ValueError("out of range")
        return v
    return parse


def _time(raw: str) -> int:
    if raw == "":
        return -1
    return _int_in(0)(raw)


def _models(raw: str) -> tuple[str, ...]:
    names = tuple(m.strip() for m in raw.split("|") if m.strip())
    return tuple(gpu_model(m).name for m in names)  # raises InvalidRequestError for an unknown model


def _name(raw: str) -> str:
    if not raw:
        raise ValueError("empty")
    return raw


# ---- loaders --------------------------------------------------------------------------------------

def load_nodes(path: str | Path) -> NodeTable:
    """Read a node list. Raises :class:`TraceFormatError` on the first bad cell."""
    rows = _Rows(path, NODE_COLUMNS)
    names: list[str] = []
    cpu: list[int] = []
    mem: list[int] = []
    gpus: list[int] = []
    models: list[str] = []
    seen: dict[str, int] = {}
    for line, row in rows:
        name = rows.cell(line, row, "sn", _name, "a node name")
        if name in seen:
            raise TraceFormatError(rows.path, line, rows.index["sn"] + 1, "sn", name, "a unique node name",
                                   f"already on line {seen[name]}")
        seen[name] = line
        names.append(name)
        cpu.append(rows.cell(line, row, "cpu_milli", _int_in(0), "a whole number of milli-CPUs >= 0"))
        mem.append(rows.cell(line, row, "memory_mib", _int_in(0), "a whole number of MiB >= 0"))
        g = rows.cell(line, row, "gpu", _int_in(0, MAX_GPUS_PER_POD), f"a whole number of GPUs 0..{MAX_GPUS_PER_POD}")
        gpus.append(g)
        if g:
            model = rows.cell(line, row, "model", lambda r: gpu_model(r).name if r else _name(r),
                              "a GPU model of the catalogue")
        else:
            model = ""
        models.append(model)
    if not names:
        raise TraceFormatError(rows.path, 1, 0, "rows", "", "at least one node", "the list has no nodes")
    return NodeTable(rows.path, tuple(names), np.asarray(cpu, np.int64), np.asarray(mem, np.int64),
                     np.asarray(gpus, np.int64), tuple(models))


def load_pods(path: str | Path) -> PodTable:
    """Read a pod list. Raises :class:`TraceFormatError` on the first bad cell.

    Beyond each cell's own range it rejects combinations no scheduler can
    serve: a share (``gpu_milli < 1000``) of more than one card, GPU-milli
    without GPUs, and GPUs without GPU-milli.
    """
    rows = _Rows(path, POD_REQUIRED, POD_OPTIONAL)
    col: dict[str, list[Any]] = {k: [] for k in POD_REQUIRED + POD_OPTIONAL}
    has = set(rows.present)
    for line, row in rows:
        col["name"].append(rows.cell(line, row, "name", _name, "a pod name"))
        col["cpu_milli"].append(rows.cell(line, row, "cpu_milli", _int_in(0), "a whole number of milli-CPUs >= 0"))
        col["memory_mib"].append(rows.cell(line, row, "memory_mib", _int_in(0), "a whole number of MiB >= 0"))
        ng = rows.cell(line, row, "num_gpu", _int_in(0, MAX_GPUS_PER_POD), f"a whole number of GPUs 0..{MAX_GPUS_PER_POD}")
        gm = rows.cell(line, row, "gpu_milli", _int_in(0, MILLI), "a whole number of milli-GPUs 0..1000")
        gm_col = rows.index["gpu_milli"] + 1
        if ng == 0 and gm != 0:
            raise TraceFormatError(rows.path, line, gm_col, "gpu_milli", str(gm), "0 when num_gpu is 0",
                                   "GPU-milli asked without a GPU")
        if ng >= 1 and gm == 0:
            raise TraceFormatError(rows.path, line, gm_col, "gpu_milli", str(gm), "1..1000 when num_gpu >= 1",
                                   "GPUs asked with no GPU-milli")
        if ng > 1 and gm != MILLI:
            raise TraceFormatError(rows.path, line, gm_col, "gpu_milli", str(gm), "1000 when num_gpu > 1",
                                   "a share of more than one card")
        col["num_gpu"].append(ng)
        col["gpu_milli"].append(gm)
        col["gpu_spec"].append(rows.cell(line, row, "gpu_spec", _models, "GPU models of the catalogue joined by |")
                               if "gpu_spec" in has else ())
        col["qos"].append(rows.cell(line, row, "qos", lambda r: r if r in QOS_CLASSES else _bad_qos(r),
                                    ", ".join(QOS_CLASSES)) if "qos" in has else "")
        col["pod_phase"].append(row[rows.index["pod_phase"]].strip() if "pod_phase" in has else "")
        for t in ("creation_time", "deletion_time", "scheduled_time"):
            col[t].append(rows.cell(line, row, t, _time, "a whole number of seconds >= 0, or empty")
                          if t in has else -1)
        if "creation_time" in has and "deletion_time" in has:
            c, d = col["creation_time"][-1], col["deletion_time"][-1]
            if c >= 0 and d >= 0 and d < c:
                raise TraceFormatError(rows.path, line, rows.index["deletion_time"] + 1, "deletion_time", str(d),
                                       f"a time >= creation_time ({c})", "deleted before it was created")
    if not col["name"]:
        raise TraceFormatError(rows.path, 1, 0, "rows", "", "at least one pod", "the list has no pods")
    arr = lambda k: np.asarray(col[k], np.int64)  # noqa: E731
    return PodTable(rows.path, tuple(col["name"]), arr("cpu_milli"), arr("memory_mib"), arr("num_gpu"),
                    arr("gpu_milli"), tuple(col["gpu_spec"]), tuple(col["qos"]), arr("creation_time"),
                    arr("deletion_time"), arr("scheduled_time"),
                    has_times="creation_time" in has and "deletion_time" in has)


def _bad_qos(raw: str) -> str:
    raise ValueError("unknown QoS class")
