"""Where events wait to be published: the outbox port and an in-memory one.

The controller appends an event in the same database transaction as the
change it describes; :class:`~controller.events.publisher.MqttPublisher`
drains the outbox. A store-backed outbox implements :class:`EventOutbox`
(and :class:`EventLog` for consumers resuming from a sequence number);
:class:`MemoryOutbox` is the in-process one for tests and demos.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from controller.events.model import Event


class EventOutbox(Protocol):
    """Unpublished events, in ``seq`` order."""

    async def unpublished(self, limit: int) -> list[Event]:
        """Up to ``limit`` events not yet marked published, lowest ``seq`` first."""
        ...

    async def mark_published(self, seqs: Sequence[int]) -> None:
        """Mark these events published. Idempotent; unknown seqs are ignored."""
        ...


class EventLog(Protocol):
    """Read access for consumers that resume from a sequence number."""

    async def since(self, seq: int, limit: int | None = None) -> list[Event]:
        """Events with ``seq`` strictly greater than ``seq``, in order."""
        ...


class MemoryOutbox:
    """An in-memory :class:`EventOutbox` and :class:`EventLog`.

    ``append`` assigns the next ``seq``. Events are kept (published or not) so
    that consumers can resume; nothing is ever dropped. Safe for concurrent
    use by tasks of one event loop.
    """

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._published: set[int] = set()
        self._first_unpublished = 0  # index into _events; all before it published
        self._changed = asyncio.Condition()

    async def append(
        self,
        kind: str,
        *,
        node: str | None = None,
        allocation: str | None = None,
        rule: str | None = None,
        reason: str = "",
        data: dict[str, Any] | None = None,
        at: float | None = None,
    ) -> Event:
        """Record a new event and return it with its ``seq``."""
        event = Event(
            seq=len(self._events) + 1,
            at=time.time() if at is None else at,
            kind=kind,
            node=node,
            allocation=allocation,
            rule=rule,
            reason=reason,
            data=dict(data or {}),
        )
        self._events.append(event)
        async with self._changed:
            self._changed.notify_all()
        return event

    async def unpublished(self, limit: int) -> list[Event]:
        out: list[Event] = []
        for event in self._events[self._first_unpublished :]:
            if len(out) >= limit:
                break
            if event.seq not in self._published:
                out.append(event)
        return out

    async def mark_published(self, seqs: Sequence[int]) -> None:
        self._published.update(s for s in seqs if 1 <= s <= len(self._events))
        while (
            self._first_unpublished < len(self._events)
            and self._events[self._first_unpublished].seq in self._published
        ):
            self._first_unpublished += 1

    async def since(self, seq: int, limit: int | None = None) -> list[Event]:
        # seq n lives at index n - 1, so everything after ``seq`` starts at index seq.
        start = max(seq, 0)
        end = None if limit is None else start + limit
        return self._events[start:end]

    async def follow(self, after: int) -> AsyncIterator[Event]:
        """Yield every event with ``seq > after``, then wait for new ones, forever.

        For a streaming consumer (e.g. the gRPC event stream) resuming from the
        last ``seq`` it saw; cancel the iteration to stop.
        """
        cursor = after
        while True:
            batch = await self.since(cursor)
            for event in batch:
                yield event
                cursor = event.seq
            if batch:
                continue
            async with self._changed:
                while len(self._events) <= cursor:
                    await self._changed.wait()

    @property
    def published_count(self) -> int:
        return len(self._published)

    def __len__(self) -> int:
        return len(self._events)
