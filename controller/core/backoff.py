"""How long something that failed waits before it is tried again: doubling,
capped and jittered (the lifecycle's steps, the leak watcher's reads)."""

from __future__ import annotations

import random
from dataclasses import dataclass


def doubling(first_s: float, cap_s: float, n: int) -> float:
    """``first_s * 2**(n-1)``, at most ``cap_s``: the wait after the n-th
    failure in a row. Any n (a BMC dead for days counts thousands) stays a
    float: the exponent is clamped before ``2**`` overflows one."""
    return min(cap_s, first_s * 2 ** min(max(0, n - 1), 64))


@dataclass(frozen=True)
class StepBackoff:
    """How long a node waits after a step that failed or made no progress:
    the n-th in a row waits ``first_delay_s * 2**(n-1)`` seconds, at most
    ``max_delay_s``, times a random factor in [1 - jitter, 1] so that a rack
    of nodes that failed together does not retry together."""

    first_delay_s: float = 1.0
    max_delay_s: float = 60.0
    jitter: float = 0.5

    def delay(self, failures: int, rng: random.Random) -> float:
        base = doubling(self.first_delay_s, self.max_delay_s, failures)
        return base * (1.0 - self.jitter * rng.random())

    def longest(self, rng: random.Random) -> float:
        """The capped delay, jittered: for a wait that something else ends."""
        return self.max_delay_s * (1.0 - self.jitter * rng.random())
