"""Scans of the whole fleet on the event loop, a slice at a time.

A periodic task that looks at every node (the leak watcher deciding which
BMCs a pass reads, power sync sorting out its readings, the health
policies looking for silent agents, the periodic checks choosing what is
due) runs on the event loop that also takes every agent's report and every
API call.
At 25,000 nodes one such look is tens of milliseconds of Python in one
piece (measured: 21 ms for the leak watcher's on an idle machine, more
beside the reports), every few seconds: each report and call that arrives
meanwhile waits for all of it. ``select`` keeps the same nodes in the same
order, and lets the loop take up what waits between slices of ``SLICE``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

SLICE = 1000
"""Items looked at before the event loop runs what waits (about a
millisecond of a cheap test each)."""


async def select(items: Sequence[T], keep: Callable[[T], bool], *, size: int = SLICE) -> list[T]:
    """The items ``keep`` keeps, in their order; other tasks and callbacks
    run between slices of ``size``. ``keep`` sees each item when its slice
    is reached, so it judges by what is true then."""
    if size < 1:
        raise ValueError(f"a scan's slice must hold at least one item, not {size}")
    kept: list[T] = []
    for start in range(0, len(items), size):
        if start:
            await asyncio.sleep(0)
        kept += filter(keep, items[start : start + size])
    return kept
