"""Reference GPU parts the fake NVML backend is built from.

Values come from the project's gathered NVML facts (``nvml.h``, captured
``nvidia-smi -q`` output of H100/H200/GB200 systems, mig-parted). Values that
nobody has seen on hardware are marked *unverified* next to them. The tables
are immutable; every fake node builds its own mutable state from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import pynvml

__all__ = ["PARTS", "MigProfileSpec", "PartSpec", "part_by_key"]


@dataclass(frozen=True)
class MigProfileSpec:
    """One GPU-instance profile: the enum the caller passes and the id NVML returns.

    ``starts`` are the placement slots (over 8 memory slots) where an instance
    of ``size`` slots may begin.
    """

    profile: int  # NVML_GPU_INSTANCE_PROFILE_* (the query argument)
    profile_id: int  # the ``.id`` NVML hands back; create/get/placement take it
    slices: int  # compute slices
    mem_slots: int  # memory slots out of 8
    instance_count: int
    starts: tuple[int, ...]
    media_ext: bool = False


# Geometry shared by H100, H200 and GB200 (7 compute slices, 8 memory slots).
_MIG_GEOMETRY: tuple[MigProfileSpec, ...] = (
    MigProfileSpec(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
    MigProfileSpec(
        pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
        20,
        1,
        1,
        1,
        (0, 1, 2, 3, 4, 5, 6),
        media_ext=True,
    ),
    MigProfileSpec(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 2, 4, (0, 2, 4, 6)),
    MigProfileSpec(pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 2, 3, (0, 2, 4)),
    MigProfileSpec(pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 4, 2, (0, 4)),
    MigProfileSpec(pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 4, 1, (0,)),
    MigProfileSpec(pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 8, 1, (0,)),
)


@dataclass(frozen=True)
class PartSpec:
    """Static facts about one GPU part and the node it ships in."""

    key: str
    name: str
    pci_device_id: int
    pci_subsystem_id: int
    architecture: int
    memory_mib: int
    power_default_w: int
    power_min_w: int
    power_max_w: int
    sm_max_mhz: int
    sm_idle_mhz: int
    mem_mhz: int
    shutdown_c: int
    slowdown_c: int
    gpu_max_c: int
    mem_max_c: int
    idle_temp_c: float
    idle_power_w: float
    gpus_per_node: int
    nvlinks: int
    bus_ids: tuple[str, ...]
    driver_version: str
    multi_node_fabric: bool
    # Memory of a one-slot MIG instance and of the full 8-slot instance (MiB);
    # names such as "1g.18gb" are derived from these, the way NVIDIA's tools do.
    mig_slot_mib: int
    mig_full_mib: int
    mig_profiles: tuple[MigProfileSpec, ...] = _MIG_GEOMETRY

    def mig_profile(self, profile: int) -> MigProfileSpec | None:
        """The profile queried by NVML_GPU_INSTANCE_PROFILE_* enum, if the part has it."""
        for p in self.mig_profiles:
            if p.profile == profile:
                return p
        return None

    def mig_profile_by_id(self, profile_id: int) -> MigProfileSpec | None:
        """The profile with the given NVML profile id, if the part has it."""
        for p in self.mig_profiles:
            if p.profile_id == profile_id:
                return p
        return None

    def mig_memory_mib(self, spec: MigProfileSpec) -> int:
        """Memory of an instance of ``spec`` in MiB."""
        if spec.mem_slots >= 8:
            return self.mig_full_mib
        return self.mig_slot_mib * spec.mem_slots


_HGX_BUS_IDS = (
    "00000000:18:00.0",
    "00000000:2A:00.0",
    "00000000:3A:00.0",
    "00000000:5D:00.0",
    "00000000:9A:00.0",
    "00000000:AB:00.0",
    "00000000:BA:00.0",
    "00000000:DB:00.0",
)

H100 = PartSpec(
    key="h100",
    name="NVIDIA H100 80GB HBM3",
    pci_device_id=0x233010DE,
    pci_subsystem_id=0x16C110DE,
    architecture=pynvml.NVML_DEVICE_ARCH_HOPPER,
    memory_mib=81559,
    power_default_w=700,
    power_min_w=200,
    power_max_w=700,
    sm_max_mhz=1980,
    sm_idle_mhz=345,
    mem_mhz=2619,
    shutdown_c=92,
    slowdown_c=89,
    gpu_max_c=87,
    mem_max_c=95,
    idle_temp_c=31.0,
    idle_power_w=72.0,
    gpus_per_node=8,
    nvlinks=18,
    bus_ids=_HGX_BUS_IDS,
    driver_version="550.90.07",
    multi_node_fabric=False,
    mig_slot_mib=9984,
    mig_full_mib=81152,
)

H200 = PartSpec(
    key="h200",
    name="NVIDIA H200",
    pci_device_id=0x233510DE,
    pci_subsystem_id=0x18A010DE,  # *unverified*
    architecture=pynvml.NVML_DEVICE_ARCH_HOPPER,
    memory_mib=143771,
    power_default_w=700,
    power_min_w=200,
    power_max_w=700,
    sm_max_mhz=1980,
    sm_idle_mhz=345,
    mem_mhz=3201,
    # H200 drivers publish margins; the H100 thresholds are used here.
    shutdown_c=92,
    slowdown_c=89,
    gpu_max_c=87,
    mem_max_c=95,
    idle_temp_c=30.0,
    idle_power_w=76.0,
    gpus_per_node=8,
    nvlinks=18,
    bus_ids=_HGX_BUS_IDS,
    driver_version="550.90.07",
    multi_node_fabric=False,
    mig_slot_mib=17408,
    mig_full_mib=143360,
)

GB200 = PartSpec(
    key="gb200",
    name="NVIDIA GB200",
    pci_device_id=0x294110DE,
    pci_subsystem_id=0x199910DE,  # *unverified*
    architecture=pynvml.NVML_DEVICE_ARCH_BLACKWELL,
    memory_mib=189471,
    power_default_w=1200,
    power_min_w=200,  # *unverified*
    power_max_w=1200,
    sm_max_mhz=2070,  # *unverified*; kept on the 15 MHz ladder from 345
    sm_idle_mhz=345,  # *unverified*
    mem_mhz=3996,  # *unverified*
    shutdown_c=92,  # *unverified*
    slowdown_c=89,  # *unverified*
    gpu_max_c=87,  # *unverified*
    mem_max_c=95,  # *unverified*
    idle_temp_c=29.0,
    idle_power_w=140.0,
    gpus_per_node=4,
    nvlinks=18,
    bus_ids=("00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0"),
    driver_version="570.133.20",
    multi_node_fabric=True,
    mig_slot_mib=22784,
    mig_full_mib=188416,
)

PARTS: MappingProxyType[str, PartSpec] = MappingProxyType({p.key: p for p in (H100, H200, GB200)})


def part_by_key(key: str) -> PartSpec:
    """Return the part for ``key`` ("h100", "h200", "gb200"); ValueError otherwise."""
    try:
        return PARTS[key]
    except KeyError:
        raise ValueError(
            f"unknown GPU part {key!r}; expected one of {', '.join(sorted(PARTS))}"
        ) from None
