"""Who is calling, and in what role: the domain's view of identity.

The API layer works out a ``Caller`` from the credentials a call carries (a
bearer token, a client certificate, or none when authentication is off) and
hands it to the core where a decision or a record depends on it: who created
a token or an allocation, whether a provisioner releases its own allocation.
What each role may call is the API layer's table
(``controller.api.auth.roles``); the core only knows the roles' names.

A ``TokenRecord`` is what the store keeps of a bearer token: never the secret
itself, only its salted hash (``controller.core.tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Role(StrEnum):
    """What a caller may do (``docs`` and README, "Securing a fleet")."""

    VIEWER = "viewer"  # reads and the event stream
    OPERATOR = "operator"  # power, drain/undrain, allocate/release
    PROVISIONER = "provisioner"  # enrol, agent tokens, allocate/release its own
    ADMIN = "admin"  # everything: tokens, audit, credentials
    AGENT = "agent"  # AgentService only, for the one node it is bound to


OPERATOR_ROLES = (Role.VIEWER, Role.OPERATOR, Role.PROVISIONER, Role.ADMIN)
"""Roles a token made with ``CreateToken`` may have (agent tokens are per node)."""


class Via(StrEnum):
    """How the caller proved who it is."""

    TOKEN = "token"
    CERTIFICATE = "certificate"
    NONE = "none"  # authentication is off on this controller


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated caller.

    ``name`` is a token's name, a certificate's common name, or a node's name
    for an agent; ``node`` is the one node an agent token may register ("":
    not bound by a token). ``subject`` is the certificate's full subject.
    """

    name: str
    role: Role
    via: Via
    node: str = ""
    subject: str = ""

    @property
    def label(self) -> str:
        """``name (role)`` for messages."""
        return f"{self.name!r} ({self.role})"


ANONYMOUS = Caller("anonymous", Role.ADMIN, Via.NONE)
"""Every caller of a controller with authentication off: it may do anything."""

SYSTEM = Caller("kiln-controller", Role.ADMIN, Via.NONE)
"""The controller itself (the bootstrap admin token's creator)."""


@dataclass(slots=True)
class TokenRecord:
    """A bearer token as the store keeps it.

    ``id`` is the public prefix of the token a caller presents, the key it is
    looked up by; ``secret_hash`` is the self-describing salted KDF output of
    its secret part (``controller.core.tokens.hash_secret``). Agent tokens
    have role ``agent`` and name the node they may register.
    """

    id: str
    name: str
    role: Role
    secret_hash: str
    created_at: float
    expires_at: float = 0.0  # 0: never
    created_by: str = ""
    last_used_at: float = 0.0
    revoked_at: float = 0.0  # 0: not revoked
    node: str = ""

    @property
    def revoked(self) -> bool:
        return self.revoked_at > 0

    def expired(self, now: float) -> bool:
        return 0 < self.expires_at <= now

    def usable(self, now: float) -> bool:
        return not self.revoked and not self.expired(now)


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A token as the API shows it: everything but its hash."""

    name: str
    role: Role
    created_at: float
    expires_at: float
    revoked: bool
    created_by: str
    last_used_at: float
    node: str = ""

    @classmethod
    def of(cls, record: TokenRecord) -> TokenInfo:
        return cls(
            name=record.name,
            role=record.role,
            created_at=record.created_at,
            expires_at=record.expires_at,
            revoked=record.revoked,
            created_by=record.created_by,
            last_used_at=record.last_used_at,
            node=record.node,
        )
