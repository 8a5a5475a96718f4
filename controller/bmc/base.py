"""One small interface per BMC capability, in the manner of Ironic's
``PowerInterface`` / ``ManagementInterface`` / ``BIOSInterface``.

Every method is async and safe to call from the event loop (drivers run
blocking libraries in worker threads). Every implementation raises only
Kiln errors:

* ``NotSupported`` -- the protocol or this BMC cannot do the operation;
* ``BmcUnreachable`` -- no answer / connection refused / breaker open;
* ``BmcAuthenticationFailed`` -- credentials refused (never retried);
* ``BmcTimeout`` -- the call or the state change did not finish in time;
* ``BmcError`` -- any other failure the BMC reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from controller.bmc.types import (
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


class Power(Protocol):
    async def state(self) -> PowerState:
        """Read the current power state (one BMC round trip).

        Raises: BmcUnreachable, BmcAuthenticationFailed, BmcTimeout, BmcError.
        """
        ...

    async def set(
        self, action: PowerAction, timeout: float = 60.0, *, resend_after: float | None = None
    ) -> PowerState:
        """Request ``action`` and poll until ``action.final_state`` holds.

        Idempotent: ON/OFF/FORCE_OFF when already there return at once without
        touching the power. CYCLE and RESTART always act. A command the BMC
        accepted but did not apply within ``resend_after`` seconds (None: the
        pool's ``power_resend_after``) is sent once more. Power-state reads
        are not held up while the change is pending.

        Raises: BmcPowerNotHonoured (a BmcTimeout) if the final state is not
        reached within ``timeout`` seconds; NotSupported; BmcUnreachable;
        BmcAuthenticationFailed; BmcError.
        """
        ...


class Boot(Protocol):
    async def get(self) -> BootOverride:
        """The current boot override (device NONE when there is none).

        Raises: NotSupported, BmcUnreachable, BmcAuthenticationFailed, BmcTimeout, BmcError.
        """
        ...

    async def set(
        self, device: BootDevice, *, persistent: bool = False, mode: BootMode | None = None
    ) -> None:
        """Set a one-time (default) or persistent boot override.

        Raises: NotSupported (device or mode unsupported), BmcUnreachable,
        BmcAuthenticationFailed, BmcTimeout, BmcError.
        """
        ...


class VirtualMedia(Protocol):
    async def insert(self, image_url: str) -> None:
        """Insert an image (CD) from ``image_url``; ejects a different one first.

        Raises: NotSupported, BmcUnreachable, BmcAuthenticationFailed, BmcTimeout, BmcError.
        """
        ...

    async def eject(self) -> None:
        """Eject the CD image; idempotent. Raises as ``insert``."""
        ...

    async def state(self) -> VirtualMediaState:
        """What is inserted. Raises as ``insert``."""
        ...


class Bios(Protocol):
    async def attributes(self) -> dict[str, Any]:
        """The current BIOS attributes. Raises NotSupported and the BMC errors."""
        ...

    async def pending(self) -> dict[str, Any]:
        """Attributes set but not applied yet (applied at next reboot)."""
        ...

    async def set(self, attrs: Mapping[str, Any]) -> None:
        """Stage ``attrs``; they apply at the next reboot. Raises as ``attributes``."""
        ...


class Firmware(Protocol):
    async def inventory(self) -> list[FirmwareComponent]:
        """Installed firmware components. Raises NotSupported and the BMC errors."""
        ...

    async def update(
        self,
        image_url: str,
        targets: list[str] | None = None,
        timeout: float = 1800.0,
        expected_version: str | None = None,
    ) -> list[FirmwareComponent]:
        """Apply ``image_url`` to ``targets``, follow the task to completion and
        return the inventory afterwards. The start request is never retried.

        Raises: NotSupported, BmcTimeout (task not finished), BmcError (task
        failed, or no component reports ``expected_version`` afterwards),
        BmcUnreachable, BmcAuthenticationFailed.
        """
        ...


class Sensors(Protocol):
    async def readings(self) -> SensorReadings:
        """Temperatures, fans, power draw and overall health.

        Raises: BmcUnreachable, BmcAuthenticationFailed, BmcTimeout, BmcError.
        """
        ...


class LeakDetection(Protocol):
    async def readings(self) -> list[LeakDetectorReading]:
        """Every leak detector of the system's chassis ([] when it has none).

        Raises: NotSupported (the protocol has no leak detectors, e.g. IPMI),
        BmcUnreachable, BmcAuthenticationFailed, BmcTimeout, BmcError
        (BmcBadResponse for a broken collection).
        """
        ...


class Inventory(Protocol):
    async def get(self) -> HardwareInventory:
        """Model, serial, manufacturer, CPUs, memory and NICs (fields the BMC
        does not report are None). Raises the BMC errors."""
        ...


class EventLog(Protocol):
    async def entries(self) -> list[LogEntry]:
        """System event log entries, oldest first.

        Raises: NotSupported, BmcUnreachable, BmcAuthenticationFailed, BmcTimeout, BmcError.
        """
        ...
