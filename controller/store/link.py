"""A unit of work's link to the database: one Connection in one transaction.

The hot statements (a node's or an allocation's row, a group's events) are
SQLAlchemy Core on the Connection. The ORM serves a few cold paths (a node's
GPU rows, agent tokens, a node's removal); its ``Session`` is made the first
time one of them runs, joined to the Connection's transaction, so a unit of
work that needs none pays nothing for it. Measured on SQLite: one UPDATE and
its commit took 77 us in a ``Session`` and 43 us on a Connection, several
units an allocation's create-and-release cycle.

The repositories see the Session's own methods (``exec``, ``get``, ``add``,
...), forwarded, so they read as if they held a Session.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection
from sqlmodel import Session


class Link:
    """One transaction's Connection, and its Session once something asks."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._session: Session | None = None

    def connection(self) -> Connection:
        return self._connection

    @property
    def session(self) -> Session:
        """The ORM's Session in this transaction (made on first use)."""
        if self._session is None:
            self._session = Session(
                bind=self._connection,
                expire_on_commit=False,
                # Its flushes go to this transaction; committing it is the store's.
                join_transaction_mode="rollback_only",
            )
        return self._session

    def exec(self, statement: Any) -> Any:
        return self.session.exec(statement)

    def execute(self, statement: Any, params: Any = None) -> Any:
        return self.session.execute(statement, params)

    def get(self, entity: Any, ident: Any) -> Any:
        return self.session.get(entity, ident)

    def add(self, instance: Any) -> None:
        self.session.add(instance)

    def delete(self, instance: Any) -> None:
        self.session.delete(instance)

    def flush(self) -> None:
        """Send what the ORM holds (nothing when it was never used)."""
        if self._session is not None:
            self._session.flush()

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
