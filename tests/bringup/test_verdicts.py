"""The bring-up's verdicts on firmware and fabric, as pure functions."""

from __future__ import annotations

import pytest

from controller.cli.main import build_parser
from controller.core.health import GpuHealth, HealthReport
from controller.core.model import GpuInfo
from controller.core.rack_bringup import (
    fabric_problem,
    firmware_mismatches,
    majority,
    tray_cliques,
)

pytestmark = pytest.mark.timeout(30)


def test_a_pinned_version_names_every_tray_off_it() -> None:
    inventories = {
        "t1": {"BIOS": "1.1.0", "BMC": "2.0"},
        "t2": {"BIOS": "1.0.0", "BMC": "2.0"},
        "t3": {"BIOS": "1.1.0", "BMC": "2.0"},
    }
    assert firmware_mismatches(inventories, {"BIOS": "1.1.0"}) == {
        "t2": "firmware BIOS at 1.0.0; the baseline pins 1.1.0"
    }
    # A pin no tray meets names them all.
    assert set(firmware_mismatches(inventories, {"BIOS": "9.9"})) == {"t1", "t2", "t3"}


def test_without_pins_the_odd_tray_out_is_named() -> None:
    inventories = {f"t{i}": {"BMC": "2.0"} for i in range(1, 18)} | {"t18": {"BMC": "1.9"}}
    problems = firmware_mismatches(inventories, {})
    assert list(problems) == ["t18"]
    assert "BMC at 1.9; 17 other tray(s) run 2.0" in problems["t18"]
    assert "no mixed versions in one NVLink domain" in problems["t18"]
    assert firmware_mismatches({"t1": {}, "t2": {}}, {}) == {}  # no inventory: nothing to judge


def test_majority_breaks_ties_by_the_smallest() -> None:
    assert majority(["b", "a", "b"]) == "b"
    assert majority(["b", "a"]) == "a"
    assert majority([]) == ""


def gpus(*cliques: str) -> tuple[GpuInfo, ...]:
    return tuple(
        GpuInfo(index=i, uuid=f"GPU-{i}", model="NVIDIA GB200", clique=c)
        for i, c in enumerate(cliques)
    )


def health(state: int = 3, healthy: bool = True) -> HealthReport:
    return HealthReport(
        gpus=tuple(GpuHealth(index=i, fabric_state=state, fabric_healthy=healthy) for i in range(4))
    )


def test_fabric_verdicts() -> None:
    rack = "c1.1"
    assert fabric_problem(tray_cliques(gpus(*[rack] * 4)), rack, health(), 18) == ""
    other = fabric_problem(tray_cliques(gpus(*["c1.2"] * 4)), rack, health(), 18)
    assert other == "fabric clique c1.2 differs from the rack's c1.1 (18 trays)"
    split = fabric_problem(tray_cliques(gpus(rack, rack, "c1.2", rack)), rack, health(), 18)
    assert "split over fabric cliques c1.1, c1.2" in split
    assert "no NVLink fabric clique" in fabric_problem(tray_cliques(gpus("", "")), rack, None, 2)
    waiting = fabric_problem(tray_cliques(gpus(*[rack] * 4)), rack, health(state=2), 18)
    assert waiting.startswith("GPU 0 NVLink fabric state 2")
    sick = fabric_problem(tray_cliques(gpus(*[rack] * 4)), rack, health(healthy=False), 18)
    assert "unhealthy" in sick


def test_enroll_takes_a_member_kind() -> None:
    parser = build_parser()
    base = ["nodes", "enroll", "nvsw-1", "--bmc", "redfish://127.0.0.1/x", "--username", "u"]
    args = parser.parse_args([*base, "--password-file", "-", "--kind", "switch_tray"])
    assert args.kind == "switch_tray"
    assert parser.parse_args([*base, "--password-file", "-"]).kind == "compute"
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--password-file", "-", "--kind", "gpu"])
    args = parser.parse_args(["racks", "bring-up", "r01", "--image", "talos", "--wait", "600"])
    assert (args.rack, args.image, args.wait, args.members) == ("r01", "talos", 600.0, None)
