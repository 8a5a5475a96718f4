"""Preparation and firmware updates are capped fleet-wide and per rack."""

from __future__ import annotations

import asyncio
from collections import Counter

from controller.core.preparation import RackGates


async def test_no_rack_and_not_the_fleet_exceed_their_caps() -> None:
    gates = RackGates(fleet=5, per_rack=2)
    running: Counter[str] = Counter()
    peak_rack: Counter[str] = Counter()
    peak_fleet = 0

    async def update(rack: str) -> None:
        nonlocal peak_fleet
        async with gates.slot(rack):
            running[rack] += 1
            peak_rack[rack] = max(peak_rack[rack], running[rack])
            peak_fleet = max(peak_fleet, sum(running.values()))
            await asyncio.sleep(0.01)
            running[rack] -= 1

    racks = [f"r{i % 4}" for i in range(40)]  # 4 racks, 10 nodes each, all at once
    await asyncio.gather(*(update(r) for r in racks))
    assert max(peak_rack.values()) == 2, "per-rack cap reached, never passed"
    assert peak_fleet == 5 == gates.peak_fleet, "fleet cap reached, never passed"
    assert sum(running.values()) == 0 and all(v == 0 for v in gates.in_flight.values())


async def test_a_failing_update_frees_its_slot() -> None:
    gates = RackGates(fleet=1, per_rack=1)

    async def fail() -> None:
        async with gates.slot("r1"):
            raise RuntimeError("BMC said no")

    for _ in range(3):  # would deadlock if the slot leaked
        try:
            await asyncio.wait_for(fail(), 1)
        except RuntimeError:
            pass
    assert gates.in_flight["r1"] == 0
