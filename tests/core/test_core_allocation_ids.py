"""Allocation ids, and the line an admission logs.

Ids come from a generator of each controller's own, seeded once from the
kernel's random source (not a system call per request): they keep their
shape, never repeat within a controller, and two controllers do not hand
out the same sequence. An admission is logged once its transaction has
committed, never for one that rolled back — on the in-memory store and on
SQLite.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from core_builders import Racks

from controller.core.errors import KilnError
from controller.core.fleet import Fleet
from controller.core.model import AllocationSpec

pytestmark = pytest.mark.timeout(60)

TRAYS = [f"r1-t{i}" for i in range(1, 5)]
ID = re.compile(r"alloc-[0-9a-f]{10}")


class Broken(KilnError):
    template = "the disk is full"


@pytest.fixture
async def fleet(make_fleet: Callable[..., Fleet]) -> AsyncIterator[Fleet]:
    fleet = make_fleet()
    async with contextlib.AsyncExitStack() as stack:
        await Racks(fleet, stack).add(TRAYS, rack="r1")
        yield fleet
        await fleet.stop()


def admissions(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "controller.core.allocations" and r.getMessage().startswith("allocation ")
    ]


async def test_ids_keep_their_shape_and_never_repeat(fleet: Fleet) -> None:
    ids = []
    for k in range(60):
        info = await fleet.create_allocation(f"job-{k}", AllocationSpec(nodes=1))
        ids.append(info.id)
        await fleet.release(info.id)
    assert all(ID.fullmatch(i) for i in ids), ids
    assert len(set(ids)) == len(ids)
    # A request without a key gets one of its own, as unique.
    keyless = [await fleet.create_allocation("", AllocationSpec(nodes=1)) for _ in range(2)]
    keys = [(await fleet.allocations.get(a.id)) for a in keyless]
    assert len({k.id for k in keys}) == 2
    assert all(ID.fullmatch(a.id) for a in keyless)


async def test_two_controllers_do_not_share_a_sequence(make_fleet: Callable[..., Fleet]) -> None:
    # Seeded from the kernel each: a fixed seed would make two controllers
    # on one database (PostgreSQL) hand out the same ids in the same order.
    first, second = make_fleet(), make_fleet()
    try:
        one = [first.allocations._ids.getrandbits(40) for _ in range(3)]
        two = [second.allocations._ids.getrandbits(40) for _ in range(3)]
        assert one != two
    finally:
        await first.stop()
        await second.stop()


async def test_an_admission_is_logged_once_committed_and_not_when_it_rolls_back(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="controller.core.allocations")
    store = fleet.allocations._store
    real = store.tx
    failing = True

    async def tx(fn: Callable[[Any], Any]) -> Any:
        def then_fail(t: Any) -> Any:
            result = fn(t)  # the unit ran: the admission was decided and written ...
            if failing:
                raise Broken()  # ... and its transaction rolls back
            return result

        return await real(then_fail)

    monkeypatch.setattr(store, "tx", tx)
    with pytest.raises(Broken):
        await fleet.create_allocation("lost", AllocationSpec(nodes=2))
    assert admissions(caplog) == []
    assert await fleet.allocations.query() == []  # nothing was stored

    failing = False
    info = await fleet.create_allocation("kept", AllocationSpec(nodes=2))
    assert admissions(caplog) == [f"allocation {info.id}: {info.state} on {','.join(info.nodes)}"]
