"""Durations: one parser for the config and the API (``"500ms"``, ``"1s"``, ``"2m"``, ``"1h"``).

The config reads plain numbers as seconds; the event-time API (windows,
watermarks, lateness) reads plain ints as milliseconds, as Flink's does. A
string carries its unit, so the same text means the same time everywhere:
``--set checkpoint.interval=1m`` and ``TumblingEventTimeWindows.of("1m")``.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any) -> float:
    """Seconds from ``1.5``, ``"200ms"``, ``"1s"``, ``"2m"``, a ``timedelta``.

    >>> parse_duration("200ms"), parse_duration("2m"), parse_duration(3)
    (0.2, 120.0, 3.0)
    """
    if isinstance(value, bool):
        raise ValueError("a duration, not a boolean")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    m = _DURATION_RE.match(str(value))
    if not m:
        raise ValueError("a duration like 500ms, 1s, 2m or a number of seconds")
    return float(m.group(1)) * _UNITS[m.group(2)]


def duration_millis(value: Any) -> int:
    """Milliseconds from an int (taken as ms), a ``timedelta`` or a string with a unit.

    >>> duration_millis("1m"), duration_millis("250ms"), duration_millis(5000)
    (60000, 250, 5000)
    """
    if isinstance(value, str):
        m = _DURATION_RE.match(value)
        if m is None or m.group(2) is None:
            raise ValueError("a duration with a unit, like 500ms, 1s, 2m, 1h")
        return round(float(m.group(1)) * _UNITS[m.group(2)] * 1000)
    if isinstance(value, timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError("milliseconds (int), a timedelta or a string like '1m'")
