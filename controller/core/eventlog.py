"""Events: recorded in the same transaction as the change they describe.

Because the event commits with the transition, an event is never lost when a
consumer or the MQTT broker is away: the publisher and the gRPC stream read
the store from a sequence number on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from controller.core.kinds import EventKind
from controller.core.model import EventInfo
from controller.core.ports import Store, Tx
from controller.core.records import NewEvent, NodeRecord


def record(
    tx: Tx,
    kind: EventKind,
    *,
    node: str = "",
    allocation: str = "",
    rule: str = "",
    reason: str = "",
    **data: Any,
) -> None:
    """Add an event to the current transaction."""
    tx.events.add(
        NewEvent(
            at=time.time(),
            kind=kind,
            node=node,
            allocation=allocation,
            rule=rule,
            reason=reason,
            data=data,
        )
    )


def tell_job(tx: Tx, node: NodeRecord, reason: str, *, rule: str = "", **data: Any) -> None:
    """An ``allocation.notice`` for the job holding ``node``; nothing when none does."""
    if node.allocation_id:
        record(
            tx,
            EventKind.ALLOCATION_NOTICE,
            node=node.name,
            allocation=node.allocation_id,
            rule=rule,
            reason=reason,
            **data,
        )


class EventLog:
    """Reads events back and wakes watchers when new ones commit."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._changed = asyncio.Event()
        store.on_commit(self._notify)

    def _notify(self) -> None:
        # Each commit sets the current Event and starts a fresh one, so every
        # watcher that looked before the commit wakes, and none clears another's.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def since(
        self, after_seq: int, *, node: str = "", allocation: str = "", limit: int = 500
    ) -> list[EventInfo]:
        return await self._store.read(
            lambda tx: tx.events.since(after_seq, node=node, allocation=allocation, limit=limit)
        )

    async def newest(self, limit: int, *, node: str = "") -> list[EventInfo]:
        """The newest ``limit`` events (of ``node``), oldest first."""
        return await self._store.read(lambda tx: tx.events.newest(limit, node=node))

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
                async with asyncio.timeout(1.0):
                    await changed.wait()
            except TimeoutError:
                pass
