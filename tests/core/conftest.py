"""The core's rules against both stores: the in-memory fake of the
repository Protocols, and SQLite through the real SQL store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from core_fakes import FakeBmc
from memory_store import MemoryStore

from controller.core.fleet import Fleet
from controller.core.ports import Store
from controller.core.profiles import ProfileCatalog
from controller.store.engine import default_sqlite_url, open_engine
from controller.store.sql_store import SqlStore


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore()
        return
    sql = SqlStore(open_engine(default_sqlite_url(tmp_path)))
    yield sql
    sql.close()


@pytest.fixture
def bmc() -> FakeBmc:
    return FakeBmc()


@pytest.fixture
def make_fleet(store: Store, bmc: FakeBmc) -> Callable[..., Fleet]:
    """A Fleet on the test's store and fake BMC; its loops are not started,
    so each test drives the steps it is about."""

    def make(profiles: ProfileCatalog | None = None, **options: object) -> Fleet:
        return Fleet(store, bmc, profiles=profiles, **options)  # type: ignore[arg-type]

    return make
