"""Durations as the YAML files write them: ``"500ms"``, ``"90s"``, ``"15m"``,
``"24h"``, ``"7d"``, or a number of seconds."""

from __future__ import annotations

import math
import re

_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(raw: object) -> float:
    """Seconds, finite and not negative. Raises ValueError saying what is wrong."""
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        seconds = float(raw)
    elif isinstance(raw, str) and (m := _DURATION.match(raw)):
        seconds = float(m.group(1)) * _UNIT_S[m.group(2) or "s"]
    else:
        raise ValueError(f"{raw!r} is not a duration like '90s', '15m' or '24h'")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{raw!r} is not a non-negative duration")
    return seconds
