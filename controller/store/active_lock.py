"""One active controller per database.

A second controller pointed at the same database waits as a hot standby
instead of running a second reconciler against the same nodes: PostgreSQL
gives the lock (a session advisory lock, released by the server the moment
the holder's connection dies, so a standby takes over within a poll), SQLite
gives it through an exclusive file lock beside the database file.

Losing the database is noticed at once, not at the next poll: every database
error the engine sees that means "no connection" (a dropped session, a refused
connect) marks the lock ``troubled`` and calls ``on_trouble``, so the
controller can check ``still_held`` straight away and stand down while the
errors it would otherwise log, one traceback per failing task, are still
the same single fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from sqlalchemy import event, text
from sqlalchemy.engine import Connection, Engine, ExceptionContext
from sqlalchemy.exc import DBAPIError

from controller.core.errors import Unavailable

log = logging.getLogger(__name__)

# Any 64-bit number unique to Kiln; "kiln" in ASCII.
ADVISORY_KEY = 0x6B696C6E


class DatabaseLost(Unavailable):
    """The database went away: the lock (PostgreSQL) is gone or cannot be taken."""

    template = "lost the database: %(reason)s"


def one_line(error: BaseException) -> str:
    """A database error as the driver put it, on one line, without SQL."""
    original = error.orig if isinstance(error, DBAPIError) and error.orig is not None else error
    return " ".join(str(original).split()) or type(original).__name__


def is_database_error(error: BaseException | None) -> bool:
    """True when ``error``, or an error it was raised from, is a database error."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, DBAPIError):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


class ActiveLock:
    """Taken by ``acquire`` (waiting as long as another controller holds it).

    ``on_trouble`` is called, from whichever thread saw it, on each database
    error that means the connection is gone; it must be thread-safe (e.g.
    ``loop.call_soon_threadsafe``).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        poll: float = 1.0,
        on_trouble: Callable[[], None] | None = None,
    ) -> None:
        self._engine = engine
        self._poll = poll
        self._conn: Connection | None = None
        self._file: IO[bytes] | None = None
        self.troubled = threading.Event()  # a connection was lost since the last check
        self.lost_reason = ""
        self._on_trouble = on_trouble
        event.listen(engine, "handle_error", self._saw_error)

    def _saw_error(self, context: ExceptionContext) -> None:
        # A refused or failed connect comes with no connection; a dropped one is
        # a disconnect. Anything else (a constraint, a deadlock) is not ours.
        if context.is_disconnect or context.connection is None:
            self.troubled.set()
            if self._on_trouble is not None:
                self._on_trouble()

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

    def try_acquire(self) -> bool:
        """Take the lock if no controller holds it; never waits. Blocking."""
        return self._try()

    async def acquire(self, on_wait: Callable[[], None] | None = None) -> None:
        """Return once this controller holds the lock; call ``on_wait`` once if it
        has to wait for another controller first.

        Raises:
            DatabaseLost: the database cannot be reached (while waiting, too).
        """
        told = False
        while True:
            try:
                if await asyncio.to_thread(self._try):
                    break
            except DBAPIError as e:
                self.lost_reason = one_line(e)
                raise DatabaseLost(reason=self.lost_reason) from e
            if not told and on_wait is not None:
                on_wait()
                told = True
            await asyncio.sleep(self._poll)
        self.troubled.clear()

    def still_held(self) -> bool:
        """False when the PostgreSQL session holding the lock is gone; then
        ``lost_reason`` says why, on one line. Blocking (call from a thread)."""
        if self._conn is None:
            return self._file is not None or self.kind == "file"
        try:
            self._conn.execute(text("SELECT 1"))
            self._conn.commit()
        except Exception as e:  # the session, and with it the lock, is gone
            self.lost_reason = one_line(e)
            log.debug("the session holding the active-controller lock is gone", exc_info=True)
            return False
        self.troubled.clear()
        return True

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
