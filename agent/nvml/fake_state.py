"""Mutable per-GPU state of the fake NVML backend, and its opaque handles.

Handles are real ctypes pointer types (``c_nvmlDevice_t``,
``c_nvmlGpuInstance_t``, ...) carrying a synthetic address that is never
dereferenced, so they fit pynvml's structures (event data, handle arrays)
exactly as real handles do. Each fake node decodes only its own handles.
"""

from __future__ import annotations

import ctypes
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pynvml

from agent.nvml.parts import PartSpec

__all__ = [
    "ComputeInstanceState",
    "EventSetState",
    "GpuInstanceState",
    "GpuState",
    "HeatCurve",
    "decode_handle",
    "make_handle",
]

KIND_DEVICE = 1
KIND_GPU_INSTANCE = 2
KIND_COMPUTE_INSTANCE = 3
KIND_EVENT_SET = 4

_KIND_TYPES: dict[int, Any] = {
    KIND_DEVICE: pynvml.c_nvmlDevice_t,
    KIND_GPU_INSTANCE: pynvml.c_nvmlGpuInstance_t,
    KIND_COMPUTE_INSTANCE: pynvml.c_nvmlComputeInstance_t,
    KIND_EVENT_SET: pynvml.c_nvmlEventSet_t,
}


def make_handle(kind: int, a: int, b: int = 0, c: int = 0) -> Any:
    """A ctypes pointer of the right NVML type encoding (kind, a, b, c)."""
    addr = (kind << 28) | ((a & 0xFFFF) << 12) | ((b & 0xFF) << 4) | (c & 0xF)
    return ctypes.cast(ctypes.c_void_p(addr), _KIND_TYPES[kind])


def decode_handle(handle: Any, kind: int) -> tuple[int, int, int] | None:
    """(a, b, c) for a handle of ``kind``, or None when it is not one."""
    try:
        addr = ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return None
    if not addr or addr >> 28 != kind:
        return None
    return (addr >> 12) & 0xFFFF, (addr >> 4) & 0xFF, addr & 0xF


@dataclass
class HeatCurve:
    """Linear temperature ramp from ``start_c`` toward ``target_c``."""

    start_c: float
    target_c: float
    rate_c_per_s: float
    t0: float

    def at(self, now: float) -> float:
        """Temperature at time ``now`` (seconds on the fake's clock)."""
        span = self.target_c - self.start_c
        moved = max(0.0, now - self.t0) * self.rate_c_per_s
        if moved >= abs(span):
            return self.target_c
        return self.start_c + (moved if span > 0 else -moved)


@dataclass
class ComputeInstanceState:
    id: int
    profile_id: int
    slices: int


@dataclass
class GpuInstanceState:
    id: int
    profile_id: int
    start: int
    size: int
    slices: int
    cis: dict[int, ComputeInstanceState] = field(default_factory=dict)


@dataclass
class EventSetState:
    """One event set: which GPUs registered which masks, and undelivered events."""

    id: int
    masks: dict[int, int] = field(default_factory=dict)
    queue: deque[tuple[int, int, int]] = field(default_factory=deque)


@dataclass
class GpuState:
    """Everything one simulated GPU remembers."""

    index: int
    uuid: str
    serial: str
    bus_id: str
    part: PartSpec
    heat: HeatCurve
    lost: bool = False
    processes: list[int] = field(default_factory=list)
    persistence: bool = False
    power_limit_mw: int = 0
    sm_lock: tuple[int, int] | None = None
    mem_lock: tuple[int, int] | None = None
    mig_current: int = pynvml.NVML_DEVICE_MIG_DISABLE
    mig_pending: int = pynvml.NVML_DEVICE_MIG_DISABLE
    gis: dict[int, GpuInstanceState] = field(default_factory=dict)
    sbe_volatile: int = 0
    dbe_volatile: int = 0
    sbe_aggregate: int = 0
    dbe_aggregate: int = 0
    remap_correctable: int = 0
    remap_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    nvlink_down: set[int] = field(default_factory=set)
    nvlink_errors: dict[tuple[int, int], int] = field(default_factory=dict)
    fabric_degraded: bool = False
    power_draw_w: float | None = None
    recovery_action: int = pynvml.NVML_GPU_RECOVERY_ACTION_NONE

    def __post_init__(self) -> None:
        if not self.power_limit_mw:
            self.power_limit_mw = self.part.power_default_w * 1000

    # -- lifecycle -------------------------------------------------------
    def forget_settings(self) -> None:
        """What a driver reload or reboot forgets: locks, power limit, persistence."""
        self.sm_lock = None
        self.mem_lock = None
        self.power_limit_mw = self.part.power_default_w * 1000
        self.persistence = False

    def reset(self) -> None:
        """Effects of a GPU reset: pending MIG mode applies, instances and locks vanish."""
        self.mig_current = self.mig_pending
        self.gis.clear()
        self.sm_lock = None
        self.mem_lock = None
        self.sbe_volatile = 0
        self.dbe_volatile = 0
        if self.remap_pending:
            self.remap_pending = False
        self.recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_NONE

    # -- derived readings ------------------------------------------------
    def busy(self) -> bool:
        return bool(self.processes) or (
            self.power_draw_w is not None and self.power_draw_w > self.part.idle_power_w
        )

    def draw_w(self) -> float:
        if self.power_draw_w is not None:
            return self.power_draw_w
        if self.processes:
            return 0.6 * self.part.power_default_w
        return self.part.idle_power_w

    def sm_ladder(self) -> list[int]:
        """Supported graphics clocks, highest first, 15 MHz apart."""
        return list(range(self.part.sm_max_mhz, self.part.sm_idle_mhz - 1, -15))

    def snap_sm(self, mhz: float) -> int:
        """Nearest supported graphics clock to ``mhz`` (clamped to the ladder)."""
        top, bottom = self.part.sm_max_mhz, self.sm_ladder()[-1]
        clamped = min(max(mhz, bottom), top)
        steps = round((top - clamped) / 15)
        return int(top - 15 * steps)

    def clocks_and_reasons(self, temp_c: float) -> tuple[int, int]:
        """Current SM clock and the clocks-event-reason bitmask."""
        reasons = 0
        busy = self.busy()
        if self.sm_lock is not None:
            target = float(self.sm_lock[1] if busy else self.sm_lock[0])
        else:
            target = float(self.part.sm_max_mhz if busy else self.part.sm_idle_mhz)
        if self.sm_lock is not None or self.mem_lock is not None:
            reasons |= pynvml.nvmlClocksEventReasonApplicationsClocksSetting
        elif not busy:
            reasons |= pynvml.nvmlClocksEventReasonGpuIdle
        if temp_c >= self.part.slowdown_c:
            reasons |= pynvml.nvmlClocksEventReasonHwThermalSlowdown
            reasons |= pynvml.nvmlClocksEventReasonHwSlowdown
            target *= 0.5
        elif temp_c >= self.part.gpu_max_c:
            reasons |= pynvml.nvmlClocksEventReasonSwThermalSlowdown
            target *= 0.85
        if self.draw_w() >= self.power_limit_mw / 1000.0:
            reasons |= pynvml.nvmlClocksEventReasonSwPowerCap
            target *= 0.9
        return self.snap_sm(target), reasons

    def fabric_health_mask(self) -> int:
        if not self.part.multi_node_fabric:
            return 0
        degraded = (
            pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE
            if self.fabric_degraded
            else pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE
        )
        unhealthy = (
            pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE
            if self.fabric_degraded
            else pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE
        )
        return (
            (degraded << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW)
            | (unhealthy << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY)
            | (
                pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_RECOVERY_FALSE
                << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY
            )
        )

    # -- MIG placement -----------------------------------------------------
    def used_slots(self) -> set[int]:
        used: set[int] = set()
        for gi in self.gis.values():
            used.update(range(gi.start, gi.start + gi.size))
        return used

    def used_slices(self) -> int:
        return sum(gi.slices for gi in self.gis.values())

    def free_start(self, profile_id: int) -> int | None:
        """First-fit placement start for ``profile_id``, or None when nothing fits."""
        spec = self.part.mig_profile_by_id(profile_id)
        if spec is None:
            return None
        existing = sum(1 for gi in self.gis.values() if gi.profile_id == profile_id)
        if existing >= spec.instance_count or self.used_slices() + spec.slices > 7:
            return None
        used = self.used_slots()
        for start in spec.starts:
            if not used.intersection(range(start, start + spec.mem_slots)):
                return start
        return None

    def next_gi_id(self) -> int:
        gid = 1
        while gid in self.gis:
            gid += 1
        return gid
