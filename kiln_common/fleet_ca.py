"""A fleet certificate authority: the CA, and the certificates Kiln reads.

``init_ca`` makes a CA (EC P-256, self-signed, ``CA:TRUE``, may sign
certificates and CRLs) as ``ca.pem`` and ``ca.key`` in a directory;
``load_ca`` reads it back and ``FleetCa.issue`` signs a ``Leaf``:

- ``controller_leaf``: a server certificate (serverAuth) for the names and
  addresses clients dial (DNS or IP SANs);
- ``agent_leaf``: a client certificate (clientAuth) naming its node (CN and
  DNS SAN) and no role, which the controller takes for that node's agent;
- ``operator_leaf``: a client certificate carrying a role twice over, as an
  organisational unit and as a SAN URI ``kiln:role:ROLE``, which is how the
  controller reads a caller's role from a certificate.

Private keys are unencrypted PKCS#8 PEM (the controller and ``grpc`` need
them so), created mode 0600 — never readable by anyone else, not even for a
moment; certificates are 0644. Nothing is overwritten unless asked to. Every
problem is a ``FleetCaError``, one line that names a file, never a key.

This module knows nothing of the controller (which roles exist is its
callers' business) and imports no grpc.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CA_CERT",
    "CA_KEY",
    "MAX_DAYS",
    "ROLE_URI_PREFIX",
    "CaExists",
    "CaMissing",
    "FilesExist",
    "FleetCa",
    "FleetCaError",
    "InvalidValue",
    "Issued",
    "Leaf",
    "agent_leaf",
    "controller_leaf",
    "host_name",
    "init_ca",
    "load_ca",
    "operator_leaf",
]

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
MAX_DAYS = 36500
ROLE_URI_PREFIX = "kiln:role:"  # as controller.api.auth.identity reads it
CERT_MODE = 0o644
KEY_MODE = 0o600
BACKDATE = datetime.timedelta(minutes=5)  # clocks a little behind still accept it

_DNS_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


class FleetCaError(ValueError):
    """A CA or certificate cannot be made, read or written (one line)."""


class InvalidValue(FleetCaError):
    """A name, address or number of days that cannot go into a certificate."""


class CaMissing(FleetCaError):
    """The directory holds no CA."""


class CaExists(FleetCaError):
    """``init_ca`` would replace a CA."""


class FilesExist(FleetCaError):
    """A file to write is already there."""


@dataclass(frozen=True)
class Issued:
    """What was written: the certificate, its key, and what it says."""

    cert: Path
    key: Path
    subject: str
    names: tuple[str, ...]  # the SANs, as ``DNS:x``, ``IP:x``, ``URI:x``
    not_after: datetime.datetime


@dataclass(frozen=True)
class Leaf:
    """A certificate to issue: its subject, SANs and extended key usage."""

    common_name: str
    sans: tuple[x509.GeneralName, ...]
    usage: x509.ObjectIdentifier
    units: tuple[str, ...] = ()  # organisational units (OU)


def host_name(text: str) -> x509.GeneralName:
    """``text`` as a SAN: an IP address, else a DNS name (``*.`` first allowed).

    Raises FleetCaError for something that is neither.
    """
    try:
        return x509.IPAddress(ipaddress.ip_address(text))
    except ValueError:
        pass
    labels = text.removeprefix("*.").split(".")
    if len(text) > 253 or not all(_DNS_LABEL.fullmatch(label) for label in labels):
        raise InvalidValue(f"{text[:64]!r} is neither an IP address nor a DNS name")
    return x509.DNSName(text.lower())


def controller_leaf(common_name: str, hosts: Sequence[str]) -> Leaf:
    """The controller's server certificate, valid for each of ``hosts``."""
    if not hosts:
        raise InvalidValue("a controller certificate needs at least one DNS name or IP address")
    sans = tuple(dict.fromkeys(host_name(h) for h in hosts))
    return Leaf(common_name, sans, ExtendedKeyUsageOID.SERVER_AUTH)


def agent_leaf(node: str) -> Leaf:
    """An agent's client certificate: CN and DNS SAN ``node``, no role."""
    return Leaf(node, (x509.DNSName(node),), ExtendedKeyUsageOID.CLIENT_AUTH)


def operator_leaf(name: str, role: str) -> Leaf:
    """A person's or pipeline's client certificate: CN ``name`` in ``role``."""
    uri = x509.UniformResourceIdentifier(ROLE_URI_PREFIX + role)
    return Leaf(name, (uri,), ExtendedKeyUsageOID.CLIENT_AUTH, units=(role,))


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _validity(days: int) -> tuple[datetime.datetime, datetime.datetime]:
    if not 1 <= days <= MAX_DAYS:
        raise InvalidValue(f"a certificate is valid for 1 to {MAX_DAYS} days, not {days}")
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    return now - BACKDATE, now + datetime.timedelta(days=days)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _san_text(name: x509.GeneralName) -> str:
    if isinstance(name, x509.IPAddress):
        return f"IP:{name.value}"
    if isinstance(name, x509.UniformResourceIdentifier):
        return f"URI:{name.value}"
    return f"DNS:{name.value}"


def _create(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to a new file ``path`` made with ``mode``; never follows a link."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            if mode != KEY_MODE:  # a certificate is public: the same mode whatever the umask
                os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _write(files: Sequence[tuple[Path, bytes, int]], *, replace: bool) -> None:
    """Write each ``(path, data, mode)``, in order; all or none unless ``replace``.

    Without ``replace`` an existing file (or link) is refused before anything
    is written (FilesExist) and a failure removes what was written; with it,
    each file is written beside its target and renamed over it.
    """
    if not replace:
        there = [str(path) for path, _, _ in files if os.path.lexists(path)]
        if there:
            raise FilesExist(f"{' and '.join(there)} already exist{'s' if len(there) == 1 else ''}")
    written: list[Path] = []
    try:
        for path, data, mode in files:
            if not replace:
                _create(path, data, mode)
                written.append(path)
                continue
            temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
            _create(temporary, data, mode)
            try:
                os.replace(temporary, path)
            except BaseException:
                temporary.unlink(missing_ok=True)
                raise
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise


class FleetCa:
    """A CA certificate and its private key, loaded; ``issue`` signs leaves."""

    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.cert = cert
        self._key = key

    @property
    def not_after(self) -> datetime.datetime:
        return self.cert.not_valid_after_utc

    def issue(self, leaf: Leaf, cert: Path, key: Path, days: int, *, replace: bool) -> Issued:
        """Sign ``leaf`` for ``days`` and write it to ``cert`` and ``key``.

        Refuses a certificate that would outlive this CA, or any from an
        expired CA. Raises FleetCaError, FilesExist or OSError.
        """
        not_before, not_after = _validity(days)
        if self.not_after <= not_before + BACKDATE:
            raise FleetCaError(f"the CA expired on {self.not_after:%Y-%m-%d}; make a new one")
        if not_after > self.not_after:
            raise InvalidValue(
                f"a certificate for {days} days would outlive the CA, which expires on "
                f"{self.not_after:%Y-%m-%d}; give fewer --days"
            )
        private = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, leaf.common_name)]
        attributes += [x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, u) for u in leaf.units]
        subject = x509.Name(attributes)
        try:
            ca_key_id = self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
            authority = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                ca_key_id.value
            )
        except x509.ExtensionNotFound:  # a CA made elsewhere
            authority = x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key())
        certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.cert.subject)
            .public_key(private.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([leaf.usage]), critical=False)
            .add_extension(x509.SubjectAlternativeName(leaf.sans), critical=False)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(private.public_key()), critical=False
            )
            .add_extension(authority, critical=False)
            .sign(self._key, hashes.SHA256())
        )
        _write(
            [
                (key, _key_pem(private), KEY_MODE),
                (cert, certificate.public_bytes(serialization.Encoding.PEM), CERT_MODE),
            ],
            replace=replace,
        )
        return Issued(
            cert=cert,
            key=key,
            subject=subject.rfc4514_string(),
            names=tuple(_san_text(name) for name in leaf.sans),
            not_after=not_after,
        )


def init_ca(directory: Path, name: str, days: int, *, replace: bool = False) -> Issued:
    """Make a CA named ``name`` in ``directory`` (made 0700 when missing).

    Raises CaExists when ``directory`` holds one already (unless ``replace``),
    FleetCaError or OSError.
    """
    if not name.strip() or len(name) > 64 or not name.isprintable():
        raise InvalidValue("a CA's name is 1 to 64 printable characters")
    not_before, not_after = _validity(days)
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    there = [str(p) for p in (cert_path, key_path) if os.path.lexists(p)]
    if there and not replace:
        raise CaExists(f"{directory} already holds a CA ({', '.join(there)})")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    private = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(private.public_key()), critical=False
        )
        .sign(private, hashes.SHA256())
    )
    _write(
        [
            (key_path, _key_pem(private), KEY_MODE),
            (cert_path, certificate.public_bytes(serialization.Encoding.PEM), CERT_MODE),
        ],
        replace=replace,
    )
    return Issued(cert_path, key_path, subject.rfc4514_string(), (), not_after)


def load_ca(directory: Path) -> FleetCa:
    """The CA in ``directory``. Raises CaMissing, or FleetCaError for one
    that cannot be read, is no CA, or whose key is not its certificate's."""
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    for path in (cert_path, key_path):
        if not path.exists():
            raise CaMissing(f"no fleet CA in {directory} ({path} not found)")
    try:
        cert_pem, key_pem = cert_path.read_bytes(), key_path.read_bytes()
    except OSError as e:
        raise FleetCaError(f"cannot read the CA in {directory}: {e.strerror or e}") from None
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        raise FleetCaError(f"{cert_path} is not a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (TypeError, ValueError, UnsupportedAlgorithm):
        raise FleetCaError(f"{key_path} is not an unencrypted PEM private key") from None
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = x509.BasicConstraints(ca=False, path_length=None)
    if not constraints.ca:
        raise FleetCaError(f"{cert_path} is not a CA certificate")
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise FleetCaError(f"{key_path} is not the private key of {cert_path}")
    return FleetCa(cert, key)
