"""Sample GPU health through an NVML backend.

:class:`HealthSampler` reads temperatures and thresholds, power, clocks and
their event reasons, ECC counters, remapped rows, NVLink and fabric state, the
recovery-action field, and the XIDs that arrived since the previous sample
(collected from an NVML event set, drained without waiting). A reading that
fails is ``None`` and its error is listed in ``GpuHealth.errors`` — never
invented. ``sample()`` blocks on NVML; ``asample()`` runs it in a worker
thread so the event loop never blocks. NVML must be initialised.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import pynvml

from agent.gpu_inventory import clique_from_fabric
from agent.nvml.backend import NvmlBackend

__all__ = ["GpuHealth", "HealthSampler", "NodeHealth", "fabric_healthy"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_U64_MAX = 2**64 - 1  # the report's uint64 fields
_NVLINK_COUNTERS = (
    pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
    pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
    pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
)
_FIELDS = [pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's readings. ``xids`` are those seen since the previous sample."""

    index: int
    uuid: str
    lost: bool
    temp_c: float | None
    mem_temp_c: float | None
    slowdown_c: float | None
    shutdown_c: float | None
    gpu_max_c: float | None
    power_w: float | None
    power_limit_w: float | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    clock_event_reasons: int
    ecc_sbe_volatile: int
    ecc_dbe_volatile: int
    ecc_sbe_aggregate: int
    ecc_dbe_aggregate: int
    remap_correctable: int | None
    remap_uncorrectable: int | None
    remap_pending: bool | None
    remap_failure: bool | None
    xids: tuple[int, ...]
    nvlink_down: tuple[int, ...]
    nvlink_errors: int
    fabric_state: int
    fabric_healthy: bool
    clique: str
    recovery_action: int
    errors: tuple[str, ...]


@dataclass(frozen=True)
class NodeHealth:
    """Health of every GPU on the node, in NVML index order."""

    gpus: tuple[GpuHealth, ...]


def _mask_field(mask: int, shift: int) -> int:
    return (mask >> shift) & 0x3


def fabric_healthy(info: Any) -> bool:
    """Whether fabric info shows a usable fabric (or none to be unhealthy).

    Not supported → healthy (no fabric). Otherwise registration must be
    complete and successful and the health mask must not flag degraded
    bandwidth or an unhealthy route.
    """
    if info.state == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
        return True
    if info.state != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED or info.status != pynvml.NVML_SUCCESS:
        return False
    mask = int(info.healthMask)
    degraded = _mask_field(mask, pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW)
    unhealthy = _mask_field(mask, pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY)
    return (
        degraded != pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE
        and unhealthy != pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE
    )


class _Reader:
    """Runs one reading, turning an NVMLError into None plus an error string."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.lost = False

    def __call__(self, what: str, fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except pynvml.NVMLError as e:
            self.lost = self.lost or isinstance(e, pynvml.NVMLError_GpuIsLost)
            if not any(x.startswith(f"{what}: ") for x in self.errors):
                self.errors.append(f"{what}: {e}")
            return None


def _address(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


class HealthSampler:
    """Samples a node's GPU health; keeps the XID event set between samples.

    Thread-safe: concurrent ``sample()`` calls are serialised.
    """

    def __init__(self, nvml: NvmlBackend) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()
        self._event_set: Any = None
        self._by_address: dict[int, int] = {}
        self._uuids: dict[int, str] = {}
        self._links: dict[int, int] = {}

    def __repr__(self) -> str:
        return f"HealthSampler({self._nvml!r})"

    async def asample(self) -> NodeHealth:
        """:meth:`sample` in a worker thread."""
        return await asyncio.to_thread(self.sample)

    def close(self) -> None:
        """Free the event set (best effort). Blocking."""
        with self._lock:
            self._drop_event_set()

    def sample(self) -> NodeHealth:
        """Read every GPU once. Blocking; raises NVMLError only if the GPU count cannot be read."""
        with self._lock:
            count = self._nvml.nvmlDeviceGetCount()
            xids = self._drain_xids(count)
            return NodeHealth(tuple(self._sample_gpu(i, xids.get(i, [])) for i in range(count)))

    # -- XID events --------------------------------------------------------------
    def _drop_event_set(self) -> None:
        if self._event_set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._event_set)
            except pynvml.NVMLError:
                pass
        self._event_set = None
        self._by_address.clear()

    def _ensure_event_set(self, count: int) -> None:
        if self._event_set is not None:
            return
        self._event_set = self._nvml.nvmlEventSetCreate()
        for i in range(count):
            try:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(i)
                self._nvml.nvmlDeviceRegisterEvents(
                    handle, pynvml.nvmlEventTypeXidCriticalError, self._event_set
                )
                self._by_address[_address(handle)] = i
            except pynvml.NVMLError as e:
                log.warning("cannot watch XIDs on GPU %s: %s", i, e)

    def _drain_xids(self, count: int) -> dict[int, list[int]]:
        """Collect queued XID events without waiting (timeout 0)."""
        out: dict[int, list[int]] = {}
        try:
            self._ensure_event_set(count)
        except pynvml.NVMLError as e:
            log.warning("cannot create an NVML event set: %s", e)
            return out
        while True:
            try:
                event = self._nvml.nvmlEventSetWait(self._event_set, 0)
            except (pynvml.NVMLError_Timeout, pynvml.NVMLError_GpuIsLost):
                return out
            except pynvml.NVMLError as e:
                # The set went stale (driver reload, re-init): start a new one next time.
                log.info("XID event set dropped: %s", e)
                self._drop_event_set()
                return out
            if event.eventType & pynvml.nvmlEventTypeXidCriticalError:
                index = self._by_address.get(_address(event.device))
                if index is not None:
                    out.setdefault(index, []).append(int(event.eventData))

    # -- per-GPU readings ------------------------------------------------------------
    def _sample_gpu(self, index: int, xids: list[int]) -> GpuHealth:
        nvml = self._nvml
        read = _Reader()
        handle = read("handle", lambda: nvml.nvmlDeviceGetHandleByIndex(index))
        uuid = read("uuid", lambda: str(nvml.nvmlDeviceGetUUID(handle))) if handle else None
        if uuid is None:
            return self._unreadable(index, read.lost, xids, read.errors)
        self._uuids[index] = uuid
        h = handle

        def thr(t: int) -> float | None:
            v = read("temperature threshold", lambda: nvml.nvmlDeviceGetTemperatureThreshold(h, t))
            return None if v is None else float(v)

        temp = read("temperature", lambda: self._temperature(h))
        power = read("power usage", lambda: nvml.nvmlDeviceGetPowerUsage(h))
        limit = read("power limit", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h))
        reasons = read(
            "clock event reasons", lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        )
        remap = read("remapped rows", lambda: nvml.nvmlDeviceGetRemappedRows(h))
        mem_temp, recovery = self._fields(h, read)
        down, nvlink_errors = self._nvlinks(index, h, read)
        fabric = pynvml.c_nvmlGpuFabricInfoV_t()
        got_fabric = read(
            "fabric", lambda: nvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(fabric))
        )
        return GpuHealth(
            index=index,
            uuid=uuid,
            lost=False,
            temp_c=None if temp is None else float(temp),
            mem_temp_c=mem_temp,
            slowdown_c=thr(pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
            shutdown_c=thr(pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
            gpu_max_c=thr(pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX),
            power_w=None if power is None else power / 1000.0,
            power_limit_w=None if limit is None else limit / 1000.0,
            sm_clock_mhz=read(
                "SM clock", lambda: nvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
            ),
            mem_clock_mhz=read(
                "memory clock", lambda: nvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)
            ),
            clock_event_reasons=int(reasons or 0),
            **self._ecc(h, read),
            remap_correctable=None if remap is None else int(remap[0]),
            remap_uncorrectable=None if remap is None else int(remap[1]),
            remap_pending=None if remap is None else bool(remap[2]),
            remap_failure=None if remap is None else bool(remap[3]),
            xids=tuple(xids),
            nvlink_down=tuple(down),
            nvlink_errors=nvlink_errors,
            fabric_state=int(fabric.state) if got_fabric is not None else 0,
            fabric_healthy=fabric_healthy(fabric) if got_fabric is not None else True,
            clique=clique_from_fabric(fabric) if got_fabric is not None else "",
            recovery_action=recovery or 0,
            errors=tuple(read.errors),
        )

    def _unreadable(self, index: int, lost: bool, xids: list[int], errors: list[str]) -> GpuHealth:
        return GpuHealth(
            index=index,
            uuid=self._uuids.get(index, ""),
            lost=lost,
            temp_c=None,
            mem_temp_c=None,
            slowdown_c=None,
            shutdown_c=None,
            gpu_max_c=None,
            power_w=None,
            power_limit_w=None,
            sm_clock_mhz=None,
            mem_clock_mhz=None,
            clock_event_reasons=0,
            ecc_sbe_volatile=0,
            ecc_dbe_volatile=0,
            ecc_sbe_aggregate=0,
            ecc_dbe_aggregate=0,
            remap_correctable=None,
            remap_uncorrectable=None,
            remap_pending=None,
            remap_failure=None,
            xids=tuple(xids),
            nvlink_down=(),
            nvlink_errors=0,
            fabric_state=0,
            fabric_healthy=False,
            clique="",
            recovery_action=0,
            errors=tuple(errors),
        )

    def _temperature(self, h: Any) -> int:
        try:
            return int(self._nvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU))
        except pynvml.NVMLError_FunctionNotFound:
            return int(self._nvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))

    def _ecc(self, h: Any, read: _Reader) -> dict[str, int]:
        out: dict[str, int] = {}
        for name, err, counter in (
            ("ecc_sbe_volatile", 0, pynvml.NVML_VOLATILE_ECC),
            ("ecc_dbe_volatile", 1, pynvml.NVML_VOLATILE_ECC),
            ("ecc_sbe_aggregate", 0, pynvml.NVML_AGGREGATE_ECC),
            ("ecc_dbe_aggregate", 1, pynvml.NVML_AGGREGATE_ECC),
        ):
            value = read(
                name.replace("_", " "),
                partial(self._nvml.nvmlDeviceGetTotalEccErrors, h, err, counter),
            )
            out[name] = int(value or 0)
        return out

    def _fields(self, h: Any, read: _Reader) -> tuple[float | None, int | None]:
        values = read("field values", lambda: self._nvml.nvmlDeviceGetFieldValues(h, _FIELDS))
        if values is None:
            return None, None
        mem_temp: float | None = None
        recovery: int | None = None
        for v in values:
            if v.nvmlReturn != pynvml.NVML_SUCCESS:
                what = "memory temperature" if v.fieldId == _FIELDS[0] else "recovery action"
                read.errors.append(f"{what}: {pynvml.NVMLError(v.nvmlReturn)}")
            elif v.fieldId == pynvml.NVML_FI_DEV_MEMORY_TEMP:
                mem_temp = float(v.value.uiVal)
            else:
                recovery = int(v.value.uiVal)
        return mem_temp, recovery

    def _nvlinks(self, index: int, h: Any, read: _Reader) -> tuple[list[int], int]:
        """Down links and the sum of DL error counters over the GPU's links."""
        links = self._links.get(index)
        down: list[int] = []
        errors = 0
        link = 0
        while links is None or link < links:
            if link >= pynvml.NVML_NVLINK_MAX_LINKS:
                break
            try:
                state = self._nvml.nvmlDeviceGetNvLinkState(h, link)
            except (pynvml.NVMLError_InvalidArgument, pynvml.NVMLError_NotSupported):
                break
            except pynvml.NVMLError as e:
                read.errors.append(f"nvlink {link}: {e}")
                break
            if state != pynvml.NVML_FEATURE_ENABLED:
                down.append(link)
            for counter in _NVLINK_COUNTERS:
                n = read(
                    "nvlink error counters",
                    partial(self._nvml.nvmlDeviceGetNvLinkErrorCounter, h, link, counter),
                )
                errors = min(errors + int(n or 0), _U64_MAX)  # a sum of 64-bit counters
            link += 1
        self._links[index] = link if links is None else links
        return down, errors
