"""Coolant leak tests: the core's leak watcher on both stores (the in-memory
fake of the repositories and SQLite), driving the real sushy-tools emulator
(with Kiln's leak detectors) through a real BMC pool on 127.0.0.1."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from bmc_peers import PASSWORD, USER, make_pool

from controller.bmc.gateway import PoolGateway
from controller.core.fleet import Fleet
from controller.core.model import EnrollSpec, EventInfo
from controller.core.ports import Store
from controller.core.records import NodeRecord
from controller.sim.redfish_emulator import RedfishEmulator, make_systems
from controller.store.engine import default_sqlite_url, open_engine
from controller.store.sql_store import SqlStore

# The in-memory store lives with the core's tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from memory_store import MemoryStore

SYSTEMS = 5  # node-00000 … node-00004, all powered on


@pytest_asyncio.fixture
async def emulator() -> AsyncIterator[RedfishEmulator]:
    """sushy-tools' fake driver with leak detectors, Basic auth, instant power changes."""
    systems = make_systems(SYSTEMS, power_state="On")
    async with RedfishEmulator(systems, username=USER, password=PASSWORD) as emu:
        yield emu


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore()
        return
    sql = SqlStore(open_engine(default_sqlite_url(tmp_path)))
    yield sql
    sql.close()


@dataclass
class Rig:
    """A Fleet (loops not started: each test drives the leak watcher's
    passes) on a real BMC pool in front of the emulator."""

    fleet: Fleet
    emulator: RedfishEmulator
    gateway: PoolGateway

    async def enroll(self, name: str, rack: str = "r1") -> None:
        await self.fleet.enroll(
            EnrollSpec(
                name=name,
                bmc_url=self.emulator.system_url(name),
                username=USER,
                password=PASSWORD,
                rack=rack,
            )
        )

    async def passes(self, count: int = 1) -> None:
        """``count`` leak watcher passes, each waited for to the end."""
        for _ in range(count):
            await self.fleet.leaks.run_once()
            await self.fleet.leaks.settle()

    async def record(self, name: str) -> NodeRecord:
        return await self.fleet.nodes.record(name)

    async def events(self, kind: str) -> list[EventInfo]:
        return [e for e in await self.fleet.events.since(0, limit=10_000) if e.kind == kind]


async def make_rig(store: Store, emulator: RedfishEmulator) -> tuple[Rig, PoolGateway]:
    gateway = PoolGateway(make_pool(call_timeout=5.0), power_timeout=20.0)
    fleet = Fleet(store, gateway)
    await fleet.nodes.loaded()
    return Rig(fleet, emulator, gateway), gateway


@pytest_asyncio.fixture
async def rig(store: Store, emulator: RedfishEmulator) -> AsyncIterator[Rig]:
    made, gateway = await make_rig(store, emulator)
    try:
        yield made
    finally:
        await made.fleet.leaks.stop()
        await gateway.close()
