"""Read-only NVML contract: the same assertions against every fake part and real NVML.

Nothing here changes a GPU (no clocks, power, MIG, ECC or resets), so it is safe
to run on a production GPU machine (scripts/gpu-readonly-check.sh). The real
backend is skipped only where no NVIDIA driver is installed.
"""

from __future__ import annotations

import ctypes
import re

import pynvml
import pytest

from agent.gpu_inventory import read_inventory
from agent.health import HealthSampler
from agent.nvml import NvmlBackend, RealNvml, open_backend
from agent.nvml.backend import NvmlBackend as Proto


def _handles(nvml: NvmlBackend) -> list[object]:
    return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]


def test_backend_satisfies_protocol(any_nvml: NvmlBackend) -> None:
    assert isinstance(any_nvml, Proto)
    assert isinstance(RealNvml(), Proto)


def test_identity(any_nvml: NvmlBackend) -> None:
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", any_nvml.nvmlSystemGetDriverVersion())
    handles = _handles(any_nvml)
    assert handles, "a GPU node has GPUs"
    uuids = set()
    for i, h in enumerate(handles):
        uuid = any_nvml.nvmlDeviceGetUUID(h)
        assert re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", uuid)
        uuids.add(uuid)
        assert any_nvml.nvmlDeviceGetIndex(h) == i
        assert any_nvml.nvmlDeviceGetName(h).startswith("NVIDIA")
        pci = any_nvml.nvmlDeviceGetPciInfo_v3(h)
        assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9]", pci.busId)
        assert pci.pciDeviceId & 0xFFFF == 0x10DE  # NVIDIA vendor id in the low half
        assert any_nvml.nvmlDeviceGetArchitecture(h) >= pynvml.NVML_DEVICE_ARCH_HOPPER
        mem = any_nvml.nvmlDeviceGetMemoryInfo(h)
        assert mem.total > 16 * 1024**3 and mem.used + mem.free <= mem.total
        assert ctypes.cast(any_nvml.nvmlDeviceGetHandleByUUID(uuid), ctypes.c_void_p).value
    assert len(uuids) == len(handles)


def test_bad_index_is_invalid_argument(any_nvml: NvmlBackend) -> None:
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        any_nvml.nvmlDeviceGetHandleByIndex(any_nvml.nvmlDeviceGetCount() + 5)


def test_thermal_and_power(any_nvml: NvmlBackend) -> None:
    for h in _handles(any_nvml):
        temp = any_nvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        assert 5 <= temp <= 110
        slowdown = any_nvml.nvmlDeviceGetTemperatureThreshold(
            h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        )
        shutdown = any_nvml.nvmlDeviceGetTemperatureThreshold(
            h, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
        )
        assert 60 <= slowdown < shutdown <= 120
        lo, hi = any_nvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
        default = any_nvml.nvmlDeviceGetPowerManagementDefaultLimit(h)
        limit = any_nvml.nvmlDeviceGetPowerManagementLimit(h)
        assert lo <= default <= hi and lo <= limit <= hi
        assert any_nvml.nvmlDeviceGetEnforcedPowerLimit(h) <= hi
        assert 0 < any_nvml.nvmlDeviceGetPowerUsage(h) <= hi * 1.1


def test_clocks_and_ladder(any_nvml: NvmlBackend) -> None:
    for h in _handles(any_nvml):
        sm_max = any_nvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)
        assert 0 < any_nvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) <= sm_max
        mems = any_nvml.nvmlDeviceGetSupportedMemoryClocks(h)
        assert any_nvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM) in mems
        ladder = any_nvml.nvmlDeviceGetSupportedGraphicsClocks(h, max(mems))
        assert max(ladder) == sm_max
        steps = {a - b for a, b in zip(sorted(ladder)[1:], sorted(ladder), strict=False)}
        assert steps == {15}
        reasons = any_nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        assert reasons & ~pynvml.nvmlClocksEventReasonAll == 0


def test_ecc_and_memory_errors(any_nvml: NvmlBackend) -> None:
    for h in _handles(any_nvml):
        current, pending = any_nvml.nvmlDeviceGetEccMode(h)
        assert current in (0, 1) and pending in (0, 1)
        for err in (
            pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        ):
            for counter in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
                assert any_nvml.nvmlDeviceGetTotalEccErrors(h, err, counter) >= 0
        with pytest.raises(pynvml.NVMLError_NotSupported):
            any_nvml.nvmlDeviceGetRetiredPages(
                h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
            )
        try:
            rows = any_nvml.nvmlDeviceGetRemappedRows(h)
        except pynvml.NVMLError_NotSupported:
            assert any_nvml.nvmlDeviceGetMigMode(h)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        else:
            assert len(rows) == 4 and all(v >= 0 for v in rows)
        values = any_nvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
        assert values[0].fieldId == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION


def test_event_set_times_out_without_events(any_nvml: NvmlBackend) -> None:
    es = any_nvml.nvmlEventSetCreate()
    try:
        for h in _handles(any_nvml):
            any_nvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
        with pytest.raises(pynvml.NVMLError_Timeout):
            any_nvml.nvmlEventSetWait(es, 20)
    finally:
        any_nvml.nvmlEventSetFree(es)


def test_nvlink_fabric_mig_processes(any_nvml: NvmlBackend) -> None:
    for h in _handles(any_nvml):
        assert any_nvml.nvmlDeviceGetNvLinkState(h, 0) in (0, 1)
        assert any_nvml.nvmlDeviceGetNvLinkErrorCounter(h, 0, 0) >= 0
        info = pynvml.c_nvmlGpuFabricInfoV_t()
        any_nvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
        assert info.state in range(4)
        current, pending = any_nvml.nvmlDeviceGetMigMode(h)
        assert {current, pending} <= {0, 1}
        for proc in any_nvml.nvmlDeviceGetComputeRunningProcesses(h):
            assert proc.pid > 0


def test_inventory_and_health(any_nvml: NvmlBackend) -> None:
    inv = read_inventory(any_nvml)
    assert len(inv.gpus) == any_nvml.nvmlDeviceGetCount()
    assert [g.index for g in inv.gpus] == list(range(len(inv.gpus)))
    assert all(g.architecture in ("Hopper", "Blackwell") for g in inv.gpus)
    health = HealthSampler(any_nvml).sample()
    assert [g.uuid for g in health.gpus] == [g.uuid for g in inv.gpus]
    for g in health.gpus:
        assert not g.lost and g.temp_c is not None and g.power_w is not None
        assert g.slowdown_c is not None and g.shutdown_c is not None


@pytest.mark.parametrize("spec", ["fake:h100", "fake:h200", "fake:gb200"])
def test_fake_parts_match_reference(spec: str) -> None:
    expected = {
        "fake:h100": ("NVIDIA H100 80GB HBM3", 0x233010DE, 81559, 8, "Hopper"),
        "fake:h200": ("NVIDIA H200", 0x233510DE, 143771, 8, "Hopper"),
        "fake:gb200": ("NVIDIA GB200", 0x294110DE, 189471, 4, "Blackwell"),
    }[spec]
    nvml = open_backend(spec)
    nvml.nvmlInit()
    inv = read_inventory(nvml)
    assert {(g.name, g.pci_device_id, g.memory_total_mib, g.architecture) for g in inv.gpus} == {
        expected[:3] + expected[4:]
    }
    assert len(inv.gpus) == expected[3]
