"""TLS for the controller's gRPC port: server credentials, checked up front.

``server_credentials(cert, key, client_ca)`` reads and checks the PEM files
(readable, parseable, the key belongs to the certificate) and returns the
``grpc.ServerCredentials`` to serve with; with ``client_ca`` every client must
present a certificate signed by it (mutual TLS). All problems are
``TlsConfigError``, one line naming the file and never its contents.

Clients (the CLI, agents) use ``channel_credentials`` from ``kiln_common.tls``,
which also reads the PEM files for this module.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

from controller.core.errors import InvalidArgument
from kiln_common.tls import TlsFileError, read_pem

__all__ = ["ReloadableTls", "TlsConfigError", "TlsFiles", "read_tls_files", "server_credentials"]


class TlsConfigError(InvalidArgument):
    """The controller's TLS options are incomplete or name unusable files."""


def _public_der(key: PublicKeyTypes) -> bytes:
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _check_pair(cert_pem: bytes, key_pem: bytes, cert: Path, key: Path) -> x509.Certificate:
    """The certificate; TlsConfigError unless ``key_pem`` is its private key."""
    try:
        certificate = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as e:
        raise TlsConfigError(f"TLS certificate {cert} cannot be parsed") from e
    try:
        private = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError as e:  # a passphrase-protected key
        raise TlsConfigError(f"TLS private key {key} is encrypted; give an unencrypted key") from e
    except (ValueError, UnsupportedAlgorithm) as e:
        raise TlsConfigError(f"TLS private key {key} cannot be parsed") from e
    if _public_der(private.public_key()) != _public_der(certificate.public_key()):
        raise TlsConfigError(f"TLS private key {key} does not belong to certificate {cert}")
    return certificate


@dataclass(frozen=True)
class TlsFiles:
    """What the controller serves TLS with, as read from its files."""

    cert_pem: bytes
    key_pem: bytes = field(repr=False)
    ca_pem: bytes | None
    expires_at: float  # the server certificate's notAfter (Unix seconds)

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(self.key_pem, self.cert_pem)], root_certificates=self.ca_pem
        )


def read_tls_files(cert: Path, key: Path, client_ca: Path | None) -> TlsFiles:
    """Read and check the files (readable, parseable, the key belongs to the
    certificate). Raises TlsConfigError."""
    try:
        cert_pem = read_pem(cert, "certificate")
        key_pem = read_pem(key, "private key")
        ca_pem = read_pem(client_ca, "CA certificate") if client_ca is not None else None
    except TlsFileError as e:
        raise TlsConfigError(str(e)) from e
    certificate = _check_pair(cert_pem, key_pem, cert, key)
    if ca_pem is not None:
        try:
            x509.load_pem_x509_certificates(ca_pem)
        except ValueError as e:
            raise TlsConfigError(f"client CA {client_ca} cannot be parsed") from e
    return TlsFiles(cert_pem, key_pem, ca_pem, certificate.not_valid_after_utc.timestamp())


def _paths(cert: Path | None, key: Path | None, client_ca: Path | None) -> tuple[Path, Path] | None:
    if cert is None and key is None and client_ca is None:
        return None
    if cert is None or key is None:
        missing = "--tls-cert" if cert is None else "--tls-key"
        raise TlsConfigError(f"TLS needs both --tls-cert and --tls-key ({missing} is missing)")
    return cert, key


def server_credentials(
    cert: Path | None, key: Path | None, client_ca: Path | None = None
) -> grpc.ServerCredentials | None:
    """Credentials to serve TLS with, or None when no option is set (plaintext).

    ``cert`` and ``key`` are required together; ``client_ca`` only with them,
    and then client certificates are required. Raises TlsConfigError.
    """
    paths = _paths(cert, key, client_ca)
    if paths is None:
        return None
    files = read_tls_files(*paths, client_ca)
    return grpc.ssl_server_credentials(
        [(files.key_pem, files.cert_pem)],
        root_certificates=files.ca_pem,
        require_client_auth=files.ca_pem is not None,
    )


class ReloadableTls:
    """Server TLS whose certificate, key and client CA are read again on
    ``reload()`` (SIGHUP), without a restart.

    gRPC asks ``_fetch`` for a new configuration at each new handshake; it is
    handed over once after a reload, so connections made since use the new
    files while established ones (agent streams) carry on untouched. Whether
    client certificates are required is fixed at start (``--tls-client-ca``
    given or not).
    """

    def __init__(self, cert: Path, key: Path, client_ca: Path | None) -> None:
        self.cert, self.key, self.client_ca = cert, key, client_ca
        self.files = read_tls_files(cert, key, client_ca)
        self._pending: TlsFiles | None = None
        self._lock = threading.Lock()  # gRPC calls _fetch from its own threads

    @classmethod
    def from_options(
        cls, cert: Path | None, key: Path | None, client_ca: Path | None
    ) -> ReloadableTls | None:
        """None when no TLS option is given. Raises TlsConfigError."""
        paths = _paths(cert, key, client_ca)
        return cls(*paths, client_ca) if paths is not None else None

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self.files.configuration(),
            self._fetch,
            require_client_authentication=self.client_ca is not None,
        )

    def reload(self) -> TlsFiles:
        """Read the files again; the next handshake uses them.

        Raises:
            TlsConfigError: a file is unusable; the current files stay in use.
        """
        files = read_tls_files(self.cert, self.key, self.client_ca)
        with self._lock:
            self.files = self._pending = files
        return files

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:
            pending, self._pending = self._pending, None
        return pending.configuration() if pending is not None else None
