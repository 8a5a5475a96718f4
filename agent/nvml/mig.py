"""MIG helpers that work over any NVML backend (real or fake).

Profile names ("1g.18gb") are derived from what the device reports — the
slice count and instance memory of ``nvmlDeviceGetGpuInstanceProfileInfo`` —
rather than from a hard-coded table, because names drift by board and driver.
The rule: the instance's share of device memory is rounded up to eighths and
multiplied by the device memory in whole GB (rounded up); half rounds up.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pynvml

if TYPE_CHECKING:
    from agent.nvml.backend import NvmlBackend

__all__ = [
    "CI_PROFILE_FOR_SLICES",
    "GPU_INSTANCE_PROFILES",
    "DeviceMigProfile",
    "device_mig_profiles",
    "list_compute_instances",
    "list_gpu_instances",
    "mig_profile_name",
]

# Every GPU-instance profile enum worth asking a device about.
GPU_INSTANCE_PROFILES: tuple[int, ...] = tuple(range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT))

# The compute-instance profile that spans a whole GPU instance of N slices.
CI_PROFILE_FOR_SLICES: dict[int, int] = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    6: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    8: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
}

_MEDIA_EXT_PROFILES = {
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1,
}
_ALL_ME_PROFILES = {
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME,
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME,
}
_NO_ME_PROFILES = {
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME,
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME,
}
_GFX_PROFILES = {
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX,
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX,
    pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX,
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX,
}

_MIB = 1024 * 1024
_GIB = 1024 * 1024 * 1024


def mig_profile_name(profile: int, slices: int, memory_mib: int, device_memory_bytes: int) -> str:
    """Name a GPU-instance profile the way nvidia-smi and mig-parted do.

    >>> mig_profile_name(0, 1, 17408, 143771 * 1024 * 1024)
    '1g.18gb'
    """
    fraction = memory_mib * _MIB / device_memory_bytes
    eighths = math.ceil(fraction * 8 - 1e-9) / 8
    total_gb = -(-device_memory_bytes // _GIB)
    gb = math.floor(eighths * total_gb + 0.5)
    name = f"{slices}g.{gb}gb"
    if profile in _MEDIA_EXT_PROFILES:
        name += "+me"
    elif profile in _ALL_ME_PROFILES:
        name += "+me.all"
    elif profile in _NO_ME_PROFILES:
        name += "-me"
    elif profile in _GFX_PROFILES:
        name += "+gfx"
    return name


@dataclass(frozen=True)
class DeviceMigProfile:
    """A GPU-instance profile as one device reports it."""

    name: str
    profile: int  # NVML_GPU_INSTANCE_PROFILE_* enum
    profile_id: int  # id for create/get/placement calls
    slices: int
    instance_count: int
    memory_mib: int


def device_mig_profiles(nvml: NvmlBackend, handle: Any) -> dict[str, DeviceMigProfile]:
    """Ask the device which GPU-instance profiles it supports, keyed by derived name.

    Blocking. Profiles the device answers NOT_SUPPORTED / INVALID_ARGUMENT for
    are skipped. Needs MIG mode enabled on real hardware.
    """
    total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    out: dict[str, DeviceMigProfile] = {}
    for profile in GPU_INSTANCE_PROFILES:
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            continue
        name = mig_profile_name(profile, int(info.sliceCount), int(info.memorySizeMB), total)
        out[name] = DeviceMigProfile(
            name=name,
            profile=profile,
            profile_id=int(info.id),
            slices=int(info.sliceCount),
            instance_count=int(info.instanceCount),
            memory_mib=int(info.memorySizeMB),
        )
    return out


def list_gpu_instances(
    nvml: NvmlBackend, handle: Any, profile_id: int, max_count: int
) -> list[Any]:
    """GPU-instance handles of one profile id on a device (pynvml's array calling shape)."""
    arr = (pynvml.c_nvmlGpuInstance_t * max(max_count, 1))()
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstances(handle, profile_id, arr, ctypes.byref(count))
    return [arr[i] for i in range(count.value)]


def list_compute_instances(
    nvml: NvmlBackend, gpu_instance: Any, profile_id: int, max_count: int
) -> list[Any]:
    """Compute-instance handles of one CI profile id inside a GPU instance."""
    arr = (pynvml.c_nvmlComputeInstance_t * max(max_count, 1))()
    count = ctypes.c_uint(0)
    nvml.nvmlGpuInstanceGetComputeInstances(gpu_instance, profile_id, arr, ctypes.byref(count))
    return [arr[i] for i in range(count.value)]
