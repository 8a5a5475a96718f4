"""Who a call comes from: its bearer token, else its client certificate.

- A bearer token travels as ``authorization: Bearer kiln.<id>.<secret>``
  metadata; the core checks it (``Fleet.authenticate``). A call with a
  token is that token's caller, whatever certificate it also presents.
- A client certificate the TLS handshake verified against ``--tls-client-ca``
  names an operator when it carries a role: a SAN URI ``kiln:role:ROLE`` or
  an organisational unit (OU) that is a role's name. Its caller is its
  common name, in that role. A certificate with no role is an agent's: its
  common name, or a DNS SAN, names the node it may register
  (``controller.api.peer_identity``).
- With authentication off every caller is an admin; it is still named (by
  its certificate, else ``anonymous``) in the audit log.

``current_caller()`` is the caller of the call being served; the interceptor
sets it before the servicer runs.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography import x509
from cryptography.x509.oid import NameOID

from controller.core.errors import PermissionDenied, Unauthenticated
from controller.core.identity import ANONYMOUS, Caller, Role, Via

ROLE_URI_PREFIX = "kiln:role:"
_ROLE_NAMES = frozenset(r.value for r in Role)

_CALLER: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("kiln_caller", default=None)


def current_caller() -> Caller:
    """The caller of the call being served (``ANONYMOUS`` outside one)."""
    return _CALLER.get() or ANONYMOUS


def set_caller(caller: Caller) -> contextvars.Token[Caller | None]:
    return _CALLER.set(caller)


def reset_caller(token: contextvars.Token[Caller | None]) -> None:
    try:
        _CALLER.reset(token)
    except ValueError:  # an async generator closed from another context
        pass


class AgentTokenMismatch(PermissionDenied):
    template = "agent token for %(bound)r cannot register node %(node)r"


def authorize_agent_token(caller: Caller, node: str) -> None:
    """Raise AgentTokenMismatch when an agent token registers another node."""
    if caller.role is Role.AGENT and caller.via is Via.TOKEN and caller.node != node:
        raise AgentTokenMismatch(bound=caller.node, node=node)


def bearer_token(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The token of the ``authorization`` metadata; None when there is none.

    Raises Unauthenticated for an ``authorization`` that is not ``Bearer …``.
    """
    for key, value in metadata or ():
        if key.lower() != "authorization":
            continue
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("the authorization metadata must read 'Bearer <token>'")
        return token.strip()
    return None


@dataclass(frozen=True)
class PeerCertificate:
    """What Kiln reads from a verified client certificate."""

    common_name: str
    dns_names: tuple[str, ...]
    subject: str
    roles: frozenset[str]  # role names from OU and kiln:role: URIs, as written
    not_after: float  # unix seconds

    @property
    def label(self) -> str:
        return self.common_name or (self.dns_names[0] if self.dns_names else "?")


@functools.lru_cache(maxsize=4096)
def _parse(pem: bytes) -> PeerCertificate:
    cert = x509.load_pem_x509_certificate(pem)
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    ous = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    roles = {str(a.value) for a in ous if str(a.value) in _ROLE_NAMES}
    dns: list[str] = []
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        pass
    else:
        dns = [str(d) for d in san.get_values_for_type(x509.DNSName)]
        for uri in san.get_values_for_type(x509.UniformResourceIdentifier):
            if uri.startswith(ROLE_URI_PREFIX):
                roles.add(uri.removeprefix(ROLE_URI_PREFIX))
    return PeerCertificate(
        common_name=str(cns[0].value) if cns else "",
        dns_names=tuple(dns),
        subject=cert.subject.rfc4514_string(),
        roles=frozenset(roles),
        not_after=cert.not_valid_after_utc.timestamp(),
    )


def peer_certificate(auth_context: Mapping[str, Iterable[bytes]]) -> PeerCertificate | None:
    """The verified client certificate of the call; None when it presented none.

    gRPC fills ``x509_pem_cert`` only for a certificate the handshake
    verified against the server's client CA.
    """
    pems = list(auth_context.get("x509_pem_cert") or ())
    if not pems:
        return None
    try:
        return _parse(bytes(pems[0]))
    except ValueError as e:
        raise Unauthenticated("the client certificate cannot be read") from e


def certificate_caller(cert: PeerCertificate) -> Caller:
    """The caller a certificate stands for. Raises Unauthenticated when it
    names an unknown role or more than one."""
    if len(cert.roles) > 1:
        raise Unauthenticated(
            f"certificate {cert.label!r} names several roles ({', '.join(sorted(cert.roles))})"
        )
    if not cert.roles:
        return Caller(cert.label, Role.AGENT, Via.CERTIFICATE, subject=cert.subject)
    (name,) = cert.roles
    try:
        role = Role(name)
    except ValueError:
        raise Unauthenticated(
            f"certificate {cert.label!r} names unknown role {name[:32]!r}"
        ) from None
    return Caller(cert.label, role, Via.CERTIFICATE, subject=cert.subject)


class Authenticator(Protocol):
    async def authenticate(self, token: str) -> Caller: ...


class CallContext(Protocol):
    def invocation_metadata(self) -> Any: ...

    def auth_context(self) -> Mapping[str, Iterable[bytes]]: ...


async def identify(
    context: CallContext, fleet: Authenticator, *, enabled: bool, certificates: bool = True
) -> Caller:
    """The caller of a call (see the module docstring).

    ``certificates``: whether the server asks clients for certificates
    (mutual TLS); when it does not, none can come, and the call's auth
    context (costly to build on every call) is not read.

    Raises Unauthenticated (authentication on): no credentials, a bad or
    unusable token, an unreadable certificate or one with a bad role.
    """
    cert = peer_certificate(context.auth_context()) if certificates else None
    if not enabled:
        name = cert.label if cert is not None else ANONYMOUS.name
        return Caller(name, Role.ADMIN, Via.NONE, subject=cert.subject if cert else "")
    token = bearer_token(context.invocation_metadata())
    if token is not None:
        return await fleet.authenticate(token)
    if cert is not None:
        return certificate_caller(cert)
    raise Unauthenticated(
        "this controller needs credentials: a bearer token (kiln reads $KILN_TOKEN, "
        "--token-file or its config file) or a client certificate"
    )
