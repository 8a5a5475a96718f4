"""BMC passwords at rest: sealed with a key only the controller holds.

The database holds ``fernet:`` tokens, never a password, so a copy of the
database (a backup, a replica, a bug report) gives no BMC away. The key lives
in a file of its own (mode 0600), created on first start in the state
directory; controllers that share one PostgreSQL database must share the key
file too (``--secret-key-file``).
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from controller.core.errors import FailedPrecondition, InvalidArgument

PREFIX = "fernet:"
# Unsealed passwords kept, by their token: a Fernet token is written once per
# seal (a random IV), so the same token always opens to the same password,
# and a changed password is a new token. Passes over the fleet (power sync,
# the silent-node scan) unseal every node's each time: 20 us of CPU a token.
# Past this many the memo starts again (old tokens of changed passwords).
OPENED_KEPT = 200_000


class SecretBox:
    def __init__(self, key: bytes) -> None:
        try:
            self._fernet = Fernet(key)
        except (ValueError, TypeError) as e:
            raise InvalidArgument("the secret key file does not hold a Fernet key") from e
        self._opened: dict[str, str] = {}

    @classmethod
    def from_key_file(cls, path: Path, *, create: bool = True) -> SecretBox:
        """Load the key at ``path``; make a new one (mode 0600) when absent."""
        if not path.exists():
            if not create:
                raise InvalidArgument(f"secret key file {path.name} does not exist")
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(Fernet.generate_key())
        return cls(path.read_bytes().strip())

    def seal(self, secret: str) -> str:
        return PREFIX + self._fernet.encrypt(secret.encode()).decode()

    def open(self, stored: str) -> str:
        """The secret behind ``stored`` (a value without the prefix is taken as
        written by an older Kiln, in the clear).

        Raises:
            FailedPrecondition: sealed with another key (no secret in the message).
        """
        if not stored.startswith(PREFIX):
            return stored
        opened = self._opened.get(stored)
        if opened is not None:
            return opened
        try:
            opened = self._fernet.decrypt(stored.removeprefix(PREFIX).encode()).decode()
        except InvalidToken as e:
            raise FailedPrecondition(
                "a stored BMC password was sealed with another key; start the controller "
                "with the key file it was enrolled under (--secret-key-file)"
            ) from e
        if len(self._opened) >= OPENED_KEPT:
            self._opened.clear()
        self._opened[stored] = opened
        return opened
