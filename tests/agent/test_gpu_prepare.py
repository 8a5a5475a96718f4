"""Applying GPU profiles to fake nodes: idempotence, validation, MIG, drift."""

from __future__ import annotations

from typing import Any

import pytest

from agent.nvml import FakeNvml, open_backend, part_by_key
from agent.nvml.mig import device_mig_profiles
from agent.nvml.mig_layout import LayoutError, apply_layout, current_layout, pack_layout
from agent.prepare import apply_profile, check_drift, reset_to_defaults
from kiln_common.gpu_profile import GpuProfile


def _profile(**over: Any) -> GpuProfile:
    d: dict[str, Any] = {
        "version": "v1",
        "name": "test",
        "persistence_mode": True,
        "power_limit_w": 600,
        "locked_clocks": {"sm_mhz": [1500, 1980], "mem_mhz": None},
    }
    d.update(over)
    return GpuProfile.from_dict(d)


def _mig(layout: dict[str, int], **entry: Any) -> list[dict[str, Any]]:
    return [{"devices": "all", "mig-enabled": True, "mig-devices": layout, **entry}]


def _layout(nvml: FakeNvml, index: int) -> dict[str, int]:
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    return current_layout(nvml, h, device_mig_profiles(nvml, h))


def _fresh(spec: str = "fake:h200") -> FakeNvml:
    nvml = open_backend(spec, node_name=f"prep-{spec}")
    assert isinstance(nvml, FakeNvml)
    nvml.nvmlInit()
    return nvml


def test_apply_is_idempotent_and_verified(fake: FakeNvml) -> None:
    profile = _profile()
    first = apply_profile(fake, profile)
    assert first.ok, first.failures
    n = fake.nvmlDeviceGetCount()
    assert len(first.changed) == 3 * n
    assert f"GPU {n - 1}: power limit 600 W" in first.changed
    assert "GPU 0: clocks locked (SM 1500-1980 MHz)" in first.changed
    second = apply_profile(fake, profile)
    assert second.ok and second.changed == []
    assert check_drift(fake, profile) == []


def test_drift_after_driver_reload_is_detected_and_repaired(h200: FakeNvml) -> None:
    profile = _profile()
    assert apply_profile(h200, profile).ok
    h200.driver_reload()
    h200.nvmlInit()
    drift = check_drift(h200, profile)
    assert "GPU 0: power limit 700 W, profile wants 600 W" in drift
    assert "GPU 3: clocks not locked" in drift
    assert "GPU 5: persistence mode is off" in drift
    again = apply_profile(h200, profile)
    assert again.ok and len(again.changed) == 24
    assert check_drift(h200, profile) == []


@pytest.mark.parametrize(
    ("over", "reason"),
    [
        pytest.param(
            {"power_limit_w": 900},
            "GPU 0: power limit 900 W outside 200-700 W supported by NVIDIA H200",
            id="power",
        ),
        pytest.param(
            {"locked_clocks": {"sm_mhz": [300, 2500]}},
            "GPU 0: SM clock range 300-2500 MHz outside 345-1980 MHz supported by NVIDIA H200",
            id="sm-clock",
        ),
        pytest.param(
            {"locked_clocks": {"mem_mhz": [1000, 1500]}},
            "GPU 0: memory clock range 1000-1500 MHz outside 3201-3201 MHz",
            id="mem-clock",
        ),
    ],
)
def test_unsupported_settings_fail_with_reason(
    h200: FakeNvml, over: dict[str, Any], reason: str
) -> None:
    result = apply_profile(h200, _profile(**over))
    assert not result.ok
    assert any(f.startswith(reason) for f in result.failures), result.failures
    h = h200.nvmlDeviceGetHandleByIndex(0)
    if "power_limit_w" in over:
        assert h200.nvmlDeviceGetPowerManagementLimit(h) == 700_000  # untouched


def test_non_root_reports_permission_failures() -> None:
    nvml = FakeNvml(part_by_key("h100"), root=False)
    nvml.nvmlInit()
    result = apply_profile(nvml, _profile())
    assert not result.ok and result.changed == []
    assert "GPU 0: power limit: Insufficient Permissions" in result.failures


def test_mig_layout_applied_with_names_from_the_device(h200: FakeNvml) -> None:
    layout = {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
    profile = _profile(mig=_mig(layout, **{"device-filter": ["0x233510DE"]}))
    result = apply_profile(h200, profile)
    assert result.ok, result.failures
    assert "GPU 2: MIG mode enabled" in result.changed
    assert "GPU 2: MIG instances 2x1g.18gb, 1x2g.35gb, 1x3g.71gb" in result.changed
    assert all(_layout(h200, i) == layout for i in range(8))
    assert apply_profile(h200, profile).changed == []
    assert check_drift(h200, profile) == []


def test_gb200_names_differ_and_are_found() -> None:
    nvml = _fresh("fake:gb200")
    result = apply_profile(
        nvml, _profile(power_limit_w=1000, mig=_mig({"1g.23gb": 3, "4g.93gb": 1}))
    )
    assert result.ok, result.failures
    wrong = apply_profile(nvml, _profile(power_limit_w=1000, mig=_mig({"1g.18gb": 1})))
    assert any("MIG profile(s) 1g.18gb not offered by NVIDIA GB200" in f for f in wrong.failures)


_H200_SLOTS = {
    "1g": [(s, 1) for s in range(7)],
    "1g2": [(0, 2), (2, 2), (4, 2), (6, 2)],
    "2g": [(0, 2), (2, 2), (4, 2)],
    "3g": [(0, 4), (4, 4)],
    "4g": [(0, 4)],
}


@pytest.mark.parametrize(
    ("layout", "fits"),
    [
        pytest.param({"3g": 1, "2g": 1, "1g": 2}, True, id="balanced-needs-3g-high"),
        pytest.param({"1g2": 3, "1g": 2}, True, id="double-memory-leaves-4-5"),
        pytest.param({"4g": 1, "2g": 2}, False, id="2g-cannot-start-at-6"),
        pytest.param({"3g": 2, "1g": 1}, False, id="slots-exhausted"),
        pytest.param({"1g": 8}, False, id="slot-7-is-no-1g-start"),
    ],
)
def test_pack_layout(layout: dict[str, int], fits: bool) -> None:
    plan = pack_layout(layout, _H200_SLOTS)
    assert (plan is not None) == fits
    if plan is not None:
        slots = [s for _, start, size in plan for s in range(start, start + size)]
        assert len(slots) == len(set(slots))
        assert sorted(n for n, _, _ in plan) == sorted(
            n for n, c in layout.items() for _ in range(c)
        )


def test_layout_without_packing_changes_nothing(h200: FakeNvml) -> None:
    assert apply_profile(h200, _profile(mig=_mig({"1g.18gb": 3}, devices=[1]))).ok
    # apply_layout alone (no budget precheck): eight one-slot instances have no
    # packing over the seven one-slot starts, so nothing is destroyed or created.
    h = h200.nvmlDeviceGetHandleByIndex(1)
    profiles = device_mig_profiles(h200, h)
    with pytest.raises(LayoutError, match="no non-overlapping placement"):
        apply_layout(h200, h, {"1g.18gb": 7, "1g.18gb+me": 1}, profiles)
    assert _layout(h200, 1) == {"1g.18gb": 3}


def test_layout_over_budget_is_rejected_before_touching(h200: FakeNvml) -> None:
    assert apply_profile(h200, _profile(mig=_mig({"4g.71gb": 1}, devices=[0]))).ok
    result = apply_profile(h200, _profile(mig=_mig({"4g.71gb": 1, "7g.141gb": 1}, devices=[0])))
    assert "GPU 0: MIG layout needs 11 compute slices, the GPU has 7" in result.failures
    assert _layout(h200, 0) == {"4g.71gb": 1}  # existing layout kept


def test_gpu_in_use_leaves_mig_pending_with_exact_reason(h200: FakeNvml) -> None:
    h200.faults.add_process(3, 501)
    h200.faults.add_process(3, 502)
    profile = _profile(mig=_mig({"7g.141gb": 1}))
    result = apply_profile(h200, profile, reset_gpu=h200.gpu_reset)
    assert "GPU 3 in use by 2 processes; MIG mode pending" in result.failures
    assert len(result.failures) == 1
    assert "GPU 3: MIG mode pending" in " ".join(check_drift(h200, profile)).replace(
        "enabled pending", "pending"
    )
    h200.faults.remove_process(3, 501)
    h200.faults.remove_process(3, 502)
    done = apply_profile(h200, profile, reset_gpu=h200.gpu_reset)
    assert done.ok, done.failures
    assert _layout(h200, 3) == {"7g.141gb": 1}


def test_reset_to_defaults_undoes_everything(h200: FakeNvml) -> None:
    profile = _profile(mig=_mig({"2g.35gb": 3}))
    assert apply_profile(h200, profile).ok
    result = reset_to_defaults(h200)
    assert result.ok, result.failures
    assert "GPU 0: MIG mode disabled" in result.changed
    assert "GPU 0: clock locks reset" in result.changed
    h = h200.nvmlDeviceGetHandleByIndex(0)
    assert h200.nvmlDeviceGetMigMode(h) == [0, 0]
    assert h200.nvmlDeviceGetPowerManagementLimit(h) == 700_000
    assert h200.nvmlDeviceGetPersistenceMode(h) == 0
    assert reset_to_defaults(h200).changed == []


def test_lost_gpu_is_reported_not_raised(h200: FakeNvml) -> None:
    h200.faults.fall_off_bus(4)
    result = apply_profile(h200, _profile())
    assert result.failures == ["GPU 4: GPU is lost"]
    assert check_drift(h200, _profile()) == ["GPU 4: GPU is lost"]
