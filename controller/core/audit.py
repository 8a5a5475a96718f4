"""The audit log: who called what, with which arguments, and how it ended.

Every mutating call and every refusal is one ``audit.call`` event, stored
with the other events (so it streams over ``WatchEvents`` and MQTT like
them) before the caller gets the answer. The API layer builds the entry
(``controller.api.auth``), with secrets already removed from the arguments;
the core stores it and reads it back.

Most entries go in a transaction of their own once the call has ended. The
allocation calls, the API's busiest, hand their entry to the core as a
``CallAudit``: it is written, as "OK", in the same transaction as the
call's change (an allocation stored, or released), so the entry and the
change are durable together and the call costs one commit instead of two.
A call that then ends otherwise (its caller gone, an error after the
change) gets a second entry with that ending.

An audit event names no node or allocation of its own (what the call was
about is in its arguments), so the streams a job watches for its allocation
carry only what happened to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from controller.core.errors import InvalidArgument
from controller.core.eventlog import record
from controller.core.kinds import EventKind
from controller.core.model import EventInfo
from controller.core.ports import Store, Tx

DEFAULT_LIMIT = 500
MAX_LIMIT = 5000


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One call. ``code`` is the gRPC status name ("OK", "PERMISSION_DENIED");
    ``arguments`` is the request as JSON values, secrets removed."""

    who: str
    role: str
    method: str
    code: str
    arguments: dict[str, Any] = field(default_factory=dict)
    detail: str = ""
    via: str = ""
    subject: str = ""
    peer: str = ""
    at: float = 0.0
    seq: int = 0


_DATA = ("who", "role", "via", "subject", "method", "arguments", "code", "detail", "peer")


def _entry(event: EventInfo) -> AuditEntry:
    data = event.data
    values: dict[str, Any] = {k: data.get(k, "") for k in _DATA}
    values["arguments"] = data.get("arguments") or {}
    return AuditEntry(**values, at=event.at, seq=event.seq)


def write_entry(tx: Tx, entry: AuditEntry) -> None:
    """Record ``entry`` as an ``audit.call`` event in ``tx`` (its ``at`` is now)."""
    record(
        tx,
        EventKind.AUDIT_CALL,
        reason=f"{entry.who} ({entry.role}) {entry.method}: {entry.code}",
        **{k: getattr(entry, k) for k in _DATA},
    )


@dataclass(slots=True)
class CallAudit:
    """A call's "OK" entry, to be written with the call's change.

    The unit of work that makes the change calls ``write`` in its
    transaction; once that transaction has committed, its owner calls
    ``committed``. ``stored`` then tells the API layer that the entry is
    durable and no entry of its own is needed for a call that ended OK.
    """

    entry: AuditEntry
    stored: bool = False

    def write(self, tx: Tx) -> None:
        write_entry(tx, self.entry)

    def committed(self) -> None:
        self.stored = True


class AuditLog:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def record(self, entry: AuditEntry) -> None:
        """Store ``entry`` as an ``audit.call`` event (its ``at`` is now)."""
        await self._store.tx(lambda tx: write_entry(tx, entry))

    async def query(
        self, *, since: float = 0.0, who: str = "", method: str = "", limit: int = 0
    ) -> list[AuditEntry]:
        """The newest ``limit`` entries (default 500, at most 5000) at or after
        ``since`` (unix seconds), of caller ``who`` and RPC ``method`` when
        given, oldest first. Raises InvalidArgument for a ``since`` that is
        not a finite number."""
        if not math.isfinite(since):
            raise InvalidArgument("since must be a finite number of unix seconds")
        limit = min(limit or DEFAULT_LIMIT, MAX_LIMIT)

        def wanted(event: EventInfo) -> bool:
            return (not who or event.data.get("who") == who) and (
                not method or event.data.get("method") == method
            )

        events = await self._store.read(
            lambda tx: tx.events.latest(
                EventKind.AUDIT_CALL, since_at=since, limit=limit, where=wanted
            )
        )
        return [_entry(e) for e in events]
