"""``kiln nodes checks``: the history table, and the parser's new commands."""

from __future__ import annotations

import json

import pytest

from controller.cli.main import build_parser
from controller.cli.node_checks import checks_table
from kiln.v1 import fleet_pb2

pytestmark = pytest.mark.timeout(30)


def run(passed: bool) -> fleet_pb2.CheckRun:
    check = fleet_pb2.CheckOutcome(
        name="nvlink-bandwidth",
        kind="nvbandwidth",
        passed=passed,
        reason="" if passed else "nvlink-bandwidth: GPU 1: 301.2 GB/s, under 760 GB/s",
        duration_s=1.25,
        figures_json=json.dumps({"gpu_gbps": {"0": 780.0, "1": 301.2}}),
        baseline_json=json.dumps({"min_gbps": 760, "gpu_model": "GB200"}),
    )
    return fleet_pb2.CheckRun(
        node="gb200-r01-t03",
        level="medium",
        trigger="operator",
        suite_version="kiln-default@2026-12-01",
        passed=passed,
        started_at=1000.0,
        duration_s=2.5,
        checks=[check],
        reason=check.reason,
    )


def test_history_table_shows_each_run_and_verbose_each_check() -> None:
    text = checks_table([run(True), run(False)], now=1060.0)
    lines = text.splitlines()
    assert lines[0].split() == ["STARTED", "LEVEL", "TRIGGER", "RESULT", "TOOK", "SUITE", "REASON"]
    assert "(60s ago)" in lines[1] and "passed" in lines[1] and lines[1].endswith("-")
    assert "failed" in lines[2] and lines[2].endswith("under 760 GB/s")
    verbose = checks_table([run(False)], verbose=True, now=1060.0).splitlines()
    assert len(verbose) == 3
    assert "nvlink-bandwidth" in verbose[2] and "nvbandwidth" in verbose[2]
    assert 'baseline {"min_gbps":760,"gpu_model":"GB200"}' in verbose[2]
    assert '{"gpu_gbps":{"0":780.0,"1":301.2}}' in verbose[2]


def test_parser_takes_check_and_checks() -> None:
    parser = build_parser()
    args = parser.parse_args(["nodes", "check", "--rack", "r01", "--level", "medium"])
    assert (args.rack, args.level, args.names) == ("r01", "medium", [])
    args = parser.parse_args(["nodes", "checks", "n1", "-v"])
    assert (args.name, args.verbose, args.limit) == ("n1", True, 20)
    with pytest.raises(SystemExit):
        parser.parse_args(["nodes", "check", "n1", "--level", "extreme"])
