"""A gang: ``workers`` identical workers granted all together or not at all (``--gpu 2x4``), and one member of it.

Split from :mod:`.request` (one module a vocabulary): a gang's worker is a :class:`~.request.GpuRequest` a single
lease could ask for. Invariants: ``workers`` is 1..:data:`MAX_GANG_WORKERS`; a worker request has no fallback and
is pinned to no node; the text form ``<workers>x<request>`` takes ASCII digits only.

An **elastic** gang (``min_workers`` set, text ``<min>-<max>x<request>``: ``1-4x1``) runs with any number of
workers from ``min_workers`` to ``workers`` (its max): each attempt is placed all or nothing at the largest size
that fits then, and it is resized -- grown into idle cards, shrunk for work that wants its cards -- only through a
checkpoint and a new attempt (docs/preemption.md, "Elastic gangs"). ``min_workers`` None is a fixed gang.
Invariant: 1 <= ``min_workers`` <= ``workers``.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.request import GpuRequest, ShareKind
from orchestrator.core.validation import typed_error

#: The most workers one gang asks for.
MAX_GANG_WORKERS = 256

_GANG_RE = re.compile(r"^\s*(?:([0-9]+)\s*-\s*)?([0-9]+)\s*[xX×]\s*(.+)$")


class GangRequest(BaseModel):
    """``workers`` identical workers, each needing ``worker``: granted all together or not at all.

    A gang is what distributed training asks for (Ray Train's ``num_workers`` x resources per worker):
    ``2x4`` is two workers of four whole cards each. Each worker is one lease of the ledger (its own
    devices, hand-out and agent) and the gang is placed, preempted and requeued as one.

    Topology preferences, in the order the placement honours them:

    * ``same_node``: every worker on one node (a requirement: no node, no gang);
    * ``worker.nvlink``: each worker's cards in one NVLink island (per worker, as for a single request);
    * ``fewest_nodes`` (default): the nodes that hold the most workers first, so the gang spans as few
      nodes as it can; off, each worker goes where the policy scores best (spread as the policy likes).

    Invariants: ``workers`` >= 1; the worker request is one a single lease could ask for, pinned to no
    node (a gang chooses its nodes).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    workers: Annotated[int, Field(ge=1, le=MAX_GANG_WORKERS, description="Number of workers (Ray Train num_workers); "
                                  "an elastic gang's most")]
    worker: GpuRequest = Field(description="What each worker needs: whole cards, or a share for small workers")
    same_node: bool = Field(default=False, description="Every worker on one node (required)")
    fewest_nodes: bool = Field(default=True, description="Prefer the placement that spans the fewest nodes")
    min_workers: Annotated[int | None, Field(ge=1, le=MAX_GANG_WORKERS, description="Elastic: the fewest workers it "
                                             "runs with (each attempt takes the most from here to workers that fit); "
                                             "None: exactly workers")] = None

    def __init__(self, **data: object) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise typed_error(e, "gang", GangRequest) from None

    @model_validator(mode="after")
    def _min_within(self) -> "GangRequest":
        if self.min_workers is not None and self.min_workers > self.workers:
            raise InvalidRequestError("gang.min_workers", self.min_workers, f"1 to workers ({self.workers})",
                                      detail="an elastic gang's least is at most its most")
        return self

    @property
    def elastic(self) -> bool:
        """It runs with ``min_workers``..``workers`` workers (a fixed gang: exactly ``workers``)."""
        return self.min_workers is not None and self.min_workers < self.workers

    @property
    def least(self) -> int:
        """The fewest workers it runs with (``workers`` for a fixed gang)."""
        return self.min_workers if self.min_workers is not None else self.workers

    def sized(self, n: int) -> "GangRequest":
        """This gang fixed at ``n`` workers (one attempt of an elastic gang)."""
        return self.model_copy(update={"workers": n, "min_workers": None})

    @model_validator(mode="after")
    def _worker_unpinned(self) -> "GangRequest":
        if self.worker.node is not None:
            raise InvalidRequestError("gang.worker.node", self.worker.node, "unset",
                                      detail="a gang chooses its nodes; pin none of its workers")
        if self.worker.fallback:
            raise InvalidRequestError("gang.worker.fallback", self.worker.describe(), "unset",
                                      detail="a gang's workers are placed alike, all or none: give one request")
        if self.worker.kind is ShareKind.WHOLE and self.worker.count < 1:
            raise InvalidRequestError("gang.worker.count", self.worker.count, "at least 1 card per worker")
        return self

    @classmethod
    def parse(cls, text: str) -> "GangRequest":
        """``NxSPEC``: ``N`` workers, each asking for ``SPEC`` in the ``--gpu`` forms of :meth:`GpuRequest.parse`
        (``2x4``: two workers of four whole cards; ``4xmps:30%``: four MPS workers); ``MIN-MAXxSPEC``: an elastic
        gang of ``MIN`` to ``MAX`` workers (``1-4x1``)."""
        forms = "NxSPEC or MIN-MAXxSPEC such as 2x4 (2 workers of 4 whole cards), 4xmps:30% or 1-4x1 (elastic)"
        if not isinstance(text, str):
            raise InvalidRequestError("gpu", text, forms, detail="not a string")
        m = _GANG_RE.match(text)
        if not m:
            raise InvalidRequestError("gpu", text, forms)
        n = int(m.group(2))
        if not 1 <= n <= MAX_GANG_WORKERS:
            raise InvalidRequestError("gpu.workers", n, f"1 to {MAX_GANG_WORKERS} workers")
        least = int(m.group(1)) if m.group(1) is not None else None
        if least is not None and not 1 <= least <= n:
            raise InvalidRequestError("gpu.min_workers", least, f"1 to the most workers ({n})",
                                      detail="MIN-MAXxSPEC: the least workers first")
        return cls(workers=n, worker=GpuRequest.parse(m.group(3)), min_workers=least)

    @property
    def gpu_demand(self) -> float:
        """GPUs the whole gang asks for, fractions counted."""
        return self.workers * self.worker.gpu_demand

    def describe(self) -> str:
        prefs = [p for p, on in (("same node", self.same_node), ("fewest nodes", self.fewest_nodes and not self.same_node)) if on]
        size = f"{self.min_workers}-{self.workers}" if self.min_workers is not None else f"{self.workers}"
        return f"gang {size}x[{self.worker.describe()}]" + (f" ({', '.join(prefs)})" if prefs else "")


def is_gang_text(text: object) -> bool:
    """True when a ``--gpu`` string asks for a gang (``NxSPEC`` or ``MIN-MAXxSPEC``)."""
    return isinstance(text, str) and _GANG_RE.match(text) is not None


class GangMember(BaseModel):
    """A lease's place in its gang: the gang's id, this worker's index, and the gang's shape and preferences
    (every member carries them, so the scheduler can tell from the pending leases alone whether the whole
    gang is there). ``min_size``: an elastic gang's least (None: fixed; stored forms without it read as fixed);
    ``size`` is then its most, and every attempt queues ``size`` members of which the placement grants the first
    ``k`` and withdraws the rest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gang_id: str = Field(description="Shared by every worker of the gang, across attempts")
    index: Annotated[int, Field(ge=0, lt=MAX_GANG_WORKERS, description="This worker's index (bundle index)")]
    size: Annotated[int, Field(ge=1, le=MAX_GANG_WORKERS, description="Workers in the gang (an elastic gang's most)")]
    same_node: bool = False
    fewest_nodes: bool = True
    min_size: Annotated[int | None, Field(ge=1, le=MAX_GANG_WORKERS,
                                          description="An elastic gang's fewest workers; None: fixed")] = None

    def __init__(self, **data: object) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise typed_error(e, "gang", GangMember) from None

    @model_validator(mode="after")
    def _index_in_gang(self) -> "GangMember":
        if self.index >= self.size:
            raise InvalidRequestError("gang.index", self.index, f"0..{self.size - 1}", detail="beyond the gang's size")
        if self.min_size is not None and self.min_size > self.size:
            raise InvalidRequestError("gang.min_workers", self.min_size, f"1 to size ({self.size})")
        return self

    @property
    def elastic(self) -> tuple[int, int] | None:
        """``(min, max)`` workers of an elastic gang; None for a fixed one."""
        return (self.min_size, self.size) if self.min_size is not None and self.min_size < self.size else None

    @classmethod
    def of(cls, gang: GangRequest, gang_id: str, index: int) -> "GangMember":
        return cls(gang_id=gang_id, index=index, size=gang.workers, same_node=gang.same_node,
                   fewest_nodes=gang.fewest_nodes, min_size=gang.min_workers if gang.elastic else None)

    def gang(self, worker: GpuRequest) -> GangRequest:
        return GangRequest(workers=self.size, worker=worker, same_node=self.same_node, fewest_nodes=self.fewest_nodes,
                           min_workers=self.min_size)
