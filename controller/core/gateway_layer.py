"""A ``BmcGateway`` that passes every call to another one.

The base of the layers wrapped around the BMC gateway: the power block's
guard (``core/power_block.py``) and the BMC readers' router
(``bmc/reader/gateway.py``). A layer overrides what it changes; everything
else reaches ``inner`` as it was asked.
"""

from __future__ import annotations

from controller.core.model import BmcTarget, LeakReading
from controller.core.ports import BmcGateway


class GatewayLayer:
    """Implements ``controller.core.ports.BmcGateway`` by calling ``inner``."""

    def __init__(self, inner: BmcGateway) -> None:
        self._inner = inner

    def canonical_url(self, url: str) -> str:
        return self._inner.canonical_url(url)

    def validate_target(self, url: str, username: str, password: str) -> str:
        return self._inner.validate_target(url, username, password)

    async def power_state(self, target: BmcTarget) -> str:
        return await self._inner.power_state(target)

    async def set_power(self, target: BmcTarget, action: str) -> str:
        return await self._inner.set_power(target, action)

    def health(self, node: str) -> str:
        return self._inner.health(node)

    async def thermal_c(self, target: BmcTarget) -> list[float]:
        return await self._inner.thermal_c(target)

    async def leak_detectors(self, target: BmcTarget) -> list[LeakReading]:
        return await self._inner.leak_detectors(target)

    async def firmware_versions(self, target: BmcTarget) -> dict[str, str]:
        return await self._inner.firmware_versions(target)

    async def firmware_update(self, target: BmcTarget, image_url: str, component: str) -> None:
        await self._inner.firmware_update(target, image_url, component)

    async def bios_attributes(self, target: BmcTarget) -> dict[str, object]:
        return await self._inner.bios_attributes(target)

    async def bios_set(self, target: BmcTarget, attributes: dict[str, object]) -> None:
        await self._inner.bios_set(target, attributes)

    async def poll_power(
        self, targets: list[BmcTarget], concurrency: int, *, spread: float = 0.0
    ) -> dict[str, tuple[str | None, str]]:
        return await self._inner.poll_power(targets, concurrency, spread=spread)

    def boot_media(self, url: str) -> str:
        return self._inner.boot_media(url)

    async def insert_media(self, target: BmcTarget, image_url: str) -> None:
        await self._inner.insert_media(target, image_url)

    async def media_state(self, target: BmcTarget) -> tuple[bool, str]:
        return await self._inner.media_state(target)

    async def eject_media(self, target: BmcTarget) -> None:
        await self._inner.eject_media(target)

    async def boot_once(self, target: BmcTarget, device: str) -> None:
        await self._inner.boot_once(target, device)

    async def boot_override(self, target: BmcTarget) -> tuple[str, bool]:
        return await self._inner.boot_override(target)

    def forget(self, node: str) -> None:
        self._inner.forget(node)

    async def close(self) -> None:
        await self._inner.close()
