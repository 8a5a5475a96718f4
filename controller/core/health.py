"""A node's health report, typed: what an agent (or the BMC fallback) saw.

The API layer builds these from the wire (``controller.api.convert``); the
store keeps the latest one per node; the policies and the health gate read
them. A reading that was not taken, failed or is not a number is ``None``.
"""

from __future__ import annotations

import dataclasses
import marshal
import operator
from collections.abc import Sequence
from typing import Any

from kiln_common.values import value_class


@value_class
class GpuHealth:
    index: int
    uuid: str = ""
    lost: bool = False
    temp_c: float | None = None
    mem_temp_c: float | None = None
    slowdown_c: float | None = None
    shutdown_c: float | None = None
    gpu_max_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    clock_event_reasons: int = 0
    ecc_sbe_volatile: int = 0
    ecc_dbe_volatile: int = 0
    ecc_sbe_aggregate: int = 0
    ecc_dbe_aggregate: int = 0
    remap_correctable: int | None = None
    remap_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    xids: tuple[int, ...] = ()  # XIDs seen since the previous sample
    nvlink_down: tuple[int, ...] = ()
    nvlink_errors: int = 0
    fabric_state: int = 0
    fabric_healthy: bool = False
    clique: str = ""
    recovery_action: int = 0
    errors: tuple[str, ...] = ()  # readings that failed, e.g. "remapped rows: Not Supported"


@value_class
class HealthReport:
    sampled_at: float = 0.0  # unix seconds
    source: str = "agent"  # "agent" or "bmc"
    gpus: tuple[GpuHealth, ...] = ()
    bmc_temps_c: tuple[float, ...] = ()
    # GPU settings the agent found drifted from its profile and re-applied.
    drift: tuple[str, ...] = ()


# -- held out of the garbage collector's sight --------------------------------
#
# The controller keeps every node's latest report until the next one (a
# fleet's worth: 25,000 at 10 s). As typed values that is 11 objects the
# cyclic collector tracks a report (the report, its tuple of GPUs, eight
# ``GpuHealth``), and every young collection walks the reports that came
# since the last one: at a real fleet's pace, about 100 ms with every
# report and API call waiting (``bench/report_gc.py``). Packed, a report is
# bytes, which the collector never tracks: its fields in order as plain
# tuples, written by ``marshal`` (nested tuples alone are no better: the
# collector stops tracking a tuple only once everything in it is
# untracked, which for tuples in tuples takes a collection per level).
# ``pack_report`` costs about 8 us for 8 GPUs; ``unpack_report`` gives an
# equal typed report back, a new one each time, in about 6 us.

PackedReport = bytes

GPU_FIELDS = tuple(f.name for f in dataclasses.fields(GpuHealth))
REPORT_FIELDS = tuple(f.name for f in dataclasses.fields(HealthReport))
_GPUS_AT = REPORT_FIELDS.index("gpus")
_gpu_values = operator.attrgetter(*GPU_FIELDS)
_report_values = operator.attrgetter(*REPORT_FIELDS)


def pack_report(report: HealthReport) -> PackedReport:
    """``report`` as bytes (see above)."""
    values = list(_report_values(report))
    values[_GPUS_AT] = tuple(map(_gpu_values, report.gpus))
    return pack_values(tuple(values))


def pack_values(values: tuple[Any, ...]) -> PackedReport:
    """A report's plain values, in ``packed_values``' order (each GPU a tuple),
    as ``pack_report`` packs the typed report: for a caller that has the
    values without the typed report (the API edge, ``convert.health_values``)."""
    return marshal.dumps(values)


def unpack_report(packed: PackedReport) -> HealthReport:
    """The typed report ``pack_report`` packed (equal to it, not the same object)."""
    return typed_report(marshal.loads(packed))


def typed_report(values: Sequence[Any]) -> HealthReport:
    """The typed report of plain values in ``packed_values``' order, with
    tuples where the report has them (``report_from_values`` takes lists)."""
    fields = list(values)
    fields[_GPUS_AT] = tuple(GpuHealth(*gpu) for gpu in fields[_GPUS_AT])
    return HealthReport(*fields)


def packed_values(packed: PackedReport) -> tuple[Any, ...]:
    """The plain values ``pack_report`` packed: the report's fields in the
    order of ``REPORT_FIELDS``, its GPUs as tuples in that of ``GPU_FIELDS``
    (what the store writes, without making the typed report again)."""
    values: tuple[Any, ...] = marshal.loads(packed)
    return values


# A GPU's fields that hold tuples (a JSON document gives them back as lists).
GPU_TUPLE_FIELDS = frozenset(
    f.name for f in dataclasses.fields(GpuHealth) if str(f.type).startswith("tuple")
)
_GPU_TUPLES = tuple(i for i, name in enumerate(GPU_FIELDS) if name in GPU_TUPLE_FIELDS)
_REPORT_TUPLES = tuple(
    i
    for i, f in enumerate(dataclasses.fields(HealthReport))
    if str(f.type).startswith("tuple") and f.name != "gpus"
)


def report_from_values(values: Sequence[Any]) -> HealthReport:
    """The typed report of plain values in ``packed_values``' order, lists
    where it has tuples (as a JSON document gives them back)."""
    report = list(values)
    gpus = []
    for gpu in report[_GPUS_AT]:
        fields = list(gpu)
        for i in _GPU_TUPLES:
            fields[i] = tuple(fields[i])
        gpus.append(GpuHealth(*fields))
    report[_GPUS_AT] = tuple(gpus)
    for i in _REPORT_TUPLES:
        report[i] = tuple(report[i])
    return HealthReport(*report)


@value_class
class HealthSample:
    """A node's latest report and when its agent was last heard from, as the
    write-behind persists it (``controller/core/live.py``): the report as it
    is held, packed (None: a sighting only; the stored report stays)."""

    node: str
    packed: PackedReport | None
    seen_at: float

    @classmethod
    def of(cls, node: str, health: HealthReport | None, seen_at: float) -> HealthSample:
        """A sample of a typed report (None: a sighting)."""
        return cls(node, None if health is None else pack_report(health), seen_at)

    @property
    def health(self) -> HealthReport | None:
        """The report, typed (a new copy each time)."""
        return None if self.packed is None else unpack_report(self.packed)
