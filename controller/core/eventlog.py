"""Events: written in the same transaction as the change they describe.

Because the event row commits with the transition, an event is never lost
when a consumer or the MQTT broker is away: the publisher and the gRPC
stream read the table from a sequence number on.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from sqlmodel import Session, col, select

from controller.core.model import EventInfo
from controller.store.database import Database
from controller.store.models import EventRow


def record(
    session: Session,
    kind: str,
    *,
    node: str = "",
    allocation: str = "",
    rule: str = "",
    reason: str = "",
    **data: Any,
) -> EventRow:
    """Add an event to the current transaction."""
    row = EventRow(
        at=time.time(),
        kind=kind,
        node=node,
        allocation=allocation,
        rule=rule,
        reason=reason,
        data_json=json.dumps(data, sort_keys=True, default=str),
    )
    session.add(row)
    return row


def to_info(row: EventRow) -> EventInfo:
    return EventInfo(
        seq=int(row.seq or 0),
        at=row.at,
        kind=row.kind,
        node=row.node,
        allocation=row.allocation,
        rule=row.rule,
        reason=row.reason,
        data=json.loads(row.data_json or "{}"),
    )


class EventLog:
    """Reads events back and wakes watchers when new ones commit."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._changed = asyncio.Event()
        db.on_commit(self._notify)

    def _notify(self) -> None:
        # Each commit sets the current Event and starts a fresh one, so every
        # watcher that looked before the commit wakes, and none clears another's.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def since(
        self, after_seq: int, *, node: str = "", allocation: str = "", limit: int = 500
    ) -> list[EventInfo]:
        def query(session: Session) -> list[EventInfo]:
            stmt = select(EventRow).where(col(EventRow.seq) > after_seq)
            if node:
                stmt = stmt.where(EventRow.node == node)
            if allocation:
                stmt = stmt.where(EventRow.allocation == allocation)
            stmt = stmt.order_by(col(EventRow.seq)).limit(limit)
            return [to_info(r) for r in session.exec(stmt)]

        return await self._db.read(query)

    async def watch(
        self, after_seq: int = 0, *, follow: bool = True, node: str = "", allocation: str = ""
    ) -> AsyncIterator[EventInfo]:
        """Yield events after ``after_seq`` in order; with ``follow``, wait for more."""
        last = after_seq
        while True:
            changed = self._changed
            batch = await self.since(last, node=node, allocation=allocation)
            for event in batch:
                last = event.seq
                yield event
            if batch:
                continue
            if not follow:
                return
            try:
                await asyncio.wait_for(changed.wait(), timeout=1.0)
            except TimeoutError:
                pass
