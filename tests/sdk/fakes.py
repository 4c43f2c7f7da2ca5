"""Test doubles for the SDK tests that are not the head: a clock and a sleep that only moves it.

The head itself is never faked: SDK and CLI tests run the real one in-process (``tests/headless.py``).
"""

from __future__ import annotations


class FakeClock:
    """A clock and a sleep that only moves it."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s
