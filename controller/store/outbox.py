"""The event table as the MQTT publisher's outbox."""

from __future__ import annotations

import json
from collections.abc import Sequence

from controller.events.model import Event
from controller.store.models import EventRow
from controller.store.sql_store import SqlStore, SqlTx


def to_event(row: EventRow) -> Event:
    return Event(
        seq=int(row.seq or 0),
        at=row.at,
        kind=row.kind,
        node=row.node or None,
        allocation=row.allocation or None,
        rule=row.rule or None,
        reason=row.reason,
        data=json.loads(row.data_json or "{}"),
    )


class StoreOutbox:
    """Unpublished events in ``seq`` order; marked once the broker has them."""

    def __init__(self, store: SqlStore) -> None:
        self._store = store

    async def unpublished(self, limit: int) -> list[Event]:
        def query(tx: SqlTx) -> list[Event]:
            return [to_event(r) for r in tx.events.unpublished(limit)]

        return await self._store.read(query)

    async def backlog(self) -> tuple[int, float | None]:
        """Events not yet published: how many, and the oldest one's time."""
        return await self._store.read(lambda tx: tx.events.backlog())

    async def mark_published(self, seqs: Sequence[int]) -> None:
        if not seqs:
            return
        wanted = list(seqs)
        await self._store.tx(lambda tx: tx.events.mark_published(wanted))
