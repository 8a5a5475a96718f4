"""``kiln alloc report``: a released allocation's health report, per GPU and
its replacements, as a table for people and as JSON for scripts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.cli.alloc import cmd_report, fmt_energy, fmt_throttled, report_text
from controller.cli.main import build_parser
from controller.cli.output import message_dict
from kiln.v1 import fleet_pb2

pytestmark = pytest.mark.timeout(30)

START = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def make_report(**fields: Any) -> Any:
    values: dict[str, Any] = {
        "allocation": "alloc-1",
        "started_at": START,
        "ended_at": START + 3725,
        "reports": 1490,
        "gpus": [
            fleet_pb2.GpuJobHealth(
                node="n1",
                index=0,
                uuid="GPU-0",
                max_temp_c=90.0,
                throttled_s={"sw_power_cap": 200.0, "hw_thermal": 7.5},
                energy_j=9.36e6,
                ecc_sbe=4,
                xids=[13, 31],
                rows_remapped=2,
                nvlink_errors=5,
            ),
            fleet_pb2.GpuJobHealth(node="n1", index=1, uuid="GPU-1", energy_j=1400.0),
        ],
        "replacements": [
            fleet_pb2.NodeReplacement(
                failed="n2", replacement="n3", at=START + 60, reason="n2 failed (XID 79)"
            ),
            fleet_pb2.NodeReplacement(failed="n4", at=START + 120, reason="degraded"),
        ],
    }
    values.update(fields)
    return fleet_pb2.AllocationReport(**values)


def test_the_report_is_parsed_as_its_own_command() -> None:
    args = build_parser().parse_args(["alloc", "report", "alloc-1", "-o", "json"])
    assert args.func is cmd_report and args.id == "alloc-1" and args.output == "json"


def test_a_table_per_gpu_then_the_replacements() -> None:
    text = report_text(make_report())
    fields, gpus, replaced = text.split("\n\n")
    assert "allocation: alloc-1" in fields
    assert "held:       2026-01-01T00:00:00Z for 1h02m" in fields
    assert "reports:    1490" in fields and "partial" not in fields
    header, first, second = gpus.splitlines()
    assert header.split("  ")[:3] == ["NODE", "GPU", "MAX TEMP"]
    assert first.split() == [
        *("n1", "0", "90C", "hw_thermal", "7.5s,", "sw_power_cap", "3m"),
        *("2.60", "kWh", "4/0", "13,31", "2", "5"),
    ]
    assert second.split() == ["n1", "1", "-", "-", "1.4", "kJ", "0/0", "-", "0", "0"]
    lines = replaced.splitlines()
    assert lines[0].split() == ["REPLACED", "BY", "AT", "REASON"]
    assert lines[1].split()[:3] == ["n2", "n3", "2026-01-01T00:01:00Z"]
    assert lines[2].startswith("n4") and "none free" in lines[2]


def test_a_partial_report_says_so_and_an_empty_one_says_why() -> None:
    text = report_text(make_report(partial=True, gpus=[], replacements=[], reports=0))
    assert "partial:    yes: held across a controller restart" in text
    assert text.endswith("no health reports came from its nodes while it held them")
    assert "REPLACED" not in text


@pytest.mark.parametrize(
    ("joules", "shown"),
    [(0.0, "-"), (950.0, "950 J"), (12_345.0, "12.3 kJ"), (3.6e6, "1.00 kWh")],
)
def test_energy_in_its_unit(joules: float, shown: str) -> None:
    assert fmt_energy(joules) == shown


def test_throttle_reasons_hardware_first_and_unknown_ones_kept() -> None:
    throttled = {"sw_power_cap": 1.0, "hw_slowdown": 2.0, "new_reason": 3.0, "sync_boost": 0.0}
    assert fmt_throttled(throttled) == "hw_slowdown 2.0s, sw_power_cap 1.0s, new_reason 3.0s"
    assert fmt_throttled({}) == "-"


def test_the_json_is_the_report_message_with_every_field() -> None:
    doc = json.loads(json.dumps(message_dict(make_report())))
    assert set(doc) == {f.name for f in fleet_pb2.AllocationReport.DESCRIPTOR.fields}
    first, second = doc["gpus"]
    assert first["throttled_s"] == {"sw_power_cap": 200.0, "hw_thermal": 7.5}
    assert first["xids"] == [13, 31] and first["ecc_sbe"] == "4"  # uint64: a string
    assert second["max_temp_c"] is None  # no reading: null, not 0
    assert doc["replacements"][1]["replacement"] == "" and doc["partial"] is False
