"""kill -9 after a write-behind window: the agents' samples of at most that
window are lost, never a transition, allocation or event.

The controller is a real child process (``--health-flush-interval`` at its
default, 5 s) with the sushy-tools emulator and agents on the NVML fake in the
test process, as in ``test_crash_recovery``: it is driven through
allocations, killed, its SQLite file read, restarted and checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from crash_harness import CrashHarness
from crash_store import read_store

from controller.sim.fleet import default_fleet
from controller.store.repositories import health_from_json

FLUSH_S = 5.0  # kiln-controller's default --health-flush-interval
SAMPLE_S = 1.0  # the harness's --sample-interval


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[CrashHarness]:
    specs = default_fleet(nvl72_racks=1, hgx_nodes=2, trays=2)
    h = CrashHarness(tmp_path, specs, random.Random(7))
    await h.start()
    try:
        yield h
    finally:
        await h.stop()


def stored_samples(db_path: Path) -> dict[str, tuple[float, float]]:
    """Per node: (agent_last_seen, the stored report's sampled_at)."""
    uri = f"file:{db_path}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=10)) as conn:
        rows = conn.execute("SELECT name, agent_last_seen, health_json FROM nodes").fetchall()
    return {
        name: (seen, report.sampled_at if (report := health_from_json(health)) else 0.0)
        for name, seen, health in rows
    }


@pytest.mark.timeout(240)
async def test_a_kill_after_a_flush_window_loses_samples_only(harness: CrashHarness) -> None:
    await harness.check()  # every node prepared and ready
    driver = harness.driver()
    running = asyncio.create_task(driver.run())  # allocations and releases meanwhile
    try:
        await asyncio.sleep(FLUSH_S + 2 * SAMPLE_S)  # at least one flush of fresh samples
        before = await asyncio.to_thread(read_store, harness.controller.db_path)
        killed_at = time.time()
        await harness._kill_controller()
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)

    # What a crash may lose is at most one flush window of samples.
    window = FLUSH_S + SAMPLE_S + 2.0  # plus the time one flush takes on a loaded machine
    samples = await asyncio.to_thread(stored_samples, harness.controller.db_path)
    assert set(samples) == {s.name for s in harness.specs}
    for name, (seen, sampled_at) in samples.items():
        assert killed_at - seen < window, f"{name}: last seen {killed_at - seen:.1f}s before"
        assert killed_at - sampled_at < window, f"{name}: report {killed_at - sampled_at:.1f}s old"

    # Nothing transactional was lost: every event the store held before the
    # kill is still there, unchanged, and the restarted fleet passes the
    # crash checks (acknowledged allocations, released ones, the event stream).
    after = await asyncio.to_thread(read_store, harness.controller.db_path)
    assert after.events[: len(before.events)] == before.events
    assert set(after.allocations) >= set(before.allocations)
    await harness._start_controller()
    await harness.driver().retry_unsure()
    await harness.check()
