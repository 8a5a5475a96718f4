"""IPMI driver on pyghmi (blocking; the pool runs it in worker threads).

pyghmi shares one session per (bmc, user, password, port) inside a process,
and a second ``Command`` for the same key can hang. So the pool hands each BMC
exactly one ``IpmiDriver`` for the life of the process, and this driver holds
a thread lock so that even a call that outlived its asyncio timeout never
overlaps the next one. pyghmi's process-wide session loop gets three fixes
at import (``controller/bmc/pyghmi_compat.py``): without them BMCs that never
answer can stop every IPMI call in the process.

IPMI has no virtual media, BIOS attributes, firmware update or leak
detectors (no standard sensor type for them): those raise ``NotSupported``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pyghmi import exceptions as pyghmi_exc
from pyghmi.ipmi import command as ipmi_command

from controller.bmc import pyghmi_compat
from controller.bmc.types import (
    BootDevice,
    BootMode,
    BootOverride,
    FirmwareComponent,
    HardwareInventory,
    Health,
    LeakDetectorReading,
    LogEntry,
    PowerAction,
    PowerState,
    SensorReading,
    SensorReadings,
    VirtualMediaState,
)
from controller.core.errors import (
    BmcAuthenticationFailed,
    BmcError,
    BmcUnreachable,
    InvalidArgument,
    NotSupported,
)

if TYPE_CHECKING:
    # The registry imports this module and address.py imports the registry.
    from controller.bmc.address import BmcAddress, BmcCredentials, TlsOptions

LOG = logging.getLogger(__name__)
pyghmi_compat.apply()
# IPMI 2.0 (RMCP+) carries a password of at most 20 bytes.
MAX_PASSWORD_BYTES = 20

# --- translation tables -----------------------------------------------------
POWER_STATES: dict[str, PowerState] = {"on": PowerState.ON, "off": PowerState.OFF}
POWER_ACTIONS: dict[PowerAction, str] = {
    PowerAction.ON: "on",
    PowerAction.OFF: "shutdown",  # ACPI soft-off request
    PowerAction.FORCE_OFF: "off",
    PowerAction.CYCLE: "reset",  # hard reset (chassis control 3)
}
BOOT_DEVICES: dict[BootDevice, str] = {
    BootDevice.PXE: "network",
    BootDevice.CD: "optical",
    BootDevice.DISK: "hd",
    BootDevice.NONE: "default",
}
# Boot flags parameter 5, data byte 2, bits 5..2 (IPMI 2.0 table 28-14).
BOOT_SELECTORS: dict[int, BootDevice] = {
    0x0: BootDevice.NONE,
    0x1: BootDevice.PXE,
    0x2: BootDevice.DISK,
    0x3: BootDevice.DISK,
    0x5: BootDevice.CD,
}
# pyghmi.constants.Health bits: Ok=0, Warning=1, Critical=2, Failed=4.
HEALTH_BITS: tuple[tuple[int, Health], ...] = (
    (4, Health.CRITICAL),
    (2, Health.CRITICAL),
    (1, Health.WARNING),
)
SEL_SEVERITY: dict[int, Health] = {0: Health.OK, 1: Health.WARNING, 2: Health.CRITICAL}
AUTH_MARKERS = ("password", "unauthorized", "privilege", "authentication", "rakp")


def _health(bits: int | None) -> Health:
    if bits is None:
        return Health.UNKNOWN
    for bit, health in HEALTH_BITS:
        if bits & bit:
            return health
    return Health.OK


class IpmiDriver:
    """Blocking IPMI calls for one BMC. Raises only Kiln errors."""

    supports_graceful_restart = False
    supports_leak_detection = False  # the handle answers NotSupported without a call

    def __init__(self, address: BmcAddress, credentials: BmcCredentials, *, node: str = "") -> None:
        self._address = address
        self._credentials = credentials
        self._node = node or address.host
        self._label = f"{address.host}:{address.port}"
        self._session_key = (address.host, address.port, credentials.username)
        self._command: ipmi_command.Command | None = None
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _edge(self, operation: str) -> Iterator[ipmi_command.Command]:
        host = self._label
        with self._lock:
            try:
                if self._command is None:
                    # This driver owns the BMC's only session: a cached one is
                    # dead (see pyghmi_compat.forget_sessions).
                    pyghmi_compat.forget_sessions(*self._session_key)
                    self._command = ipmi_command.Command(
                        bmc=self._address.host,
                        userid=self._credentials.username,
                        password=self._credentials.password,
                        port=self._address.port,
                    )
                yield self._command
            except (BmcError, NotSupported):
                raise
            except pyghmi_exc.UnsupportedFunctionality as e:
                raise NotSupported(operation) from e
            except pyghmi_exc.IpmiException as e:
                text = str(e.args[0]) if e.args and e.args[0] else ""
                lowered = text.lower()
                if any(marker in lowered for marker in AUTH_MARKERS):
                    self._command = None
                    raise BmcAuthenticationFailed(
                        host=host, username=self._credentials.username
                    ) from e
                if not text or "timeout" in lowered or "session" in lowered or "logon" in lowered:
                    # pyghmi drops broken sessions itself; build a fresh Command next time.
                    self._command = None
                    raise BmcUnreachable(host=host, reason=text or "no answer") from e
                if getattr(e, "ipmicode", 0) in (0xC1, 0xC9, 0xCC):
                    raise NotSupported(operation) from e
                raise BmcError(host=host, reason=f"{operation}: {text}") from e
            except pyghmi_exc.PyghmiException as e:
                raise BmcError(host=host, reason=f"{operation}: {e}") from e
            except OSError as e:
                self._command = None
                raise BmcUnreachable(host=host, reason=str(e)) from e

    def close(self) -> None:
        """Log out, so no keepalive traffic for this BMC lingers in pyghmi's
        process-wide I/O loop (where a dead BMC's retries slow everyone).

        Never waits: while a call holds the driver's lock (perhaps stuck in
        pyghmi) the session is in use, and close leaves it to pyghmi.
        """
        if not self._lock.acquire(blocking=False):
            LOG.debug(
                "node %s: IPMI %s has a call in flight; not logging out", self._node, self._label
            )
            return
        try:
            command, self._command = self._command, None
            if command is not None:
                with contextlib.suppress(Exception):
                    command.ipmi_session.logout()
                # A logout with no answer leaves the session half logged out
                # in pyghmi's tables, where the next Command would find it.
                pyghmi_compat.forget_sessions(*self._session_key)
        finally:
            self._lock.release()

    # --- power --------------------------------------------------------------
    def power_state(self) -> PowerState:
        with self._edge("power state") as cmd:
            wire = cmd.get_power().get("powerstate")
        if wire not in POWER_STATES:
            raise BmcError(host=self._label, reason=f"unknown power state {wire!r}")
        return POWER_STATES[wire]

    def power_action(self, action: PowerAction) -> None:
        if action not in POWER_ACTIONS:
            raise NotSupported(f"power {action.value}")
        with self._edge(f"power {action.value}") as cmd:
            cmd.set_power(POWER_ACTIONS[action], wait=False)

    # --- boot ---------------------------------------------------------------
    def boot_get(self) -> BootOverride:
        with self._edge("get boot device") as cmd:
            rsp = cmd.raw_command(netfn=0, command=9, data=(5, 0, 0))
        if "error" in rsp:
            raise BmcError(host=self._label, reason=f"get boot device: {rsp['error']}")
        data = list(rsp.get("data") or [])
        if len(data) < 4:
            raise BmcError(host=self._label, reason="get boot device: short answer")
        flags, selector = data[2], (data[3] >> 2) & 0x0F
        device = BOOT_SELECTORS.get(selector, BootDevice.OTHER)
        if device is BootDevice.NONE:
            return BootOverride(BootDevice.NONE)
        mode = BootMode.UEFI if flags & 0x20 else BootMode.LEGACY
        return BootOverride(device, persistent=bool(flags & 0x40), mode=mode)

    def boot_set(self, device: BootDevice, persistent: bool, mode: BootMode | None) -> None:
        if device not in BOOT_DEVICES:
            raise NotSupported(f"boot from {device.value}")
        with self._edge(f"set boot device {device.value}") as cmd:
            cmd.set_bootdev(
                BOOT_DEVICES[device], persist=persistent, uefiboot=mode is BootMode.UEFI
            )

    # --- not in IPMI --------------------------------------------------------
    def vmedia_state(self) -> VirtualMediaState:
        raise NotSupported("virtual media")

    def vmedia_insert(self, image_url: str) -> None:
        raise NotSupported("virtual media")

    def vmedia_eject(self) -> None:
        raise NotSupported("virtual media")

    def bios_attributes(self) -> dict[str, Any]:
        raise NotSupported("BIOS attributes")

    def bios_pending(self) -> dict[str, Any]:
        raise NotSupported("BIOS attributes")

    def bios_set(self, attrs: Mapping[str, Any]) -> None:
        raise NotSupported("BIOS attributes")

    def firmware_inventory(self) -> list[FirmwareComponent]:
        raise NotSupported("firmware inventory")

    def firmware_start(self, image_url: str, targets: list[str] | None) -> str | None:
        raise NotSupported("firmware update")

    def firmware_task_done(self, monitor_uri: str) -> bool:
        raise NotSupported("firmware update")

    # --- sensors, inventory, SEL ----------------------------------------------
    def sensors(self) -> SensorReadings:
        temps: list[SensorReading] = []
        fans: list[SensorReading] = []
        watts: float | None = None
        worst = 0
        with self._edge("sensors") as cmd:
            for reading in cmd.get_sensor_data():
                health_bits = int(reading.health or 0)
                worst |= health_bits
                units = str(reading.units or "")
                value = float(reading.value) if reading.value is not None else None
                item = SensorReading(str(reading.name).strip(), value, units, _health(health_bits))
                if reading.type == "Temperature":
                    temps.append(SensorReading(item.name, value, "C", item.health))
                elif reading.type == "Fan":
                    fans.append(item)
                elif units == "W" and watts is None:
                    watts = value
        return SensorReadings(tuple(temps), tuple(fans), watts, _health(worst))

    def leak_detectors(self) -> list[LeakDetectorReading]:
        raise NotSupported("leak detection")

    def inventory(self) -> HardwareInventory:
        with self._edge("inventory") as cmd:
            try:
                system = dict(cmd.get_inventory_of_component("System") or {})
            except pyghmi_exc.IpmiException:
                system = {}  # no FRU data: report nothing rather than fail
        return HardwareInventory(
            manufacturer=system.get("Manufacturer") or system.get("Board manufacturer"),
            model=system.get("Product name") or system.get("Model"),
            serial=system.get("Serial Number") or system.get("Board serial number"),
        )

    def log_entries(self) -> list[LogEntry]:
        entries: list[LogEntry] = []
        with self._edge("event log") as cmd:
            for raw in cmd.get_event_log():
                entries.append(_sel_entry(raw))
        return entries


def _sel_entry(raw: Mapping[str, Any]) -> LogEntry:
    created = None
    if raw.get("timestamp"):
        with contextlib.suppress(ValueError):
            created = datetime.fromisoformat(str(raw["timestamp"]))
    component = str(raw.get("component") or "").strip()
    event = str(raw.get("event") or "")
    return LogEntry(
        id=str(raw.get("record_id", "")),
        message=f"{component}: {event}" if component else event,
        severity=SEL_SEVERITY.get(int(raw.get("severity") or 0), Health.UNKNOWN),
        created=created,
        extra={k: str(v) for k, v in raw.items() if k in ("component_type", "event_id")},
    )


# --- registry hooks (controller/bmc/registry.py) ------------------------------
def check_path(path: str) -> str:
    """An IPMI BMC URL is a host and port only.

    Raises:
        InvalidArgument: the URL has a path.
    """
    if path:
        raise InvalidArgument(f"IPMI BMC URL must not have a path (got {path!r})")
    return ""


def validate_credentials(username: str, password: str) -> None:
    """Reject a password IPMI 2.0 cannot carry (no I/O).

    Raises:
        InvalidArgument: the password is longer than 20 bytes (UTF-8).
    """
    if len(password.encode()) > MAX_PASSWORD_BYTES:
        raise InvalidArgument("IPMI 2.0 passwords are at most 20 bytes; this one is longer")


def make_driver(
    address: BmcAddress,
    credentials: BmcCredentials,
    tls: TlsOptions,
    *,
    request_timeout: float,
    node: str,
) -> IpmiDriver:
    """The registry's factory. IPMI has no TLS, and pyghmi keeps its own
    per-request timeouts (the pool's guard bounds each call)."""
    return IpmiDriver(address, credentials, node=node)
