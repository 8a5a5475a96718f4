"""Fault injection and lifecycle simulation for :class:`agent.nvml.fake.FakeNvml`.

``fake.faults`` is a :class:`FaultInjector`. Each method changes the fake's
hardware state the way the real fault would show through NVML (counters,
events, error codes); nothing else. :meth:`FaultInjector.apply_fault` takes a
JSON-friendly dict so faults can be driven over an API or CLI — the kinds and
their arguments are listed in :data:`FAULT_KINDS` and docs/gpu-profiles.md.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pynvml

from agent.nvml import fake_state as fs

if TYPE_CHECKING:
    from agent.nvml.fake import FakeNvml

__all__ = ["FAULT_KINDS", "FaultInjector"]

log = logging.getLogger(__name__)

# XIDs after which NVIDIA's catalogue says: reset the GPU / reboot the node.
_RESET_XIDS = frozenset({46, 48, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158})
_REBOOT_XIDS = frozenset({79, 160})
_GPU_RESET = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET

# kind -> (required args, optional args). "gpu" is an int GPU index.
FAULT_KINDS: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "heat": (("gpu", "target_c"), ("rate_c_per_s",)),
    "ecc": (("gpu",), ("sbe", "dbe")),
    "row_remap": (("gpu",), ("pending", "failure", "correctable", "uncorrectable")),
    "xid": (("gpu", "code"), ("recovery_action",)),
    "fall_off_bus": (("gpu",), ()),
    "nvlink_down": (("gpu", "link"), ()),
    "nvlink_errors": (("gpu", "link"), ("crc", "replay", "recovery")),
    "fabric_degraded": (("gpu",), ()),
    "power_draw": (("gpu", "watts"), ()),
    "add_process": (("gpu", "pid"), ()),
    "remove_process": (("gpu", "pid"), ()),
    "recovery_action": (("gpu", "action"), ()),
    "clear": ((), ()),
    "reboot": ((), ()),
    "driver_reload": ((), ()),
    "gpu_reset": (("gpu",), ()),
}


# What NVML itself can report, so that a fault shows through the fake only as
# something a real GPU could: NaN or 1e308 degrees cannot come out of NVML.
INT32 = (-(2**31), 2**31 - 1)  # nvmlTemperature_t.temperature is a C int (°C)
U32_MAX = 2**32 - 1  # XID codes, pids, link numbers, recovery actions
U64_MAX = 2**64 - 1  # ECC, row-remap and NVLink error counters
MAX_POWER_W = U32_MAX / 1000  # nvmlDeviceGetPowerUsage: unsigned milliwatts


def _whole(name: str, value: object, low: int = 0, high: int = U32_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a whole number, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be from {low} to {high}")
    return value


def _count(name: str, value: object) -> int:
    """An error count to add: a whole number a 64-bit NVML counter can hold."""
    return _whole(name, value, 0, U64_MAX)


def _number(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, not {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or not low <= number <= high:
        raise ValueError(f"{name} must be a finite number from {_shown(low)} to {_shown(high)}")
    return number


def _shown(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def _temperature(name: str, value: object) -> float:
    """A temperature NVML can report: whole degrees in a C int."""
    return _number(name, value, *INT32)


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false")
    return value


# Each argument's check, run by ``apply_fault`` before the fault is applied.
_ARG_CHECKS: Mapping[str, Callable[[str, object], object]] = {
    "gpu": _whole,
    "link": _whole,
    "code": _whole,
    "pid": _whole,
    "action": _whole,
    "recovery_action": _whole,
    "target_c": _temperature,
    "rate_c_per_s": lambda n, v: _number(n, v, 1e-9, 1e9),
    "watts": lambda n, v: _number(n, v, 0.0, MAX_POWER_W),
    "pending": _flag,
    "failure": _flag,
    **dict.fromkeys(("sbe", "dbe", "correctable", "uncorrectable"), _count),
    **dict.fromkeys(("crc", "replay", "recovery"), _count),
}


def _added(counter: int, n: int) -> int:
    """``counter + n``, saturating as NVML's 64-bit counters do not overflow."""
    return min(U64_MAX, counter + n)


class FaultInjector:
    """Injects hardware faults into one fake node. Thread-safe; never blocks long."""

    def __init__(self, fake: FakeNvml) -> None:
        self._fake = fake

    def __repr__(self) -> str:
        return f"FaultInjector(node={self._fake.node_name!r})"

    def _state(self, gpu: int) -> fs.GpuState:
        if not 0 <= gpu < len(self._fake.gpus):
            raise ValueError(
                f"no GPU {gpu} on {self._fake.node_name} ({len(self._fake.gpus)} GPUs)"
            )
        return self._fake.gpus[gpu]

    # -- faults ------------------------------------------------------------------
    def heat(self, gpu: int, target_c: float, rate_c_per_s: float = 5.0) -> None:
        """Ramp GPU ``gpu`` linearly from its current temperature to ``target_c``.

        Raises ValueError for a target NVML could not report (not finite, or
        beyond a C int) or a rate that is not a positive finite number.
        """
        target = _temperature("target_c", target_c)
        rate = _number("rate_c_per_s", rate_c_per_s, 1e-9, 1e9)
        with self._fake._lock:
            g = self._state(gpu)
            now = self._fake.clock()
            g.heat = fs.HeatCurve(g.heat.at(now), target, rate, now)

    def ecc(self, gpu: int, sbe: int = 0, dbe: int = 0) -> None:
        """Add ECC errors (volatile and aggregate); a DBE also raises XID 48."""
        if sbe < 0 or dbe < 0:
            raise ValueError("ECC counts must be non-negative")
        _count("sbe", sbe)
        _count("dbe", dbe)
        with self._fake._lock:
            g = self._state(gpu)
            g.sbe_volatile = _added(g.sbe_volatile, sbe)
            g.sbe_aggregate = _added(g.sbe_aggregate, sbe)
            g.dbe_volatile = _added(g.dbe_volatile, dbe)
            g.dbe_aggregate = _added(g.dbe_aggregate, dbe)
        if sbe:
            self._fake._emit(gpu, pynvml.nvmlEventTypeSingleBitEccError, sbe)
        if dbe:
            self._fake._emit(gpu, pynvml.nvmlEventTypeDoubleBitEccError, dbe)
            self.xid(gpu, 48)

    def row_remap(
        self,
        gpu: int,
        pending: bool = False,
        failure: bool = False,
        correctable: int = 0,
        uncorrectable: int = 1,
    ) -> None:
        """Record remapped rows; ``pending`` needs a GPU reset, ``failure`` means no spare rows."""
        _count("correctable", correctable)
        _count("uncorrectable", uncorrectable)
        with self._fake._lock:
            g = self._state(gpu)
            g.remap_correctable = _added(g.remap_correctable, correctable)
            g.remap_uncorrectable = _added(g.remap_uncorrectable, uncorrectable)
            g.remap_pending = g.remap_pending or pending
            g.remap_failure = g.remap_failure or failure
            if pending:
                g.recovery_action = max(
                    g.recovery_action, pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
                )

    def xid(self, gpu: int, code: int, recovery_action: int | None = None) -> None:
        """Raise XID ``code``: one XidCriticalError event to every registered event set."""
        with self._fake._lock:
            g = self._state(gpu)
            if recovery_action is not None:
                g.recovery_action = recovery_action
            elif code in _REBOOT_XIDS:
                g.recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
            elif code in _RESET_XIDS:
                g.recovery_action = max(
                    g.recovery_action, pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
                )
        log.info("fake node %s: GPU %s XID %s", self._fake.node_name, gpu, code)
        self._fake._emit(gpu, pynvml.nvmlEventTypeXidCriticalError, code)

    def fall_off_bus(self, gpu: int) -> None:
        """XID 79, then the GPU answers GPU_IS_LOST to everything until a reboot."""
        self.xid(gpu, 79)
        with self._fake._cond:
            self._state(gpu).lost = True
            self._fake._cond.notify_all()

    def nvlink_down(self, gpu: int, link: int) -> None:
        """Take one NVLink down (state inactive, one recovery error counted)."""
        with self._fake._lock:
            g = self._state(gpu)
            if not 0 <= link < g.part.nvlinks:
                raise ValueError(f"GPU {gpu} has links 0..{g.part.nvlinks - 1}, not {link}")
            g.nvlink_down.add(link)
            key = (link, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY)
            g.nvlink_errors[key] = _added(g.nvlink_errors.get(key, 0), 1)

    def nvlink_errors(
        self, gpu: int, link: int, crc: int = 0, replay: int = 0, recovery: int = 0
    ) -> None:
        """Add NVLink error counts on one link (CRC data, replay, recovery)."""
        _count("crc", crc)
        _count("replay", replay)
        _count("recovery", recovery)
        with self._fake._lock:
            g = self._state(gpu)
            if not 0 <= link < g.part.nvlinks:
                raise ValueError(f"GPU {gpu} has links 0..{g.part.nvlinks - 1}, not {link}")
            for counter, n in (
                (pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA, crc),
                (pynvml.NVML_NVLINK_ERROR_DL_REPLAY, replay),
                (pynvml.NVML_NVLINK_ERROR_DL_RECOVERY, recovery),
            ):
                g.nvlink_errors[(link, counter)] = _added(
                    g.nvlink_errors.get((link, counter), 0), n
                )

    def fabric_degraded(self, gpu: int) -> None:
        """Mark the GPU's fabric health degraded (multi-node NVLink parts only show it)."""
        with self._fake._lock:
            self._state(gpu).fabric_degraded = True

    def power_draw(self, gpu: int, watts: float) -> None:
        """Force the GPU's power draw; above the limit it is capped and SwPowerCap is set."""
        draw = _number("watts", watts, 0.0, MAX_POWER_W)
        with self._fake._lock:
            self._state(gpu).power_draw_w = draw

    def recovery_action(self, gpu: int, action: int) -> None:
        """Set the recovery-action field (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)."""
        with self._fake._lock:
            self._state(gpu).recovery_action = int(action)

    def add_process(self, gpu: int, pid: int) -> None:
        """Attach a compute process to the GPU (blocks resets and MIG activation)."""
        with self._fake._lock:
            g = self._state(gpu)
            if pid not in g.processes:
                g.processes.append(pid)

    def remove_process(self, gpu: int, pid: int) -> None:
        """Detach a compute process; unknown pids are ignored."""
        with self._fake._lock:
            g = self._state(gpu)
            if pid in g.processes:
                g.processes.remove(pid)

    def clear(self) -> None:
        """Undo every injected fault (heat, errors, lost GPUs, processes).

        Configuration (clocks, power limit, persistence, MIG) is kept.
        """
        with self._fake._cond:
            now = self._fake.clock()
            for g in self._fake.gpus:
                idle = g.part.idle_temp_c
                g.heat = fs.HeatCurve(idle, idle, 0.0, now)
                g.lost = False
                g.processes.clear()
                g.sbe_volatile = g.dbe_volatile = g.sbe_aggregate = g.dbe_aggregate = 0
                g.remap_correctable = g.remap_uncorrectable = 0
                g.remap_pending = g.remap_failure = False
                g.nvlink_down.clear()
                g.nvlink_errors.clear()
                g.fabric_degraded = False
                g.power_draw_w = None
                g.recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_NONE
            for es in self._fake._event_sets.values():
                es.queue.clear()
            self._fake._cond.notify_all()

    # -- lifecycle -------------------------------------------------------------------
    def reboot(self) -> None:
        """Node reboot: every GPU resets, lost GPUs return, settings and sessions are lost."""
        with self._fake._cond:
            for g in self._fake.gpus:
                g.lost = False
                g.processes.clear()
                g.forget_settings()
                g.reset()
                g.nvlink_down.clear()
            self._fake._drop_sessions()
        log.info("fake node %s rebooted", self._fake.node_name)

    def driver_reload(self) -> None:
        """Unload and reload the kernel driver; refused (InUse) while processes run.

        Locks, power limits and persistence are forgotten and GPUs reset; NVML
        must be initialised again. GPUs that fell off the bus stay lost.
        """
        with self._fake._cond:
            if any(g.processes for g in self._fake.gpus):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)
            for g in self._fake.gpus:
                g.forget_settings()
                if not g.lost:
                    g.reset()
            self._fake._drop_sessions()
        log.info("fake node %s: driver reloaded", self._fake.node_name)

    def gpu_reset(self, gpu: int) -> None:
        """Reset one GPU (``nvidia-smi -r``): applies pending MIG mode, clears instances.

        Raises InUse while processes hold the GPU and GpuIsLost for a lost GPU.
        """
        with self._fake._lock:
            g = self._state(gpu)
            if g.lost:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            if g.processes:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)
            g.reset()
        log.info("fake node %s: GPU %s reset", self._fake.node_name, gpu)

    # -- JSON dispatcher ------------------------------------------------------------
    def apply_fault(self, spec: Mapping[str, Any]) -> str:
        """Apply one fault described as a dict, e.g. ``{"kind": "heat", "gpu": 0, "target_c": 95}``.

        Returns a one-line description of what was applied. Raises ValueError
        for an unknown kind, missing or unexpected arguments, or an argument of
        the wrong type or beyond what NVML could report (``_ARG_CHECKS``).
        """
        kind = spec.get("kind")
        if not isinstance(kind, str) or kind not in FAULT_KINDS:
            raise ValueError(
                f"unknown fault kind {kind!r}; expected one of {', '.join(FAULT_KINDS)}"
            )
        required, optional = FAULT_KINDS[kind]
        args = {k: v for k, v in spec.items() if k != "kind"}
        missing = [k for k in required if k not in args]
        extra = sorted(set(args) - set(required) - set(optional))
        if missing:
            raise ValueError(f"fault {kind!r} needs {', '.join(missing)}")
        if extra:
            raise ValueError(f"fault {kind!r} does not take {', '.join(extra)}")
        for name, value in args.items():
            try:
                _ARG_CHECKS[name](name, value)
            except ValueError as e:
                raise ValueError(f"fault {kind!r}: {e}") from None
        method: Callable[..., None] = getattr(self, kind)
        try:
            method(**args)
        except TypeError as e:
            raise ValueError(f"fault {kind!r}: {e}") from None
        detail = ", ".join(f"{k}={v}" for k, v in sorted(args.items()))
        return f"{kind}({detail}) on {self._fake.node_name}"
