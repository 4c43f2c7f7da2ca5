"""The injected clock: elapsed time for delays, and the time of day for windows.

Two readings, kept apart because they move differently when a day is compressed:

* :meth:`Clock.monotonic` -- seconds that never go back. Autoscaling delays,
  hysteresis timers and everything measured against real requests read it. In
  a compressed day it stays *real* seconds: requests still take real
  milliseconds, so an ``upscale_delay_s`` of 3 means three real seconds.
* :meth:`Clock.time_of_day_s` -- the (possibly simulated) wall-clock time of
  day, ``0 <= t < 86400``. Time windows (``08:00-22:00`` inference guaranteed
  60%) read it, and only it.

Three clocks:

* :class:`SystemClock` -- real time and the machine's local time of day;
* :class:`CompressedClock` -- real monotonic time, and a time of day that runs
  ``speedup`` times faster from ``start_time_of_day_s`` (720: a day in 120 s);
* :class:`ManualClock` -- both readings move only when a test calls
  :meth:`ManualClock.advance` (or jumps the day with
  :meth:`ManualClock.set_time_of_day`): tests never sleep.

:class:`DayClock` is the settings form of a compressed day
(``settings.day_clock: {speedup: 720, start: "06:00"}`` in a cluster file):
the head builds its :class:`CompressedClock` from it.

Invariant: no clock's ``monotonic`` ever decreases, and every
``time_of_day_s`` is in ``[0, 86400)``.
"""

from __future__ import annotations

import time
from typing import Annotated, Callable, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchestrator.core.errors import InvalidRequestError

#: Seconds in a day.
DAY_S = 86400.0

_HHMM = "a time of day HH:MM from 00:00 to 24:00"


def parse_hhmm(text: str, field: str = "time") -> float:
    """``"08:30"`` -> 30600.0 seconds after midnight; ``"24:00"`` -> 86400.0 (the end of the day, as an end).

    Raises :class:`InvalidRequestError` naming ``field`` for anything else."""
    if not isinstance(text, str):
        raise InvalidRequestError(field, text, _HHMM, detail="not a string")
    hh, sep, mm = text.strip().partition(":")
    if not (sep and hh.isascii() and hh.isdigit() and mm.isascii() and mm.isdigit() and len(mm) == 2 and 1 <= len(hh) <= 2):
        raise InvalidRequestError(field, text, _HHMM)
    h, m = int(hh), int(mm)
    if m > 59 or h > 24 or (h == 24 and m != 0):
        raise InvalidRequestError(field, text, _HHMM)
    return float(h * 3600 + m * 60)


def format_hhmm(seconds: float) -> str:
    """Seconds after midnight as ``HH:MM`` (of the day, so 86400 shows as 00:00)."""
    s = int(seconds % DAY_S)
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}"


@runtime_checkable
class Clock(Protocol):
    """What the head and the autoscaler read time from; see the module docstring."""

    def monotonic(self) -> float:
        """Seconds, never going back (real seconds, also in a compressed day)."""
        ...

    def time_of_day_s(self) -> float:
        """The (possibly simulated) wall-clock time of day, ``0 <= t < 86400``."""
        ...


class SystemClock:
    """Real time: ``time.monotonic`` and the local time of day of this machine."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time_of_day_s(self) -> float:
        t = time.time()
        lt = time.localtime(t)
        return (lt.tm_hour * 3600 + lt.tm_min * 60 + lt.tm_sec + (t % 1.0)) % DAY_S

    def __repr__(self) -> str:
        return "SystemClock()"


class CompressedClock:
    """A day that runs ``speedup`` times faster than real time (720: 24 h in 120 s).

    ``monotonic`` is ``base()`` itself (real seconds); ``time_of_day_s`` is
    ``start_time_of_day_s + speedup x (base() - base() at construction)``, modulo a day.
    """

    def __init__(self, speedup: float = 720.0, start_time_of_day_s: float = 0.0,
                 base: Callable[[], float] = time.monotonic) -> None:
        if not (speedup > 0):
            raise InvalidRequestError("speedup", speedup, "a number above 0")
        if not (0 <= start_time_of_day_s < DAY_S):
            raise InvalidRequestError("start_time_of_day_s", start_time_of_day_s, "seconds in [0, 86400)")
        self.speedup = float(speedup)
        self.start_time_of_day_s = float(start_time_of_day_s)
        self._base = base
        self._t0 = base()

    def monotonic(self) -> float:
        return self._base()

    def time_of_day_s(self) -> float:
        return (self.start_time_of_day_s + self.speedup * (self._base() - self._t0)) % DAY_S

    def __repr__(self) -> str:
        return f"CompressedClock(speedup={self.speedup:g}, start={format_hhmm(self.start_time_of_day_s)})"


class ManualClock:
    """A clock that moves only when told: ``advance(seconds)`` moves both readings by ``seconds``
    (the day wrapping at midnight); ``set_time_of_day`` jumps the day alone."""

    def __init__(self, t: float = 0.0, time_of_day_s: float = 0.0) -> None:
        if not (0 <= time_of_day_s < DAY_S):
            raise InvalidRequestError("time_of_day_s", time_of_day_s, "seconds in [0, 86400)")
        self.t = float(t)
        self._tod = float(time_of_day_s)

    def monotonic(self) -> float:
        return self.t

    def time_of_day_s(self) -> float:
        return self._tod

    def advance(self, seconds: float) -> float:
        """Move on by ``seconds`` (>= 0: a monotonic clock never goes back); returns the new ``monotonic``."""
        if not (seconds >= 0):
            raise InvalidRequestError("seconds", seconds, "seconds >= 0", detail="a monotonic clock never goes back")
        self.t += seconds
        self._tod = (self._tod + seconds) % DAY_S
        return self.t

    def set_time_of_day(self, time_of_day_s: float) -> None:
        """Jump the day clock alone (``monotonic`` is unchanged)."""
        if not (0 <= time_of_day_s < DAY_S):
            raise InvalidRequestError("time_of_day_s", time_of_day_s, "seconds in [0, 86400)")
        self._tod = float(time_of_day_s)

    def __repr__(self) -> str:
        return f"ManualClock(t={self.t:g}, time_of_day={format_hhmm(self._tod)})"


class DayClock(BaseModel):
    """A compressed day, as settings: the head reads the time of day from a :class:`CompressedClock`
    built from this instead of the machine's local time (``settings.day_clock`` in a cluster file)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    speedup: Annotated[float, Field(gt=0, le=1_000_000, description="Simulated seconds per real second "
                                    "(720: a day in 120 s)")] = 720.0
    start: str = Field(default="00:00", description="Time of day the head starts at, HH:MM")

    @field_validator("start")
    @classmethod
    def _hhmm(cls, v: str) -> str:
        if parse_hhmm(v, "start") >= DAY_S:
            raise InvalidRequestError("start", v, "a time of day from 00:00 to 23:59")
        return v

    def build(self, base: Callable[[], float] = time.monotonic) -> CompressedClock:
        return CompressedClock(self.speedup, parse_hhmm(self.start, "start"), base)
