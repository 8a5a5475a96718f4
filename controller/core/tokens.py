"""Bearer tokens: made, checked, listed and revoked; only salted hashes are kept.

A token reads ``kiln.<id>.<secret>``. ``id`` (12 hex digits) is the public
key it is stored under, so checking a token is one look-up, never a scan;
``secret`` (``secrets.token_urlsafe(32)``, 256 random bits) is checked against
its scrypt hash under a salt of its own. The secret is handed back once, when
the token is made, and is never stored, logged or returned again.

scrypt costs tens of milliseconds of CPU a check, by design. A token that
checked out is remembered by this process (a SHA-256 of its salt and secret,
in memory only), so later calls with it cost a hash; records are cached for
``cache_s`` seconds, and every change made through this ``Tokens`` drops the
cache at once. Only the active controller serves, so no other process changes
tokens behind its back. ``last_used_at`` is written at most once a minute per
token, so a busy pipeline does not cost a write per call.

Operator tokens have a name, a role (``OPERATOR_ROLES``), an optional expiry
and their creator. Agent tokens (role ``agent``) are named ``agent:NODE`` and
may register only that node; issuing a new one replaces the old.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import math
import re
import secrets
import time
from collections.abc import Awaitable, Callable

from controller.core.errors import AlreadyExists, InvalidArgument, NotFound, Unauthenticated
from controller.core.identity import (
    OPERATOR_ROLES,
    Caller,
    Role,
    TokenInfo,
    TokenRecord,
    Via,
)
from controller.core.ports import Store, Tx

log = logging.getLogger(__name__)

PREFIX = "kiln"
AGENT_PREFIX = "agent:"
MAX_TTL_S = 10 * 366 * 86400.0
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
_ID = re.compile(r"[0-9a-f]{12}")
# scrypt's cost: 16 MiB and ~50 ms a check; the parameters travel with each hash.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1


def hash_secret(secret: str, salt: bytes | None = None) -> str:
    """``scrypt$N$r$p$SALT$HASH`` (base64) of ``secret`` under a fresh 16-byte salt."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.scrypt(
        secret.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32
    )
    b64 = base64.b64encode
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${b64(salt).decode()}${b64(digest).decode()}"


def _salt(encoded: str) -> bytes:
    return base64.b64decode(encoded.split("$")[4])


def verify_secret(secret: str, encoded: str) -> bool:
    """Whether ``secret`` hashes to ``encoded`` (constant-time comparison)."""
    try:
        scheme, n, r, p, salt, want = encoded.split("$")
        if scheme != "scrypt":
            return False
        got = hashlib.scrypt(
            secret.encode(),
            salt=base64.b64decode(salt),
            n=int(n),
            r=int(r),
            p=int(p),
            dklen=len(base64.b64decode(want)),
        )
    except ValueError:
        return False
    return hmac.compare_digest(got, base64.b64decode(want))


def _quick(record: TokenRecord, secret: str) -> bytes:
    """The in-memory stand-in for a secret that passed scrypt once."""
    return hashlib.sha256(_salt(record.secret_hash) + secret.encode()).digest()


def split_token(presented: str) -> tuple[str, str]:
    """``(id, secret)`` of ``kiln.<id>.<secret>``. Raises Unauthenticated."""
    parts = presented.split(".")
    if len(parts) != 3 or parts[0] != PREFIX or not _ID.fullmatch(parts[1]) or not parts[2]:
        raise Unauthenticated("the bearer token is malformed (want kiln.<id>.<secret>)")
    return parts[1], parts[2]


def agent_token_name(node: str) -> str:
    return AGENT_PREFIX + node


def parse_role(text: str) -> Role:
    """An operator token's role. Raises InvalidArgument naming the choices."""
    try:
        role = Role(text.strip().lower())
    except ValueError:
        role = None
    if role not in OPERATOR_ROLES:
        choices = ", ".join(OPERATOR_ROLES)
        raise InvalidArgument(
            f"a token's role is one of {choices}, not {text[:32]!r} "
            "(an agent's token comes from IssueAgentToken)"
        )
    assert role is not None
    return role


def validate_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise InvalidArgument(
            "a token's name is 1-64 letters, digits and . _ @ -, starting with a letter "
            f"or digit; not {name[:64]!r}"
        )


def _ttl(ttl_s: float) -> float:
    if not math.isfinite(ttl_s) or ttl_s < 0 or ttl_s > MAX_TTL_S:
        raise InvalidArgument("a token's time to live is 0 (never expires) to 10 years")
    return ttl_s


class Tokens:
    """The token book of one controller (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], float] = time.time,
        cache_s: float = 5.0,
        touch_every: float = 60.0,
    ) -> None:
        self._store = store
        self._clock = clock
        self._cache_s = cache_s
        self._touch_every = touch_every
        self._records: dict[str, tuple[TokenRecord | None, float]] = {}
        self._verified: dict[tuple[str, str], bytes] = {}

    def _forget(self) -> None:
        self._records.clear()

    def invalidate(self) -> None:
        """Drop cached token look-ups (tokens were removed with their node)."""
        self._forget()

    def _new(
        self, name: str, role: Role, secret_hash: str, *, token_id: str, by: str, node: str = ""
    ) -> TokenRecord:
        return TokenRecord(
            id=token_id,
            name=name,
            role=role,
            secret_hash=secret_hash,
            created_at=self._clock(),
            created_by=by,
            node=node,
        )

    @staticmethod
    async def _mint() -> tuple[str, str, str]:
        """A fresh ``(id, token, hash)``; scrypt runs off the event loop."""
        token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
        hashed = await asyncio.to_thread(hash_secret, secret)
        return token_id, f"{PREFIX}.{token_id}.{secret}", hashed

    async def create(
        self, name: str, role: str, *, ttl_s: float = 0.0, by: Caller
    ) -> tuple[TokenInfo, str]:
        """Make an operator token; returns it and its secret (shown once).

        A revoked token's name may be used again (the old record goes).

        Raises:
            InvalidArgument: a bad name, role or time to live.
            AlreadyExists: a token of that name is in use.
        """
        validate_name(name)
        wanted = parse_role(role)
        ttl = _ttl(ttl_s)
        token_id, token, hashed = await self._mint()

        def write(tx: Tx) -> TokenRecord:
            old = tx.tokens.by_name(name)
            if old is not None:
                if not old.revoked:
                    raise AlreadyExists(kind="token", name=name)
                tx.tokens.delete(old.id)
            record = self._new(name, wanted, hashed, token_id=token_id, by=by.name)
            if ttl:
                record.expires_at = record.created_at + ttl
            tx.tokens.add(record)
            return record

        record = await self._store.tx(write)
        self._forget()
        log.info("token %r (%s) created by %s", name, wanted, by.name)
        return TokenInfo.of(record), token

    async def list(self, *, include_revoked: bool = False) -> list[TokenInfo]:
        """Every token by name (agent tokens too), revoked ones on request."""
        records = await self._store.read(lambda tx: tx.tokens.find(include_revoked=include_revoked))
        return [TokenInfo.of(r) for r in records]

    async def revoke(self, name: str, *, by: Caller) -> TokenInfo:
        """Revoke a token by name; it stops working at once. Idempotent.

        Raises NotFound.
        """

        def write(tx: Tx) -> TokenRecord:
            record = tx.tokens.by_name(name)
            if record is None:
                raise NotFound(kind="token", name=name)
            if not record.revoked:
                record.revoked_at = self._clock()
                tx.tokens.save(record)
            return record

        record = await self._store.tx(write)
        self._forget()
        log.info("token %r revoked by %s", name, by.name)
        return TokenInfo.of(record)

    async def issue_agent_token(self, node: str, *, by: Caller) -> str:
        """A new token that may register ``node`` only; it replaces the old one.

        The caller checks that the node exists.
        """
        token_id, token, hashed = await self._mint()
        name = agent_token_name(node)

        def write(tx: Tx) -> None:
            old = tx.tokens.by_name(name)
            if old is not None:
                tx.tokens.delete(old.id)
            tx.tokens.add(
                self._new(name, Role.AGENT, hashed, token_id=token_id, by=by.name, node=node)
            )

        await self._store.tx(write)
        self._forget()
        log.info("node %s: agent token issued by %s", node, by.name)
        return token

    async def ensure_admin(
        self, keep: Callable[[str, str], Awaitable[None]], name: str = "bootstrap-admin"
    ) -> str | None:
        """Make the fleet's first admin token; returns its name.

        ``keep(name, secret)`` is awaited before the token is stored, so a
        secret that could not be kept (an unwritable file) leaves no token
        behind, and the next start tries again.

        None, and nothing made, when the store holds any admin token, even a
        revoked or expired one: a restart, or revoking the bootstrap token
        once real admins exist, never brings a new one to disk. (Whoever lost
        every admin token gets back in with an admin certificate from the
        fleet CA.) Only the active controller runs this, at its start.
        """

        def first_free(tx: Tx) -> str | None:
            if any(t.role is Role.ADMIN for t in tx.tokens.find(include_revoked=True)):
                return None
            free, n = name, 1
            while tx.tokens.by_name(free) is not None:  # a viewer called bootstrap-admin…
                n += 1
                free = f"{name}-{n}"
            return free

        chosen = await self._store.read(first_free)
        if chosen is None:
            return None
        token_id, token, hashed = await self._mint()
        await keep(chosen, token)

        def write(tx: Tx) -> None:
            if first_free(tx) != chosen:  # cannot happen with one active controller
                raise AlreadyExists(kind="token", name=chosen)
            tx.tokens.add(
                self._new(chosen, Role.ADMIN, hashed, token_id=token_id, by="kiln-controller")
            )

        await self._store.tx(write)
        self._forget()
        return chosen

    async def _record(self, token_id: str) -> TokenRecord | None:
        cached = self._records.get(token_id)
        now = time.monotonic()
        if cached is not None and now - cached[1] < self._cache_s:
            return cached[0]
        record = await self._store.read(lambda tx: tx.tokens.get(token_id))
        self._records[token_id] = (record, now)
        return record

    async def _secret_matches(self, record: TokenRecord, secret: str) -> bool:
        key = (record.id, record.secret_hash)
        known = self._verified.get(key)
        if known is not None:
            return hmac.compare_digest(known, _quick(record, secret))
        if not await asyncio.to_thread(verify_secret, secret, record.secret_hash):
            return False
        self._verified[key] = _quick(record, secret)
        return True

    async def authenticate(self, presented: str) -> Caller:
        """The caller a bearer token stands for.

        Raises Unauthenticated: malformed, unknown, wrong secret, revoked or
        expired. Only a caller that holds the right secret learns the token's
        name (in the revoked or expired message).
        """
        token_id, secret = split_token(presented)
        record = await self._record(token_id)
        if record is None or not await self._secret_matches(record, secret):
            raise Unauthenticated("the bearer token is not valid")
        now = self._clock()
        if record.revoked:
            raise Unauthenticated(f"token {record.name!r} was revoked")
        if record.expired(now):
            raise Unauthenticated(f"token {record.name!r} has expired")
        if now - record.last_used_at >= self._touch_every:
            await self._touch(record, now)
        if record.role is Role.AGENT:
            return Caller(record.node, Role.AGENT, Via.TOKEN, node=record.node)
        return Caller(record.name, record.role, Via.TOKEN)

    async def _touch(self, record: TokenRecord, now: float) -> None:
        """Note the token was used (best effort: a failed write fails no call)."""

        def write(tx: Tx) -> None:
            stored = tx.tokens.get(record.id)
            if stored is not None:
                stored.last_used_at = now
                tx.tokens.save(stored)

        record.last_used_at = now  # the cached copy: no second write this minute
        try:
            await self._store.tx(write)
        except Exception as e:
            log.warning("token %r: could not note its use: %s", record.name, type(e).__name__)
