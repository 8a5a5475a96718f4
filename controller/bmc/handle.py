"""The async capability objects of one BMC handle.

Each capability wraps the blocking driver with the BMC's guard (timeout,
retries, breaker) and holds the per-BMC lock for the whole operation, so a
power action and the polling that verifies it are one step.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from controller.bmc.resilience import BmcGuard
from controller.bmc.types import (
    BmcHealth,
    BootDevice,
    BootMode,
    BootOverride,
    FirmwareComponent,
    HardwareInventory,
    LogEntry,
    PowerAction,
    PowerState,
    SensorReadings,
    VirtualMediaState,
)
from controller.core.errors import BmcError, BmcTimeout

LOG = logging.getLogger(__name__)
T = TypeVar("T")


class Driver(Protocol):
    """What a protocol driver provides (blocking, Kiln errors only)."""

    def power_state(self) -> PowerState: ...
    def power_action(self, action: PowerAction) -> None: ...
    def boot_get(self) -> BootOverride: ...
    def boot_set(self, device: BootDevice, persistent: bool, mode: BootMode | None) -> None: ...
    def vmedia_state(self) -> VirtualMediaState: ...
    def vmedia_insert(self, image_url: str) -> None: ...
    def vmedia_eject(self) -> None: ...
    def bios_attributes(self) -> dict[str, Any]: ...
    def bios_pending(self) -> dict[str, Any]: ...
    def bios_set(self, attrs: Mapping[str, Any]) -> None: ...
    def firmware_inventory(self) -> list[FirmwareComponent]: ...
    def firmware_start(self, image_url: str, targets: list[str] | None) -> str | None: ...
    def firmware_task_done(self, monitor_uri: str) -> bool: ...
    def sensors(self) -> SensorReadings: ...
    def inventory(self) -> HardwareInventory: ...
    def log_entries(self) -> list[LogEntry]: ...
    def close(self) -> None: ...


class _Capability:
    def __init__(self, driver: Driver, guard: BmcGuard) -> None:
        self._driver = driver
        self._guard = guard

    async def _one(self, operation: str, fn: Callable[[], T]) -> T:
        async with self._guard.exclusive():
            return await self._guard.call(operation, fn)


class PowerControl(_Capability):
    """Implements ``controller.bmc.base.Power``."""

    poll_interval: float = 0.5
    max_poll_interval: float = 2.0

    async def state(self) -> PowerState:
        return await self._one("power state", self._driver.power_state)

    async def set(self, action: PowerAction, timeout: float = 60.0) -> PowerState:
        guard = self._guard
        clock = guard.clock
        deadline = clock.monotonic() + timeout
        target = action.final_state
        async with guard.exclusive():
            current = await guard.call("power state", self._driver.power_state, deadline=deadline)
            if action in (PowerAction.ON, PowerAction.OFF, PowerAction.FORCE_OFF):
                if current is target:
                    return current  # already there: success, nothing sent
                await self._act(action, deadline)
            elif current is PowerState.OFF:
                await self._act(PowerAction.ON, deadline)  # restarting an off node = power on
            elif action is PowerAction.RESTART and not getattr(
                self._driver, "supports_graceful_restart", True
            ):
                await self._act(PowerAction.OFF, deadline)
                await self._wait_for(PowerState.OFF, deadline, action, timeout)
                await self._act(PowerAction.ON, deadline)
            else:
                await self._act(action, deadline)
            state = await self._wait_for(target, deadline, action, timeout)
            LOG.info("node %s: power %s done, now %s", guard.node, action.value, state.value)
            return state

    async def _act(self, action: PowerAction, deadline: float) -> None:
        LOG.info("node %s: power %s requested", self._guard.node, action.value)
        await self._guard.call(
            f"power {action.value}", lambda: self._driver.power_action(action), deadline=deadline
        )

    async def _wait_for(
        self, target: PowerState, deadline: float, action: PowerAction, timeout: float
    ) -> PowerState:
        guard = self._guard
        clock = guard.clock
        interval = self.poll_interval
        while True:
            state = await guard.call("power state", self._driver.power_state, deadline=deadline)
            if state is target:
                return state
            remaining = deadline - clock.monotonic()
            if remaining <= 0:
                raise BmcTimeout(
                    host=guard.host, operation=f"power {action.value}", seconds=timeout
                )
            await clock.sleep(min(interval, remaining))
            interval = min(self.max_poll_interval, interval * 1.5)


class BootControl(_Capability):
    """Implements ``controller.bmc.base.Boot``."""

    async def get(self) -> BootOverride:
        return await self._one("get boot device", self._driver.boot_get)

    async def set(
        self, device: BootDevice, *, persistent: bool = False, mode: BootMode | None = None
    ) -> None:
        await self._one(
            f"set boot device {device.value}",
            lambda: self._driver.boot_set(device, persistent, mode),
        )


class VirtualMediaControl(_Capability):
    """Implements ``controller.bmc.base.VirtualMedia``."""

    async def insert(self, image_url: str) -> None:
        await self._one("insert virtual media", lambda: self._driver.vmedia_insert(image_url))

    async def eject(self) -> None:
        await self._one("eject virtual media", self._driver.vmedia_eject)

    async def state(self) -> VirtualMediaState:
        return await self._one("virtual media state", self._driver.vmedia_state)


class BiosControl(_Capability):
    """Implements ``controller.bmc.base.Bios``."""

    async def attributes(self) -> dict[str, Any]:
        return await self._one("BIOS attributes", self._driver.bios_attributes)

    async def pending(self) -> dict[str, Any]:
        return await self._one("BIOS pending attributes", self._driver.bios_pending)

    async def set(self, attrs: Mapping[str, Any]) -> None:
        frozen = dict(attrs)
        await self._one("set BIOS attributes", lambda: self._driver.bios_set(frozen))


class FirmwareControl(_Capability):
    """Implements ``controller.bmc.base.Firmware``."""

    poll_interval: float = 2.0

    async def inventory(self) -> list[FirmwareComponent]:
        return await self._one("firmware inventory", self._driver.firmware_inventory)

    async def update(
        self,
        image_url: str,
        targets: list[str] | None = None,
        timeout: float = 1800.0,
        expected_version: str | None = None,
    ) -> list[FirmwareComponent]:
        guard = self._guard
        clock = guard.clock
        deadline = clock.monotonic() + timeout
        async with guard.exclusive():
            # Starting an update is not idempotent: never retry the POST.
            monitor = await guard.call(
                "firmware update", lambda: self._driver.firmware_start(image_url, targets)
            )
            LOG.info("node %s: firmware update from %s started", guard.node, image_url)
            while monitor is not None:
                check = functools.partial(self._driver.firmware_task_done, monitor)
                if await guard.call("firmware task", check, deadline=deadline):
                    break
                if clock.monotonic() >= deadline:
                    raise BmcTimeout(host=guard.host, operation="firmware update", seconds=timeout)
                await clock.sleep(self.poll_interval)
            inventory = await guard.call("firmware inventory", self._driver.firmware_inventory)
            if expected_version is not None and all(
                c.version != expected_version for c in inventory
            ):
                raise BmcError(
                    host=guard.host,
                    reason=f"firmware update finished but no component reports {expected_version}",
                )
            LOG.info("node %s: firmware update from %s done", guard.node, image_url)
            return inventory


class SensorsReader(_Capability):
    """Implements ``controller.bmc.base.Sensors``."""

    async def readings(self) -> SensorReadings:
        return await self._one("sensors", self._driver.sensors)


class InventoryReader(_Capability):
    """Implements ``controller.bmc.base.Inventory``."""

    async def get(self) -> HardwareInventory:
        return await self._one("inventory", self._driver.inventory)


class EventLogReader(_Capability):
    """Implements ``controller.bmc.base.EventLog``."""

    async def entries(self) -> list[LogEntry]:
        return await self._one("event log", self._driver.log_entries)


class Bmc:
    """One BMC, by capability. Obtain from ``BmcPool.get``; safe to share."""

    def __init__(self, node: str, protocol: str, driver: Driver, guard: BmcGuard) -> None:
        self.node = node
        self.protocol = protocol
        self.power = PowerControl(driver, guard)
        self.boot = BootControl(driver, guard)
        self.vmedia = VirtualMediaControl(driver, guard)
        self.bios = BiosControl(driver, guard)
        self.firmware = FirmwareControl(driver, guard)
        self.sensors = SensorsReader(driver, guard)
        self.inventory = InventoryReader(driver, guard)
        self.log = EventLogReader(driver, guard)
        self._guard = guard
        self._driver = driver

    @property
    def health(self) -> BmcHealth:
        """The breaker's view: "ok" | "degraded" | "unreachable" and the last error."""
        return self._guard.breaker.health

    def __repr__(self) -> str:
        return f"Bmc(node={self.node!r}, protocol={self.protocol!r}, host={self._guard.host!r})"
