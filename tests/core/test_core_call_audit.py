"""An allocation call's audit entry stored with its change (``CallAudit``):
in the same transaction as the request stored or the release, so both are
durable together or neither is — on the in-memory store and on SQLite."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from core_builders import Racks

from controller.core import allocations as allocations_module
from controller.core.audit import AuditEntry, CallAudit
from controller.core.errors import KilnError
from controller.core.fleet import Fleet
from controller.core.model import AllocationSpec
from controller.core.states import AllocationState

pytestmark = pytest.mark.timeout(60)


class Broken(KilnError):
    template = "the database is gone"


@pytest.fixture
async def fleet(make_fleet: Callable[..., Fleet]) -> AsyncIterator[Fleet]:
    fleet = make_fleet()
    async with contextlib.AsyncExitStack() as stack:
        await Racks(fleet, stack).add(["r1-t1", "r1-t2"], rack="r1")
        yield fleet
        await fleet.stop()


def draft(method: str, **arguments: Any) -> CallAudit:
    entry = AuditEntry(
        who="pipeline", role="provisioner", method=method, code="OK", arguments=arguments
    )
    return CallAudit(entry)


async def audited(fleet: Fleet) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (e.data["method"], e.data["code"], e.data["arguments"])
        for e in await fleet.events.since(0)
        if e.kind == "audit.call"
    ]


async def test_a_create_stores_its_entry_with_the_request(fleet: Fleet) -> None:
    audit = draft("CreateAllocation", key="job-1")
    alloc = await fleet.create_allocation("job-1", AllocationSpec(nodes=1), audit=audit)
    assert alloc.state == AllocationState.READY
    assert audit.stored
    assert await audited(fleet) == [("CreateAllocation", "OK", {"key": "job-1"})]
    # The same key again returns the stored allocation and stores nothing:
    # its entry is not stored, so the API layer writes one of its own.
    again = draft("CreateAllocation", key="job-1")
    same = await fleet.create_allocation("job-1", AllocationSpec(nodes=1), audit=again)
    assert same.id == alloc.id and not again.stored
    assert len(await audited(fleet)) == 1


async def test_a_create_whose_transaction_fails_stores_neither(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass writes the request and the entry, then fails before its
    commit: neither is stored, and the entry is not marked stored."""
    apply = fleet.allocations._apply

    def apply_then_fail(*args: Any) -> None:
        apply(*args)
        raise Broken()

    monkeypatch.setattr(fleet.allocations, "_apply", apply_then_fail)
    audit = draft("CreateAllocation", key="job-1")
    with pytest.raises(Broken):
        await fleet.create_allocation("job-1", AllocationSpec(nodes=1), audit=audit)
    assert not audit.stored
    assert await fleet.list_allocations(include_released=True) == []
    assert await audited(fleet) == []


async def test_a_release_stores_its_entry_with_the_release(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    alloc = await fleet.create_allocation("job-1", AllocationSpec(nodes=1))
    # A release whose transaction fails after writing everything: still held,
    # no entry.
    report = allocations_module.record_report

    def report_then_fail(*args: Any, **kwargs: Any) -> None:
        report(*args, **kwargs)
        raise Broken()

    monkeypatch.setattr(allocations_module, "record_report", report_then_fail)
    failed = draft("ReleaseAllocation", id=alloc.id)
    with pytest.raises(Broken):
        await fleet.release(alloc.id, audit=failed)
    assert not failed.stored
    assert (await fleet.get_allocation(alloc.id)).state == AllocationState.READY
    assert await audited(fleet) == []
    monkeypatch.undo()

    audit = draft("ReleaseAllocation", id=alloc.id)
    released = await fleet.release(alloc.id, audit=audit)
    assert released.state == AllocationState.RELEASED and audit.stored
    assert await audited(fleet) == [("ReleaseAllocation", "OK", {"id": alloc.id})]
    # Releasing it again changes nothing but is a call like any other.
    again = draft("ReleaseAllocation", id=alloc.id)
    await fleet.release(alloc.id, audit=again)
    assert again.stored and len(await audited(fleet)) == 2
