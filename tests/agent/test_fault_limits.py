"""A fault injected into the NVML fake shows only what a real GPU could report:
the dispatcher refuses arguments NVML could never return (NaN or 1e308
degrees, negative or 65-bit counts, strings for numbers), and the counters it
adds to saturate at NVML's 64 bits."""

from __future__ import annotations

import math

import pynvml
import pytest

from agent.client import health_pb
from agent.health import HealthSampler
from agent.nvml import FakeNvml
from agent.nvml.faults import U64_MAX

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("fault", "problem"),
    [
        ({"kind": "heat", "gpu": 0, "target_c": math.nan}, "target_c must be a finite number"),
        ({"kind": "heat", "gpu": 0, "target_c": 1e308}, "target_c must be a finite number"),
        ({"kind": "heat", "gpu": 0, "target_c": -math.inf}, "target_c must be a finite number"),
        ({"kind": "heat", "gpu": 0, "target_c": "hot"}, "target_c must be a number, not str"),
        ({"kind": "heat", "gpu": 0, "target_c": 90, "rate_c_per_s": math.nan}, "rate_c_per_s"),
        ({"kind": "heat", "gpu": 0, "target_c": 90, "rate_c_per_s": 0}, "rate_c_per_s"),
        ({"kind": "heat", "gpu": True, "target_c": 90}, "gpu must be a whole number, not bool"),
        ({"kind": "heat", "gpu": 0.5, "target_c": 90}, "gpu must be a whole number, not float"),
        ({"kind": "ecc", "gpu": 0, "sbe": 2**64}, "sbe must be from 0 to"),
        ({"kind": "ecc", "gpu": 0, "dbe": -1}, "dbe must be from 0 to"),
        ({"kind": "row_remap", "gpu": 0, "uncorrectable": -3}, "uncorrectable must be from 0"),
        ({"kind": "row_remap", "gpu": 0, "pending": "yes"}, "pending must be true or false"),
        ({"kind": "xid", "gpu": 0, "code": 2**32}, "code must be from 0 to 4294967295"),
        ({"kind": "power_draw", "gpu": 0, "watts": math.inf}, "watts must be a finite number"),
        ({"kind": "power_draw", "gpu": 0, "watts": -5}, "watts must be a finite number"),
        ({"kind": "nvlink_errors", "gpu": 0, "link": 0, "crc": 1e3}, "crc must be a whole"),
    ],
    ids=lambda v: v if isinstance(v, str) else str(v.get("kind")),
)
def test_a_fault_nvml_could_never_show_is_refused(
    h200: FakeNvml, fault: dict[str, object], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        h200.faults.apply_fault(fault)
    assert h200.nvmlDeviceGetTemperature(h200.nvmlDeviceGetHandleByIndex(0), 0) < 60


def test_direct_calls_are_held_to_the_same_rules(h200: FakeNvml) -> None:
    with pytest.raises(ValueError, match="target_c"):
        h200.faults.heat(0, math.nan)
    with pytest.raises(ValueError, match="watts"):
        h200.faults.power_draw(0, math.nan)


def test_impossible_but_reportable_readings_still_go_through(h200: FakeNvml) -> None:
    """A broken sensor's 1000 °C or -100 °C is what tests of garbage readings need."""
    h200.faults.apply_fault({"kind": "heat", "gpu": 0, "target_c": 1000, "rate_c_per_s": 1e9})
    h200.faults.apply_fault({"kind": "heat", "gpu": 1, "target_c": -100.0, "rate_c_per_s": 1e9})
    temps = [h200.nvmlDeviceGetTemperature(h200.nvmlDeviceGetHandleByIndex(i), 0) for i in (0, 1)]
    assert temps == [1000, -100]


def test_counters_saturate_at_64_bits_and_health_still_samples(h200: FakeNvml) -> None:
    for _ in range(3):
        h200.faults.apply_fault({"kind": "ecc", "gpu": 0, "sbe": U64_MAX})
        h200.faults.apply_fault({"kind": "row_remap", "gpu": 0, "correctable": U64_MAX})
        h200.faults.apply_fault(
            {"kind": "nvlink_errors", "gpu": 0, "link": 0, "crc": U64_MAX, "replay": 1}
        )
    handle = h200.nvmlDeviceGetHandleByIndex(0)
    volatile = pynvml.NVML_VOLATILE_ECC
    sbe = h200.nvmlDeviceGetTotalEccErrors(
        handle, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, volatile
    )
    assert sbe == U64_MAX
    report = HealthSampler(h200).sample()
    assert report.gpus[0].ecc_sbe_volatile == U64_MAX
    assert health_pb(report, 0.0).gpus[0].ecc_sbe_volatile == U64_MAX  # fits the wire
