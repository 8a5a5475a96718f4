"""The core's ``Store`` port on SQLAlchemy: transactions off the event loop.

Every unit of work is a plain function of a ``Tx`` that runs inside one
transaction on a worker thread, so the asyncio services never block on the
database: writes on one thread (SQLite sees one writer at a time), reads on
threads of their own, so that a read never queues behind writes. Events the unit of work
records commit with it (the outbox), and only then are listeners told.

Group commit: the writes queued while the thread was busy run together, in
order, in one transaction with one commit (up to ``GROUP_MAX``), which is
what lets thousands of agents register, or hundreds of allocations a second
be admitted, each durable before its caller hears back. The result is the
same as running them one after another. When one of them fails, the group is
rolled back and each runs again alone, so a failure is its own caller's only:
a unit of work must act through its ``Tx`` alone (it may be run twice).
The group's events go to the database in one INSERT before its commit (or
sooner, when a unit reads events).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from cryptography.fernet import Fernet
from sqlalchemy.engine import Connection, Engine, RootTransaction
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlmodel import Session

from controller.core.errors import DuplicateKey, KilnError, Unavailable
from controller.core.node_view import NodeChanges
from controller.core.records import AllocationRecord
from controller.store.link import Link
from controller.store.repositories import (
    SpecCodec,
    SqlAllocations,
    SqlEvents,
    SqlNodes,
    SqlTokens,
)
from controller.store.secrets import SecretBox
from controller.store.write_thread import WriteThread
from controller.store.writer_rows import TxRows, WriterRows

T = TypeVar("T")
log = logging.getLogger(__name__)

Changes = TypeVar("Changes")


def _tell(listeners: Sequence[Callable[[Changes], None]], changes: Changes) -> None:
    """Each listener hears ``changes``; one that raises is logged, the rest still hear."""
    for listener in listeners:
        try:
            listener(changes)
        except Exception:
            log.exception("store: a view of committed changes failed to follow them")


GROUP_MAX = 256  # units of work committed together, at most
READ_THREADS = 2  # reads beside the one writer


@dataclass
class _Outcome:
    result: Any = None
    events: int = 0
    error: BaseException | None = None
    nodes: NodeChanges | None = None
    allocations: dict[str, AllocationRecord] | None = None


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
    """One transaction: the repositories over one ``Link``."""

    def __init__(
        self,
        link: Link,
        secrets: SecretBox,
        events: list[dict[str, Any]] | None = None,
        rows: TxRows | None = None,
        specs: SpecCodec | None = None,
    ) -> None:
        self._link = link
        self._nodes = SqlNodes(link, secrets, rows.nodes if rows else None)
        self._allocations = SqlAllocations(link, rows.allocations if rows else None, specs)
        self._events = SqlEvents(link, events)
        self._tokens = SqlTokens(link)

    @property
    def session(self) -> Session:
        """The ORM's Session in this transaction (for what the repositories
        do not say)."""
        return self._link.session

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

    def __init__(self, engine: Engine, *, secrets: SecretBox | None = None) -> None:
        self.engine = engine
        self._secrets = secrets or SecretBox(Fernet.generate_key())
        # One writer: SQLite takes one at a time, and ``_rows`` is its alone.
        self._writes: WriteThread[_Outcome] = WriteThread(
            lambda units: self._run_group(units),
            self._deliver,
            lambda: _Outcome(error=StoreUnavailable()),
            group_max=GROUP_MAX,
        )
        self._rows = WriterRows()  # the rows the writer last committed
        self._specs = SpecCodec()  # every thread's: allocation specs by their JSON
        # The writer thread's own connection, kept across transactions (SQLite).
        self._keep_writer = engine.dialect.name == "sqlite"
        self._writer: Connection | None = None
        # Reads on threads of their own: a GetNode never waits behind a group
        # commit (SQLite's WAL lets readers run beside its one writer).
        self._read_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=READ_THREADS, thread_name_prefix="kiln-db-read"
        )
        self._listeners: list[Callable[[], None]] = []
        self._node_listeners: list[Callable[[NodeChanges], None]] = []
        self._allocation_listeners: list[Callable[[Mapping[str, AllocationRecord]], None]] = []
        self.groups = 0  # group commits so far (more than one unit of work)

    def on_commit(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def on_nodes_committed(self, listener: Callable[[NodeChanges], None]) -> None:
        self._node_listeners.append(listener)

    def on_allocations_committed(
        self, listener: Callable[[Mapping[str, AllocationRecord]], None]
    ) -> None:
        self._allocation_listeners.append(listener)

    def _run(
        self, fn: Callable[[SqlTx], T], *, write: bool
    ) -> tuple[T, int, NodeChanges, dict[str, AllocationRecord]]:
        rows = self._rows.begin() if write else None
        with self._transaction(write=write) as (link, transaction):
            tx = SqlTx(link, self._secrets, rows=rows, specs=self._specs)
            try:
                result = fn(tx)
                if write:
                    link.flush()
                    tx.events.flush()
                    transaction.commit()
                # A read ends with the connection's close, which rolls back.
            except IntegrityError as e:
                self._failed(transaction, write)
                # Never the statement's parameters: they hold sealed secrets.
                raise DuplicateKey("another write stored a record with the same key first") from e
            except (SQLAlchemyError, OverflowError) as e:  # sqlite3 raises OverflowError
                self._failed(transaction, write)  # unwrapped for an integer past 64 bits
                raise _store_error(e) from e
            except BaseException:
                self._failed(transaction, write)
                raise
            if rows is not None:
                rows.commit()
            return result, tx.events.added, tx.nodes.changes(), tx.allocations.saved

    @contextlib.contextmanager
    def _transaction(self, *, write: bool = True) -> Iterator[tuple[Link, RootTransaction]]:
        """A connection in a transaction, and its link (closed after). On
        SQLite the writer keeps its connection from one transaction to the
        next (a checkout and its return were half of a small unit's cost,
        43 -> 24 us); a server's connection is checked out (and pinged) for
        each, so a restarted PostgreSQL costs no write."""
        if not (write and self._keep_writer):
            with self.engine.connect() as connection:
                link = Link(connection)
                try:
                    yield link, connection.begin()
                finally:
                    link.close()
            return
        if self._writer is None or self._writer.closed or self._writer.invalidated:
            self._writer = self.engine.connect()
        link = Link(self._writer)
        transaction = self._writer.begin()
        try:
            yield link, transaction
        finally:
            link.close()
            if transaction.is_active:  # a unit that raised past its rollback
                transaction.rollback()

    def _failed(self, transaction: RootTransaction, write: bool) -> None:
        if transaction.is_active:
            transaction.rollback()
        if write and self._writer is not None:
            # Whatever failed may have left the connection unusable: the
            # next write starts on a fresh one.
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = None
        if write:
            self._rows.clear()  # what the database holds now is read anew

    def _alone(self, fn: Callable[[SqlTx], Any]) -> _Outcome:
        try:
            result, events, nodes, allocations = self._run(fn, write=True)
        except Exception as e:
            return _Outcome(error=e)
        return _Outcome(result, events, nodes=nodes, allocations=allocations)

    def _run_group(self, fns: list[Callable[[SqlTx], Any]]) -> list[_Outcome]:
        """Run ``fns`` in order in one transaction; on any failure, each alone."""
        if len(fns) == 1:
            return [self._alone(fns[0])]
        rows = self._rows.begin()  # the group's, shared by its units in turn
        with self._transaction() as (link, transaction):
            outcomes = []
            events: list[dict[str, Any]] = []  # the group's, sent in one INSERT
            try:
                for fn in fns:
                    tx = SqlTx(link, self._secrets, events, rows, self._specs)
                    result = fn(tx)
                    link.flush()  # a constraint fails here, at its own unit
                    outcomes.append(
                        _Outcome(
                            result,
                            tx.events.added,
                            nodes=tx.nodes.changes(),
                            allocations=tx.allocations.saved,
                        )
                    )
                if events:
                    SqlEvents(link, events).flush()
                transaction.commit()
            except Exception:
                self._failed(transaction, write=True)
            else:
                rows.commit()
                self.groups += 1
                return outcomes
        return [self._alone(fn) for fn in fns]

    def _deliver(self, answers: list[tuple[asyncio.Future[_Outcome], _Outcome]]) -> None:
        """On the loop, a group's outcomes in commit order: the view first,
        so that each caller reads its own write. A listener that raises is
        logged and the rest of the group still answered: its units are
        committed, and a caller left unanswered would wait forever."""
        for future, outcome in answers:
            if outcome.nodes:
                _tell(self._node_listeners, outcome.nodes)
            if outcome.allocations:
                _tell(self._allocation_listeners, outcome.allocations)
            if not future.done():  # its caller may be gone
                future.set_result(outcome)

    async def tx(self, fn: Callable[[SqlTx], T]) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Outcome] = loop.create_future()
        # Its caller may be gone (cancelled at shutdown) when the writer fails
        # it: mark the failure seen, so asyncio does not log it as lost.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        if not self._writes.put(fn, loop, future):
            raise StoreUnavailable()  # closed
        # Not shielded: a caller cancelled while waiting cancels only its
        # future; its unit stays queued and runs with its group (its answer
        # is dropped), as it would have with the outcome unread.
        outcome = await future
        if outcome.error is not None:
            raise outcome.error
        if outcome.events:
            for listener in self._listeners:
                listener()
        return outcome.result  # type: ignore[no-any-return]

    async def read(self, fn: Callable[[SqlTx], T]) -> T:
        loop = asyncio.get_running_loop()
        result, *_ = await loop.run_in_executor(self._read_pool, lambda: self._run(fn, write=False))
        return result

    def writer_figures(self) -> dict[str, float]:
        """The writing thread's work since it started (``WriteThread.figures``)."""
        return self._writes.figures()

    def close(self) -> None:
        self._writes.close()
        self._read_pool.shutdown(wait=True)
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = None
        self.engine.dispose()
