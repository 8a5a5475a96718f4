"""The health policies through the core while the controller slows its
agents down: reports at the pace it asked for are no gap in a streak."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import pytest
from core_builders import Racks
from core_fakes import FakeBmc

from controller.core.fleet import Fleet
from controller.core.health import GpuHealth, HealthReport
from controller.core.report_pace import PaceRules
from controller.policies import load_rules

RULES = load_rules(
    """
version: v1
max_sample_gap: 100ms
rules:
  - name: shutdown-heat
    when: {metric: gpu_temp_c, op: ">=", value: 94}
    for_samples: 3
    actions: [{power_off: now}]
"""
)
HEAT = HealthReport(gpus=(GpuHealth(index=0, temp_c=95.0, slowdown_c=89.0, shutdown_c=92.0),))
APART_S = 0.35  # between two reports of a node: over twice the 0.1 s asked for


async def three_reports(fleet: Fleet, node: str) -> None:
    for i in range(3):
        if i:
            await asyncio.sleep(APART_S)
        await fleet.agent_health(node, HEAT)
    await fleet.policies.settle()


@pytest.mark.timeout(60)
async def test_a_paced_agents_reports_still_build_a_streak(
    make_fleet: Callable[..., Fleet], bmc: FakeBmc
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        fleet = make_fleet(rules=RULES, sample_interval=0.1, pace=PaceRules(stretch=4.0))
        await Racks(fleet, stack).add(["t1", "t2"], rack="r1")

        # At the pace asked for (0.1 s), reports 0.35 s apart are gaps: no streak.
        await three_reports(fleet, "t1")
        assert bmc.power["t1"] == "on"

        # The controller is behind: it asks every agent for one report every 0.4 s.
        assert fleet.pace.judge([1.0] * 5, now=0.0) == pytest.approx(0.4)
        assert fleet.report_interval == pytest.approx(0.4)
        await three_reports(fleet, "t2")
        assert bmc.power["t2"] == "off"  # the third hot report in a row
