"""Database engines and schema migrations.

SQLite (WAL mode) in a state directory is the embedded default; PostgreSQL is
used when a ``postgresql+psycopg://`` URL is given. The schema is owned by the
Alembic migrations under ``controller/store/migrations``; ``open_engine``
brings any database up to the latest revision before handing it out.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import create_engine

from controller.core.errors import InvalidArgument

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).with_name("migrations")


def default_sqlite_url(state_dir: Path) -> str:
    state_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{state_dir / 'kiln.db'}"


def _enable_sqlite_wal(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


def open_engine(url: str, *, migrate_schema: bool = True) -> Engine:
    """Create an engine for ``url`` and migrate the schema to head.

    Raises:
        InvalidArgument: the URL names a database Kiln does not support.
    """
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False})
        event.listen(engine, "connect", _enable_sqlite_wal)
    elif url.startswith("postgresql"):
        if not url.startswith("postgresql+psycopg://"):
            raise InvalidArgument(
                "PostgreSQL URLs must use the psycopg driver: postgresql+psycopg://USER@HOST/DB"
            )
        engine = create_engine(url, pool_pre_ping=True, pool_size=5)
    else:
        raise InvalidArgument(f"unsupported database URL scheme in {url.split(':', 1)[0]!r}")
    if migrate_schema:
        migrate(engine)
    return engine


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def migrate(engine: Engine, revision: str = "head") -> None:
    """Upgrade the schema to ``revision``; a no-op when already there."""
    config = alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
    log.info("database schema at %s", revision)
