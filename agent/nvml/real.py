"""``RealNvml``: the NVML backend that delegates to the ``pynvml`` module.

Every method is pynvml's function of the same name; errors are pynvml's own
``NVMLError`` subclasses. All calls block on the driver: use a worker thread.
The object holds no state, so several may exist in one process (NVML itself
reference-counts ``nvmlInit``/``nvmlShutdown``).
"""

from __future__ import annotations

from typing import Any

import pynvml

__all__ = ["RealNvml"]


class RealNvml:
    """Thin delegation to pynvml; satisfies :class:`agent.nvml.backend.NvmlBackend`."""

    def __repr__(self) -> str:
        return "RealNvml()"

    def nvmlInit(self) -> None:
        return pynvml.nvmlInit()

    def nvmlShutdown(self) -> None:
        return pynvml.nvmlShutdown()

    def nvmlSystemGetDriverVersion(self) -> str:
        return pynvml.nvmlSystemGetDriverVersion()

    def nvmlDeviceGetCount(self) -> int:
        return pynvml.nvmlDeviceGetCount()

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return pynvml.nvmlDeviceGetHandleByIndex(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        return pynvml.nvmlDeviceGetHandleByUUID(uuid)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return pynvml.nvmlDeviceGetIndex(handle)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return pynvml.nvmlDeviceGetUUID(handle)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return pynvml.nvmlDeviceGetName(handle)

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        return pynvml.nvmlDeviceGetSerial(handle)

    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> Any:
        return pynvml.nvmlDeviceGetPciInfo_v3(handle)

    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:
        return pynvml.nvmlDeviceGetArchitecture(handle)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        return pynvml.nvmlDeviceGetMemoryInfo(handle, version)

    def nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int) -> int:
        return pynvml.nvmlDeviceGetTemperatureV(handle, sensor)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return pynvml.nvmlDeviceGetTemperature(handle, sensor)

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        return pynvml.nvmlDeviceGetTemperatureThreshold(handle, threshold)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return pynvml.nvmlDeviceGetPowerUsage(handle)

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        return pynvml.nvmlDeviceGetPowerManagementLimit(handle)

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        return pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        return pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return pynvml.nvmlDeviceGetEnforcedPowerLimit(handle)

    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit: int) -> None:
        return pynvml.nvmlDeviceSetPowerManagementLimit(handle, limit)

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        return pynvml.nvmlDeviceGetClockInfo(handle, type)

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        return pynvml.nvmlDeviceGetMaxClockInfo(handle, type)

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: Any) -> list[int]:
        return pynvml.nvmlDeviceGetSupportedMemoryClocks(handle)

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: Any, memoryClockMHz: int) -> list[int]:
        return pynvml.nvmlDeviceGetSupportedGraphicsClocks(handle, memoryClockMHz)

    def nvmlDeviceSetGpuLockedClocks(
        self, handle: Any, minGpuClockMHz: int, maxGpuClockMHz: int
    ) -> None:
        return pynvml.nvmlDeviceSetGpuLockedClocks(handle, minGpuClockMHz, maxGpuClockMHz)

    def nvmlDeviceResetGpuLockedClocks(self, handle: Any) -> None:
        return pynvml.nvmlDeviceResetGpuLockedClocks(handle)

    def nvmlDeviceSetMemoryLockedClocks(
        self, handle: Any, minMemClockMHz: int, maxMemClockMHz: int
    ) -> None:
        return pynvml.nvmlDeviceSetMemoryLockedClocks(handle, minMemClockMHz, maxMemClockMHz)

    def nvmlDeviceResetMemoryLockedClocks(self, handle: Any) -> None:
        return pynvml.nvmlDeviceResetMemoryLockedClocks(handle)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)

    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        return pynvml.nvmlDeviceGetPersistenceMode(handle)

    def nvmlDeviceSetPersistenceMode(self, handle: Any, mode: int) -> None:
        return pynvml.nvmlDeviceSetPersistenceMode(handle, mode)

    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        return pynvml.nvmlDeviceGetEccMode(handle)

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        return pynvml.nvmlDeviceGetTotalEccErrors(handle, errorType, counterType)

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        return pynvml.nvmlDeviceGetRemappedRows(device)

    def nvmlDeviceGetRetiredPages(self, device: Any, sourceFilter: int) -> list[int]:
        return pynvml.nvmlDeviceGetRetiredPages(device, sourceFilter)

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[Any]) -> Any:
        return pynvml.nvmlDeviceGetFieldValues(handle, fieldIds)

    def nvmlEventSetCreate(self) -> Any:
        return pynvml.nvmlEventSetCreate()

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        return pynvml.nvmlDeviceRegisterEvents(handle, eventTypes, eventSet)

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return pynvml.nvmlDeviceGetSupportedEventTypes(handle)

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        return pynvml.nvmlEventSetWait(eventSet, timeoutms)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        return pynvml.nvmlEventSetFree(eventSet)

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        return pynvml.nvmlDeviceGetNvLinkState(device, link)

    def nvmlDeviceGetNvLinkErrorCounter(self, device: Any, link: int, counter: int) -> int:
        return pynvml.nvmlDeviceGetNvLinkErrorCounter(device, link, counter)

    def nvmlDeviceGetGpuFabricInfoV(self, device: Any, gpuFabricInfo: Any) -> int:
        return pynvml.nvmlDeviceGetGpuFabricInfoV(device, gpuFabricInfo)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return pynvml.nvmlDeviceGetComputeRunningProcesses(handle)

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        return pynvml.nvmlDeviceGetMigMode(device)

    def nvmlDeviceSetMigMode(self, device: Any, mode: int) -> int:
        return pynvml.nvmlDeviceSetMigMode(device, mode)

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: Any, profile: int, version: int = 2
    ) -> Any:
        return pynvml.nvmlDeviceGetGpuInstanceProfileInfo(device, profile, version)

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: Any, profileId: int) -> int:
        return pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(device, profileId)

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        return pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
            device, profileId, placementsRef, countRef
        )

    def nvmlDeviceCreateGpuInstance(self, device: Any, profileId: int) -> Any:
        return pynvml.nvmlDeviceCreateGpuInstance(device, profileId)

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: Any, profileId: int, placement: Any
    ) -> Any:
        return pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(device, profileId, placement)

    def nvmlDeviceGetGpuInstances(
        self, device: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        return pynvml.nvmlDeviceGetGpuInstances(device, profileId, gpuInstancesRef, countRef)

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any:
        return pynvml.nvmlDeviceGetGpuInstanceById(device, gpuInstanceId)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        return pynvml.nvmlGpuInstanceGetInfo(gpuInstance)

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        return pynvml.nvmlGpuInstanceDestroy(gpuInstance)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        return pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            device, profile, engProfile, version
        )

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        return pynvml.nvmlGpuInstanceCreateComputeInstance(gpuInstance, profileId)

    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int:
        return pynvml.nvmlGpuInstanceGetComputeInstances(
            gpuInstance, profileId, computeInstancesRef, countRef
        )

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        return pynvml.nvmlComputeInstanceDestroy(computeInstance)
