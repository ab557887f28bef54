"""``assay.durations.duration``: every length of time a page prints, at each unit's boundaries."""

from __future__ import annotations

import math

import pytest

from assay.durations import duration


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0, "under 0.1 s"),
        (0.0999, "under 0.1 s"),
        (0.1, "0.1 s"),
        (0.25, "0.2 s"),  # tenths, rounded half to even
        (2.34, "2.3 s"),
        (59.94, "59.9 s"),
        (59.96, "1 min"),  # never "60.0 s"
        (60, "1 min"),
        (61, "1 min 1 s"),
        (250, "4 min 10 s"),
        (3599.4, "59 min 59 s"),
        (3599.6, "1 h"),  # never "60 min"
        (3600, "1 h"),
        (3629, "1 h"),
        (3631, "1 h 1 min"),
        (3900, "1 h 5 min"),
        (86_369, "23 h 59 min"),
        (86_371, "1 d"),  # never "24 h"
        (2 * 86_400 + 3 * 3600, "2 d 3 h"),
    ],
)
def test_duration_at_each_boundary(seconds: float, words: str) -> None:
    assert duration(seconds) == words


def test_duration_of_nothing_or_nonsense() -> None:
    assert duration(None) == "–" and duration(math.nan) == "–" and duration(math.inf) == "–"
    assert duration(-3.0) == "under 0.1 s"  # two clocks that disagree: counted as no time
