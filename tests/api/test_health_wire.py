"""An agent's health report read off the wire (``convert.health_from_pb``):
every reading of ``GpuHealth`` comes through, an absent optional reading is
unknown (None), and a value that is not a finite number is unknown too."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from controller.api import convert
from controller.core.health import GpuHealth, HealthReport
from kiln.v1 import types_pb2


def _every_field_set() -> GpuHealth:
    """A GPU whose every field holds a value off its default, each distinct."""
    values: dict[str, object] = {}
    hints = typing.get_type_hints(GpuHealth)
    for n, f in enumerate(dataclasses.fields(GpuHealth), start=1):
        hint = str(hints[f.name])
        if "tuple[str" in hint:
            values[f.name] = (f"failed {n}", f"failed {n + 1}")
        elif "tuple[int" in hint:
            values[f.name] = (n, n + 100)
        elif "bool" in hint:
            values[f.name] = True
        elif "float" in hint:
            values[f.name] = n + 0.5
        elif "int" in hint:
            values[f.name] = n
        elif "str" in hint:
            values[f.name] = f"value {n}"
        else:
            raise AssertionError(f"a GpuHealth field this test does not know: {f.name}: {hint}")
    return GpuHealth(**values)  # type: ignore[arg-type]


def _round_trip(report: HealthReport) -> HealthReport:
    msg = convert.health_pb(report)
    assert msg is not None
    return convert.health_from_pb(types_pb2.NodeHealth.FromString(msg.SerializeToString()))


def test_the_wire_and_the_core_know_the_same_gpu_readings() -> None:
    wire = set(types_pb2.GpuHealth.DESCRIPTOR.fields_by_name)
    core = {f.name for f in dataclasses.fields(GpuHealth)}
    assert wire == core


@pytest.mark.timeout(10)
def test_every_reading_comes_through() -> None:
    gpu = _every_field_set()
    report = HealthReport(
        sampled_at=1_700_000_000.25, gpus=(gpu,), bmc_temps_c=(41.0,), drift=("clocks",)
    )
    back = _round_trip(report)
    assert back == report
    for f in dataclasses.fields(GpuHealth):
        assert getattr(back.gpus[0], f.name) == getattr(gpu, f.name), f.name


@pytest.mark.timeout(10)
def test_absent_optional_readings_are_unknown_and_defaults_stay_defaults() -> None:
    msg = types_pb2.NodeHealth(sampled_at=5.0, gpus=[types_pb2.GpuHealth(index=3)])
    gpu = convert.health_from_pb(msg).gpus[0]
    assert gpu == GpuHealth(index=3)
    assert gpu.temp_c is None and gpu.remap_pending is None and gpu.sm_clock_mhz is None
    # An optional reading present at zero is a reading, not an absent one.
    msg.gpus[0].temp_c = 0.0
    msg.gpus[0].remap_pending = False
    gpu = convert.health_from_pb(msg).gpus[0]
    assert gpu.temp_c == 0.0 and gpu.remap_pending is False


@pytest.mark.timeout(10)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_reading_that_is_not_a_finite_number_is_unknown(bad: float) -> None:
    msg = types_pb2.NodeHealth(
        gpus=[types_pb2.GpuHealth(index=0, temp_c=bad, power_w=350.0, slowdown_c=bad)],
        bmc_temps_c=[bad, 38.5],
    )
    report = convert.health_from_pb(msg)
    gpu = report.gpus[0]
    assert gpu.temp_c is None and gpu.slowdown_c is None
    assert gpu.power_w == 350.0
    assert report.bmc_temps_c == (38.5,)


@pytest.mark.timeout(10)
def test_each_flag_comes_through_as_itself() -> None:
    """The flags all read True in the test above, so one read into another's
    place would pass it: each is set alone here."""
    flags = [f.name for f in dataclasses.fields(GpuHealth) if f.type in ("bool", "bool | None")]
    assert len(flags) >= 4, flags
    for name in flags:
        gpu = GpuHealth(index=0, **{name: True})  # type: ignore[arg-type]
        back = _round_trip(HealthReport(sampled_at=1.0, gpus=(gpu,))).gpus[0]
        assert [f for f in flags if getattr(back, f)] == [name]
