"""Who a TLS client certificate says the peer is, and what it may register.

Under mutual TLS an agent's certificate names its node: the certificate's
common name, or one of its DNS subject alternative names, equals the node
name. ``certificate_names`` reads those names from gRPC's auth context (None:
the peer presented no certificate, e.g. plaintext); ``authorize_node`` is the
pure rule. ``PermissionDenied`` maps to PERMISSION_DENIED in
``controller.api.errors``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cryptography import x509

from controller.core.errors import PermissionDenied


class CertificateMismatch(PermissionDenied):
    template = "certificate for %(certificate)r cannot register node %(node)r"


@dataclass(frozen=True)
class CertificateNames:
    """The names a verified client certificate carries."""

    common_name: str
    dns_names: tuple[str, ...]

    def __contains__(self, name: object) -> bool:
        """Whether the certificate names ``name`` (an empty name never matches)."""
        return bool(name) and (name == self.common_name or name in self.dns_names)

    @property
    def label(self) -> str:
        """The name to show in messages: the CN, else the first DNS name."""
        return self.common_name or (self.dns_names[0] if self.dns_names else "?")


def _texts(values: Iterable[bytes] | None) -> tuple[str, ...]:
    return tuple(v.decode("utf-8", "replace") for v in values or ())


def certificate_names(auth_context: Mapping[str, Iterable[bytes]]) -> CertificateNames | None:
    """The peer certificate's CN and DNS SANs, or None when it presented none.

    gRPC only fills these properties for a certificate the TLS handshake
    verified against the server's client CA.
    """
    if not auth_context.get("x509_pem_cert"):
        return None
    common = _texts(auth_context.get("x509_common_name"))
    return CertificateNames(
        common_name=common[0] if common else "",
        dns_names=_texts(auth_context.get("peer_dns")),
    )


def certificate_expiry(auth_context: Mapping[str, Iterable[bytes]]) -> float | None:
    """When the peer's verified certificate expires (Unix seconds), or None
    when it presented none (or gRPC gave a certificate that cannot be read)."""
    pem = next(iter(auth_context.get("x509_pem_cert") or ()), None)
    if not pem:
        return None
    try:
        certificate = x509.load_pem_x509_certificate(pem)
    except ValueError:
        return None
    return certificate.not_valid_after_utc.timestamp()


def authorize_node(names: CertificateNames | None, node: str) -> None:
    """Raise CertificateMismatch unless the certificate (if any) names ``node``.

    A peer without a certificate is not restricted here: without a client CA
    the transport admits anyone, which is the operator's choice.
    """
    if names is not None and node not in names:
        raise CertificateMismatch(certificate=names.label, node=node)
