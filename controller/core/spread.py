"""Spreading a pass of BMC calls over time instead of starting them at once.

A pass over many BMCs (the leak watcher's, the power sync's) is CPU in the
controller's one interpreter: every call is a thread's HTTP exchange and a
parse. Begun all at once, a few hundred of them keep the event loop, and
with it every agent report and API call, from running for a large part of a
second (measured: 400 leak reads at once, the loop's lag p99 116 ms, worst
669 ms; the same reads over 4 s, 5 ms and 13 ms). ``Spread`` says when the
i-th call of a pass may begin: the first ``burst`` at once (a small pass, or
a small fleet, is not slowed down), the rest evenly over ``span`` seconds
from the pass's start. A call that is already late (the BMCs answer slower
than the spread asks) begins at once: spreading never makes a pass longer
than its BMCs do.

The calls after the burst begin in clumps: every call due within one
``tick`` begins with the first of them, each clump at most ``clump``
calls (32) and the ticks at most ``max_tick`` apart (0.5 s). One read
begun alone is its own wake-ups of the event loop (its turn, its
connection, its answer), and an idle process pays for each: on this
code's 2-core machine a sleep and a wake cost about 0.1 ms of CPU, and
a power read spread alone 2.3 ms against 0.44 ms for the same read among
others (``bench/bmc_pass_spread.py``). A clump shares its wake-ups and
holds the loop no longer than the burst already does. No call begins
before its even turn, and none after the span's end.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_BURST = 32
"""Calls a pass begins at once before it spreads the rest."""

DEFAULT_CLUMP = 32
"""Calls after the burst that begin together, at most."""

DEFAULT_MAX_TICK = 0.5
"""Seconds between two clumps, at most."""


@dataclass
class Spread:
    """When each of a pass's ``size`` calls may begin (see the module)."""

    size: int
    span: float = 0.0  # s over which the calls after the burst are spread (0: none)
    burst: int = DEFAULT_BURST
    clump: int = DEFAULT_CLUMP  # calls that begin together, at most (1: each alone)
    max_tick: float = DEFAULT_MAX_TICK  # s between two clumps, at most
    clock: Callable[[], float] = time.monotonic
    began: float = field(default=-1.0)

    def __post_init__(self) -> None:
        if self.span < 0 or self.burst < 0:
            raise ValueError("a spread needs a span and a burst of 0 or more")
        if self.clump < 1 or self.max_tick < 0:
            raise ValueError("a spread needs a clump of 1 or more and a max_tick of 0 or more")
        if self.began < 0:
            self.began = self.clock()
        spread = self.size - self.burst
        # The calls due within one tick begin together: ``clump`` calls' worth
        # of the span, and no longer than ``max_tick``.
        self._tick = (
            min(self.max_tick, self.span * self.clump / spread)
            if spread > 0 and self.span > 0 and self.clump > 1
            else 0.0
        )

    def due(self, index: int) -> float:
        """When call ``index`` (from 0, in the pass's order) may begin."""
        spread = self.size - self.burst
        if index < self.burst or spread <= 0 or self.span <= 0:
            return self.began
        at = self.span * (index - self.burst + 1) / spread
        tick = self._tick
        if tick > 0:
            # At the end of its tick: with the tick's other calls, never
            # before its own turn, never past the span.
            at = min(self.span, math.ceil(at / tick - 1e-9) * tick)
        return self.began + at

    async def turn(self, index: int) -> None:
        """Wait until call ``index`` may begin (at once when it is due)."""
        wait = self.due(index) - self.clock()
        if wait > 0:
            await asyncio.sleep(wait)
