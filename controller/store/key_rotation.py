"""``kiln-controller rotate-key``: re-seal every stored BMC password under a new key.

The steps are ordered so that an interruption at any point loses nothing:

1. The new key is written beside the current one as ``KEY.next`` (mode 0600,
   made fresh unless ``--new-key-file`` gives one). An interrupted run left it
   there; a new run takes it up again.
2. One transaction opens each sealed password with the current key and seals
   it with the new one. Until it commits, the current key opens everything.
3. The current key is kept as ``KEY.previous`` and ``KEY.next`` replaces
   ``KEY`` (``os.replace``, atomic). A run interrupted between 2 and 3 is
   finished by running the command again; the controller's start-up check
   says so when it finds ``KEY.next`` opening the passwords ``KEY`` cannot.

No controller may use the database meanwhile: the command takes the
active-controller lock (and refuses when a controller holds it). Standbys
and other controllers sharing the database load the key at start, so stop
them all first, and give them the new key file before starting them again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.fernet import Fernet
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from controller.core.errors import FailedPrecondition, InvalidArgument
from controller.store.active_lock import ActiveLock
from controller.store.engine import open_engine
from controller.store.models import NodeRow
from controller.store.secrets import SecretBox


class ControllerRunning(FailedPrecondition):
    template = (
        "a controller is using this database (it holds the active-controller lock); "
        "stop every controller on it before rotating the key"
    )


@dataclass(frozen=True)
class Rotation:
    """What ``rotate_key`` did."""

    resealed: int  # passwords sealed again under the new key
    key_file: Path  # holds the new key now
    previous_file: Path  # holds the key it replaced


def next_key_path(key_file: Path) -> Path:
    return key_file.with_name(key_file.name + ".next")


def previous_key_path(key_file: Path) -> Path:
    return key_file.with_name(key_file.name + ".previous")


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file of mode 0600 and flush it to disk."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _new_key(key_file: Path, new_key_file: Path | None) -> tuple[SecretBox, bytes]:
    """The key to rotate to, written to ``KEY.next`` unless already there."""
    pending = next_key_path(key_file)
    if pending.exists():
        key = pending.read_bytes().strip()
        if new_key_file is not None and new_key_file.read_bytes().strip() != key:
            raise FailedPrecondition(
                f"{pending.name} is left from an interrupted rotation to another key; "
                "run rotate-key without --new-key-file to finish it"
            )
        return SecretBox(key), key
    key = new_key_file.read_bytes().strip() if new_key_file is not None else Fernet.generate_key()
    box = SecretBox(key)  # InvalidArgument before anything is written
    _write_private(pending, key + b"\n")
    return box, key


def rotate_key(db_url: str, key_file: Path, new_key_file: Path | None = None) -> Rotation:
    """Re-seal every BMC password in the database at ``db_url`` under a new key.

    Raises:
        InvalidArgument: the current or new key file is not a Fernet key, or
            the current one is missing.
        ControllerRunning: a controller holds the database.
        FailedPrecondition: a stored password opens with neither key.
    """
    if not key_file.exists():
        raise InvalidArgument(f"no such key file {key_file}")
    old = SecretBox.from_key_file(key_file, create=False)
    engine = open_engine(db_url)
    lock = ActiveLock(engine)
    try:
        if not lock.try_acquire():
            raise ControllerRunning()
        try:
            new, _ = _new_key(key_file, new_key_file)
            resealed = _reseal(engine, old, new)
            previous = previous_key_path(key_file)
            previous.unlink(missing_ok=True)
            _write_private(previous, key_file.read_bytes())
            os.replace(next_key_path(key_file), key_file)
        finally:
            lock.release()
    finally:
        engine.dispose()
    return Rotation(resealed=resealed, key_file=key_file, previous_file=previous)


def _reseal(engine: Engine, old: SecretBox, new: SecretBox) -> int:
    """One transaction: each stored password opened and sealed again (one an
    older Kiln stored in the clear is sealed now). A password the new key
    already opens (a run interrupted after its commit) is left as it is."""
    count = 0
    with Session(engine) as session:
        rows = session.exec(select(NodeRow).where(col(NodeRow.bmc_password) != ""))
        for row in list(rows):
            try:
                secret = old.open(row.bmc_password)
            except FailedPrecondition:
                new.open(row.bmc_password)  # raises when neither key opens it
                continue
            row.bmc_password = new.seal(secret)
            session.add(row)
            count += 1
        session.commit()
    return count
