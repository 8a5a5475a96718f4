"""The collector settings a serving controller runs with (``controller/heap.py``)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from controller import heap


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


class _Node:
    def __init__(self) -> None:
        self.me: _Node | None = None


def test_settle_freezes_the_heap_and_collects_less_often(restored_gc: None) -> None:
    kept = [[f"node{i}"] for i in range(1000)]  # a loaded fleet, say
    heap.settle()
    assert gc.get_threshold() == (heap.YOUNG, heap.OLDER, heap.OLDER)
    assert heap.YOUNG > 700, "collects less often than CPython's default"
    assert gc.get_freeze_count() >= len(kept), "what existed is out of the collector's sight"
    assert gc.is_tracked(kept[0])
    assert not any(o is kept[0] for o in gc.get_objects()), "no longer in a generation"


def test_cycles_made_after_settle_are_still_collected(restored_gc: None) -> None:
    heap.settle()
    node = _Node()
    node.me = node  # a cycle: reference counting alone never frees it
    gone = weakref.ref(node)
    del node
    assert gone() is not None
    gc.collect()
    assert gone() is None


def test_gc_pauses_are_timed_by_generation_and_long_ones_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[tuple[int, float]] = []
    # pauses of 250 ms, 1 ms, 200 ms (within the minute: counted, not logged), 600 ms
    ticks = iter([0.0, 0.25, 1.0, 1.001, 2.0, 2.2, 3.0, 3.6])
    pauses = heap.GcPauses(lambda g, s: seen.append((g, s)), clock=lambda: next(ticks))
    caplog.set_level("INFO", logger="controller.heap")
    gc.disable()  # only the collections below, each with its two ticks
    pauses.start()
    pauses.start()  # once only
    try:
        gc.collect(2)
        gc.collect(0)
        gc.collect(1)
        gc.collect(2)
    finally:
        pauses.stop()
        gc.enable()
    assert [g for g, _ in seen] == [2, 0, 1, 2]
    assert [round(s, 3) for _, s in seen] == [0.25, 0.001, 0.2, 0.6]
    logged = [r.getMessage() for r in caplog.records if r.name == "controller.heap"]
    assert len(logged) == 2, "one line a minute, and every very slow pause"
    assert "250 ms (generation 2" in logged[0]
    assert "600 ms (generation 2; 2 pauses" in logged[1], "the 200 ms one counted"
    gc.collect()
    assert len(seen) == 4, "stopped: no longer called"


async def test_a_slow_whole_heap_collection_freezes_its_survivors(restored_gc: None) -> None:
    ticks = iter([0.0, 0.3, 1.0, 1.3])  # a 300 ms whole-heap pause, then a 300 ms young one
    pauses = heap.GcPauses(lambda g, s: None, refreeze_after=0.25, clock=lambda: next(ticks))
    grown = [[f"enrolled{i}"] for i in range(1000)]  # a fleet that grew while serving
    gc.disable()
    pauses.start()
    try:
        gc.collect(2)
        frozen = gc.get_freeze_count()
        await asyncio.sleep(0)  # the freeze runs on the loop, after the collection
        assert gc.get_freeze_count() >= frozen + len(grown)
        assert not any(o is grown[0] for o in gc.get_objects())
        after = gc.get_freeze_count()
        gc.collect(0)
        await asyncio.sleep(0)
        assert gc.get_freeze_count() <= after, "only a whole-heap pause freezes"
    finally:
        pauses.stop()
        gc.enable()


@pytest.mark.timeout(60)
def test_a_bmc_reader_runs_with_the_controllers_collector_settings() -> None:
    """A reader's heap is its BMC handles (750,000 objects at 25,000 nodes):
    its ``serve`` sets the collector as the controller's before it serves,
    and says "the BMC reader" in its pause lines. Run in a process of its
    own (it freezes that process's heap)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = (
        "import asyncio, gc, sys\n"
        "from controller.bmc.reader import worker\n"
        "async def fake(args):\n"
        "    print(gc.get_threshold(), gc.get_freeze_count() > 0, len(gc.callbacks))\n"
        "    return 0\n"
        "worker._serve = fake\n"
        "sys.exit(asyncio.run(worker.serve(None)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=root,
        env={"PYTHONPATH": f"{root / 'proto'}:{root}", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        f"({heap.YOUNG},",
        f"{heap.OLDER},",
        f"{heap.OLDER})",
        "True",
        "1",
    ]


def test_gc_pause_lines_name_their_process(caplog: pytest.LogCaptureFixture) -> None:
    ticks = iter([0.0, 0.6])
    pauses = heap.GcPauses(lambda g, s: None, clock=lambda: next(ticks), process="the BMC reader")
    caplog.set_level("INFO", logger="controller.heap")
    gc.disable()
    pauses.start()
    try:
        gc.collect(2)
    finally:
        pauses.stop()
        gc.enable()
    (line,) = [r.getMessage() for r in caplog.records if r.name == "controller.heap"]
    assert line.startswith("the garbage collector paused the BMC reader 600 ms")
