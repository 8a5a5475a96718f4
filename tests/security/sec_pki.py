"""Certificates for the security tests: operators with a role, agents with a node.

Built on ``tls_certs.TestCa``: an operator's certificate carries its role as
an organisational unit (OU) or as a SAN URI ``kiln:role:ROLE``; an agent's
names its node (CN), with no role.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from tls_certs import CertFiles, TestCa


class RoleCa(TestCa):
    """A test CA that also issues certificates with roles in them."""

    __test__ = False

    def person(
        self, common_name: str, *, ous: tuple[str, ...] = (), uris: tuple[str, ...] = ()
    ) -> CertFiles:
        """A client certificate: CN ``common_name``, OUs ``ous``, URI SANs ``uris``."""
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        attributes += [x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou) for ou in ous]
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        )
        if uris:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris]),
                critical=False,
            )
        cert = builder.sign(self._key, hashes.SHA256())
        stem = Path(self.directory) / f"person-{common_name}"
        files = CertFiles(stem.with_suffix(".pem"), Path(f"{stem}-key.pem"))
        files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return files
