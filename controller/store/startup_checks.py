"""What the store must offer before a controller starts: checked once, up front.

A controller that starts against a database it cannot reach, cannot write, or
whose BMC passwords its key cannot open would fail later, call by call, node
by node. These checks find each of those at start-up instead, in the order a
start-up needs them, and raise one error whose message is one line:

1. ``check_database``: the URL is one Kiln supports, the database answers
   within a few seconds, and it takes writes (a replica or a read-only file
   does not).
2. ``check_secret_key``: when the database holds sealed BMC passwords, the key
   file exists and opens one of them.

Neither changes anything: the write probe is rolled back, and a missing key
file is left for the controller to create (when nothing is sealed yet).
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

from sqlalchemy import inspect, select
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session

from controller.core.errors import FailedPrecondition, KilnError, Unavailable
from controller.store.active_lock import one_line
from controller.store.engine import open_engine
from controller.store.key_rotation import next_key_path
from controller.store.models import NodeRow
from controller.store.secrets import PREFIX, SecretBox

CONNECT_TIMEOUT_S = 10  # a database host that drops packets fails here, not in minutes
SQLITE_READONLY = 8  # the primary result code; extended codes keep it in the low byte
PG_READ_ONLY_TRANSACTION = "25006"


class DatabaseUnreachable(Unavailable):
    template = "cannot connect to the database: %(reason)s"


class DatabaseReadOnly(FailedPrecondition):
    template = "the database does not take writes (a read-only file or replica?): %(reason)s"


class SecretKeyMissing(FailedPrecondition):
    template = (
        "no such key file, but the database holds BMC passwords sealed with a key; "
        "give the key file the nodes were enrolled under"
    )


class SecretKeyMismatch(FailedPrecondition):
    template = (
        "this key does not open the BMC passwords stored in the database (they were "
        "sealed with another key); give the key file the nodes were enrolled under"
    )


class RotationUnfinished(FailedPrecondition):
    template = (
        "this key no longer opens the stored BMC passwords, but %(pending)s beside it does: "
        "a key rotation was interrupted; run `kiln-controller rotate-key` again to finish it"
    )


def _probe_engine(url: str) -> Engine:
    """An engine for ``url`` that gives up connecting after CONNECT_TIMEOUT_S.

    Raises InvalidArgument for a URL Kiln does not support.
    """
    parsed = make_url(url)
    if parsed.drivername.startswith("postgresql") and "connect_timeout" not in parsed.query:
        parsed = parsed.update_query_dict({"connect_timeout": str(CONNECT_TIMEOUT_S)})
        url = parsed.render_as_string(hide_password=False)
    return open_engine(url, migrate_schema=False)


def check_database(url: str) -> None:
    """Connect to ``url`` and prove it takes writes; changes nothing.

    May block for up to CONNECT_TIMEOUT_S (call before the event loop starts,
    or from a thread).

    Raises:
        InvalidArgument: the URL names a database Kiln does not support.
        DatabaseUnreachable: no connection (refused, timed out, bad credentials).
        DatabaseReadOnly: connected, but a write is refused.
    """
    engine = _probe_engine(url)
    try:
        try:
            connection = engine.connect()
        except DBAPIError as e:
            if _refused_as_read_only(e):  # SQLite sets WAL mode as it connects
                raise DatabaseReadOnly(reason=one_line(e)) from e
            raise DatabaseUnreachable(reason=one_line(e)) from e
        with connection:
            try:
                _prove_writable(connection)
            except DBAPIError as e:
                raise DatabaseReadOnly(reason=one_line(e)) from e
    finally:
        engine.dispose()


def _refused_as_read_only(error: DBAPIError) -> bool:
    code = getattr(error.orig, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF == SQLITE_READONLY
    return getattr(error.orig, "sqlstate", None) == PG_READ_ONLY_TRANSACTION


def _prove_writable(connection: Connection) -> None:
    """Create a table in a transaction and roll it back: a read-only database
    refuses the CREATE, a writable one is left as it was.

    The transaction is begun by hand on an autocommit connection because
    pysqlite opens none before DDL (it would commit the CREATE at once);
    ``BEGIN IMMEDIATE`` takes SQLite's write lock, which a read-only file refuses.
    """
    autocommit = connection.execution_options(isolation_level="AUTOCOMMIT")
    sqlite = connection.dialect.name == "sqlite"
    try:
        autocommit.exec_driver_sql("BEGIN IMMEDIATE" if sqlite else "BEGIN")
        autocommit.exec_driver_sql(f"CREATE TABLE kiln_write_probe_{uuid.uuid4().hex} (x INTEGER)")
    finally:
        with contextlib.suppress(DBAPIError):  # none open when BEGIN itself was refused
            autocommit.exec_driver_sql("ROLLBACK")


def check_secret_key(url: str, key_file: Path) -> None:
    """Prove ``key_file`` opens the BMC passwords sealed in the database at ``url``.

    One sealed password is tried (they are all sealed with the same key). A
    database with none (new, or only clear-text passwords from an older Kiln)
    passes whatever the key; a missing key file then is created at start.

    Raises:
        InvalidArgument: the key file does not hold a Fernet key.
        SecretKeyMissing: the key file does not exist but passwords are sealed.
        SecretKeyMismatch: the key does not open them.
        DatabaseUnreachable: the database cannot be read.
    """
    engine = _probe_engine(url)
    try:
        sealed = _one_sealed_password(engine)
    except DBAPIError as e:
        raise DatabaseUnreachable(reason=one_line(e)) from e
    finally:
        engine.dispose()
    if sealed is None:
        return
    if not key_file.exists():
        raise SecretKeyMissing()
    box = SecretBox.from_key_file(key_file, create=False)
    try:
        box.open(sealed)
    except FailedPrecondition as e:
        if _opens(next_key_path(key_file), sealed):
            raise RotationUnfinished(pending=next_key_path(key_file).name) from e
        raise SecretKeyMismatch() from e


def _opens(key_file: Path, sealed: str) -> bool:
    try:
        SecretBox.from_key_file(key_file, create=False).open(sealed)
    except (OSError, KilnError):
        return False
    return True


def _one_sealed_password(engine: Engine) -> str | None:
    if not inspect(engine).has_table(NodeRow.__tablename__):
        return None  # a new database: nothing sealed yet
    with Session(engine) as session:
        query = (
            select(NodeRow.bmc_password)  # type: ignore[call-overload]
            .where(NodeRow.bmc_password.startswith(PREFIX))  # type: ignore[attr-defined]
            .limit(1)
        )
        value = session.execute(query).scalar()
    return str(value) if value is not None else None
