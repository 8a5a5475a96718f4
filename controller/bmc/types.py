"""Protocol-neutral values the BMC layer hands to the rest of Kiln.

Wire strings (Redfish ``PowerState``, IPMI boot device names) are translated
to these enums at the top of each driver module; nothing above the drivers
sees a sushy or pyghmi type.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime


class PowerState(enum.Enum):
    ON = "on"
    OFF = "off"


class PowerAction(enum.Enum):
    """What to do to the power. The final state of each action is ``final_state``."""

    ON = "on"
    OFF = "off"  # graceful shutdown through the OS
    FORCE_OFF = "force_off"
    CYCLE = "cycle"  # force restart (or off, then on)
    RESTART = "restart"  # graceful restart

    @property
    def final_state(self) -> PowerState:
        if self in (PowerAction.OFF, PowerAction.FORCE_OFF):
            return PowerState.OFF
        return PowerState.ON


class BootDevice(enum.Enum):
    PXE = "pxe"
    CD = "cd"
    DISK = "disk"
    UEFI_HTTP = "uefi_http"
    NONE = "none"  # no override
    OTHER = "other"  # a device Kiln does not manage (BIOS setup, USB, ...)


class BootMode(enum.Enum):
    UEFI = "uefi"
    LEGACY = "legacy"


class Health(enum.Enum):
    """Redfish ``Status.Health``; IPMI sensor health is mapped onto it."""

    OK = "ok"
    WARNING = "warning"
    CRITICAL = "critical"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class BootOverride:
    """A boot source override. ``persistent=False`` means the next boot only."""

    device: BootDevice
    persistent: bool = False
    mode: BootMode | None = None


@dataclass(frozen=True)
class VirtualMediaState:
    inserted: bool
    image_url: str | None = None


@dataclass(frozen=True)
class FirmwareComponent:
    id: str
    name: str
    version: str
    target: str = ""  # the URI an update of this component names (Redfish SimpleUpdate)


@dataclass(frozen=True)
class SensorReading:
    name: str
    value: float | None
    units: str
    health: Health = Health.UNKNOWN


@dataclass(frozen=True)
class SensorReadings:
    temperatures: tuple[SensorReading, ...] = ()
    fans: tuple[SensorReading, ...] = ()
    power_watts: float | None = None
    health: Health = Health.UNKNOWN


@dataclass(frozen=True)
class LeakDetectorReading:
    """One leak detector (DMTF ``LeakDetector``) as its BMC reported it.

    ``detector_state`` is ``DetectorState`` (None: absent or null),
    ``status_state`` and ``status_health`` its ``Status.State`` (the DMTF word,
    e.g. "Enabled", "UnavailableOffline"; None: absent) and ``Status.Health``
    (None: absent). ``problem`` says what was wrong with the detector's own
    document ("" when nothing): a detector Kiln cannot read is reported, not
    dropped, so the layer above can flag it while the others still count.
    ``read_at`` is when its document arrived (Unix seconds).
    """

    path: str
    id: str
    name: str
    detector_state: Health | None
    status_state: str | None
    status_health: Health | None
    read_at: float
    detector_type: str | None = None
    physical_context: str | None = None
    problem: str = ""


@dataclass(frozen=True)
class Nic:
    id: str
    mac: str | None


@dataclass(frozen=True)
class HardwareInventory:
    manufacturer: str | None = None
    model: str | None = None
    serial: str | None = None
    cpu_count: int | None = None
    cpu_model: str | None = None
    memory_gib: float | None = None
    nics: tuple[Nic, ...] = ()


@dataclass(frozen=True)
class LogEntry:
    id: str
    message: str
    severity: Health = Health.UNKNOWN
    created: datetime | None = None
    extra: dict[str, str] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class BmcHealth:
    """What the per-BMC circuit breaker thinks of a BMC.

    ``state`` is "ok" (answering), "degraded" (recent failures, still tried)
    or "unreachable" (breaker open: calls fail fast).
    """

    state: str
    last_error: str | None = None
    consecutive_failures: int = 0
