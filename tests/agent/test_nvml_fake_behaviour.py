"""Mutating NVML behaviour, checked on the fake only (MIG, clocks, resets, faults)."""

from __future__ import annotations

import ctypes
import threading
import time
import uuid

import pynvml
import pytest
from conftest import ManualClock

from agent.gpu_inventory import read_inventory
from agent.nvml import FAULT_KINDS, FakeNvml, open_backend, part_by_key
from agent.nvml.mig import device_mig_profiles, list_gpu_instances


def _fake(spec: str = "fake:h200", **kw: object) -> FakeNvml:
    nvml = open_backend(spec, **kw)  # type: ignore[arg-type]
    assert isinstance(nvml, FakeNvml)
    nvml.nvmlInit()
    return nvml


# -- factory and lifecycle --------------------------------------------------------------
@pytest.mark.parametrize("spec", ["", "fake", "fake:", "fake:a100", "mock:h100", "REAL"])
def test_open_backend_rejects_bad_specs(spec: str) -> None:
    with pytest.raises(ValueError, match="backend spec"):
        open_backend(spec)


def test_calls_before_init_are_uninitialized() -> None:
    nvml = open_backend("fake:h100")
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    nvml.nvmlInit()
    nvml.nvmlInit()
    nvml.nvmlShutdown()
    assert nvml.nvmlDeviceGetCount() == 8  # still one reference
    nvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlSystemGetDriverVersion()


def test_non_root_setters_get_no_permission() -> None:
    nvml = FakeNvml(part_by_key("h100"), root=False)
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetPowerManagementLimit(h) == 700_000  # reads still work
    for call in (
        lambda: nvml.nvmlDeviceSetPowerManagementLimit(h, 500_000),
        lambda: nvml.nvmlDeviceSetGpuLockedClocks(h, 1500, 1980),
        lambda: nvml.nvmlDeviceSetPersistenceMode(h, 1),
        lambda: nvml.nvmlDeviceSetMigMode(h, 1),
    ):
        with pytest.raises(pynvml.NVMLError_NoPermission):
            call()


def test_nodes_are_independent() -> None:
    a, b = _fake(node_name="a"), _fake(node_name="b")
    ha, hb = a.nvmlDeviceGetHandleByIndex(0), b.nvmlDeviceGetHandleByIndex(0)
    a.nvmlDeviceSetPowerManagementLimit(ha, 500_000)
    a.faults.heat(0, 90, rate_c_per_s=1e6)
    assert b.nvmlDeviceGetPowerManagementLimit(hb) == 700_000
    assert b.nvmlDeviceGetTemperature(hb, 0) < 40
    assert a.nvmlDeviceGetUUID(ha) != b.nvmlDeviceGetUUID(hb)
    assert _fake(node_name="a").nvmlDeviceGetUUID(ha) == a.nvmlDeviceGetUUID(ha)  # seeded


# -- topology ----------------------------------------------------------------------------
def test_gb200_trays_share_a_clique() -> None:
    cluster = str(uuid.UUID(int=0x5A0C3B39))
    trays = [
        _fake("fake:gb200", node_name=f"tray{i}", cluster_uuid=cluster, clique_id=3)
        for i in range(2)
    ]
    cliques = {g.clique for t in trays for g in read_inventory(t).gpus}
    assert cliques == {f"{cluster}.3"}
    assert all(t.nvmlDeviceGetCount() == 4 for t in trays)


def test_hgx_reports_completed_fabric_without_domain() -> None:
    nvml = _fake("fake:h100")
    info = pynvml.c_nvmlGpuFabricInfo_v3_t()
    nvml.nvmlDeviceGetGpuFabricInfoV(nvml.nvmlDeviceGetHandleByIndex(0), ctypes.byref(info))
    assert info.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    assert bytes(info.clusterUuid) == bytes(16) and info.cliqueId == 0
    assert {g.clique for g in read_inventory(nvml).gpus} == {""}


# -- clocks, power, persistence ------------------------------------------------------------
def test_clock_locks_snap_to_ladder_and_are_forgotten_on_reload(fake: FakeNvml) -> None:
    h = fake.nvmlDeviceGetHandleByIndex(0)
    ladder = fake.nvmlDeviceGetSupportedGraphicsClocks(h, fake.part.mem_mhz)
    fake.nvmlDeviceSetGpuLockedClocks(h, 1503, 1502 + 100)
    fake.faults.add_process(0, 100)
    sm = fake.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
    assert sm in ladder and abs(sm - 1602) <= 7
    reasons = fake.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert reasons & pynvml.nvmlClocksEventReasonApplicationsClocksSetting
    fake.nvmlDeviceSetPowerManagementLimit(h, 400_000)
    fake.nvmlDeviceSetPersistenceMode(h, 1)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceSetGpuLockedClocks(h, 1900, 1500)
    fake.faults.remove_process(0, 100)
    fake.driver_reload()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetPowerManagementLimit(h) == fake.part.power_default_w * 1000
    assert fake.nvmlDeviceGetPersistenceMode(h) == 0
    assert not fake.nvmlDeviceGetCurrentClocksEventReasons(h) & 0x2
    assert fake.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == fake.part.sm_idle_mhz


def test_power_limit_range_and_cap(h200: FakeNvml) -> None:
    h = h200.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        h200.nvmlDeviceSetPowerManagementLimit(h, 900_000)
    h200.nvmlDeviceSetPowerManagementLimit(h, 500_000)
    h200.faults.power_draw(1, 650)
    assert h200.nvmlDeviceGetPowerUsage(h) == 500_000
    assert h200.nvmlDeviceGetCurrentClocksEventReasons(h) & pynvml.nvmlClocksEventReasonSwPowerCap


def test_driver_reload_refused_while_processes_run(h200: FakeNvml) -> None:
    h200.faults.add_process(2, 42)
    with pytest.raises(pynvml.NVMLError_InUse):
        h200.driver_reload()
    h200.reboot()  # a reboot ends the process
    h200.nvmlInit()
    assert h200.nvmlDeviceGetComputeRunningProcesses(h200.nvmlDeviceGetHandleByIndex(2)) == []


# -- thermal ----------------------------------------------------------------------------------
def test_heat_curve_follows_injected_clock() -> None:
    clock = ManualClock()
    nvml = FakeNvml(part_by_key("h100"), clock=clock)
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    start = nvml.nvmlDeviceGetTemperature(h, 0)
    nvml.faults.heat(0, 95, rate_c_per_s=5)
    clock.advance(4)
    assert nvml.nvmlDeviceGetTemperature(h, 0) == pytest.approx(start + 20, abs=1)
    clock.advance(100)
    assert nvml.nvmlDeviceGetTemperature(h, 0) == 95
    reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert reasons & pynvml.nvmlClocksEventReasonHwThermalSlowdown
    nvml.faults.heat(0, 40, rate_c_per_s=10)
    clock.advance(2)
    assert nvml.nvmlDeviceGetTemperature(h, 0) == 75


# -- events -----------------------------------------------------------------------------------
def test_each_xid_is_delivered_once_then_timeout(h200: FakeNvml) -> None:
    es = h200.nvmlEventSetCreate()
    h = h200.nvmlDeviceGetHandleByIndex(4)
    h200.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
    h200.faults.xid(4, 94)
    h200.faults.xid(5, 62)  # GPU 5 not registered: not delivered here
    event = h200.nvmlEventSetWait(es, 1000)
    assert (event.eventData, event.eventType) == (94, pynvml.nvmlEventTypeXidCriticalError)
    assert h200.nvmlDeviceGetIndex(event.device) == 4
    t0 = time.monotonic()
    with pytest.raises(pynvml.NVMLError_Timeout):
        h200.nvmlEventSetWait(es, 80)
    assert 0.07 <= time.monotonic() - t0 < 1.0


def test_wait_wakes_when_an_event_arrives(h200: FakeNvml) -> None:
    es = h200.nvmlEventSetCreate()
    h200.nvmlDeviceRegisterEvents(
        h200.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlEventTypeXidCriticalError, es
    )
    timer = threading.Timer(0.05, h200.faults.xid, args=(0, 13))
    timer.start()
    t0 = time.monotonic()
    assert h200.nvmlEventSetWait(es, 5000).eventData == 13
    assert time.monotonic() - t0 < 2.0
    timer.join()


def test_dbe_counts_and_queues_xid_48(h200: FakeNvml) -> None:
    es = h200.nvmlEventSetCreate()
    h = h200.nvmlDeviceGetHandleByIndex(1)
    h200.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
    h200.faults.ecc(1, sbe=3, dbe=1)
    assert h200.nvmlEventSetWait(es, 100).eventData == 48
    assert h200.nvmlDeviceGetTotalEccErrors(h, 1, pynvml.NVML_VOLATILE_ECC) == 1
    assert h200.nvmlDeviceGetTotalEccErrors(h, 0, pynvml.NVML_AGGREGATE_ECC) == 3
    h200.gpu_reset(1)
    assert h200.nvmlDeviceGetTotalEccErrors(h, 1, pynvml.NVML_VOLATILE_ECC) == 0
    assert h200.nvmlDeviceGetTotalEccErrors(h, 1, pynvml.NVML_AGGREGATE_ECC) == 1


def test_fallen_gpu_is_lost_for_everything(h200: FakeNvml) -> None:
    es = h200.nvmlEventSetCreate()
    h = h200.nvmlDeviceGetHandleByIndex(6)
    h200.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
    h200.faults.fall_off_bus(6)
    assert h200.nvmlEventSetWait(es, 100).eventData == 79
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        h200.nvmlEventSetWait(es, 10)
    for call in (
        h200.nvmlDeviceGetUUID,
        h200.nvmlDeviceGetPowerUsage,
        h200.nvmlDeviceGetMigMode,
        h200.nvmlDeviceGetRemappedRows,
        lambda x: h200.nvmlDeviceGetTemperature(x, 0),
    ):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call(h)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        h200.gpu_reset(6)
    h200.reboot()
    h200.nvmlInit()
    assert h200.nvmlDeviceGetUUID(h200.nvmlDeviceGetHandleByIndex(6)).startswith("GPU-")


def test_nvlink_and_fabric_faults() -> None:
    nvml = _fake("fake:gb200", cluster_uuid=str(uuid.UUID(int=7)), clique_id=1)
    h = nvml.nvmlDeviceGetHandleByIndex(2)
    nvml.faults.nvlink_down(2, 5)
    assert nvml.nvmlDeviceGetNvLinkState(h, 5) == pynvml.NVML_FEATURE_DISABLED
    assert nvml.nvmlDeviceGetNvLinkState(h, 4) == pynvml.NVML_FEATURE_ENABLED
    assert nvml.nvmlDeviceGetNvLinkErrorCounter(h, 5, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY) == 1
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetNvLinkState(h, 18)
    nvml.faults.fabric_degraded(2)
    info = pynvml.c_nvmlGpuFabricInfo_v3_t()
    nvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
    assert info.healthSummary == pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY
    assert info.healthMask & 0x3 == pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE


# -- MIG ----------------------------------------------------------------------------------------
def test_mig_mode_pending_until_reset_and_reset_refused_in_use(h200: FakeNvml) -> None:
    h = h200.nvmlDeviceGetHandleByIndex(3)
    h200.faults.add_process(3, 1001)
    h200.faults.add_process(3, 1002)
    status = h200.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_ENABLE)
    assert status == pynvml.NVML_ERROR_IN_USE  # returned, not raised
    assert h200.nvmlDeviceGetMigMode(h) == [0, 1]
    with pytest.raises(pynvml.NVMLError_InUse):
        h200.gpu_reset(3)
    h200.faults.remove_process(3, 1001)
    h200.faults.remove_process(3, 1002)
    assert h200.nvmlDeviceGetMigMode(h) == [0, 1]  # still pending until a reset
    h200.gpu_reset(3)
    assert h200.nvmlDeviceGetMigMode(h) == [1, 1]


def test_mig_profiles_ids_and_first_fit(fake: FakeNvml) -> None:
    h = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceCreateGpuInstance(h, 19)  # MIG off
    assert fake.nvmlDeviceSetMigMode(h, 1) == pynvml.NVML_SUCCESS
    profiles = device_mig_profiles(fake, h)
    ids = {p.profile_id for p in profiles.values()}
    assert ids == {19, 20, 15, 14, 9, 5, 0}
    one = next(p for p in profiles.values() if p.profile_id == 19)
    three = next(p for p in profiles.values() if p.profile_id == 9)
    starts = []
    for _ in range(3):
        gi = fake.nvmlDeviceCreateGpuInstance(h, one.profile_id)
        starts.append(fake.nvmlGpuInstanceGetInfo(gi).placement.start)
    assert starts == [0, 1, 2]
    # Slots 0-2 taken: a 3g (starts 0 or 4) fits only at 4; a second one does not fit.
    gi3 = fake.nvmlDeviceCreateGpuInstance(h, three.profile_id)
    assert fake.nvmlGpuInstanceGetInfo(gi3).placement.start == 4
    assert fake.nvmlDeviceGetGpuInstanceRemainingCapacity(h, three.profile_id) == 0
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        fake.nvmlDeviceCreateGpuInstance(h, three.profile_id)
    assert len(list_gpu_instances(fake, h, one.profile_id, 7)) == 3
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetRemappedRows(h)
    placement = pynvml.c_nvmlGpuInstancePlacement_t(3, 1)
    gi = fake.nvmlDeviceCreateGpuInstanceWithPlacement(h, 19, ctypes.byref(placement))
    assert fake.nvmlGpuInstanceGetInfo(gi).placement.start == 3
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        fake.nvmlDeviceCreateGpuInstanceWithPlacement(h, 19, ctypes.byref(placement))
    with pytest.raises(pynvml.NVMLError_InUse):
        fake.nvmlDeviceSetMigMode(h, 0)  # instances exist


def test_compute_instances_block_gpu_instance_destroy(h200: FakeNvml) -> None:
    h = h200.nvmlDeviceGetHandleByIndex(0)
    h200.nvmlDeviceSetMigMode(h, 1)
    gi = h200.nvmlDeviceCreateGpuInstance(h, 14)
    info = h200.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE, 0
    )
    ci = h200.nvmlGpuInstanceCreateComputeInstance(gi, info.id)
    with pytest.raises(pynvml.NVMLError_InUse):
        h200.nvmlGpuInstanceDestroy(gi)
    h200.nvmlComputeInstanceDestroy(ci)
    h200.nvmlGpuInstanceDestroy(gi)
    assert h200.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)


# -- fault dispatcher ------------------------------------------------------------------------------
def test_apply_fault_dispatches_and_validates(h200: FakeNvml) -> None:
    msg = h200.faults.apply_fault({"kind": "row_remap", "gpu": 2, "pending": True})
    assert "row_remap" in msg
    assert h200.nvmlDeviceGetRemappedRows(h200.nvmlDeviceGetHandleByIndex(2))[2] == 1
    with pytest.raises(ValueError, match="unknown fault kind"):
        h200.faults.apply_fault({"kind": "meteor"})
    with pytest.raises(ValueError, match="needs target_c"):
        h200.faults.apply_fault({"kind": "heat", "gpu": 0})
    with pytest.raises(ValueError, match="does not take"):
        h200.faults.apply_fault({"kind": "xid", "gpu": 0, "code": 13, "colour": "red"})
    with pytest.raises(ValueError, match="no GPU 9"):
        h200.faults.apply_fault({"kind": "xid", "gpu": 9, "code": 13})
    assert set(FAULT_KINDS) >= {"heat", "ecc", "xid", "fall_off_bus", "gpu_reset", "clear"}
    h200.faults.apply_fault({"kind": "fall_off_bus", "gpu": 1})
    h200.faults.apply_fault({"kind": "clear"})
    h = h200.nvmlDeviceGetHandleByIndex(1)
    assert h200.nvmlDeviceGetUUID(h) and h200.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)
