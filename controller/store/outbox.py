"""The event table as the MQTT publisher's outbox."""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlmodel import Session, col, select, update

from controller.events.model import Event
from controller.store.database import Database
from controller.store.models import EventRow


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

    def __init__(self, db: Database) -> None:
        self._db = db

    async def unpublished(self, limit: int) -> list[Event]:
        def query(session: Session) -> list[Event]:
            stmt = (
                select(EventRow)
                .where(col(EventRow.published).is_(False))
                .order_by(col(EventRow.seq))
                .limit(limit)
            )
            return [to_event(r) for r in session.exec(stmt)]

        return await self._db.read(query)

    async def mark_published(self, seqs: Sequence[int]) -> None:
        if not seqs:
            return
        wanted = list(seqs)

        def write(session: Session) -> None:
            session.exec(  # type: ignore[call-overload]
                update(EventRow).where(col(EventRow.seq).in_(wanted)).values(published=True)
            )

        await self._db.read(write)
