"""Power-state sync: poll the whole fleet, report drift and BMC health.

Ironic's conductor does this every 120 s with 8 threads; Kiln polls with
bounded async concurrency so 10,000 BMCs fit in one interval.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from controller.bmc.fleet import BulkResult, run_bulk
from controller.bmc.handle import Bmc
from controller.bmc.types import BmcHealth, PowerState

LOG = logging.getLogger(__name__)

FleetEntry = tuple[str, Bmc, PowerState | None]


@dataclass(frozen=True)
class SyncReport:
    polled: int
    drifted: list[str]
    failed: dict[str, str]
    states: dict[str, PowerState]
    wall_seconds: float


class PowerSync:
    """Polls power state of every BMC each ``interval`` seconds.

    ``fleet()`` returns the current ``(node, bmc, expected_power)`` list
    (expected None = no expectation). ``on_drift(node, expected, actual)`` is
    called when a node is not in the state Kiln expects (e.g. powered off
    behind Kiln's back); ``on_health(node, health)`` whenever a BMC's health
    changes (and for each node on the first pass).
    """

    def __init__(
        self,
        fleet: Callable[[], Sequence[FleetEntry]],
        *,
        on_drift: Callable[[str, PowerState, PowerState], None] | None = None,
        on_health: Callable[[str, BmcHealth], None] | None = None,
        interval: float = 60.0,
        concurrency: int = 256,
    ) -> None:
        self._fleet = fleet
        self._on_drift = on_drift
        self._on_health = on_health
        self.interval = interval
        self.concurrency = concurrency
        self._last_health: dict[str, str] = {}
        self._stop = asyncio.Event()

    async def run_once(self) -> SyncReport:
        """One pass over the fleet; never raises for a node's failure."""
        entries = list(self._fleet())
        expected = {node: exp for node, _, exp in entries}
        bmcs = {node: bmc for node, bmc, _ in entries}

        async def read(bmc: Bmc) -> PowerState:
            return await bmc.power.state()

        result: BulkResult[PowerState] = await run_bulk(
            [(node, bmc) for node, bmc, _ in entries], read, concurrency=self.concurrency
        )
        drifted: list[str] = []
        states: dict[str, PowerState] = {}
        for node, outcome in result.outcomes.items():
            if outcome.ok and outcome.value is not None:
                states[node] = outcome.value
                want = expected.get(node)
                if want is not None and outcome.value is not want:
                    drifted.append(node)
                    LOG.warning(
                        "node %s: power drift, expected %s, BMC says %s",
                        node,
                        want.value,
                        outcome.value.value,
                    )
                    if self._on_drift is not None:
                        self._on_drift(node, want, outcome.value)
            health = bmcs[node].health
            if self._last_health.get(node) != health.state:
                self._last_health[node] = health.state
                if self._on_health is not None:
                    self._on_health(node, health)
        return SyncReport(
            polled=len(entries),
            drifted=drifted,
            failed=result.failed,
            states=states,
            wall_seconds=result.wall_seconds,
        )

    async def run(self) -> None:
        """Loop until ``stop()``; each pass starts ``interval`` after the last began."""
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            began = loop.time()
            report = await self.run_once()
            LOG.info(
                "power sync: %d polled, %d drifted, %d failed in %.1fs",
                report.polled,
                len(report.drifted),
                len(report.failed),
                report.wall_seconds,
            )
            delay = max(0.0, self.interval - (loop.time() - began))
            try:
                await asyncio.wait_for(self._stop.wait(), delay)
            except TimeoutError:
                pass

    def stop(self) -> None:
        self._stop.set()
