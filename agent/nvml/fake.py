"""``FakeNvml``: a faithful, per-node fake of the NVML calls the agent makes.

Same function names, signatures, return shapes (pynvml's ctypes structures)
and error classes (``pynvml.NVMLError(code)``) as the real library, modelled on
real H100 / H200 / GB200 parts (:mod:`agent.nvml.parts`). Behaviour worth
knowing:

* Every call before ``nvmlInit`` raises Uninitialized; init is ref-counted.
* Setters need root (``root=False`` → NoPermission).
* A GPU that fell off the bus answers GPU_IS_LOST to every device call.
* MIG mode set while processes hold the GPU stays pending and SetMigMode
  returns the activation status ``NVML_ERROR_IN_USE`` instead of raising; a
  simulated GPU reset (refused with InUse while processes are attached)
  applies it. GPU instances are placed first-fit over the real placement
  slots; INSUFFICIENT_RESOURCES when none is free.
* Remapped rows are NOT_SUPPORTED while MIG instances exist; retired pages
  always (Hopper and later).
* Clock locks snap to the 15 MHz ladder. A driver reload or reboot forgets
  locks, power limit and persistence mode.
* Each XID is delivered once by ``nvmlEventSetWait``; then it times out
  (waiting in real time on a condition variable).

State is per object and guarded by one lock, so many fake nodes can live in
one process and be driven from several threads. Faults and lifecycle events
are injected through :attr:`FakeNvml.faults` (:class:`agent.nvml.faults.FaultInjector`).
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
import time
import uuid as uuidlib
from collections.abc import Callable
from typing import Any

import pynvml

from agent.nvml import fake_state as fs
from agent.nvml.fake_mig import FakeMigMixin
from agent.nvml.parts import PartSpec

__all__ = ["FakeNvml"]

_NO_ID = 0xFFFFFFFF
_SUPPORTED_EVENTS = (
    pynvml.nvmlEventTypeSingleBitEccError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypePState
    | pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeClock
)
_MIB = 1024 * 1024


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def _out(ref: Any) -> Any:
    """The ctypes object behind ``byref(x)``, ``pointer(x)`` or ``x`` itself."""
    obj = getattr(ref, "_obj", None)
    if obj is not None:
        return obj
    contents = getattr(ref, "contents", None)
    return contents if contents is not None else ref


class FakeNvml(FakeMigMixin):
    """One simulated node's NVML. Satisfies :class:`agent.nvml.backend.NvmlBackend`."""

    def __init__(
        self,
        part: PartSpec,
        *,
        node_name: str = "node",
        cluster_uuid: str | None = None,
        clique_id: int = 0,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
        root: bool = True,
        gpu_count: int | None = None,
    ) -> None:
        from agent.nvml.faults import FaultInjector

        self.part = part
        self.node_name = node_name
        self.clock = clock
        self.root = root
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._refcount = 0
        self._event_sets: dict[int, fs.EventSetState] = {}
        self._next_event_set = 1
        count = part.gpus_per_node if gpu_count is None else gpu_count
        if part.multi_node_fabric:
            raw = cluster_uuid or str(
                uuidlib.UUID(bytes=self._digest(f"cluster:{node_name}:{seed}")[:16])
            )
            self.cluster_uuid: uuidlib.UUID | None = uuidlib.UUID(raw)
            self.clique_id = clique_id
        else:
            self.cluster_uuid = None
            self.clique_id = 0
        now = clock()
        self.gpus: list[fs.GpuState] = []
        for i in range(count):
            d = self._digest(f"{node_name}:{seed}:{i}")
            serial = str(int.from_bytes(d[16:24], "big"))[:13].rjust(13, "1")
            jitter = (d[24] % 40) / 10.0
            self.gpus.append(
                fs.GpuState(
                    index=i,
                    uuid=f"GPU-{uuidlib.UUID(bytes=d[:16])}",
                    serial=serial,
                    bus_id=part.bus_ids[i % len(part.bus_ids)],
                    part=part,
                    heat=fs.HeatCurve(part.idle_temp_c + jitter, part.idle_temp_c + jitter, 0, now),
                )
            )
        self.faults = FaultInjector(self)

    def __repr__(self) -> str:
        return f"FakeNvml(part={self.part.key!r}, node={self.node_name!r}, gpus={len(self.gpus)})"

    @staticmethod
    def _digest(text: str) -> bytes:
        return hashlib.sha256(text.encode()).digest()

    # -- internal helpers (also used by FaultInjector) -------------------
    def _check_init(self) -> None:
        if self._refcount <= 0:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)

    def _check_root(self) -> None:
        if not self.root:
            raise _err(pynvml.NVML_ERROR_NO_PERMISSION)

    def _gpu(self, handle: Any, *, allow_lost: bool = False) -> fs.GpuState:
        self._check_init()
        decoded = fs.decode_handle(handle, fs.KIND_DEVICE)
        if decoded is None or decoded[0] >= len(self.gpus):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[decoded[0]]
        if gpu.lost and not allow_lost:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def _gi(self, handle: Any) -> tuple[fs.GpuState, fs.GpuInstanceState]:
        self._check_init()
        decoded = fs.decode_handle(handle, fs.KIND_GPU_INSTANCE)
        if decoded is None or decoded[0] >= len(self.gpus):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[decoded[0]]
        if gpu.lost:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        gi = gpu.gis.get(decoded[1])
        if gi is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, gi

    def _temp(self, gpu: fs.GpuState) -> float:
        return gpu.heat.at(self.clock())

    def _emit(self, gpu: int, event_type: int, data: int) -> None:
        """Queue an event for every event set that registered ``gpu`` for it."""
        with self._cond:
            for es in self._event_sets.values():
                if es.masks.get(gpu, 0) & event_type:
                    es.queue.append((gpu, event_type, data))
            self._cond.notify_all()

    def _drop_sessions(self) -> None:
        """A reboot or driver reload ends every NVML session and event set."""
        with self._cond:
            self._refcount = 0
            self._event_sets.clear()
            self._cond.notify_all()

    # -- lifecycle and system ----------------------------------------------
    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlInitWithFlags(self, flags: int) -> None:
        with self._lock:
            self._refcount += 1

    def nvmlShutdown(self) -> None:
        with self._lock:
            self._check_init()
            self._refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        with self._lock:
            self._check_init()
            return self.part.driver_version

    # -- identity ----------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        with self._lock:
            self._check_init()
            return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        with self._lock:
            self._check_init()
            if not 0 <= index < len(self.gpus):
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return fs.make_handle(fs.KIND_DEVICE, index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        with self._lock:
            self._check_init()
            text = uuid.decode() if isinstance(uuid, bytes) else uuid
            for gpu in self.gpus:
                if gpu.uuid == text:
                    if gpu.lost:
                        raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
                    return fs.make_handle(fs.KIND_DEVICE, gpu.index)
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        with self._lock:
            return self._gpu(handle).index

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        with self._lock:
            return self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        with self._lock:
            return self._gpu(handle).part.name

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        with self._lock:
            return self._gpu(handle).serial

    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> Any:
        with self._lock:
            gpu = self._gpu(handle)
            domain, bus, rest = gpu.bus_id.split(":")
            info = pynvml.nvmlPciInfo_t()
            info.busIdLegacy = gpu.bus_id[-12:].encode()
            info.busId = gpu.bus_id.encode()
            info.domain = int(domain, 16)
            info.bus = int(bus, 16)
            info.device = int(rest.split(".")[0], 16)
            info.pciDeviceId = gpu.part.pci_device_id
            info.pciSubSystemId = gpu.part.pci_subsystem_id
            return info

    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:
        with self._lock:
            return self._gpu(handle).part.architecture

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        with self._lock:
            gpu = self._gpu(handle)
            total = gpu.part.memory_mib * _MIB
            reserved = 512 * _MIB
            used = reserved + len(gpu.processes) * 1024 * _MIB
            if version:
                mem2 = pynvml.c_nvmlMemory_v2_t()
                mem2.version = version
                mem2.total, mem2.reserved = total, reserved
                mem2.used, mem2.free = used - reserved, total - used
                return mem2
            mem = pynvml.c_nvmlMemory_t()
            mem.total, mem.used, mem.free = total, used, total - used
            return mem

    # -- thermal -------------------------------------------------------------
    def nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int) -> int:
        return self.nvmlDeviceGetTemperature(handle, sensor)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        with self._lock:
            gpu = self._gpu(handle)
            if sensor != pynvml.NVML_TEMPERATURE_GPU:
                raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return round(self._temp(gpu))

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        with self._lock:
            part = self._gpu(handle).part
            table = {
                pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: part.shutdown_c,
                pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: part.slowdown_c,
                pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: part.mem_max_c,
                pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: part.gpu_max_c,
            }
            if threshold not in table:
                raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return table[threshold]

    # -- power (mW) ------------------------------------------------------------
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        with self._lock:
            gpu = self._gpu(handle)
            return int(min(gpu.draw_w() * 1000, gpu.power_limit_mw))

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        with self._lock:
            return self._gpu(handle).power_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        with self._lock:
            part = self._gpu(handle).part
            return [part.power_min_w * 1000, part.power_max_w * 1000]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        with self._lock:
            return self._gpu(handle).part.power_default_w * 1000

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        with self._lock:
            return self._gpu(handle).power_limit_mw

    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit: int) -> None:
        with self._lock:
            gpu = self._gpu(handle)
            self._check_root()
            if not gpu.part.power_min_w * 1000 <= limit <= gpu.part.power_max_w * 1000:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            gpu.power_limit_mw = int(limit)

    # -- clocks ----------------------------------------------------------------
    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        with self._lock:
            gpu = self._gpu(handle)
            sm, _ = gpu.clocks_and_reasons(self._temp(gpu))
            if type in (pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM):
                return sm
            if type == pynvml.NVML_CLOCK_MEM:
                return gpu.mem_lock[1] if gpu.mem_lock else gpu.part.mem_mhz
            if type == pynvml.NVML_CLOCK_VIDEO:
                return min(sm, 1755)
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        with self._lock:
            part = self._gpu(handle).part
            if type in (pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM):
                return part.sm_max_mhz
            if type == pynvml.NVML_CLOCK_MEM:
                return part.mem_mhz
            if type == pynvml.NVML_CLOCK_VIDEO:
                return 1755
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: Any) -> list[int]:
        with self._lock:
            return [self._gpu(handle).part.mem_mhz]

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: Any, memoryClockMHz: int) -> list[int]:
        with self._lock:
            gpu = self._gpu(handle)
            if memoryClockMHz != gpu.part.mem_mhz:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return gpu.sm_ladder()

    def nvmlDeviceSetGpuLockedClocks(
        self, handle: Any, minGpuClockMHz: int, maxGpuClockMHz: int
    ) -> None:
        with self._lock:
            gpu = self._gpu(handle)
            self._check_root()
            if minGpuClockMHz > maxGpuClockMHz or minGpuClockMHz < 0:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            gpu.sm_lock = (gpu.snap_sm(minGpuClockMHz), gpu.snap_sm(maxGpuClockMHz))

    def nvmlDeviceResetGpuLockedClocks(self, handle: Any) -> None:
        with self._lock:
            gpu = self._gpu(handle)
            self._check_root()
            gpu.sm_lock = None

    def nvmlDeviceSetMemoryLockedClocks(
        self, handle: Any, minMemClockMHz: int, maxMemClockMHz: int
    ) -> None:
        with self._lock:
            gpu = self._gpu(handle)
            self._check_root()
            if minMemClockMHz > maxMemClockMHz or minMemClockMHz < 0:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            # HBM parts support one memory clock: every request snaps to it.
            gpu.mem_lock = (gpu.part.mem_mhz, gpu.part.mem_mhz)

    def nvmlDeviceResetMemoryLockedClocks(self, handle: Any) -> None:
        with self._lock:
            gpu = self._gpu(handle)
            self._check_root()
            gpu.mem_lock = None

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        with self._lock:
            gpu = self._gpu(handle)
            return gpu.clocks_and_reasons(self._temp(gpu))[1]

    # -- persistence -------------------------------------------------------------
    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        with self._lock:
            return int(self._gpu(handle).persistence)

    def nvmlDeviceSetPersistenceMode(self, handle: Any, mode: int) -> None:
        with self._lock:
            gpu = self._gpu(handle)
            self._check_root()
            if mode not in (pynvml.NVML_FEATURE_DISABLED, pynvml.NVML_FEATURE_ENABLED):
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            gpu.persistence = mode == pynvml.NVML_FEATURE_ENABLED

    # -- ECC, remapping, field values ------------------------------------------
    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        with self._lock:
            self._gpu(handle)
            return [pynvml.NVML_FEATURE_ENABLED, pynvml.NVML_FEATURE_ENABLED]

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        with self._lock:
            gpu = self._gpu(handle)
            table = {
                (0, 0): gpu.sbe_volatile,
                (0, 1): gpu.sbe_aggregate,
                (1, 0): gpu.dbe_volatile,
                (1, 1): gpu.dbe_aggregate,
            }
            if (errorType, counterType) not in table:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return table[(errorType, counterType)]

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        with self._lock:
            gpu = self._gpu(device)
            if gpu.gis:
                raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return (
                gpu.remap_correctable,
                gpu.remap_uncorrectable,
                int(gpu.remap_pending),
                int(gpu.remap_failure),
            )

    def nvmlDeviceGetRetiredPages(self, device: Any, sourceFilter: int) -> list[int]:
        with self._lock:
            self._gpu(device)
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[Any]) -> Any:
        with self._lock:
            gpu = self._gpu(handle)
            values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
            now_us = int(time.time() * 1e6)
            for i, fid in enumerate(fieldIds):
                field_id, scope = fid if isinstance(fid, tuple) else (fid, 0)
                v = values[i]
                v.fieldId, v.scopeId, v.timestamp = field_id, scope, now_us
                v.nvmlReturn = pynvml.NVML_SUCCESS
                if field_id == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                    v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                    v.value.uiVal = gpu.recovery_action
                elif field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
                    v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                    v.value.uiVal = round(self._temp(gpu) + 4)
                elif field_id == pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT:
                    v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                    v.value.uiVal = gpu.part.nvlinks
                else:
                    v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            return values

    # -- events --------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> Any:
        with self._lock:
            self._check_init()
            es = fs.EventSetState(self._next_event_set)
            self._next_event_set += 1
            self._event_sets[es.id] = es
            return fs.make_handle(fs.KIND_EVENT_SET, es.id)

    def _event_set(self, handle: Any) -> fs.EventSetState:
        self._check_init()
        decoded = fs.decode_handle(handle, fs.KIND_EVENT_SET)
        es = self._event_sets.get(decoded[0]) if decoded else None
        if es is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return es

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        with self._lock:
            gpu = self._gpu(handle)
            es = self._event_set(eventSet)
            if eventTypes & ~_SUPPORTED_EVENTS:
                raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
            es.masks[gpu.index] = es.masks.get(gpu.index, 0) | eventTypes

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        with self._lock:
            self._gpu(handle)
            return _SUPPORTED_EVENTS

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        deadline = time.monotonic() + max(timeoutms, 0) / 1000.0
        with self._cond:
            while True:
                es = self._event_set(eventSet)
                if es.queue:
                    gpu, event_type, data = es.queue.popleft()
                    event = pynvml.c_nvmlEventData_t()
                    event.device = fs.make_handle(fs.KIND_DEVICE, gpu)
                    event.eventType, event.eventData = event_type, data
                    event.gpuInstanceId = event.computeInstanceId = _NO_ID
                    return event
                if any(self.gpus[g].lost for g in es.masks):
                    raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _err(pynvml.NVML_ERROR_TIMEOUT)
                self._cond.wait(remaining)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        with self._cond:
            es = self._event_set(eventSet)
            del self._event_sets[es.id]
            self._cond.notify_all()

    # -- NVLink and fabric -----------------------------------------------------------
    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        with self._lock:
            gpu = self._gpu(device)
            if not 0 <= link < gpu.part.nvlinks:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if link in gpu.nvlink_down:
                return pynvml.NVML_FEATURE_DISABLED
            return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, device: Any, link: int, counter: int) -> int:
        with self._lock:
            gpu = self._gpu(device)
            if not 0 <= link < gpu.part.nvlinks or not 0 <= counter < 5:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return gpu.nvlink_errors.get((link, counter), 0)

    def nvmlDeviceGetGpuFabricInfoV(self, device: Any, gpuFabricInfo: Any) -> int:
        with self._lock:
            gpu = self._gpu(device)
            info = _out(gpuFabricInfo)
            raw = self.cluster_uuid.bytes if self.cluster_uuid else bytes(16)
            ctypes.memmove(info.clusterUuid, raw, 16)
            info.status = pynvml.NVML_SUCCESS
            info.cliqueId = self.clique_id
            info.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
            info.healthMask = gpu.fabric_health_mask()
            if hasattr(info, "healthSummary"):
                if not gpu.part.multi_node_fabric:
                    info.healthSummary = pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED
                elif gpu.fabric_degraded:
                    info.healthSummary = pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY
                else:
                    info.healthSummary = pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
            return pynvml.NVML_SUCCESS

    # -- processes -----------------------------------------------------------------
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        with self._lock:
            gpu = self._gpu(handle)
            out = []
            for pid in gpu.processes:
                info = pynvml.c_nvmlProcessInfo_v3_t()
                info.pid, info.usedGpuMemory = pid, 1024 * _MIB
                info.gpuInstanceId = info.computeInstanceId = _NO_ID
                out.append(pynvml.nvmlStructToFriendlyObject(info))
            return out

    # -- lifecycle simulation (see FaultInjector for the details) -------------
    def reboot(self) -> None:
        """Simulate a node reboot; NVML must be initialised again afterwards."""
        self.faults.reboot()

    def driver_reload(self) -> None:
        """Simulate a driver reload (InUse while processes run)."""
        self.faults.driver_reload()

    def gpu_reset(self, gpu: int) -> None:
        """Simulate ``nvidia-smi -r -i gpu`` (InUse while processes hold the GPU)."""
        self.faults.gpu_reset(gpu)
