"""Turn a health sample into per-series values for one metric, with guard rails.

A *series* is one GPU of an agent sample (``"gpu3"``) or one sensor of a BMC
sample (``"bmc0"``). For each series the value is either a usable reading or
``None`` ("unknown"): a missing value, NaN, an impossible temperature, or a
temperature margin whose threshold is known neither from the GPU nor from the
rule. Unknown values never satisfy a condition, so they can neither trigger an
action nor count toward ``for:``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from controller.policies.rules import Metric, RecoveryAction, Thresholds
from controller.policies.samples import GpuReading, HealthSample

#: Temperatures outside this range are broken sensors, not hot GPUs.
MIN_PLAUSIBLE_C = -40.0
MAX_PLAUSIBLE_C = 150.0

Value = float | bool | tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SeriesValue:
    series: str
    value: Value | None
    gpu: int | None = None  # the GPU's index (None: a BMC sensor)

    @property
    def known(self) -> bool:
        return self.value is not None


def plausible_temp(t: float | None) -> float | None:
    """``t`` if it is a finite, physically possible temperature, else ``None``."""
    if t is None or isinstance(t, bool):
        return None
    try:
        t = float(t)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(t) or not MIN_PLAUSIBLE_C <= t <= MAX_PLAUSIBLE_C:
        return None
    return t


def plausible_threshold(t: float | None) -> float | None:
    """A threshold is usable only if it is finite and in (0, 150] °C."""
    t = plausible_temp(t)
    return t if t is not None and t > 0 else None


def series_values(metric: Metric, sample: HealthSample, fallback: Thresholds) -> list[SeriesValue]:
    """The value of ``metric`` for every series of ``sample``.

    Agent samples yield one series per GPU; BMC samples yield one series per
    sensor, and only for temperature metrics (they carry nothing else).
    """
    if sample.source == "bmc":
        return [
            SeriesValue(f"bmc{i}", _temp_metric(metric, t, None, None, fallback))
            for i, t in enumerate(sample.bmc_temps_c)
        ]
    return [
        SeriesValue(f"gpu{g.index}", _gpu_value(metric, g, fallback), g.index) for g in sample.gpus
    ]


def _gpu_value(metric: Metric, gpu: GpuReading, fallback: Thresholds) -> Value | None:
    if metric is Metric.XID:
        return tuple(gpu.xids)
    if metric is Metric.GPU_LOST:
        return bool(gpu.lost)
    if metric is Metric.REMAP_FAILURE:
        return gpu.remap_failure if isinstance(gpu.remap_failure, bool) else None
    if metric is Metric.REMAP_PENDING:
        return gpu.remap_pending if isinstance(gpu.remap_pending, bool) else None
    if metric is Metric.NVLINK_DOWN:
        down = gpu.nvlink_down
        return float(down) if isinstance(down, int) and not isinstance(down, bool) else None
    if metric is Metric.RECOVERY_ACTION:
        return _recovery_action(gpu)
    if metric is Metric.FABRIC_DEGRADED:
        return gpu.fabric_degraded if isinstance(gpu.fabric_degraded, bool) else None
    if metric is Metric.ECC_DBE_VOLATILE:
        dbe = gpu.dbe_volatile
        if isinstance(dbe, bool) or not isinstance(dbe, int) or dbe < 0:
            return None
        return float(dbe)
    return _temp_metric(metric, gpu.temp_c, gpu.slowdown_c, gpu.shutdown_c, fallback)


def _recovery_action(gpu: GpuReading) -> float | None:
    """The field's code, if it is one Kiln knows; a lost GPU reads nothing."""
    code = gpu.recovery_action
    if gpu.lost or isinstance(code, bool) or not isinstance(code, int):
        return None
    action = RecoveryAction.known(code)
    return None if action is None else float(action)


def _temp_metric(
    metric: Metric,
    temp_c: float | None,
    slowdown_c: float | None,
    shutdown_c: float | None,
    fallback: Thresholds,
) -> float | None:
    temp = plausible_temp(temp_c)
    if temp is None:
        return None
    if metric is Metric.GPU_TEMP_C:
        return temp
    if metric is Metric.GPU_TEMP_MARGIN_TO_SLOWDOWN_C:
        limit = plausible_threshold(slowdown_c)
        limit = limit if limit is not None else fallback.slowdown_c
    elif metric is Metric.GPU_TEMP_MARGIN_TO_SHUTDOWN_C:
        limit = plausible_threshold(shutdown_c)
        limit = limit if limit is not None else fallback.shutdown_c
    else:
        return None
    return None if limit is None else limit - temp
