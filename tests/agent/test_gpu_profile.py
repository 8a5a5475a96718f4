"""GPU profile parsing and validation (table-driven)."""

from __future__ import annotations

from typing import Any

import pytest

from kiln_common.gpu_profile import GpuProfile, LockedClocks, ProfileError

H200_YAML = """
version: v1
name: h200-balanced
persistence_mode: true
power_limit_w: 600
locked_clocks:
  sm_mhz: [1500, 1980]
  mem_mhz: null
mig:
  - device-filter: ["0x233510DE"]
    devices: all
    mig-enabled: true
    mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
  - devices: [7]
    mig-enabled: false
"""


def test_parse_full_profile() -> None:
    p = GpuProfile.from_yaml(H200_YAML)
    assert p.name == "h200-balanced" and p.persistence_mode and p.power_limit_w == 600
    assert p.locked_clocks == LockedClocks(sm_mhz=(1500, 1980), mem_mhz=None)
    entry = p.mig_entry_for(0, 0x233510DE)
    assert entry is not None and entry.layout == {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
    assert p.mig_entry_for(7, 0x233010DE) == p.mig[1]  # filter excludes H100 from entry 0
    assert p.mig_entry_for(3, 0x233010DE) is None  # no entry: MIG left alone


def test_round_trip() -> None:
    p = GpuProfile.from_yaml(H200_YAML)
    assert GpuProfile.from_dict(p.to_dict()) == p
    assert GpuProfile.from_yaml(p.to_yaml()) == p


def _base(**over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"version": "v1", "name": "p"}
    d.update(over)
    return d


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        pytest.param({"version": "v2", "name": "p"}, "unsupported 'v2'", id="unknown-version"),
        pytest.param({"name": "p"}, "unsupported None", id="missing-version"),
        pytest.param(_base(colour="red"), "unknown key(s) 'colour'", id="unknown-top-key"),
        pytest.param(_base(name=""), "name: required", id="empty-name"),
        pytest.param(_base(persistence_mode="yes"), "persistence_mode", id="persistence-type"),
        pytest.param(_base(power_limit_w=-5), "power_limit_w", id="negative-power"),
        pytest.param(_base(power_limit_w=True), "power_limit_w", id="bool-power"),
        pytest.param(
            _base(locked_clocks={"sm_mhz": [1980, 1500]}), "min <= max", id="inverted-clocks"
        ),
        pytest.param(
            _base(locked_clocks={"sm_mhz": [1500]}), "expected [min, max]", id="short-range"
        ),
        pytest.param(_base(locked_clocks={"gpc_mhz": None}), "'gpc_mhz'", id="unknown-clock"),
        pytest.param(_base(mig={"devices": "all"}), "expected a list", id="mig-not-list"),
        pytest.param(_base(mig=[{"devices": "all"}]), "mig-enabled: required", id="no-enabled"),
        pytest.param(
            _base(mig=[{"mig-enabled": True, "mig-devices": {"big": 1}}]),
            "bad MIG profile name 'big'",
            id="bad-mig-name",
        ),
        pytest.param(
            _base(mig=[{"mig-enabled": True, "mig-devices": {"1g.18gb": -1}}]),
            "count >= 0",
            id="negative-count",
        ),
        pytest.param(
            _base(mig=[{"mig-enabled": False, "mig-devices": {"1g.18gb": 1}}]),
            "mig-enabled: false",
            id="instances-without-mig",
        ),
        pytest.param(
            _base(mig=[{"mig-enabled": True, "device-filter": ["0xZZ"]}]),
            "bad PCI device id",
            id="bad-filter",
        ),
        pytest.param(
            _base(mig=[{"mig-enabled": True, "devices": "some"}]), "'all' or a list", id="devices"
        ),
        pytest.param(
            _base(mig=[{"mig-enabled": True, "mig_devices": {}}]), "'mig_devices'", id="typo-key"
        ),
        pytest.param([1, 2], "mapping at the top level", id="not-mapping"),
    ],
)
def test_invalid_profiles_are_rejected(doc: Any, message: str) -> None:
    with pytest.raises(ProfileError) as exc:
        GpuProfile.from_dict(doc)
    assert message in str(exc.value)
    assert isinstance(exc.value, ValueError)


def test_bad_yaml() -> None:
    with pytest.raises(ProfileError, match="not valid YAML"):
        GpuProfile.from_yaml("version: [v1")
