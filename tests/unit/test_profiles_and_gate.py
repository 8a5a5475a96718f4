"""Node profiles: validated on load; the health gate's verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.core.errors import InvalidArgument, NotFound
from controller.core.health import GpuHealth, HealthReport
from controller.core.preparation import gate_problems
from controller.core.profiles import HealthGate, ProfileCatalog, parse_profile

GOOD = """
version: v1
name: gb200-train
firmware:
  - {component: BMC, version: "1.1.0", image: "http://127.0.0.1:8080/bmc-1.1.0.bin"}
bios: {ProcTurboMode: Enabled, NumaNodesPerSocket: 2}
gpu:
  persistence_mode: true
  locked_clocks: {sm_mhz: [1500, 1980], mem_mhz: null}
health_gate: {max_gpu_temp_c: 70, require_fabric: true}
"""


def test_a_full_profile_loads() -> None:
    profile = parse_profile(yaml.safe_load(GOOD), "gb200-train.yaml")
    assert profile.firmware[0].component == "BMC" and profile.firmware[0].version == "1.1.0"
    assert profile.bios == {"ProcTurboMode": "Enabled", "NumaNodesPerSocket": 2}
    assert profile.health_gate == HealthGate(max_gpu_temp_c=70, require_fabric=True)
    assert "persistence_mode: true" in profile.gpu_yaml()


def bad(**change: Any) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(GOOD)
    data.update(change)
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (bad(version="v2"), "unsupported profile version"),
        (bad(colour="red"), "unknown keys"),
        (bad(name=""), "needs a name"),
        (bad(firmware=[{"component": "BMC"}]), "component, version and image"),
        (bad(firmware=[{"component": "BMC", "version": "1", "image": "ftp://x"}]), "http"),
        (bad(bios={"A": [1]}), "string, number or boolean"),
        (bad(health_gate={"max_temp": 3}), "unknown keys"),
        (bad(gpu={"power_limit_w": "lots"}), "gpu:"),
        (bad(gpu={"locked_clocks": {"sm_mhz": [1500]}}), "gpu:"),
    ],
    ids=[
        "version",
        "unknown-key",
        "no-name",
        "firmware-fields",
        "firmware-url",
        "bios-value",
        "gate-key",
        "gpu-power",
        "gpu-clocks",
    ],
)
def test_bad_profiles_are_refused_with_the_reason(data: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as err:
        parse_profile(data, "p.yaml")
    assert str(err.value).startswith("p.yaml")


def test_catalog_loads_a_directory_and_names_the_bad_file(tmp_path: Path) -> None:
    (tmp_path / "good.yaml").write_text(GOOD)
    catalog = ProfileCatalog.load(tmp_path)
    assert catalog.names() == ["gb200-train"]
    with pytest.raises(NotFound):
        catalog.get("nope")
    (tmp_path / "broken.yaml").write_text("version: v1\nname: [unclosed\n")
    with pytest.raises(InvalidArgument, match=r"broken\.yaml"):
        ProfileCatalog.load(tmp_path)


def gpu(**fields: Any) -> dict[str, Any]:
    base = {
        "index": 0,
        "lost": False,
        "temp_c": 40.0,
        "ecc_dbe_volatile": 0,
        "remap_failure": False,
        "remap_pending": False,
        "nvlink_down": [],
        "fabric_state": 3,
        "fabric_healthy": True,
    }
    base.update(fields)
    return base


@pytest.mark.parametrize(
    ("gate", "gpus", "expected"),
    [
        (HealthGate(), [gpu()], []),
        (HealthGate(max_gpu_temp_c=60), [gpu(temp_c=75.0)], ["GPU 0 at 75 °C (gate 60 °C)"]),
        (HealthGate(max_gpu_temp_c=60), [gpu(temp_c=None)], ["GPU 0 temperature unreadable"]),
        (HealthGate(), [gpu(ecc_dbe_volatile=2)], ["GPU 0 has 2 uncorrectable ECC errors"]),
        (
            HealthGate(),
            [gpu(remap_pending=True)],
            ["GPU 0 has a row remap pending (needs a reset)"],
        ),
        (HealthGate(allow_remap_pending=True), [gpu(remap_pending=True)], []),
        (HealthGate(), [gpu(lost=True)], ["GPU 0 fell off the bus"]),
        (
            HealthGate(require_fabric=True),
            [gpu(fabric_state=2)],
            ["GPU 0 NVLink fabric not ready (state 2)"],
        ),
        (HealthGate(), [gpu(nvlink_down=[3])], ["GPU 0 NVLink(s) down: [3]"]),
        (HealthGate(), [], ["no GPU health reported"]),
    ],
    ids=[
        "healthy",
        "too-hot",
        "no-temperature",
        "dbe",
        "remap-pending",
        "remap-allowed",
        "lost",
        "fabric",
        "nvlink-down",
        "no-gpus",
    ],
)
def test_health_gate(gate: HealthGate, gpus: list[dict[str, Any]], expected: list[str]) -> None:
    report = HealthReport(
        gpus=tuple(GpuHealth(**{**g, "nvlink_down": tuple(g["nvlink_down"])}) for g in gpus)
    )
    assert gate_problems(gate, report) == expected
