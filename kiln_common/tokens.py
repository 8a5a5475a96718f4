"""Bearer tokens on the client side (agent and CLI): files and metadata.

A token lives in a file of its own, mode 0600, never on a command line:
``read_token_file`` reads one (the first line, stripped), ``write_private``
writes one so that no other user can read it, even for a moment.
``bearer_metadata`` is the gRPC metadata a call carries it in. Token text
never appears in an error.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

AUTHORIZATION = "authorization"


class TokenFileError(ValueError):
    """A token file is missing, unreadable or empty (the message names the file only)."""


def read_token_file(path: Path | str) -> str:
    """The token in ``path``. Raises TokenFileError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TokenFileError(f"token file {path} not found") from None
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise TokenFileError(f"cannot read token file {path}: {reason}") from None
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise TokenFileError(f"token file {path} holds no token")
    return token


def write_private(path: Path | str, text: str) -> None:
    """Write ``text`` to ``path`` (replacing it) readable by its owner only (0600).

    The file is made 0600 in the same directory and renamed into place, so no
    other user ever sees the text, and a reader never sees half of it.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text if text.endswith("\n") else text + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata that carries ``token`` (none for None)."""
    return ((AUTHORIZATION, f"Bearer {token}"),) if token else ()
