"""The head's copy of the latest Kubernetes inventory cross-check. Pure.

The comparison itself runs on the Kubernetes side
(:func:`orchestrator.deploy.k8s.inventory.compare_nodes`, which reads Node
objects and may import the ``kubernetes`` package) and pushes its result here
through ``report_inventory_check``; this module only validates it at the
head's edge and answers the questions ``status``, ``orchestrator nodes`` and
the metric ask.

Invariant: a stored check is well-formed (every disagreement names a node,
a field and a severity of ``error`` or ``warning``); a malformed report is a
typed error naming the field, and the previous check stays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from orchestrator.core.errors import InvalidRequestError

SEVERITIES = ("error", "warning")


@dataclass(frozen=True, slots=True)
class Disagreement:
    node: str
    field: str
    severity: str
    kubernetes: str = ""
    agents: str = ""


@dataclass(frozen=True, slots=True)
class InventoryCheck:
    at: float
    nodes: tuple[str, ...]
    disagreements: tuple[Disagreement, ...]

    @classmethod
    def parse(cls, report: Mapping[str, Any], *, at: float) -> "InventoryCheck":
        rows = report.get("disagreements")
        if not isinstance(rows, list):
            raise InvalidRequestError("report.disagreements", rows, "a list of {node, field, severity}")
        out = []
        for i, d in enumerate(rows):
            if not isinstance(d, Mapping) or not all(isinstance(d.get(k), str) and d.get(k) for k in ("node", "field")):
                raise InvalidRequestError(f"report.disagreements.{i}", d, "a mapping with node and field names")
            if d.get("severity") not in SEVERITIES:
                raise InvalidRequestError(f"report.disagreements.{i}.severity", d.get("severity"), SEVERITIES)
            out.append(Disagreement(d["node"], d["field"], d["severity"], str(d.get("kubernetes", "")),
                                    str(d.get("agents", ""))))
        nodes = report.get("nodes", [])
        return cls(at, tuple(str(n) for n in nodes) if isinstance(nodes, list) else (), tuple(out))

    @property
    def errors(self) -> int:
        return sum(1 for d in self.disagreements if d.severity == "error")

    def counts(self) -> dict[tuple[str, str, str], int]:
        """How many disagreements per (node, field, severity): the gauge's values."""
        out: dict[tuple[str, str, str], int] = {}
        for d in self.disagreements:
            key = (d.node, d.field, d.severity)
            out[key] = out.get(key, 0) + 1
        return out

    def node_line(self, node: str) -> str:
        """One line for ``orchestrator nodes``: the node's disagreements, errors first; '' when it agrees."""
        found = sorted((d for d in self.disagreements if d.node == node), key=lambda d: (d.severity != "error", d.field))
        return "; ".join(f"{d.severity}: {d.field}: labels {d.kubernetes}, agents {d.agents}" for d in found)

    def summary(self) -> dict[str, Any]:
        return {"at": self.at, "nodes": len(self.nodes), "errors": self.errors,
                "warnings": len(self.disagreements) - self.errors}
