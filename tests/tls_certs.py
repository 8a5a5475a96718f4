"""A throw-away certificate authority for TLS tests (``cryptography``, EC P-256).

``TestCa(tmp_dir)`` writes ``ca.pem``; ``server(...)`` and ``client(name)``
write a certificate and key signed by it and return their paths. Keys are
unencrypted PEM; everything lives in the directory the test gave.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertFiles:
    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


class TestCa:
    """A self-signed CA in ``directory``; ``ca_path`` is its certificate."""

    __test__ = False  # not a pytest test class

    def __init__(self, directory: Path, common_name: str = "kiln test CA") -> None:
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self._name = _name(common_name)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.ca_path = directory / "ca.pem"
        self.ca_path.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def _issue(
        self,
        stem: str,
        common_name: str,
        sans: list[x509.GeneralName],
        usage: x509.ObjectIdentifier,
    ) -> CertFiles:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        files = CertFiles(self.directory / f"{stem}.pem", self.directory / f"{stem}-key.pem")
        files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, files.key)
        return files

    def server(self, stem: str = "server", ip: str = "127.0.0.1") -> CertFiles:
        """A server certificate valid for ``ip`` (an IP SAN)."""
        return self._issue(
            stem,
            "kiln-controller",
            [x509.IPAddress(ipaddress.ip_address(ip))],
            ExtendedKeyUsageOID.SERVER_AUTH,
        )

    def client(self, common_name: str, *, dns: tuple[str, ...] = ()) -> CertFiles:
        """A client certificate with CN ``common_name`` and optional DNS SANs."""
        return self._issue(
            f"client-{common_name}",
            common_name,
            [x509.DNSName(d) for d in dns],
            ExtendedKeyUsageOID.CLIENT_AUTH,
        )
