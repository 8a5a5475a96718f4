"""How long something that failed waits before it is tried again: doubling,
capped and jittered (the lifecycle's steps, the leak watcher's reads)."""

from __future__ import annotations

import random
from dataclasses import dataclass


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
        base = min(self.max_delay_s, self.first_delay_s * 2 ** max(0, failures - 1))
        return base * (1.0 - self.jitter * rng.random())

    def longest(self, rng: random.Random) -> float:
        """The capped delay, jittered: for a wait that something else ends."""
        return self.max_delay_s * (1.0 - self.jitter * rng.random())
