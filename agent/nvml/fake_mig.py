"""MIG calls of the fake NVML backend (mixed into :class:`agent.nvml.fake.FakeNvml`).

Modelled on the real driver: two id spaces (the profile enum you query, the
profile id you create with), first-fit placement over the real slots,
INSUFFICIENT_RESOURCES when nothing fits, IN_USE while processes run or
compute instances remain, and a pending MIG mode that only a GPU reset applies
while clients hold the GPU.
"""

from __future__ import annotations

import threading
from typing import Any

import pynvml

from agent.nvml import fake_state as fs
from agent.nvml.mig import mig_profile_name

__all__ = ["FakeMigMixin"]

_MIB = 1024 * 1024
_CI_SLICES = {
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: 1,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: 3,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: 7,
}


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def _set_count(count_ref: Any, value: int) -> None:
    obj = getattr(count_ref, "_obj", None)
    if obj is None:
        obj = getattr(count_ref, "contents", count_ref)
    obj.value = value


class FakeMigMixin:
    """MIG half of the fake; relies on the host class's lock and helpers."""

    _lock: threading.RLock

    def _gpu(self, handle: Any, *, allow_lost: bool = False) -> fs.GpuState:
        raise NotImplementedError

    def _gi(self, handle: Any) -> tuple[fs.GpuState, fs.GpuInstanceState]:
        raise NotImplementedError

    def _check_root(self) -> None:
        raise NotImplementedError

    def _mig_on(self, handle: Any) -> fs.GpuState:
        gpu = self._gpu(handle)
        if gpu.mig_current != pynvml.NVML_DEVICE_MIG_ENABLE:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        with self._lock:
            gpu = self._gpu(device)
            return [gpu.mig_current, gpu.mig_pending]

    def nvmlDeviceSetMigMode(self, device: Any, mode: int) -> int:
        """Request a MIG mode; returns the activation status (0 when active now)."""
        with self._lock:
            gpu = self._gpu(device)
            self._check_root()
            if mode not in (pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_ENABLE):
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if mode == pynvml.NVML_DEVICE_MIG_DISABLE and gpu.gis:
                raise _err(pynvml.NVML_ERROR_IN_USE)
            gpu.mig_pending = mode
            if gpu.mig_current == mode:
                return pynvml.NVML_SUCCESS
            if gpu.processes:
                return pynvml.NVML_ERROR_IN_USE
            gpu.mig_current = mode
            return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: Any, profile: int, version: int = 2
    ) -> Any:
        with self._lock:
            gpu = self._mig_on(device)
            spec = gpu.part.mig_profile(profile)
            if spec is None:
                raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if version == 2:
                info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
                name = mig_profile_name(
                    profile, spec.slices, gpu.part.mig_memory_mib(spec), gpu.part.memory_mib * _MIB
                )
                info.name = f"MIG {name}".encode()
            elif version == 1:
                info = pynvml.c_nvmlGpuInstanceProfileInfo_t()
            else:
                raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            info.id = spec.profile_id
            info.isP2pSupported = 0
            info.sliceCount = spec.slices
            info.instanceCount = spec.instance_count
            info.multiprocessorCount = spec.slices * 16
            info.copyEngineCount = max(1, spec.mem_slots)
            info.decoderCount = spec.slices if spec.slices > 1 or spec.media_ext else 0
            info.jpegCount = info.decoderCount
            info.ofaCount = 1 if spec.slices == 7 or spec.media_ext else 0
            info.memorySizeMB = gpu.part.mig_memory_mib(spec)
            return info

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: Any, profileId: int) -> int:
        with self._lock:
            gpu = self._mig_on(device)
            if gpu.part.mig_profile_by_id(profileId) is None:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            # Count how many more would fit by placing them on a scratch copy.
            saved = dict(gpu.gis)
            count = 0
            try:
                while (start := gpu.free_start(profileId)) is not None:
                    self._place(gpu, profileId, start)
                    count += 1
            finally:
                gpu.gis = saved
            return count

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        """Every placement the profile may take on an empty GPU (occupancy not considered)."""
        with self._lock:
            gpu = self._mig_on(device)
            spec = gpu.part.mig_profile_by_id(profileId)
            if spec is None:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if placementsRef is None:
                _set_count(countRef, len(spec.starts))
                return pynvml.NVML_SUCCESS
            if len(spec.starts) > len(placementsRef):
                raise _err(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            for i, start in enumerate(spec.starts):
                placementsRef[i].start, placementsRef[i].size = start, spec.mem_slots
            _set_count(countRef, len(spec.starts))
            return pynvml.NVML_SUCCESS

    def _place(self, gpu: fs.GpuState, profile_id: int, start: int) -> fs.GpuInstanceState:
        spec = gpu.part.mig_profile_by_id(profile_id)
        assert spec is not None
        gi = fs.GpuInstanceState(
            id=gpu.next_gi_id(),
            profile_id=profile_id,
            start=start,
            size=spec.mem_slots,
            slices=spec.slices,
        )
        gpu.gis[gi.id] = gi
        return gi

    def nvmlDeviceCreateGpuInstance(self, device: Any, profileId: int) -> Any:
        with self._lock:
            gpu = self._mig_on(device)
            self._check_root()
            if gpu.part.mig_profile_by_id(profileId) is None:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            start = gpu.free_start(profileId)
            if start is None:
                raise _err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            gi = self._place(gpu, profileId, start)
            return fs.make_handle(fs.KIND_GPU_INSTANCE, gpu.index, gi.id)

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: Any, profileId: int, placement: Any
    ) -> Any:
        with self._lock:
            gpu = self._mig_on(device)
            self._check_root()
            spec = gpu.part.mig_profile_by_id(profileId)
            place = getattr(placement, "_obj", placement)
            if spec is None or place.start not in spec.starts or place.size != spec.mem_slots:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            existing = sum(1 for g in gpu.gis.values() if g.profile_id == profileId)
            clash = gpu.used_slots().intersection(range(place.start, place.start + place.size))
            if clash or existing >= spec.instance_count or gpu.used_slices() + spec.slices > 7:
                raise _err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            gi = self._place(gpu, profileId, place.start)
            return fs.make_handle(fs.KIND_GPU_INSTANCE, gpu.index, gi.id)

    def nvmlDeviceGetGpuInstances(
        self, device: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        with self._lock:
            gpu = self._mig_on(device)
            if gpu.part.mig_profile_by_id(profileId) is None:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            found = sorted(g.id for g in gpu.gis.values() if g.profile_id == profileId)
            if len(found) > len(gpuInstancesRef):
                raise _err(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            for i, gid in enumerate(found):
                gpuInstancesRef[i] = fs.make_handle(fs.KIND_GPU_INSTANCE, gpu.index, gid)
            _set_count(countRef, len(found))
            return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any:
        with self._lock:
            gpu = self._mig_on(device)
            if gpuInstanceId not in gpu.gis:
                raise _err(pynvml.NVML_ERROR_NOT_FOUND)
            return fs.make_handle(fs.KIND_GPU_INSTANCE, gpu.index, gpuInstanceId)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        with self._lock:
            gpu, gi = self._gi(gpuInstance)
            info = pynvml.c_nvmlGpuInstanceInfo_t()
            info.device = fs.make_handle(fs.KIND_DEVICE, gpu.index)
            info.id, info.profileId = gi.id, gi.profile_id
            info.placement.start, info.placement.size = gi.start, gi.size
            return info

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        with self._lock:
            gpu, gi = self._gi(gpuInstance)
            self._check_root()
            if gi.cis or gpu.processes:
                raise _err(pynvml.NVML_ERROR_IN_USE)
            del gpu.gis[gi.id]
            return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        with self._lock:
            _, gi = self._gi(device)
            slices = _CI_SLICES.get(profile)
            if slices is None or slices > gi.slices:
                raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if engProfile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if version == 2:
                info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
                info.name = f"MIG {slices}c.{gi.slices}g".encode()
            else:
                info = pynvml.c_nvmlComputeInstanceProfileInfo_t()
            info.id = profile
            info.sliceCount = slices
            info.instanceCount = gi.slices // slices
            info.multiprocessorCount = slices * 16
            return info

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        with self._lock:
            gpu, gi = self._gi(gpuInstance)
            self._check_root()
            slices = _CI_SLICES.get(profileId)
            if slices is None or slices > gi.slices:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if sum(ci.slices for ci in gi.cis.values()) + slices > gi.slices:
                raise _err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            cid = 0
            while cid in gi.cis:
                cid += 1
            gi.cis[cid] = fs.ComputeInstanceState(cid, profileId, slices)
            return fs.make_handle(fs.KIND_COMPUTE_INSTANCE, gpu.index, gi.id, cid)

    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int:
        with self._lock:
            gpu, gi = self._gi(gpuInstance)
            found = sorted(c.id for c in gi.cis.values() if c.profile_id == profileId)
            if len(found) > len(computeInstancesRef):
                raise _err(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            for i, cid in enumerate(found):
                computeInstancesRef[i] = fs.make_handle(
                    fs.KIND_COMPUTE_INSTANCE, gpu.index, gi.id, cid
                )
            _set_count(countRef, len(found))
            return pynvml.NVML_SUCCESS

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        with self._lock:
            decoded = fs.decode_handle(computeInstance, fs.KIND_COMPUTE_INSTANCE)
            if decoded is None:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            gpu, gi = self._gi(fs.make_handle(fs.KIND_GPU_INSTANCE, decoded[0], decoded[1]))
            self._check_root()
            if decoded[2] not in gi.cis:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if gpu.processes:
                raise _err(pynvml.NVML_ERROR_IN_USE)
            del gi.cis[decoded[2]]
            return pynvml.NVML_SUCCESS
