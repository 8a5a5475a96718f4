"""What the policies read of a GPU's report (``health_policy.gpu_reading``):
every field of ``GpuReading`` is filled from the report, none left at its
default by omission."""

from __future__ import annotations

import dataclasses

import pytest

from controller.core.health import GpuHealth
from controller.core.health_policy import FABRIC_COMPLETED, gpu_reading
from controller.policies.samples import GpuReading


@pytest.mark.timeout(10)
def test_every_reading_the_policies_use_comes_from_the_report() -> None:
    gpu = GpuHealth(
        index=5,
        temp_c=81.5,
        slowdown_c=87.0,
        shutdown_c=92.0,
        ecc_dbe_volatile=2,
        remap_failure=True,
        remap_pending=True,
        xids=(79, 48),
        lost=True,
        nvlink_down=(0, 3, 7),
        fabric_state=FABRIC_COMPLETED,
        fabric_healthy=False,
        recovery_action=2,
    )
    reading = gpu_reading(gpu)
    assert reading == GpuReading(
        index=5,
        temp_c=81.5,
        slowdown_c=87.0,
        shutdown_c=92.0,
        dbe_volatile=2,
        remap_failure=True,
        remap_pending=True,
        xids=(79, 48),
        lost=True,
        nvlink_down=3,
        fabric_degraded=True,
        recovery_action=2,
    )
    defaults = GpuReading(index=0, temp_c=None, slowdown_c=None, shutdown_c=None)
    for f in dataclasses.fields(GpuReading):
        assert getattr(reading, f.name) != getattr(defaults, f.name), f"{f.name} not read"


@pytest.mark.timeout(10)
def test_fabric_is_judged_only_once_the_gpu_has_joined_it() -> None:
    joining = GpuHealth(index=0, fabric_state=FABRIC_COMPLETED - 1, fabric_healthy=False)
    assert gpu_reading(joining).fabric_degraded is None
    joined = GpuHealth(index=0, fabric_state=FABRIC_COMPLETED, fabric_healthy=True)
    assert gpu_reading(joined).fabric_degraded is False
