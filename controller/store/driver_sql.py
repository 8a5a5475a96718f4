"""The writer's hot statements as plain SQL on the driver's cursor.

An allocation's create and release write a handful of rows (the allocation,
its node, a node reset, their events), each a statement SQLAlchemy Core
compiles and binds afresh: its parameter processing costs three times the
driver's own ``execute`` (26 us against 9 us for a three-column UPDATE
through ``exec_driver_sql``, SQLite, this machine). These statements are
simple (INSERT of named columns, UPDATE of named columns by primary key),
so they are written here as text: identifiers double-quoted, values
always bound, never formatted in; ``execute_many`` sends any such text
(written with ``?``) in the driver's own placeholder. They still go through
``Connection.exec_driver_sql``: in the transaction, with SQLAlchemy's
events and error wrapping.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection


def _marker(connection: Connection) -> str:
    # SQLite's driver takes ``?``; psycopg takes ``%s``.
    return "?" if connection.dialect.paramstyle == "qmark" else "%s"


def _quoted(name: str) -> str:
    # Kiln's table and column names are lower-case words: double quotes (the
    # standard's, SQLite's and PostgreSQL's) name the same thing, and keep a
    # keyword (``key``) a name, without the dialect's check of each name.
    return f'"{name}"'


def insert_rows(
    connection: Connection, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
) -> None:
    """INSERT ``rows`` (values in ``columns`` order) into ``table``: one
    statement, the driver's ``executemany`` when there are several."""
    mark = _marker(connection)
    sql = (
        f"INSERT INTO {_quoted(table)} ({', '.join(map(_quoted, columns))}) "
        f"VALUES ({', '.join([mark] * len(columns))})"
    )
    if len(rows) == 1:
        connection.exec_driver_sql(sql, tuple(rows[0]))
    else:
        connection.exec_driver_sql(sql, [tuple(r) for r in rows])


def update_row(
    connection: Connection, table: str, key: tuple[str, Any], values: dict[str, Any]
) -> None:
    """UPDATE the columns of ``values`` in ``table``'s row whose ``key``
    column (the primary key) holds the key's value."""
    mark = _marker(connection)
    sets = ", ".join([f'"{c}" = {mark}' for c in values])
    sql = f'UPDATE "{table}" SET {sets} WHERE "{key[0]}" = {mark}'
    connection.exec_driver_sql(sql, (*values.values(), key[1]))


def execute_many(connection: Connection, sql: str, rows: list[Any]) -> None:
    """``sql`` (``?`` for each parameter) once per row, in the driver's
    placeholder."""
    if _marker(connection) != "?":
        sql = sql.replace("?", _marker(connection))
    connection.exec_driver_sql(sql, rows)
