"""Backpressure: more agents than the report budget allows are told, as they
register, to report less often; the controller says so once."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from controller.core.fleet import Fleet


@pytest.mark.timeout(30)
async def test_agents_beyond_the_report_budget_are_told_to_slow_down(
    make_fleet: Callable[..., Fleet], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    fleet = make_fleet(sample_interval=1.0, max_reports_per_second=4.0)
    told = []
    for i in range(8):
        told.append(fleet.agent_sample_interval())
        fleet.agents.attach(f"n{i}")
    # Up to 4 agents at one report a second fit; then the interval grows so
    # that all of them together stay at 4 reports a second.
    assert told[:4] == [1.0, 1.0, 1.0, 1.0]
    assert told[4:] == [5 / 4, 6 / 4, 7 / 4, 8 / 4]
    warnings = [r for r in caplog.records if "over the budget" in r.getMessage()]
    assert len(warnings) == 1 and "--max-health-reports-per-second" in warnings[0].getMessage()
    for i in range(6):
        fleet.agents.detach(fleet.agents.attach(f"n{i}"))
    assert fleet.agent_sample_interval() == 1.0  # 3 agents: back within budget
    assert any("back within budget" in r.getMessage() for r in caplog.records)
