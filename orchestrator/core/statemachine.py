"""A small explicit state machine: one transition table, a history of (time, state, reason).

Used by leases and jobs. The table is the single source of truth for which
edges exist; each edge carries the comment that says when it is taken.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Generic, Mapping, TypeVar

from orchestrator.core.errors import IllegalTransitionError

S = TypeVar("S", bound=Enum)


@dataclass(frozen=True, slots=True)
class Transition(Generic[S]):
    """One entry of a history: entered ``state`` at ``at`` (seconds, the caller's clock) because ``reason``."""

    at: float
    state: S
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {"at": self.at, "state": self.state.value, "reason": self.reason}


class TransitionTable(Generic[S]):
    """``table[src]`` maps each allowed destination to the comment describing the edge."""

    def __init__(self, name: str, table: Mapping[S, Mapping[S, str]], terminal: frozenset[S]) -> None:
        self.name = name
        self.table = table
        self.terminal = terminal
        for src, dsts in table.items():
            if src in terminal and dsts:
                raise ValueError(f"{name}: terminal state {src} has outgoing edges")

    def check(self, src: S, dst: S) -> str:
        """Return the edge's comment, or raise :class:`IllegalTransitionError`."""
        try:
            return self.table[src][dst]
        except KeyError:
            raise IllegalTransitionError(self.name, src.value, dst.value) from None

    def allowed(self, src: S) -> tuple[S, ...]:
        return tuple(self.table.get(src, {}))
