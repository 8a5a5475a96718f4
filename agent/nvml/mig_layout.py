"""Reading and rewriting a GPU's MIG layout through any NVML backend.

Used by :mod:`agent.prepare`. All functions block on NVML. Instance layouts
are counted by profile name as derived from the device (see
:func:`agent.nvml.mig.device_mig_profiles`).
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from agent.nvml.backend import NvmlBackend
from agent.nvml.mig import (
    CI_PROFILE_FOR_SLICES,
    DeviceMigProfile,
    list_compute_instances,
    list_gpu_instances,
)

__all__ = [
    "LayoutError",
    "apply_layout",
    "current_layout",
    "destroy_all",
    "pack_layout",
    "possible_placements",
    "precheck_layout",
]

_MAX_CI = 8


class LayoutError(Exception):
    """A MIG layout could not be applied; the message is the reason for the operator."""


def current_layout(
    nvml: NvmlBackend, handle: Any, profiles: dict[str, DeviceMigProfile]
) -> dict[str, int]:
    """Existing GPU instances counted by profile name (only names with count > 0)."""
    out: dict[str, int] = {}
    for name, p in profiles.items():
        n = len(list_gpu_instances(nvml, handle, p.profile_id, p.instance_count))
        if n:
            out[name] = n
    return out


def precheck_layout(
    layout: dict[str, int], profiles: dict[str, DeviceMigProfile], device_name: str
) -> str | None:
    """Why ``layout`` cannot fit on this device without trying, or None if it may fit."""
    unknown = sorted(set(layout) - set(profiles))
    if unknown:
        offered = ", ".join(sorted(profiles))
        missing = ", ".join(unknown)
        return f"MIG profile(s) {missing} not offered by {device_name} (offers {offered})"
    for name, count in layout.items():
        if count > profiles[name].instance_count:
            return f"at most {profiles[name].instance_count} x {name}, asked for {count}"
    slices = sum(profiles[n].slices * c for n, c in layout.items())
    if slices > 7:
        return f"MIG layout needs {slices} compute slices, the GPU has 7"
    full = max(p.memory_mib for p in profiles.values())
    memory = sum(profiles[n].memory_mib * c for n, c in layout.items())
    if memory > full:
        return f"MIG layout needs {memory} MiB, the GPU has {full} MiB for instances"
    return None


def destroy_all(nvml: NvmlBackend, handle: Any, profiles: dict[str, DeviceMigProfile]) -> int:
    """Destroy every compute and GPU instance (compute instances first). Returns GIs destroyed.

    Raises pynvml.NVMLError_InUse while processes use an instance.
    """
    destroyed = 0
    for p in profiles.values():
        for gi in list_gpu_instances(nvml, handle, p.profile_id, p.instance_count):
            for ci_profile in set(CI_PROFILE_FOR_SLICES.values()):
                try:
                    cis = list_compute_instances(nvml, gi, ci_profile, _MAX_CI)
                except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
                    continue
                for ci in cis:
                    nvml.nvmlComputeInstanceDestroy(ci)
            nvml.nvmlGpuInstanceDestroy(gi)
            destroyed += 1
    return destroyed


def possible_placements(nvml: NvmlBackend, handle: Any, profile_id: int) -> list[tuple[int, int]]:
    """(start, size) memory-slot placements a profile may take on this device."""
    arr = (pynvml.c_nvmlGpuInstancePlacement_t * 16)()
    count = ctypes.c_uint(len(arr))
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, arr, ctypes.byref(count))
    return [(int(arr[i].start), int(arr[i].size)) for i in range(count.value)]


def pack_layout(
    layout: dict[str, int], placements: dict[str, list[tuple[int, int]]]
) -> list[tuple[str, int, int]] | None:
    """Choose non-overlapping placements for every requested instance, or None.

    Pure depth-first search, largest instances first; layouts have at most 7
    instances over 8 slots, so the search is tiny.
    """
    items = sorted(
        (name for name, n in layout.items() for _ in range(n)),
        key=lambda n: (-max((s for _, s in placements[n]), default=0), n),
    )
    chosen: list[tuple[str, int, int]] = []

    def place(k: int, used: frozenset[int]) -> bool:
        if k == len(items):
            return True
        name = items[k]
        for start, size in placements[name]:
            slots = frozenset(range(start, start + size))
            if used & slots:
                continue
            # Identical instances go in increasing start order (no symmetric retries).
            if k and items[k - 1] == name and start <= chosen[-1][1]:
                continue
            chosen.append((name, start, size))
            if place(k + 1, used | slots):
                return True
            chosen.pop()
        return False

    return list(chosen) if place(0, frozenset()) else None


def _create_one(nvml: NvmlBackend, handle: Any, p: DeviceMigProfile, start: int, size: int) -> Any:
    placement = pynvml.c_nvmlGpuInstancePlacement_t(start, size)
    gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
        handle, p.profile_id, ctypes.byref(placement)
    )
    ci_profile = CI_PROFILE_FOR_SLICES[p.slices]
    info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, ci_profile, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    )
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, int(info.id))
    return gi


def apply_layout(
    nvml: NvmlBackend,
    handle: Any,
    layout: dict[str, int],
    profiles: dict[str, DeviceMigProfile],
) -> None:
    """Replace the GPU's instances with ``layout``: one full compute instance per GPU instance.

    Placements are chosen up front from the device's possible placements; a
    layout with no valid packing raises LayoutError before anything changes.
    Should the driver still refuse an instance, everything created here is
    destroyed again (no half-applied layout) and LayoutError says which.
    """
    placements = {
        name: possible_placements(nvml, handle, profiles[name].profile_id) for name in layout
    }
    plan = pack_layout(layout, placements)
    wanted = dict(sorted(layout.items()))
    if plan is None:
        raise LayoutError(f"MIG layout {wanted} does not fit: no non-overlapping placement")
    destroy_all(nvml, handle, profiles)
    for name, start, size in plan:
        try:
            _create_one(nvml, handle, profiles[name], start, size)
        except pynvml.NVMLError_InsufficientResources:
            destroy_all(nvml, handle, profiles)
            raise LayoutError(
                f"MIG layout {wanted} does not fit: no free placement for {name} "
                f"at slot {start}; no instances left behind"
            ) from None
