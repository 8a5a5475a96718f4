"""Bring a node's GPUs to a :class:`~kiln_common.gpu_profile.GpuProfile`, and check drift.

Reads like a checklist, per GPU: persistence mode, power limit, clock locks,
MIG mode, MIG layout. Each step reads the current state first and changes only
what differs, then verifies; applying the same profile twice reports no
changes the second time. Failures are reasons (strings), not exceptions, so a
node that cannot reach its profile says why.

Clock locks cannot be read back through NVML. The lock is detected through
the clock-event reason "applications clocks setting" (0x2); locks are
re-asserted on every apply (an idempotent call) and reported as a change only
when the GPU was not locked.

Everything here blocks on NVML: call it from a thread, e.g.
``await asyncio.to_thread(apply_profile, nvml, profile)``. NVML must be
initialised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from agent.nvml.backend import NvmlBackend
from agent.nvml.mig import device_mig_profiles
from agent.nvml.mig_layout import LayoutError, apply_layout, current_layout, precheck_layout
from kiln_common.gpu_profile import GpuProfile, MigEntry

__all__ = ["DEFAULTS_PROFILE", "ApplyResult", "apply_profile", "check_drift", "reset_to_defaults"]

log = logging.getLogger(__name__)

_LOCKED = pynvml.nvmlClocksEventReasonApplicationsClocksSetting
_ON = pynvml.NVML_FEATURE_ENABLED
_MIG_ON = pynvml.NVML_DEVICE_MIG_ENABLE

DEFAULTS_PROFILE = GpuProfile(
    name="driver-defaults",
    persistence_mode=False,
    power_limit_w=None,
    mig=(MigEntry(mig_enabled=False),),
)

ResetGpu = Callable[[int], None]


@dataclass
class ApplyResult:
    """Outcome of applying a profile: ``ok`` when nothing failed."""

    ok: bool
    changed: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


class _Gpu:
    """Per-GPU context collected while applying."""

    def __init__(self, nvml: NvmlBackend, index: int) -> None:
        self.nvml = nvml
        self.index = index
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self.name = str(nvml.nvmlDeviceGetName(self.handle))
        self.pci_device_id = int(nvml.nvmlDeviceGetPciInfo_v3(self.handle).pciDeviceId)

    def processes(self) -> int:
        return len(self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle))

    def locked(self) -> bool:
        return bool(self.nvml.nvmlDeviceGetCurrentClocksEventReasons(self.handle) & _LOCKED)


# -- checklist steps -------------------------------------------------------------------
def _persistence(g: _Gpu, profile: GpuProfile, res: ApplyResult) -> None:
    want = _ON if profile.persistence_mode else pynvml.NVML_FEATURE_DISABLED
    if g.nvml.nvmlDeviceGetPersistenceMode(g.handle) == want:
        return
    g.nvml.nvmlDeviceSetPersistenceMode(g.handle, want)
    if g.nvml.nvmlDeviceGetPersistenceMode(g.handle) != want:
        res.failures.append(f"GPU {g.index}: persistence mode did not change")
        return
    res.changed.append(f"GPU {g.index}: persistence mode {'on' if want == _ON else 'off'}")


def _power_target_mw(g: _Gpu, profile: GpuProfile) -> tuple[int, str | None]:
    if profile.power_limit_w is None:
        return int(g.nvml.nvmlDeviceGetPowerManagementDefaultLimit(g.handle)), None
    lo, hi = g.nvml.nvmlDeviceGetPowerManagementLimitConstraints(g.handle)
    want = profile.power_limit_w * 1000
    if not lo <= want <= hi:
        return want, (
            f"GPU {g.index}: power limit {profile.power_limit_w} W outside "
            f"{lo // 1000}-{hi // 1000} W supported by {g.name}"
        )
    return want, None


def _power(g: _Gpu, profile: GpuProfile, res: ApplyResult) -> None:
    want, problem = _power_target_mw(g, profile)
    if problem:
        res.failures.append(problem)
        return
    if g.nvml.nvmlDeviceGetPowerManagementLimit(g.handle) == want:
        return
    g.nvml.nvmlDeviceSetPowerManagementLimit(g.handle, want)
    got = g.nvml.nvmlDeviceGetPowerManagementLimit(g.handle)
    if got != want:
        res.failures.append(f"GPU {g.index}: power limit reads {got // 1000} W after setting")
        return
    res.changed.append(f"GPU {g.index}: power limit {want // 1000} W")


def _clock_problem(g: _Gpu, profile: GpuProfile) -> str | None:
    """Why the profile's clock ranges are not supported by this part, if they are not."""
    sm, mem = profile.locked_clocks.sm_mhz, profile.locked_clocks.mem_mhz
    if sm is None and mem is None:
        return None
    mems = g.nvml.nvmlDeviceGetSupportedMemoryClocks(g.handle)
    if mem is not None and not (min(mems) <= mem[0] and mem[1] <= max(mems)):
        return (
            f"GPU {g.index}: memory clock range {mem[0]}-{mem[1]} MHz outside "
            f"{min(mems)}-{max(mems)} MHz supported by {g.name}"
        )
    graphics = g.nvml.nvmlDeviceGetSupportedGraphicsClocks(g.handle, max(mems))
    if sm is not None and not (min(graphics) <= sm[0] and sm[1] <= max(graphics)):
        return (
            f"GPU {g.index}: SM clock range {sm[0]}-{sm[1]} MHz outside "
            f"{min(graphics)}-{max(graphics)} MHz supported by {g.name}"
        )
    return None


def _clocks(g: _Gpu, profile: GpuProfile, res: ApplyResult) -> None:
    problem = _clock_problem(g, profile)
    if problem:
        res.failures.append(problem)
        return
    sm, mem = profile.locked_clocks.sm_mhz, profile.locked_clocks.mem_mhz
    was_locked = g.locked()
    if sm is None and mem is None and not was_locked:
        return
    # Locks cannot be read back, so re-assert them (idempotent calls).
    if sm is not None:
        g.nvml.nvmlDeviceSetGpuLockedClocks(g.handle, sm[0], sm[1])
    elif was_locked:
        g.nvml.nvmlDeviceResetGpuLockedClocks(g.handle)
    if mem is not None:
        g.nvml.nvmlDeviceSetMemoryLockedClocks(g.handle, mem[0], mem[1])
    elif was_locked:
        g.nvml.nvmlDeviceResetMemoryLockedClocks(g.handle)
    want_locked = sm is not None or mem is not None
    if g.locked() != want_locked:
        res.failures.append(f"GPU {g.index}: clock locks did not take effect")
        return
    if want_locked and not was_locked:
        parts = []
        if sm is not None:
            parts.append(f"SM {sm[0]}-{sm[1]} MHz")
        if mem is not None:
            parts.append(f"memory {mem[0]}-{mem[1]} MHz")
        res.changed.append(f"GPU {g.index}: clocks locked ({', '.join(parts)})")
    elif not want_locked:
        res.changed.append(f"GPU {g.index}: clock locks reset")


def _mig_mode(g: _Gpu, entry: MigEntry, res: ApplyResult, reset_gpu: ResetGpu | None) -> bool:
    """Bring MIG mode to the entry's; True when current mode matches afterwards."""
    want = _MIG_ON if entry.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
    current, pending = g.nvml.nvmlDeviceGetMigMode(g.handle)
    if current == want and pending == want:
        return True
    status = g.nvml.nvmlDeviceSetMigMode(g.handle, want)
    current, pending = g.nvml.nvmlDeviceGetMigMode(g.handle)
    if current != want and reset_gpu is not None:
        log.info("GPU %s: MIG mode pending (status %s); resetting the GPU", g.index, status)
        try:
            reset_gpu(g.index)
        except pynvml.NVMLError_InUse:
            pass
        current, pending = g.nvml.nvmlDeviceGetMigMode(g.handle)
    word = "enabled" if want == _MIG_ON else "disabled"
    if current != want:
        n = g.processes()
        reason = f"in use by {n} processes" if n else "needs a GPU reset"
        res.failures.append(f"GPU {g.index} {reason}; MIG mode pending")
        return False
    res.changed.append(f"GPU {g.index}: MIG mode {word}")
    return True


def _mig_layout(g: _Gpu, entry: MigEntry, res: ApplyResult) -> None:
    profiles = device_mig_profiles(g.nvml, g.handle)
    want = entry.layout
    problem = precheck_layout(want, profiles, g.name)
    if problem:
        res.failures.append(f"GPU {g.index}: {problem}")
        return
    have = current_layout(g.nvml, g.handle, profiles)
    if have == want:
        return
    try:
        apply_layout(g.nvml, g.handle, want, profiles)
    except pynvml.NVMLError_InUse:
        n = g.processes()
        res.failures.append(f"GPU {g.index} in use by {n} processes; MIG layout not changed")
        return
    except LayoutError as e:
        res.failures.append(f"GPU {g.index}: {e}")
        return
    got = current_layout(g.nvml, g.handle, profiles)
    if got != want:
        res.failures.append(f"GPU {g.index}: MIG layout reads {got} after applying {want}")
        return
    text = ", ".join(f"{c}x{n}" for n, c in sorted(want.items())) or "none"
    res.changed.append(f"GPU {g.index}: MIG instances {text}")


def _mig(g: _Gpu, profile: GpuProfile, res: ApplyResult, reset_gpu: ResetGpu | None) -> None:
    entry = profile.mig_entry_for(g.index, g.pci_device_id)
    if entry is None:
        return
    try:
        g.nvml.nvmlDeviceGetMigMode(g.handle)
    except pynvml.NVMLError_NotSupported:
        if entry.mig_enabled:
            res.failures.append(f"GPU {g.index}: MIG not supported by {g.name}")
        return
    if not entry.mig_enabled:
        current, _ = g.nvml.nvmlDeviceGetMigMode(g.handle)
        if current == _MIG_ON:
            before = len(res.failures)
            _mig_layout(g, MigEntry(mig_enabled=True), res)  # destroy instances first
            if len(res.failures) > before:
                return
    if _mig_mode(g, entry, res, reset_gpu) and entry.mig_enabled:
        _mig_layout(g, entry, res)


_Step = Callable[[_Gpu, GpuProfile, ApplyResult], None]
_STEPS: tuple[tuple[str, _Step], ...] = (
    ("persistence mode", _persistence),
    ("power limit", _power),
    ("clock locks", _clocks),
)


def apply_profile(
    nvml: NvmlBackend, profile: GpuProfile, *, reset_gpu: ResetGpu | None = None
) -> ApplyResult:
    """Apply ``profile`` to every GPU. Blocking; idempotent; never raises NVMLError.

    ``reset_gpu(index)`` is called when MIG mode stays pending (e.g. the fake's
    ``gpu_reset`` or ``nvidia-smi -r -i N`` on hardware); without it a pending
    mode is reported as a failure.
    """
    res = ApplyResult(ok=True)
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            g = _Gpu(nvml, index)
        except pynvml.NVMLError as e:
            res.failures.append(f"GPU {index}: {e}")
            continue
        for what, step in _STEPS:
            try:
                step(g, profile, res)
            except pynvml.NVMLError as e:
                res.failures.append(f"GPU {index}: {what}: {e}")
        try:
            _mig(g, profile, res, reset_gpu)
        except pynvml.NVMLError as e:
            res.failures.append(f"GPU {index}: MIG: {e}")
    res.ok = not res.failures
    log.info(
        "applied GPU profile %s: %s changes, %s failures",
        profile.name,
        len(res.changed),
        len(res.failures),
    )
    return res


def reset_to_defaults(nvml: NvmlBackend, *, reset_gpu: ResetGpu | None = None) -> ApplyResult:
    """Driver defaults everywhere: persistence off, default power, clocks unlocked, MIG off."""
    return apply_profile(nvml, DEFAULTS_PROFILE, reset_gpu=reset_gpu)


def _drift_one(g: _Gpu, profile: GpuProfile) -> list[str]:
    out: list[str] = []
    i = g.index
    want_pm = _ON if profile.persistence_mode else pynvml.NVML_FEATURE_DISABLED
    if g.nvml.nvmlDeviceGetPersistenceMode(g.handle) != want_pm:
        out.append(f"GPU {i}: persistence mode is {'off' if want_pm == _ON else 'on'}")
    want_mw, problem = _power_target_mw(g, profile)
    have_mw = g.nvml.nvmlDeviceGetPowerManagementLimit(g.handle)
    if problem:
        out.append(problem)
    elif have_mw != want_mw:
        out.append(f"GPU {i}: power limit {have_mw // 1000} W, profile wants {want_mw // 1000} W")
    want_locked = (
        profile.locked_clocks.sm_mhz is not None or profile.locked_clocks.mem_mhz is not None
    )
    if g.locked() != want_locked:
        out.append(f"GPU {i}: clocks {'not ' if want_locked else ''}locked")
    entry = profile.mig_entry_for(i, g.pci_device_id)
    if entry is not None:
        out.extend(_mig_drift(g, entry))
    return out


def _mig_drift(g: _Gpu, entry: MigEntry) -> list[str]:
    i = g.index
    want = _MIG_ON if entry.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
    try:
        current, pending = g.nvml.nvmlDeviceGetMigMode(g.handle)
    except pynvml.NVMLError_NotSupported:
        return [f"GPU {i}: MIG not supported"] if entry.mig_enabled else []
    if current != want:
        state = "pending" if pending == want else "not set"
        return [f"GPU {i}: MIG mode {'enabled' if entry.mig_enabled else 'disabled'} {state}"]
    if not entry.mig_enabled:
        return []
    profiles = device_mig_profiles(g.nvml, g.handle)
    have: dict[str, Any] = current_layout(g.nvml, g.handle, profiles)
    if have != entry.layout:
        return [f"GPU {i}: MIG instances {have}, profile wants {entry.layout}"]
    return []


def check_drift(nvml: NvmlBackend, profile: GpuProfile) -> list[str]:
    """Differences between the GPUs and ``profile`` (empty when in line). Read-only; blocking."""
    drift: list[str] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            drift.extend(_drift_one(_Gpu(nvml, index), profile))
        except pynvml.NVMLError as e:
            drift.append(f"GPU {index}: {e}")
    return drift
