"""One active controller per database.

A second controller pointed at the same database waits as a hot standby
instead of running a second reconciler against the same nodes: PostgreSQL
gives the lock (a session advisory lock, released by the server the moment
the holder's connection dies, so a standby takes over within a poll), SQLite
gives it through an exclusive file lock beside the database file.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

log = logging.getLogger(__name__)

# Any 64-bit number unique to Kiln; "kiln" in ASCII.
ADVISORY_KEY = 0x6B696C6E


class ActiveLock:
    """Taken by ``acquire`` (waiting as long as another controller holds it)."""

    def __init__(self, engine: Engine, *, poll: float = 1.0) -> None:
        self._engine = engine
        self._poll = poll
        self._conn: Connection | None = None
        self._file: IO[bytes] | None = None

    @property
    def kind(self) -> str:
        return "postgresql" if self._engine.dialect.name == "postgresql" else "file"

    def _try(self) -> bool:
        if self._engine.dialect.name == "postgresql":
            conn = self._engine.connect()
            got = bool(
                conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": ADVISORY_KEY}).scalar()
            )
            conn.commit()
            if got:
                self._conn = conn
            else:
                conn.close()
            return got
        database = self._engine.url.database
        if not database or database == ":memory:":
            return True
        handle = Path(database + ".lock").open("ab")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n".encode())
        handle.flush()
        self._file = handle
        return True

    async def acquire(self, on_wait: Callable[[], None] | None = None) -> None:
        """Return once this controller holds the lock; call ``on_wait`` once if it
        has to wait for another controller first."""
        told = False
        while not await asyncio.to_thread(self._try):
            if not told and on_wait is not None:
                on_wait()
                told = True
            await asyncio.sleep(self._poll)

    def still_held(self) -> bool:
        """False when the PostgreSQL session holding the lock is gone."""
        if self._conn is None:
            return self._file is not None or self.kind == "file"
        try:
            self._conn.execute(text("SELECT 1"))
            self._conn.commit()
            return True
        except Exception:  # the session, and with it the lock, is gone
            log.exception("lost the database session that holds the active-controller lock")
            return False

    def release(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ADVISORY_KEY})
                self._conn.commit()
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
        if self._file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
