"""`kiln demo`, the README's main job, runs to the end on a smaller fleet."""

from __future__ import annotations

import argparse

from controller.cli.demo import demo


async def test_demo_runs_end_to_end_with_the_thermal_scenario() -> None:
    lines: list[str] = []
    args = argparse.Namespace(
        racks=1,
        hgx=2,
        serve=False,
        listen="127.0.0.1:0",
        power_delay=False,
        timeout=120.0,
        no_thermal=False,
    )
    assert await demo(args, lines.append) == 0, "\n".join(lines)
    text = "\n".join(lines)
    assert "18 nodes in 1 NVLink domain(s)" in text
    assert "gang of 2 HGX H200 nodes" in text and "same allocation: True" in text
    assert "refused     1000 nodes → FAILED_PRECONDITION" in text
    assert "lifecycle   ready 20" in text
    assert "allocation.notice" in text and "allocation.node_replaced" in text
    assert "PowerState=Off" in text
