"""The store's tests run on both engines: SQLite in a temporary directory and
a real PostgreSQL (emptied again after each test)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel

from controller.store.engine import default_sqlite_url, open_engine


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """An engine migrated to the head revision."""
    if request.param == "sqlite":
        url = default_sqlite_url(tmp_path)
    else:
        url = request.getfixturevalue("postgres_url")
    eng = open_engine(url)
    yield eng
    if request.param == "postgresql":
        SQLModel.metadata.drop_all(eng)
        with eng.begin() as conn:
            conn.execute(text("DROP TABLE IF EXISTS alembic_version"))
    eng.dispose()
