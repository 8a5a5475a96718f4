"""``scan.select``: a look at every node that lets the event loop run between
slices, and keeps what a plain filter keeps."""

from __future__ import annotations

import asyncio

import pytest

from controller.core import scan

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("size", [1, 3, 7, scan.SLICE])
async def test_it_keeps_what_a_filter_keeps_in_the_same_order(size: int) -> None:
    items = list(range(20))
    kept = await scan.select(items, lambda i: i % 3 != 1, size=size)
    assert kept == [i for i in items if i % 3 != 1]


async def test_other_work_runs_between_slices_and_not_within_one() -> None:
    seen: list[str] = []
    scanning = True

    async def other() -> None:
        while scanning:
            seen.append("other")
            await asyncio.sleep(0)

    def keep(i: int) -> bool:
        seen.append(f"item {i}")
        return True

    task = asyncio.create_task(other())
    try:
        await asyncio.sleep(0)  # the other task is running
        seen.clear()
        await scan.select(range(6), keep, size=2)
    finally:
        scanning = False
        await task
    items = [i for i, s in enumerate(seen) if s != "other"]
    # The slices of two, each looked at in one piece, with the loop's turn
    # (the other task) in between, and none in a slice.
    assert [seen[i] for i in items] == [f"item {i}" for i in range(6)]
    assert seen[items[0] : items[1] + 1] == ["item 0", "item 1"]
    assert "other" in seen[items[1] : items[2]]
    assert seen[items[2] : items[3] + 1] == ["item 2", "item 3"]
    assert "other" in seen[items[3] : items[4]]


async def test_a_scan_of_one_slice_does_not_give_the_loop_away() -> None:
    ran = False

    async def other() -> None:
        nonlocal ran
        ran = True

    task = asyncio.create_task(other())
    kept = await scan.select(range(5), lambda i: True, size=5)
    assert kept == [0, 1, 2, 3, 4]
    assert not ran, "a small fleet's look is one piece, as before"
    await task


async def test_each_item_is_judged_when_its_slice_is_reached() -> None:
    """What changed while the loop ran between slices counts for the items
    not looked at yet (a node read meanwhile is not chosen again)."""
    busy: set[int] = set()

    async def reader() -> None:
        busy.update({4, 5})

    task = asyncio.create_task(reader())
    kept = await scan.select(range(6), lambda i: i not in busy, size=3)
    await task
    assert kept == [0, 1, 2, 3]


async def test_a_slice_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one item, not 0"):
        await scan.select([1, 2], lambda i: True, size=0)
