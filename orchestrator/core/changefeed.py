"""A change feed: which keys changed since a point, at the cost of what changed.

The head keeps per-node state that readers recompute from (the metrics' per-GPU series). Asking every key
"did you change?" costs a pass over every node per reader per cycle (5,000 at the scale bench); a feed answers
"what changed since I last looked" with the keys that did.

Invariants (``tests/unit/test_changefeed.py``):

* ``count`` only grows, by one per :meth:`ChangeFeed.changed`;
* :meth:`ChangeFeed.version` of a key is ``count`` at its last change (0: never changed), so it changes whenever
  the key does;
* :meth:`ChangeFeed.since` ``(mark)`` is exactly the keys whose version is above ``mark``, newest change first,
  and reads only those (the keys are kept in order of last change).
"""

from __future__ import annotations

from typing import Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)


class ChangeFeed(Generic[K]):
    """Keys in the order of their last change, each with the change count at that change."""

    __slots__ = ("count", "_at")

    def __init__(self) -> None:
        self.count = 0  # changes so far: a reader keeps the count it last read as its mark
        self._at: dict[K, int] = {}  # key -> count at its last change, least recently changed first

    def changed(self, key: K) -> None:
        """``key`` changed now."""
        self.count += 1
        self._at.pop(key, None)  # to the end: the order is the order of last change
        self._at[key] = self.count

    def version(self, key: K) -> int:
        """``count`` at ``key``'s last change; 0 if it never changed."""
        return self._at.get(key, 0)

    def since(self, mark: int) -> list[K]:
        """The keys changed after ``count`` was ``mark``, newest change first."""
        out = []
        for key, at in reversed(self._at.items()):
            if at <= mark:
                break
            out.append(key)
        return out
