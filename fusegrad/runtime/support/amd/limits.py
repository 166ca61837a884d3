"""Checks for the AMD layer's durations and counts: the right type, finite, and inside a range that cannot hang."""

from __future__ import annotations

import math
from numbers import Integral, Real

# Longest single wait. GIM's full-access timeout tops out at 500 s (facts §10), so a longer wait can only be a hang.
MAX_WAIT_S = 600.0
# Most attempts per mailbox request; the kernel makes 5, so 100 is already generous.
MAX_ATTEMPTS = 100


def check_seconds(what: str, value: object, *, allow_zero: bool = False, maximum: float = MAX_WAIT_S) -> float:
    """`value` as float seconds, or TypeError/ValueError naming `what` and the value."""
    # bool is a number in Python, but True seconds is a caller's mistake
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{what} must be a number of seconds, got {value!r} ({type(value).__name__})")
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond float range
        seconds = math.inf
    low = "[0" if allow_zero else "(0"
    # NaN fails every comparison, so it must be caught explicitly: a NaN deadline is never reached
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero) or seconds > maximum:
        raise ValueError(f"{what} must be a finite number of seconds in {low}, {maximum:g}], got {value!r}")
    return seconds


def check_count(what: str, value: object, *, minimum: int = 1, maximum: int = MAX_ATTEMPTS) -> int:
    """`value` as an int in [minimum, maximum], or TypeError/ValueError naming `what` and the value."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{what} must be an int, got {value!r} ({type(value).__name__})")
    if not minimum <= value <= maximum:
        raise ValueError(f"{what} must be in [{minimum}, {maximum}], got {value!r}")
    return int(value)
