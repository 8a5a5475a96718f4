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

from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

from controller.core.errors import InvalidArgument
from kiln_common.tls import TlsFileError, read_pem

__all__ = ["TlsConfigError", "server_credentials"]


class TlsConfigError(InvalidArgument):
    """The controller's TLS options are incomplete or name unusable files."""


def _public_der(key: PublicKeyTypes) -> bytes:
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _check_pair(cert_pem: bytes, key_pem: bytes, cert: Path, key: Path) -> None:
    """Raise TlsConfigError unless ``key_pem`` is the private key of ``cert_pem``."""
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


def server_credentials(
    cert: Path | None, key: Path | None, client_ca: Path | None = None
) -> grpc.ServerCredentials | None:
    """Credentials to serve TLS with, or None when no option is set (plaintext).

    ``cert`` and ``key`` are required together; ``client_ca`` only with them,
    and then client certificates are required. Raises TlsConfigError.
    """
    if cert is None and key is None and client_ca is None:
        return None
    if cert is None or key is None:
        missing = "--tls-cert" if cert is None else "--tls-key"
        raise TlsConfigError(f"TLS needs both --tls-cert and --tls-key ({missing} is missing)")
    try:
        cert_pem = read_pem(cert, "certificate")
        key_pem = read_pem(key, "private key")
        ca_pem = read_pem(client_ca, "CA certificate") if client_ca is not None else None
    except TlsFileError as e:
        raise TlsConfigError(str(e)) from e
    _check_pair(cert_pem, key_pem, cert, key)
    return grpc.ssl_server_credentials(
        [(key_pem, cert_pem)],
        root_certificates=ca_pem,
        require_client_auth=ca_pem is not None,
    )
