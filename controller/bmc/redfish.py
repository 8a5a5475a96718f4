"""Redfish driver on sushy (blocking; the pool runs it in worker threads).

Translation tables sit at the top; sushy exceptions become Kiln errors in
``_edge``. One ``RedfishDriver`` serves one BMC system and is used by one
thread at a time (the pool serializes calls per BMC).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sushy
from sushy import auth as sushy_auth
from sushy import connector as sushy_connector
from sushy import exceptions as sushy_exc
from sushy.resources.system import system as sushy_system

from controller.bmc.errors import BmcServerError, BmcTlsError
from controller.bmc.types import (
    BootDevice,
    BootMode,
    BootOverride,
    FirmwareComponent,
    HardwareInventory,
    Health,
    LogEntry,
    Nic,
    PowerAction,
    PowerState,
    SensorReading,
    SensorReadings,
    VirtualMediaState,
)
from controller.core.errors import (
    BmcAuthenticationFailed,
    BmcError,
    BmcTimeout,
    BmcUnreachable,
    InvalidArgument,
    NotSupported,
)

if TYPE_CHECKING:
    # The registry imports this module and address.py imports the registry.
    from controller.bmc.address import BmcAddress, BmcCredentials, TlsOptions

LOG = logging.getLogger(__name__)
_SYSTEM_PATH = re.compile(r"^/redfish/v1/Systems/[^/?#\s]+$")

# --- translation tables (wire <-> Kiln) -------------------------------------
POWER_STATES: dict[str, PowerState] = {
    "On": PowerState.ON,
    "Off": PowerState.OFF,
    "PoweringOn": PowerState.OFF,  # not on yet
    "PoweringOff": PowerState.ON,  # not off yet
    "Paused": PowerState.ON,
}
RESET_TYPES: dict[PowerAction, sushy.ResetType] = {
    PowerAction.ON: sushy.ResetType.ON,
    PowerAction.OFF: sushy.ResetType.GRACEFUL_SHUTDOWN,
    PowerAction.FORCE_OFF: sushy.ResetType.FORCE_OFF,
    PowerAction.CYCLE: sushy.ResetType.FORCE_RESTART,
    PowerAction.RESTART: sushy.ResetType.GRACEFUL_RESTART,
}
BOOT_TARGETS: dict[BootDevice, sushy.BootSource] = {
    BootDevice.PXE: sushy.BootSource.PXE,
    BootDevice.CD: sushy.BootSource.CD,
    BootDevice.DISK: sushy.BootSource.HDD,
    BootDevice.UEFI_HTTP: sushy.BootSource.UEFI_HTTP,
    BootDevice.NONE: sushy.BootSource.NONE,
}
BOOT_TARGETS_REV: dict[sushy.BootSource, BootDevice] = {v: k for k, v in BOOT_TARGETS.items()}
BOOT_MODES: dict[BootMode, sushy.BootSourceOverrideMode] = {
    BootMode.UEFI: sushy.BootSourceOverrideMode.UEFI,
    BootMode.LEGACY: sushy.BootSourceOverrideMode.LEGACY,
}
BOOT_MODES_REV = {v: k for k, v in BOOT_MODES.items()}
HEALTH: dict[str | None, Health] = {
    "OK": Health.OK,
    "Warning": Health.WARNING,
    "Critical": Health.CRITICAL,
}
TASK_DONE_OK = {"Completed"}
TASK_FAILED = {"Exception", "Killed", "Cancelled", "Interrupted", "Suspended"}


def _health(value: Any) -> Health:
    if isinstance(value, sushy.Health):
        value = value.value
    return HEALTH.get(value, Health.UNKNOWN)


class RedfishDriver:
    """Blocking Redfish calls for one system. Raises only Kiln errors."""

    def __init__(
        self,
        address: BmcAddress,
        credentials: BmcCredentials,
        tls: TlsOptions,
        *,
        request_timeout: float = 10.0,
        node: str = "",
    ) -> None:
        self._address = address
        self._credentials = credentials
        self._tls = tls
        self._timeout = request_timeout
        self._node = node or address.host
        self._label = f"{address.host}:{address.port}"
        self._conn: sushy.Sushy | None = None
        self._connector: Any = None
        self._system: sushy_system.System | None = None
        # Guards lazy connection set-up against a timed-out call still running.
        self._setup_lock = threading.Lock()

    # --- plumbing ---------------------------------------------------------
    @contextlib.contextmanager
    def _edge(self, operation: str) -> Iterator[None]:
        """Convert sushy/requests failures into Kiln errors."""
        host = self._label
        try:
            yield
        except (BmcError, NotSupported):
            raise
        except sushy_exc.AccessError as e:
            if e.status_code == 401:
                raise BmcAuthenticationFailed(host=host, username=self._credentials.username) from e
            raise BmcError(host=host, reason=f"{operation}: access denied (403)") from e
        except sushy_exc.ServerSideError as e:
            if e.status_code == 501:
                raise NotSupported(operation) from e
            raise BmcServerError(
                host=host, status=e.status_code, reason=f"{operation}: {e.detail or 'error'}"
            ) from e
        except sushy_exc.ResourceNotFoundError as e:
            raise NotSupported(operation) from e
        except sushy_exc.HTTPError as e:
            if e.status_code in (405, 501):
                raise NotSupported(operation) from e
            raise BmcError(
                host=host, reason=f"{operation}: HTTP {e.status_code} {e.detail or ''}".strip()
            ) from e
        except sushy_exc.ConnectionError as e:
            self._reset_connection()
            text = str(e)
            if "ssl" in text.lower() or "certificate" in text.lower():
                raise BmcTlsError(host=host, reason=_short(_tls_reason(text))) from e
            if "timed out" in text.lower() or "timeout" in text.lower():
                raise BmcTimeout(host=host, operation=operation, seconds=self._timeout) from e
            raise BmcUnreachable(host=host, reason=_short(_connection_reason(text))) from e
        except (sushy_exc.MissingAttributeError, sushy_exc.MissingActionError) as e:
            raise NotSupported(operation) from e
        except sushy_exc.InvalidParameterValueError as e:
            raise NotSupported(operation) from e
        except sushy_exc.SushyError as e:
            raise BmcError(host=host, reason=f"{operation}: {_short(str(e))}") from e
        except (ValueError, KeyError, TypeError) as e:
            raise BmcError(host=host, reason=f"{operation}: malformed answer ({e!r})") from e

    def _reset_connection(self) -> None:
        with self._setup_lock:
            self._system = None

    def _sushy(self) -> sushy.Sushy:
        with self._setup_lock:
            if self._conn is None:
                connector = sushy_connector.Connector(
                    self._address.base_url,
                    verify=self._tls.requests_verify,
                    # Kiln retries with backoff itself; keep sushy's own
                    # retry loops to a single attempt.
                    server_side_retries=1,
                    server_side_retries_delay=0,
                    default_request_timeout=self._timeout,
                    connect_timeout=min(self._timeout, 5.0),
                )
                auth = sushy_auth.BasicAuth(
                    username=self._credentials.username, password=self._credentials.password
                )
                self._conn = sushy.Sushy(self._address.base_url, auth=auth, connector=connector)
                self._connector = connector
            return self._conn

    def _sys(self, refresh: bool = True) -> sushy_system.System:
        conn = self._sushy()
        system = self._system
        if system is None:
            system = conn.get_system(self._address.system_path)
            self._system = system
        elif refresh:
            system.refresh(force=True)
        return system

    def close(self) -> None:
        """Close the HTTP session. Never waits: while a call is connecting
        (sushy reads the service root under the set-up lock, perhaps from a
        BMC that never answers) there is no session yet to close."""
        if not self._setup_lock.acquire(blocking=False):
            LOG.debug(
                "node %s: Redfish %s is still connecting; nothing to close", self._node, self._label
            )
            return
        try:
            if self._connector is not None:
                with contextlib.suppress(Exception):
                    self._connector.close()
            self._conn = None
            self._connector = None
            self._system = None
        finally:
            self._setup_lock.release()

    # --- power --------------------------------------------------------------
    def power_state(self) -> PowerState:
        with self._edge("power state"):
            self._sushy()
            doc = self._connector.get(self._address.system_path).json()
            wire = doc.get("PowerState")
            if wire not in POWER_STATES:
                raise BmcError(host=self._label, reason=f"unknown PowerState {wire!r}")
            return POWER_STATES[wire]

    def power_action(self, action: PowerAction) -> None:
        with self._edge(f"power {action.value}"):
            self._sys().reset_system(RESET_TYPES[action])

    # --- boot ---------------------------------------------------------------
    def boot_get(self) -> BootOverride:
        with self._edge("get boot device"):
            boot = self._sys().boot
            enabled = boot.enabled
            target = boot.target
            if enabled in (None, sushy.BootSourceOverrideEnabled.DISABLED) or target is None:
                return BootOverride(BootDevice.NONE)
            device = BOOT_TARGETS_REV.get(target, BootDevice.OTHER)
            mode = BOOT_MODES_REV.get(boot.mode) if boot.mode else None
            return BootOverride(
                device, persistent=enabled == sushy.BootSourceOverrideEnabled.CONTINUOUS, mode=mode
            )

    def boot_set(self, device: BootDevice, persistent: bool, mode: BootMode | None) -> None:
        if device not in BOOT_TARGETS:
            raise NotSupported(f"boot from {device.value}")
        with self._edge(f"set boot device {device.value}"):
            enabled = (
                sushy.BootSourceOverrideEnabled.CONTINUOUS
                if persistent
                else sushy.BootSourceOverrideEnabled.ONCE
            )
            self._sys().set_system_boot_options(
                target=BOOT_TARGETS[device],
                enabled=enabled,
                mode=BOOT_MODES[mode] if mode else None,
            )

    # --- virtual media ------------------------------------------------------
    def _cd(self) -> Any:
        system = self._sys()
        collections = []
        with contextlib.suppress(sushy_exc.MissingAttributeError):
            collections.append(system.virtual_media)
        if not collections:
            for manager in system.managers:
                with contextlib.suppress(sushy_exc.MissingAttributeError):
                    collections.append(manager.virtual_media)
        for collection in collections:
            for member in collection.get_members():
                types = {t.value if hasattr(t, "value") else t for t in member.media_types or []}
                if types & {"CD", "DVD"} or not types:
                    return member
        raise NotSupported("virtual media (CD)")

    def vmedia_state(self) -> VirtualMediaState:
        with self._edge("virtual media state"):
            cd = self._cd()
            return VirtualMediaState(inserted=bool(cd.inserted), image_url=cd.image or None)

    def vmedia_insert(self, image_url: str) -> None:
        with self._edge("insert virtual media"):
            cd = self._cd()
            if cd.inserted and cd.image == image_url:
                return
            if cd.inserted:
                cd.eject_media()
                cd.refresh(force=True)
            cd.insert_media(image_url, inserted=True, write_protected=True)

    def vmedia_eject(self) -> None:
        with self._edge("eject virtual media"):
            cd = self._cd()
            if cd.inserted or cd.image:
                cd.eject_media()

    # --- BIOS ---------------------------------------------------------------
    def _bios(self) -> Any:
        try:
            return self._sys().bios
        except (sushy_exc.MissingAttributeError, sushy_exc.ResourceNotFoundError) as e:
            raise NotSupported("BIOS attributes") from e

    def bios_attributes(self) -> dict[str, Any]:
        with self._edge("BIOS attributes"):
            return dict(self._bios().attributes or {})

    def bios_pending(self) -> dict[str, Any]:
        with self._edge("BIOS attributes"):
            bios = self._bios()
            bios.refresh(force=True)
            return dict(bios.pending_attributes or {})

    def bios_set(self, attrs: Mapping[str, Any]) -> None:
        with self._edge("BIOS attributes"):
            self._bios().set_attributes(dict(attrs))

    # --- firmware -----------------------------------------------------------
    def _update_service(self) -> Any:
        try:
            return self._sushy().get_update_service()
        except (sushy_exc.MissingAttributeError, sushy_exc.ResourceNotFoundError) as e:
            raise NotSupported("firmware update") from e

    def firmware_inventory(self) -> list[FirmwareComponent]:
        """FirmwareInventory members; without one, the System's ``BiosVersion``."""
        with self._edge("firmware inventory"):
            try:
                members = self._update_service().firmware_inventory.get_members()
            except (
                NotSupported,
                sushy_exc.MissingAttributeError,
                sushy_exc.ResourceNotFoundError,
            ) as e:
                bios_version = self._sys().bios_version
                if not bios_version:
                    raise NotSupported("firmware inventory") from e
                return [
                    FirmwareComponent(
                        id="BIOS", name="BIOS", version=str(bios_version), target=self._sys().path
                    )
                ]
            return [
                FirmwareComponent(
                    id=m.identity, name=m.name or m.identity, version=m.version or "", target=m.path
                )
                for m in members
            ]

    def firmware_start(self, image_url: str, targets: list[str] | None) -> str | None:
        """Start SimpleUpdate; return a task monitor path or None when it finished at once."""
        with self._edge("firmware update"):
            monitor = self._update_service().simple_update(image_url, targets=targets)
            if monitor is None or not monitor.is_processing:
                self._check_monitor(monitor)
                return None
            return str(monitor.task_monitor_uri)

    def firmware_task_done(self, monitor_uri: str) -> bool:
        """True when the task finished successfully; raises BmcError when it failed."""
        with self._edge("firmware update"):
            monitor = self._sushy().get_task_monitor(monitor_uri)
            monitor.refresh()
            if monitor.is_processing:
                return False
            self._check_monitor(monitor)
            return True

    def _check_monitor(self, monitor: Any) -> None:
        task = getattr(monitor, "task", None) if monitor is not None else None
        if task is None:
            return
        state = getattr(task.task_state, "value", task.task_state)
        if state in TASK_FAILED:
            messages = "; ".join(str(m.message) for m in (task.messages or []) if m.message)
            raise BmcError(
                host=self._label, reason=f"firmware task {state}: {messages or 'no detail'}"
            )

    # --- sensors, inventory, logs --------------------------------------------
    def sensors(self) -> SensorReadings:
        with self._edge("sensors"):
            system = self._sys()
            temps: list[SensorReading] = []
            fans: list[SensorReading] = []
            watts: float | None = None
            for chassis in _safe_list(lambda: system.chassis):
                thermal = _safe(lambda c=chassis: c.thermal)
                if thermal is not None:
                    for t in thermal.temperatures or []:
                        temps.append(
                            SensorReading(
                                t.name or "temperature",
                                t.reading_celsius,
                                "C",
                                _health(t.status.health if t.status else None),
                            )
                        )
                    for f in thermal.fans or []:
                        units = getattr(f.reading_units, "value", f.reading_units) or ""
                        fans.append(
                            SensorReading(
                                f.name or "fan",
                                f.reading,
                                str(units),
                                _health(f.status.health if f.status else None),
                            )
                        )
                power = _safe(lambda c=chassis: c.power)
                if power is not None and watts is None:
                    for control in power.power_control or []:
                        if control.power_consumed_watts is not None:
                            watts = float(control.power_consumed_watts)
                            break
            health = _health(system.status.health if system.status else None)
            return SensorReadings(tuple(temps), tuple(fans), watts, health)

    def inventory(self) -> HardwareInventory:
        with self._edge("inventory"):
            system = self._sys()
            cpu_count = cpu_model = None
            summary = system.json.get("ProcessorSummary") or {}
            cpu_count = summary.get("Count")
            cpu_model = summary.get("Model")
            mem = (system.json.get("MemorySummary") or {}).get("TotalSystemMemoryGiB")
            nics: list[Nic] = []
            ifaces = _safe(lambda: system.ethernet_interfaces)
            if ifaces is not None:
                for member in _safe_list(ifaces.get_members):
                    nics.append(Nic(id=member.identity, mac=member.mac_address))
            return HardwareInventory(
                manufacturer=system.manufacturer,
                model=system.model,
                serial=system.serial_number,
                cpu_count=cpu_count,
                cpu_model=cpu_model,
                memory_gib=float(mem) if mem is not None else None,
                nics=tuple(nics),
            )

    def log_entries(self) -> list[LogEntry]:
        with self._edge("event log"):
            system = self._sys()
            link = (system.json.get("LogServices") or {}).get("@odata.id")
            if not link:
                raise NotSupported("event log")
            entries: list[LogEntry] = []
            services = self._connector.get(link).json().get("Members", [])
            for ref in services:
                service = self._connector.get(ref["@odata.id"]).json()
                entries_link = (service.get("Entries") or {}).get("@odata.id")
                if not entries_link:
                    continue
                for raw in self._connector.get(entries_link).json().get("Members", []):
                    if "Message" not in raw and "@odata.id" in raw:
                        raw = self._connector.get(raw["@odata.id"]).json()
                    entries.append(_log_entry(raw))
            return entries


def _log_entry(raw: Mapping[str, Any]) -> LogEntry:
    created = None
    if raw.get("Created"):
        with contextlib.suppress(ValueError):
            created = datetime.fromisoformat(str(raw["Created"]).replace("Z", "+00:00"))
    return LogEntry(
        id=str(raw.get("Id", "")),
        message=str(raw.get("Message", "")),
        severity=HEALTH.get(raw.get("Severity"), Health.UNKNOWN),
        created=created,
    )


def _safe(get: Any) -> Any:
    """Optional sub-resources: absent or 404/500 means "not reported"."""
    try:
        return get()
    except (sushy_exc.MissingAttributeError, sushy_exc.HTTPError):
        return None


def _safe_list(get: Any) -> list[Any]:
    value = _safe(get)
    return list(value) if value else []


def _tls_reason(text: str) -> str:
    """The useful part of a requests SSL error ("certificate verify failed: ...")."""
    marker = "certificate verify failed"
    index = text.find(marker)
    return text[index:].split("'")[0].rstrip(")") if index >= 0 else text


_CONNECTION_CAUSES = (
    "Connection refused",
    "Connection reset",
    "No route to host",
    "Network is unreachable",
    "Name or service not known",
    "Temporary failure in name resolution",
    "Remote end closed connection without response",
)


def _connection_reason(text: str) -> str:
    """The root cause of a requests connection error ("Connection refused"),
    not the whole urllib3 chain; the chain itself when no cause is known."""
    return next((cause.lower() for cause in _CONNECTION_CAUSES if cause in text), text)


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- registry hooks (controller/bmc/registry.py) ------------------------------
def check_path(path: str) -> str:
    """A Redfish BMC URL names one ComputerSystem; return its path.

    Raises:
        InvalidArgument: the path is not ``/redfish/v1/Systems/<id>``.
    """
    if not _SYSTEM_PATH.match(path):
        raise InvalidArgument(
            f"Redfish BMC URL path must be /redfish/v1/Systems/<id> (got {path or '/'!r})"
        )
    return path


def validate_credentials(username: str, password: str) -> None:
    """Redfish itself limits neither; a BMC's own policy answers at login."""


def make_driver(
    address: BmcAddress,
    credentials: BmcCredentials,
    tls: TlsOptions,
    *,
    request_timeout: float,
    node: str,
) -> RedfishDriver:
    """The registry's factory (no I/O: sushy connects on first use)."""
    return RedfishDriver(address, credentials, tls, request_timeout=request_timeout, node=node)
