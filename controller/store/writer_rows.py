"""The writer's rows: what the writing thread last read or wrote of each node
and allocation row, kept across its transactions.

The store writes on one thread, and only the active controller writes at all
(``active_lock.py``), so the columns a write transaction last committed for
a row are the row as stored: a later unit of work that asks for the node or
allocation by key reads it from here instead of with a SELECT (a release, an
admission and the lifecycle's step after it each read the rows the last
one wrote). Health and BMC passwords are never kept (each has a writer of
its own and neither is part of a record a unit saves).

A transaction works on ``TableRows``: its own copies over the committed
rows, handed to the committed ones only once its commit succeeded. Any
failed transaction empties the cache (its database may have moved in ways
this thread did not see, as when a connection died mid-commit); reads start
over from the database. Read transactions get a ``TableRows`` of their own
with nothing committed behind it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

ROWS_KEPT = 100_000  # per table; past it the cache starts over

Columns = dict[str, Any]


class TableRows:
    """One transaction's rows of one table, by key: its own reads and writes
    over the rows committed before it (``committed``; None for a read)."""

    def __init__(self, committed: dict[str, Columns] | None = None) -> None:
        self._committed = committed
        self._mine: dict[str, Columns | None] = {}  # None: removed here
        # Columns touched on a committed row this transaction has not read:
        # kept apart, not by copying the row (a health batch touches 250).
        self._touched: dict[str, Columns] = {}

    def get(self, key: str) -> Columns | None:
        """The row's columns as this transaction knows them (a copy it may
        change), or None when it does not know the row."""
        if key in self._mine:
            return self._mine[key]
        found = self._committed.get(key) if self._committed is not None else None
        if found is None:
            return None
        mine = self._mine[key] = dict(found)
        touched = self._touched.pop(key, None)
        if touched is not None:
            mine.update(touched)
        return mine

    def __getitem__(self, key: str) -> Columns:
        found = self.get(key)
        if found is None:
            raise KeyError(key)
        return found

    def __setitem__(self, key: str, columns: Columns) -> None:
        self._mine[key] = columns
        self._touched.pop(key, None)

    def remove(self, key: str) -> None:
        self._mine[key] = None
        self._touched.pop(key, None)

    def touch(self, key: str, **columns: Any) -> None:
        """Columns written past a record (a health batch's ``agent_last_seen``):
        kept where the row is known, ignored where it is not."""
        if key in self._mine:
            known = self._mine[key]
            if known is not None:
                known.update(columns)
        elif self._committed is not None and key in self._committed:
            self._touched.setdefault(key, {}).update(columns)

    def commit(self) -> None:
        """This transaction committed: its rows are the stored ones now."""
        committed = self._committed
        if committed is None:
            return
        if len(committed) + len(self._mine) > ROWS_KEPT:
            committed.clear()
        for key, columns in self._mine.items():
            if columns is None:
                committed.pop(key, None)
            else:
                committed[key] = columns
        for key, columns in self._touched.items():
            row = committed.get(key)
            if row is not None:  # rows are never shared: each get copies
                row.update(columns)
        self._mine = {}
        self._touched = {}


class TxRows(NamedTuple):
    """One write transaction's rows of both tables."""

    nodes: TableRows
    allocations: TableRows

    def commit(self) -> None:
        self.nodes.commit()
        self.allocations.commit()


class WriterRows:
    """The committed rows of the writer's transactions (writer thread only)."""

    def __init__(self) -> None:
        self.nodes: dict[str, Columns] = {}
        self.allocations: dict[str, Columns] = {}

    def begin(self) -> TxRows:
        """A write transaction's rows."""
        return TxRows(TableRows(self.nodes), TableRows(self.allocations))

    def clear(self) -> None:
        self.nodes.clear()
        self.allocations.clear()
