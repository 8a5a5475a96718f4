"""Health sampling on fake nodes: readings, XIDs once, lost GPUs, never blocking the loop."""

from __future__ import annotations

import asyncio
import threading

import pynvml

from agent.health import HealthSampler
from agent.nvml import FakeNvml
from agent.prepare import apply_profile
from kiln_common.gpu_profile import GpuProfile


def test_healthy_node_readings(fake: FakeNvml) -> None:
    health = HealthSampler(fake).sample()
    assert len(health.gpus) == fake.nvmlDeviceGetCount()
    g = health.gpus[0]
    part = fake.part
    assert (g.slowdown_c, g.shutdown_c, g.gpu_max_c) == (
        part.slowdown_c,
        part.shutdown_c,
        part.gpu_max_c,
    )
    assert g.power_w == part.idle_power_w and g.power_limit_w == part.power_default_w
    assert g.sm_clock_mhz == part.sm_idle_mhz and g.mem_clock_mhz == part.mem_mhz
    assert g.clock_event_reasons == pynvml.nvmlClocksEventReasonGpuIdle
    assert (g.remap_correctable, g.remap_pending, g.remap_failure) == (0, False, False)
    assert g.xids == () and g.nvlink_down == () and g.errors == ()
    assert g.fabric_state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED and g.fabric_healthy
    assert (g.clique != "") == (part.key == "gb200")


def test_faults_show_up_and_xids_are_reported_once(h200: FakeNvml) -> None:
    sampler = HealthSampler(h200)
    sampler.sample()  # registers for XID events
    h200.faults.heat(0, 95, rate_c_per_s=1e6)
    h200.faults.ecc(1, sbe=2, dbe=1)
    h200.faults.row_remap(2, pending=True)
    h200.faults.xid(3, 13)
    h200.faults.xid(3, 31)
    h200.faults.nvlink_down(4, 7)
    h200.faults.nvlink_errors(4, 2, crc=5)
    h200.faults.power_draw(5, 900)
    g = sampler.sample().gpus
    assert g[0].temp_c == 95 and g[0].mem_temp_c == 99
    assert g[0].clock_event_reasons & pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert g[0].sm_clock_mhz is not None and g[0].sm_clock_mhz < 345 / 0.5
    assert (g[1].ecc_sbe_volatile, g[1].ecc_dbe_volatile, g[1].ecc_dbe_aggregate) == (2, 1, 1)
    assert g[1].xids == (48,) and g[1].recovery_action == pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    assert g[2].remap_pending is True and g[2].remap_uncorrectable == 1
    assert g[3].xids == (13, 31)
    assert g[4].nvlink_down == (7,) and g[4].nvlink_errors == 6
    assert g[5].power_w == 700 and g[5].clock_event_reasons & pynvml.nvmlClocksEventReasonSwPowerCap
    assert all(x.xids == () for x in sampler.sample().gpus)


def test_lost_gpu_and_missing_readings(h200: FakeNvml) -> None:
    sampler = HealthSampler(h200)
    before = sampler.sample().gpus[6].uuid
    h200.faults.fall_off_bus(6)
    profile = GpuProfile.from_dict(
        {
            "version": "v1",
            "name": "mig",
            "mig": [{"devices": [2], "mig-enabled": True, "mig-devices": {"7g.141gb": 1}}],
        }
    )
    assert apply_profile(h200, profile).failures == ["GPU 6: GPU is lost"]
    g = sampler.sample().gpus
    lost = g[6]
    assert lost.lost and lost.uuid == before and lost.xids == (79,)
    assert lost.temp_c is None and lost.power_w is None and lost.remap_pending is None
    assert "uuid: GPU is lost" in lost.errors
    assert not g[2].lost and g[2].remap_correctable is None and g[2].remap_pending is None
    assert "remapped rows: Not Supported" in g[2].errors
    assert g[2].temp_c is not None


def test_event_set_recreated_after_reboot(h200: FakeNvml) -> None:
    sampler = HealthSampler(h200)
    sampler.sample()
    h200.reboot()
    h200.nvmlInit()
    sampler.sample()  # stale set dropped
    h200.faults.xid(0, 94)
    sampler.sample()  # new set registered after the event: not seen (as on hardware)
    h200.faults.xid(0, 95)
    assert sampler.sample().gpus[0].xids == (95,)


async def test_asample_does_not_block_the_loop(h200: FakeNvml) -> None:
    """NVML calls run off the loop: a call held inside NVML is released by a
    coroutine on the loop, which could never run if the call blocked it."""
    sampler = HealthSampler(h200)
    release = threading.Event()
    entered = threading.Event()
    original = h200.nvmlDeviceGetPowerUsage

    def held(handle: object) -> int:
        entered.set()
        assert release.wait(timeout=5), "the event loop never ran while NVML was busy"
        return int(original(handle))

    h200.nvmlDeviceGetPowerUsage = held  # type: ignore[method-assign]
    sample = asyncio.create_task(sampler.asample())
    while not entered.is_set():  # noqa: ASYNC110 (a thread sets it)
        await asyncio.sleep(0.01)  # the loop keeps running while the sample is inside NVML
    assert not sample.done()
    release.set()
    health = await sample
    assert len(health.gpus) == 8
    sampler.close()
