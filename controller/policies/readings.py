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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from controller.policies.rules import RECOVERY_CODES, Metric, Thresholds
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
    if t.__class__ is float:  # the common case, once per GPU per rule of every report
        # NaN and the infinities fail the range test.
        return t if MIN_PLAUSIBLE_C <= t <= MAX_PLAUSIBLE_C else None
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


def series_labels(sample: HealthSample) -> list[tuple[str, int | None]]:
    """Each series of ``sample``: its name and its GPU's index (None: a BMC sensor)."""
    if sample.source == "bmc":
        return [(f"bmc{i}", None) for i in range(len(sample.bmc_temps_c))]
    return [(f"gpu{g.index}", g.index) for g in sample.gpus]


def metric_values(metric: Metric, sample: HealthSample, fallback: Thresholds) -> list[Value | None]:
    """The value of ``metric`` for every series of ``sample``, in the order of
    ``series_labels``: agent samples yield one per GPU; BMC samples one per
    sensor, and only for temperature metrics (they carry nothing else). The
    engine reads this of every sample for every rule, so it builds no
    objects for it."""
    if sample.source == "bmc":
        return [_temp_metric(metric, t, None, None, fallback) for t in sample.bmc_temps_c]
    read = _GPU_READERS.get(metric)
    if read is None:
        return [
            _temp_metric(metric, g.temp_c, g.slowdown_c, g.shutdown_c, fallback)
            for g in sample.gpus
        ]
    return [read(g) for g in sample.gpus]


def _known_bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _nvlink_down(gpu: GpuReading) -> float | None:
    down = gpu.nvlink_down
    return float(down) if isinstance(down, int) and not isinstance(down, bool) else None


def _dbe_volatile(gpu: GpuReading) -> float | None:
    dbe = gpu.dbe_volatile
    if isinstance(dbe, bool) or not isinstance(dbe, int) or dbe < 0:
        return None
    return float(dbe)


def _recovery_action(gpu: GpuReading) -> float | None:
    """The field's code, if it is one Kiln knows; a lost GPU reads nothing."""
    code = gpu.recovery_action
    if gpu.lost or isinstance(code, bool) or not isinstance(code, int):
        return None
    return float(code) if code in RECOVERY_CODES else None


# How each metric that is not a temperature is read off one GPU; looked up
# once per rule and sample, not tested metric by metric for every GPU.
_GPU_READERS: Mapping[Metric, Callable[[GpuReading], Value | None]] = MappingProxyType(
    {
        Metric.XID: lambda gpu: tuple(gpu.xids),
        Metric.GPU_LOST: lambda gpu: bool(gpu.lost),
        Metric.REMAP_FAILURE: lambda gpu: _known_bool(gpu.remap_failure),
        Metric.REMAP_PENDING: lambda gpu: _known_bool(gpu.remap_pending),
        Metric.NVLINK_DOWN: _nvlink_down,
        Metric.RECOVERY_ACTION: _recovery_action,
        Metric.FABRIC_DEGRADED: lambda gpu: _known_bool(gpu.fabric_degraded),
        Metric.ECC_DBE_VOLATILE: _dbe_volatile,
    }
)


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
