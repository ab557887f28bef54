"""A duration as people read it: "under 0.1 s", "2.3 s", "4 min 10 s", "1 h 5 min", "2 d 3 h".

The one helper every face uses to print a length of time (the leaderboard's per-model run times, heartbeat
ages and the stale limit, a DyePack run's time), so none prints "0.0 s" or "250.0 s". Each unit is
rounded before the next is chosen, so no reading shows "60.0 s" or "60 min": 59.96 s is "1 min".
"""

from __future__ import annotations

import math

MISSING = "–"  # what the pages print for a number they do not have


def duration(seconds: float | None) -> str:
    """``seconds`` in the largest sensible units: tenths under a minute, then two units at most.

    None, NaN or infinity give ``MISSING``; a negative value (two clocks that disagree) counts as zero.
    """
    if seconds is None or not math.isfinite(seconds):
        return MISSING
    seconds = max(0.0, float(seconds))
    if seconds < 0.1:
        return "under 0.1 s"
    tenths = round(seconds * 10)
    if tenths < 600:
        return f"{tenths / 10:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return _two(whole, 60, "min", "s")
    minutes = round(seconds / 60)
    if minutes < 24 * 60:
        return _two(minutes, 60, "h", "min")
    return _two(round(seconds / 3600), 24, "d", "h")


def _two(count: int, per: int, big: str, small: str) -> str:
    """``count`` small units as "N big M small", the small part left out when it is zero."""
    high, low = divmod(count, per)
    return f"{high} {big} {low} {small}" if low else f"{high} {big}"
