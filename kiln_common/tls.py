"""Client-side TLS for the controller's gRPC port (agent and CLI).

``channel_credentials`` reads PEM files once, up front, and returns the
``grpc.ChannelCredentials`` to dial with, or ``None`` for plaintext. Nothing is
kept at module level: each caller (each agent of a simulated fleet) holds its
own credentials. Private key bytes never appear in errors or logs.
"""

from __future__ import annotations

from pathlib import Path

import grpc


class TlsFileError(ValueError):
    """A TLS option is incomplete, or a file is missing, unreadable or not PEM."""


_PEM_MARKERS = {
    "certificate": b"-----BEGIN CERTIFICATE-----",
    "CA certificate": b"-----BEGIN CERTIFICATE-----",
    "private key": b"PRIVATE KEY-----",
}


def read_pem(path: Path, what: str) -> bytes:
    """The bytes of PEM file ``path`` holding a ``what`` (a key of ``_PEM_MARKERS``).

    Raises TlsFileError naming the file and the reason; never its contents.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise TlsFileError(f"cannot read TLS {what} {path}: {e.strerror or e}") from e
    if _PEM_MARKERS[what] not in data:
        raise TlsFileError(f"TLS {what} {path} is not a PEM {what}")
    return data


def channel_credentials(
    ca: Path | None = None, cert: Path | None = None, key: Path | None = None
) -> grpc.ChannelCredentials | None:
    """Credentials for a TLS channel, or None when no option is given (plaintext).

    ``ca`` verifies the controller (None: the system's trusted roots);
    ``cert`` and ``key`` are this client's certificate for mutual TLS and
    come together or not at all. Raises TlsFileError.
    """
    if ca is None and cert is None and key is None:
        return None
    if (cert is None) != (key is None):
        raise TlsFileError("a TLS client certificate and its key must be given together")
    return grpc.ssl_channel_credentials(
        root_certificates=read_pem(ca, "CA certificate") if ca is not None else None,
        private_key=read_pem(key, "private key") if key is not None else None,
        certificate_chain=read_pem(cert, "certificate") if cert is not None else None,
    )
