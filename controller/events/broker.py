"""How the controller signs in to its MQTT broker: credentials and TLS.

``BrokerAccess`` is built once from the options (``--mqtt-username``,
``--mqtt-password-file``, ``--mqtt-tls``, ``--mqtt-tls-ca``,
``--mqtt-tls-cert``/``--mqtt-tls-key``); every file is read and every TLS
setting is loaded then, so a missing or wrong file stops the start with one
line. The password is held in memory only and never appears in its repr,
in logs or in errors.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

from controller.core.errors import InvalidArgument

MAX_PASSWORD_BYTES = 65535  # MQTT's length-prefixed binary data


@dataclass(frozen=True)
class BrokerTls:
    """TLS to the broker: verified against ``ca_file`` (else the system's
    CAs), with a client certificate when ``cert_file`` is given."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def context(self) -> ssl.SSLContext:
        """The client context (hostname checked, TLS 1.2 or later).

        Raises:
            InvalidArgument: a file is missing or does not hold what it should.
        """
        if (self.cert_file is None) != (self.key_file is None):
            raise InvalidArgument("--mqtt-tls-cert and --mqtt-tls-key go together")
        try:
            context = ssl.create_default_context(
                cafile=str(self.ca_file) if self.ca_file is not None else None
            )
        except (OSError, ssl.SSLError) as e:
            raise InvalidArgument(f"--mqtt-tls-ca {self.ca_file}: {_why(e)}") from None
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert_file is not None and self.key_file is not None:
            try:
                context.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as e:
                raise InvalidArgument(
                    f"--mqtt-tls-cert {self.cert_file} / --mqtt-tls-key {self.key_file}: {_why(e)}"
                ) from None
        return context


@dataclass(frozen=True)
class BrokerAccess:
    """Credentials (both or neither) and TLS (None: plaintext) for the broker."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: BrokerTls | None = None

    def __post_init__(self) -> None:
        if (self.username is None) != (self.password is None):
            raise InvalidArgument("--mqtt-username and --mqtt-password-file go together")

    @property
    def summary(self) -> str:
        """What a log line may say about it (never the password)."""
        who = f"as {self.username}" if self.username else "anonymously"
        return f"{who}, {'TLS' if self.tls is not None else 'plaintext'}"


def read_password_file(path: Path) -> str:
    """The first line of ``path``, without its line end.

    Raises:
        InvalidArgument: unreadable, not UTF-8, empty or too long; the
            message names the file and never quotes it.
    """
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InvalidArgument(f"--mqtt-password-file {path}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(f"--mqtt-password-file {path}: not UTF-8 text") from None
    password = text.splitlines()[0] if text else ""
    if not password:
        raise InvalidArgument(f"--mqtt-password-file {path}: the file is empty")
    if len(password.encode()) > MAX_PASSWORD_BYTES:
        raise InvalidArgument(f"--mqtt-password-file {path}: longer than MQTT allows")
    return password


def _why(error: Exception) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(getattr(error, "reason", None) or error)
