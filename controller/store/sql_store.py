"""The core's ``Store`` port on SQLAlchemy: transactions off the event loop.

Every unit of work is a plain function of a ``Tx`` that runs inside one
transaction on a dedicated worker thread, so the asyncio services never block
on the database and SQLite sees one writer at a time. Events the unit of work
records commit with it (the outbox), and only then are listeners told.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from typing import TypeVar

from cryptography.fernet import Fernet
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlmodel import Session

from controller.core.errors import DuplicateKey, KilnError, Unavailable
from controller.store.repositories import SqlAllocations, SqlEvents, SqlNodes, SqlTokens
from controller.store.secrets import SecretBox

T = TypeVar("T")
log = logging.getLogger(__name__)


class StoreFailed(KilnError):
    """The database refused or failed a unit of work for a reason that is not
    the caller's (INTERNAL): the client is told no more than that; the log has
    the driver's one-line message (never the statement or its parameters)."""

    template = "the database could not complete the request; see the controller's log"


class StoreUnavailable(Unavailable):
    template = "the database cannot be reached right now"


def _store_error(error: Exception) -> KilnError:
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return StoreUnavailable()
    # The error rides along (not as a traceback) so that a controller which
    # knows its database is gone can drop these lines (controller.main).
    log.error("database call failed: %s", _first_line(error), extra={"database_error": error})
    return StoreFailed()


def _first_line(error: Exception) -> str:
    """The driver's own message, its first line only: PostgreSQL's next lines
    and SQLAlchemy's ``[SQL: …]`` quote the statement."""
    original = getattr(error, "orig", None) or error
    lines = str(original).strip().splitlines()
    return f"{type(original).__name__}: {lines[0] if lines else ''}".rstrip(": ")


class SqlTx:
    """One transaction: the repositories over one ``Session``."""

    def __init__(self, session: Session, secrets: SecretBox) -> None:
        self.session = session
        self._nodes = SqlNodes(session, secrets)
        self._allocations = SqlAllocations(session)
        self._events = SqlEvents(session)
        self._tokens = SqlTokens(session)

    @property
    def nodes(self) -> SqlNodes:
        return self._nodes

    @property
    def allocations(self) -> SqlAllocations:
        return self._allocations

    @property
    def events(self) -> SqlEvents:
        return self._events

    @property
    def tokens(self) -> SqlTokens:
        return self._tokens


class SqlStore:
    """An engine, the key that seals BMC passwords, and the thread that talks
    to the database.

    Args:
        engine: from ``controller.store.engine.open_engine``.
        secrets: seals and opens BMC passwords; a fresh random key by default
            (fine for tests, useless across restarts).
    """

    def __init__(
        self, engine: Engine, *, secrets: SecretBox | None = None, workers: int = 1
    ) -> None:
        self.engine = engine
        self._secrets = secrets or SecretBox(Fernet.generate_key())
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="kiln-db"
        )
        self._listeners: list[Callable[[], None]] = []

    def on_commit(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def _run(self, fn: Callable[[SqlTx], T], *, write: bool) -> tuple[T, int]:
        with Session(self.engine, expire_on_commit=False) as session:
            tx = SqlTx(session, self._secrets)
            try:
                result = fn(tx)
                if write:
                    session.commit()
                # A read ends with the session's close, which rolls back
                # without expiring what it loaded.
            except IntegrityError as e:
                session.rollback()
                # Never the statement's parameters: they hold sealed secrets.
                raise DuplicateKey("another write stored a record with the same key first") from e
            except (SQLAlchemyError, OverflowError) as e:  # sqlite3 raises OverflowError
                session.rollback()  # unwrapped for an integer past 64 bits
                raise _store_error(e) from e
            return result, tx.events.added

    async def tx(self, fn: Callable[[SqlTx], T]) -> T:
        loop = asyncio.get_running_loop()
        result, events = await loop.run_in_executor(self._pool, lambda: self._run(fn, write=True))
        if events:
            for listener in self._listeners:
                listener()
        return result

    async def read(self, fn: Callable[[SqlTx], T]) -> T:
        loop = asyncio.get_running_loop()
        result, _ = await loop.run_in_executor(self._pool, lambda: self._run(fn, write=False))
        return result

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.engine.dispose()
