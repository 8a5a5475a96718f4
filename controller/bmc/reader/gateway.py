"""The ``BmcGateway`` that sends the periodic reads to the BMC readers.

``poll_power`` (the power sync), ``leak_detectors`` (the leak watcher) and
``thermal_c`` (the BMC thermal poll) go to the reader of each node
(``readers.py``); everything else, power changes and the rest, goes to the
controller's own gateway, ``inner``. A node whose reader is not up is read
by ``inner``, as without readers; so is the rest of a power pass whose
reader ended in the middle of it. A power pass begun at once (with readers,
power sync's default) is then held to the controller's own rate,
``DEFAULT_POWER_SYNC_RATE`` reads a second, so that it does not take the
controller's loop from its agents while its reader is away.
"""

from __future__ import annotations

import asyncio
import logging

from controller.bmc.reader.readers import BmcReaders
from controller.core.errors import Unavailable
from controller.core.gateway_layer import GatewayLayer
from controller.core.model import BmcTarget, LeakReading
from controller.core.ports import BmcGateway
from controller.core.power_sync import DEFAULT_POWER_SYNC_RATE

log = logging.getLogger(__name__)


class ReaderGateway(GatewayLayer):
    """Implements ``controller.core.ports.BmcGateway``: reads by ``readers``,
    the rest by ``inner``."""

    def __init__(self, inner: BmcGateway, readers: BmcReaders) -> None:
        super().__init__(inner)
        self._readers = readers

    @property
    def readers(self) -> BmcReaders:
        return self._readers

    # -- the reads the readers do --------------------------------------------------

    async def poll_power(
        self, targets: list[BmcTarget], concurrency: int, *, spread: float = 0.0
    ) -> dict[str, tuple[str | None, str]]:
        shards: dict[int, list[BmcTarget]] = {}
        for target in targets:
            shards.setdefault(self._readers.slot(target.node), []).append(target)
        share = max(1, concurrency // max(1, len(shards)))
        polled: dict[str, tuple[str | None, str]] = {}
        for part in await asyncio.gather(
            *(self._poll_shard(shard, share, spread) for shard in shards.values())
        ):
            polled.update(part)
        return polled

    async def _poll_shard(
        self, targets: list[BmcTarget], concurrency: int, spread: float
    ) -> dict[str, tuple[str | None, str]]:
        link = self._readers.link_for(targets[0].node)
        if link is not None:
            try:
                return await self._readers.poll_power(link, targets, concurrency, spread)
            except Unavailable as e:
                log.warning("power sync: %s; its %d BMCs are read here", e, len(targets))
        here = max(spread, len(targets) / DEFAULT_POWER_SYNC_RATE)
        return await self._inner.poll_power(targets, concurrency, spread=here)

    async def leak_detectors(self, target: BmcTarget) -> list[LeakReading]:
        link = self._readers.link_for(target.node)
        if link is None:
            return await self._inner.leak_detectors(target)
        return await self._readers.leak_detectors(link, target)

    async def thermal_c(self, target: BmcTarget) -> list[float]:
        link = self._readers.link_for(target.node)
        if link is None:
            return await self._inner.thermal_c(target)
        return await self._readers.thermal_c(link, target)

    def forget(self, node: str) -> None:
        self._inner.forget(node)
        self._readers.forget(node)

    async def close(self) -> None:
        await self._readers.stop()
        await self._inner.close()
