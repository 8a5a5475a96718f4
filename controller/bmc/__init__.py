"""Kiln's BMC layer: Redfish (sushy) and IPMI (pyghmi) behind small async
capability interfaces, with timeouts, retries, per-BMC breakers and bulk
operations. Only this package imports sushy or pyghmi."""

from controller.bmc.address import BmcAddress, BmcCredentials, TlsOptions, parse_bmc_url
from controller.bmc.fleet import BulkProgress, BulkResult, NodeOutcome, run_bulk
from controller.bmc.handle import Bmc
from controller.bmc.pool import BmcPool
from controller.bmc.resilience import RetryPolicy
from controller.bmc.types import (
    BmcHealth,
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

__all__ = [
    "Bmc",
    "BmcAddress",
    "BmcCredentials",
    "BmcHealth",
    "BmcPool",
    "BootDevice",
    "BootMode",
    "BootOverride",
    "BulkProgress",
    "BulkResult",
    "FirmwareComponent",
    "HardwareInventory",
    "Health",
    "LeakDetectorReading",
    "LogEntry",
    "NodeOutcome",
    "PowerAction",
    "PowerState",
    "RetryPolicy",
    "SensorReading",
    "SensorReadings",
    "TlsOptions",
    "VirtualMediaState",
    "parse_bmc_url",
    "run_bulk",
]
