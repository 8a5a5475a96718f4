"""The async capability objects of one BMC handle.

Each capability wraps the blocking driver with the BMC's guard (call slots,
hard deadline, retries, breaker). A state change holds the per-BMC operation
lock for the whole operation, so a power action and the polling that
verifies it are one step and two changes never interleave; reads never take
that lock, so a power-state read answers while a change is pending.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from controller.bmc.errors import BmcPowerNotHonoured
from controller.bmc.redfish_http import RedfishHttp
from controller.bmc.resilience import BmcGuard
from controller.bmc.types import (
    BmcHealth,
    BootDevice,
    BootMode,
    BootOverride,
    FirmwareComponent,
    HardwareInventory,
    LeakDetectorReading,
    LogEntry,
    PowerAction,
    PowerState,
    SensorReadings,
    VirtualMediaState,
)
from controller.core.deadline import bounded
from controller.core.errors import BmcError, BmcTimeout, NotSupported

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
    def leak_detectors(self) -> list[LeakDetectorReading]: ...
    def inventory(self) -> HardwareInventory: ...
    def log_entries(self) -> list[LogEntry]: ...
    def close(self) -> None: ...


class _Capability:
    def __init__(self, driver: Driver, guard: BmcGuard) -> None:
        self._driver = driver
        self._guard = guard

    async def _read(self, operation: str, fn: Callable[[], T]) -> T:
        """One read: no operation lock (the guard still bounds calls per BMC)."""
        return await self._guard.call(operation, fn)

    async def _one(self, operation: str, fn: Callable[[], T]) -> T:
        """One state change under the per-BMC operation lock."""
        async with self._guard.exclusive_until(None, operation):
            return await self._guard.call(operation, fn)


# How a power command is named when it is not honoured.
COMMAND_NAMES: dict[PowerAction, str] = {
    PowerAction.ON: "power-on",
    PowerAction.OFF: "power-off",
    PowerAction.FORCE_OFF: "forced power-off",
    PowerAction.CYCLE: "power cycle",
    PowerAction.RESTART: "restart",
}


class PowerControl(_Capability):
    """Implements ``controller.bmc.base.Power``.

    ``resend_after``: seconds a power change may stay unapplied before the
    command is sent once more (BMCs do lose them); None or 0 never re-sends.
    """

    poll_interval: float = 0.5
    max_poll_interval: float = 2.0
    min_read_budget: float = 0.25

    def __init__(
        self,
        driver: Driver,
        guard: BmcGuard,
        *,
        resend_after: float | None = 30.0,
        http: RedfishHttp | None = None,
    ) -> None:
        super().__init__(driver, guard)
        self.resend_after = resend_after
        self._http = http

    async def state(self) -> PowerState:
        return await self._read("power state", self._driver.power_state)

    async def poll(self) -> PowerState:
        """The power state, read for a periodic pass over the fleet (power
        sync): on the event loop where the driver can read it there (Redfish,
        through the pool's ``RedfishHttp``), else as ``state``. The same
        guard either way: slots, retries, breakers, health."""
        read = getattr(self._driver, "power_state_async", None)
        http = self._http
        if read is None or http is None:
            return await self.state()
        return await self._guard.call_async("power state", lambda: read(http))

    async def set(
        self, action: PowerAction, timeout: float = 60.0, *, resend_after: float | None = None
    ) -> PowerState:
        guard = self._guard
        clock = guard.clock
        timeout = bounded(timeout)  # the caller's deadline comes first
        deadline = clock.monotonic() + timeout
        resend = self.resend_after if resend_after is None else resend_after
        target = action.final_state
        async with guard.exclusive_until(deadline, f"power {action.value}"):
            current = await guard.call("power state", self._driver.power_state, deadline=deadline)
            if action in (PowerAction.ON, PowerAction.OFF, PowerAction.FORCE_OFF):
                if current is target:
                    return current  # already there: success, nothing sent
                state = await self._change(action, deadline, timeout, resend)
            elif current is PowerState.OFF:
                # Restarting an off node = power on.
                state = await self._change(PowerAction.ON, deadline, timeout, resend)
            elif action is PowerAction.RESTART and not getattr(
                self._driver, "supports_graceful_restart", True
            ):
                await self._change(PowerAction.OFF, deadline, timeout, resend)
                state = await self._change(PowerAction.ON, deadline, timeout, resend)
            else:
                # A cycle of a node that is on ends on: a lost command cannot be
                # told from a quick one, so it is sent once.
                await self._act(action, deadline)
                state = await self._wait_for(target, deadline, deadline)
                if state is not target:
                    raise BmcTimeout(
                        host=guard.host, operation=f"power {action.value}", seconds=timeout
                    )
            LOG.info("node %s: power %s done, now %s", guard.node, action.value, state.value)
            return state

    async def _change(
        self, action: PowerAction, deadline: float, timeout: float, resend: float | None
    ) -> PowerState:
        """Send ``action`` and poll until its final state holds; send it once
        more if it has not landed after ``resend`` seconds.

        Raises:
            BmcPowerNotHonoured: still not there at the deadline.
        """
        clock = self._guard.clock
        target = action.final_state
        resend_at = clock.monotonic() + resend if resend else math.inf
        attempts = 1
        await self._act(action, deadline)
        state = await self._wait_for(target, deadline, min(deadline, resend_at))
        now = clock.monotonic()
        if state is not target and resend_at <= now < deadline:
            attempts = 2
            LOG.warning(
                "node %s: BMC %s accepted power %s but the power is still %s after %.0fs; "
                "sending it again",
                self._guard.node,
                self._guard.host,
                action.value,
                state.value,
                resend or 0.0,
            )
            await self._act(action, deadline)
            state = await self._wait_for(target, deadline, deadline)
        if state is not target:
            raise BmcPowerNotHonoured(
                host=self._guard.host,
                operation=f"power {action.value}",
                command=COMMAND_NAMES[action],
                tries="2 attempts" if attempts == 2 else "1 attempt",
                attempts=attempts,
                state=state.value,
                seconds=timeout,
            )
        return state

    async def _act(self, action: PowerAction, deadline: float) -> None:
        LOG.info("node %s: power %s requested", self._guard.node, action.value)
        await self._guard.call(
            f"power {action.value}", lambda: self._driver.power_action(action), deadline=deadline
        )

    async def _wait_for(self, target: PowerState, deadline: float, until: float) -> PowerState:
        """Poll until ``target`` holds or ``until`` passes; returns the last state
        read (``target`` on success). Every read is bounded by ``deadline``, and
        none starts with less than ``min_read_budget`` seconds left."""
        guard = self._guard
        clock = guard.clock
        interval = self.poll_interval
        state = await guard.call("power state", self._driver.power_state, deadline=deadline)
        while state is not target:
            remaining = until - clock.monotonic()
            if remaining <= 0:
                break
            await clock.sleep(min(interval, remaining))
            interval = min(self.max_poll_interval, interval * 1.5)
            if deadline - clock.monotonic() < self.min_read_budget:
                break
            state = await guard.call("power state", self._driver.power_state, deadline=deadline)
        return state


class BootControl(_Capability):
    """Implements ``controller.bmc.base.Boot``."""

    async def get(self) -> BootOverride:
        return await self._read("get boot device", self._driver.boot_get)

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
        return await self._read("virtual media state", self._driver.vmedia_state)


class BiosControl(_Capability):
    """Implements ``controller.bmc.base.Bios``."""

    async def attributes(self) -> dict[str, Any]:
        return await self._read("BIOS attributes", self._driver.bios_attributes)

    async def pending(self) -> dict[str, Any]:
        return await self._read("BIOS pending attributes", self._driver.bios_pending)

    async def set(self, attrs: Mapping[str, Any]) -> None:
        frozen = dict(attrs)
        await self._one("set BIOS attributes", lambda: self._driver.bios_set(frozen))


class FirmwareControl(_Capability):
    """Implements ``controller.bmc.base.Firmware``."""

    poll_interval: float = 2.0

    async def inventory(self) -> list[FirmwareComponent]:
        return await self._read("firmware inventory", self._driver.firmware_inventory)

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
        async with guard.exclusive_until(deadline, "firmware update"):
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
        return await self._read("sensors", self._driver.sensors)


class LeakDetectionReader(_Capability):
    """Implements ``controller.bmc.base.LeakDetection``.

    A driver whose protocol has no leak detectors (``supports_leak_detection
    = False``) answers NotSupported at once, without taking a call slot.
    The leak watcher reads every BMC over and over: ``poll`` reads on the
    event loop where the driver can (Redfish, through the pool's
    ``RedfishHttp``), as power sync's ``PowerControl.poll``, behind the same
    guard; ``readings`` reads in the pool's threads.
    """

    def __init__(self, driver: Driver, guard: BmcGuard, *, http: RedfishHttp | None = None):
        super().__init__(driver, guard)
        self._http = http

    async def readings(self) -> list[LeakDetectorReading]:
        self._refuse_unsupported()
        return await self._read("leak detectors", self._driver.leak_detectors)

    async def poll(self) -> list[LeakDetectorReading]:
        """``readings``, read for the leak watcher's passes: on the event
        loop where the driver can read there, else as ``readings``."""
        self._refuse_unsupported()
        read = getattr(self._driver, "leak_detectors_async", None)
        http = self._http
        if read is None or http is None:
            return await self._read("leak detectors", self._driver.leak_detectors)
        return await self._guard.call_async("leak detectors", lambda: read(http))

    def _refuse_unsupported(self) -> None:
        if not getattr(self._driver, "supports_leak_detection", True):
            raise NotSupported("leak detection")


class InventoryReader(_Capability):
    """Implements ``controller.bmc.base.Inventory``."""

    async def get(self) -> HardwareInventory:
        return await self._read("inventory", self._driver.inventory)


class EventLogReader(_Capability):
    """Implements ``controller.bmc.base.EventLog``."""

    async def entries(self) -> list[LogEntry]:
        return await self._read("event log", self._driver.log_entries)


class Bmc:
    """One BMC, by capability. Obtain from ``BmcPool.get``; safe to share."""

    def __init__(
        self,
        node: str,
        protocol: str,
        driver: Driver,
        guard: BmcGuard,
        *,
        power_resend_after: float | None = 30.0,
        http: RedfishHttp | None = None,
    ) -> None:
        self.node = node
        self.protocol = protocol
        self.power = PowerControl(driver, guard, resend_after=power_resend_after, http=http)
        self.boot = BootControl(driver, guard)
        self.vmedia = VirtualMediaControl(driver, guard)
        self.bios = BiosControl(driver, guard)
        self.firmware = FirmwareControl(driver, guard)
        self.sensors = SensorsReader(driver, guard)
        self.leaks = LeakDetectionReader(driver, guard, http=http)
        self.inventory = InventoryReader(driver, guard)
        self.log = EventLogReader(driver, guard)
        self._guard = guard
        self._driver = driver

    @property
    def health(self) -> BmcHealth:
        """The breaker's view: "ok" | "degraded" | "unreachable" and the last error."""
        return self._guard.health

    def __repr__(self) -> str:
        return f"Bmc(node={self.node!r}, protocol={self.protocol!r}, host={self._guard.host!r})"
